"""The tensor-parallel style of each module of a captured graph's model (the torch front-end's Hugging Face model)
that a strategy tree's configs over tp split, as `trainsim measure --frontend torch --tree` hands them to the ranks
(measure/front_end_model.py applies them with torch.distributed.tensor.parallel; no torch here: the command checks a
plan before any rank starts).

The captured graph's ops sit under the model's module paths (compile/shape_front_end.py shapes them from the tree's
configs, given or inferred along the data dependencies). What maps onto torch's styles is Megatron-LM's pair
(Shoeybi et al. 2019, Sec. 3) inside one module: its linear layers (nn.Linear, or GPT-2's Conv1D) split by output
features over tp (ColwiseParallel: GPT-2's c_attn and c_fc; a captured LLaMA's q, k, v or gate and up GEMM, which
torch.fuse leaves under the attention or MLP module itself: that module's linear layers but the row one) feeding,
through ops that keep that split (the attention core by heads, the activation by ffn features), one linear layer
split by its reduction dimension over tp (RowwiseParallel: c_proj, o_proj, down_proj), every other op of the model
whole on each rank. Such a plan is priced with one all-reduce forward per row layer and one backward per module (its
column layers' input gradient), which is what the styles issue (one f per module: measure/op_parallel.py
fused_input); any other config a tree gives a captured graph (a split over fewer ranks, by tokens, a norm by
features, the head by the vocabulary, a pair whose inferred configs the compiler reshards otherwise) is refused in
one line.
"""

import re
from collections import Counter
from collections.abc import Mapping

from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer
from trainsim.strategy.front_end_splits import config_text
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import UNSPLIT
from trainsim.strategy.placement import OpConfig

COLWISE, ROWWISE = "colwise", "rowwise"
Styles = dict[str, str]  # the model's module path -> COLWISE or ROWWISE
_ALLOWED = ("measured where a linear layer takes Megatron's column split (out over tp) or row split (reduce over "
            "tp), a module's column layers feeding its one row layer, every other op whole; predict prices the "
            "other configs")


def front_end_styles(plan: LoweredPlan, shaped: LoweredPlan, tp: int) -> Styles:
    """The styles of a captured graph's plan (plan: lowered from the tree; shaped: after the compiler's passes,
    its layers' collectives priced). Refuses, in one line, what the styles do not run (module doc)."""
    given = plan.tp_configs()
    styles: Styles = {}
    block = 0
    for a, shaped_a in zip(plan.layers, shaped.layers, strict=True):
        layer = a.layer
        where = f"split.compute@tp ({layer.name})"
        found = _layer_styles(where, layer, given.get(a.index, {}), tp)
        if found and layer.kind != "block":
            raise ConfigError(where, found, _ALLOWED)
        _check_pairs(where, found, shaped_a.layer)
        styles.update({_model_path(path, block): style for path, style in found.items()})
        block += layer.kind == "block"
    return styles


def _layer_styles(where: str, layer: Layer, given: Mapping[str, OpConfig], tp: int) -> Styles:
    matmuls = {op.module_path for op in layer.fwd if op.kind == "matmul"}
    found: Styles = {}
    for path, config in sorted(given.items()):
        if config == UNSPLIT:
            continue
        style = {OpConfig(1, 1, tp, 1): COLWISE, OpConfig(1, 1, 1, tp): ROWWISE}.get(config)
        if style is None or path not in matmuls:
            raise ConfigError(where, f"{path} {config_text(config)}", _ALLOWED)
        found[path] = style
    return found


def _check_pairs(where: str, found: Styles, shaped: Layer) -> None:
    """Each module with split layers has column layers and one row layer, and the compiler prices the layer with
    Megatron's all-reduces alone: one forward per row layer, one backward per module."""
    modules: dict[str, Counter[str]] = {}
    for path, style in found.items():
        modules.setdefault(pair_module(path, style, found), Counter())[style] += 1
    priced = Counter((c.collective, c.phase) for c in shaped.comms if c.axis == "tp")
    wanted = Counter({("all-reduce", "fwd"): len(modules), ("all-reduce", "bwd"): len(modules)})
    pairs = all(n[ROWWISE] == 1 and n[COLWISE] >= 1 for n in modules.values())
    if not pairs or priced != wanted or any(c.ranks for c in shaped.comms):
        collectives = ", ".join(f"{c.name} {c.collective} {c.phase}" for c in shaped.comms) or "none"
        raise ConfigError(where, {path: style for path, style in sorted(found.items())},
                          f"{_ALLOWED} (this layer's priced collectives: {collectives})")


def pair_module(path: str, style: str, styles: Mapping[str, str]) -> str:
    """The module a split layer's pair lives in: a row layer's parent; a column layer's parent, or the column path
    itself where the row layer sits below it (a LLaMA's captured q, k, v GEMM is its attention module's: the tree
    splits `self_attn`, its row layer is `self_attn.o_proj`)."""
    if style == COLWISE and any(other.startswith(f"{path}.") for other, s in styles.items() if s == ROWWISE):
        return path
    return path.rsplit(".", 1)[0]


def _model_path(path: str, block: int) -> str:
    """A captured block's module path in the model: the repeated container's index is the block's (the graph's
    untraced blocks repeat a traced one's paths: transformer.h.0.attn.c_attn for every block but the last)."""
    return re.sub(r"\.\d+\.", f".{block}.", path, count=1)
