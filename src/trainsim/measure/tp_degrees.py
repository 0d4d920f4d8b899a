"""The tp split of each op of a strategy tree's per-op tp configs, as `trainsim measure --tree` hands them to the
ranks (measure/op_parallel.py, measure/op_splits.py and measure/hidden_splits.py run them; no torch here: the
command checks a plan before any rank starts).

A tree may give an op Megatron's split over d consecutive tp ranks, d dividing tp, or none (d = 1: whole on each tp
rank; strategy.megatron.own_configs, Proteus Sec. IV-B), and these other splits over d ranks (its "dim"):
- "reduce": a column matmul (qkv, fc1, gate_up) split by its reduction dimension: each rank multiplies its slice
  of the input features by the weight's rows for them, and the partial sums are reduce-scattered onto the next
  stage's split (the same d: heads or ffn features) or all-reduced for a whole next stage;
- "seq" on the attention core (query rows): q, k and v exchanged by all-to-all from heads to rows, the keys and
  values of the whole sequence all-gathered (as context parallelism does), the output exchanged back to heads;
  its qkv and projection take Megatron's split over the same d;
- "seq" on a dense MLP (all its ops): each rank runs the whole MLP on its own tokens, their outputs all-gathered;
  the MLP's weights' gradients are summed over the d ranks;
- "seq" on a block's norms and residual adds (all four, over tp, the attention and MLP Megatron's): Megatron's
  sequence parallelism inside the block, the block's input sliced and its output all-gathered; the norms'
  gradients summed over tp; or on the residual adds alone (over tp, the norms whole): each rank adds its tokens,
  the projections reduce-scattered onto them (measure/hidden_splits.py);
- "features" (an `out` split) on a block's norms and residual adds, the head's final norm and the learned
  positions (over tp, the other ops of the block or head Megatron's): each rank normalises or adds its slice of
  the hidden features, a norm's statistics all-reduced in fp32, the projections before a split add
  reduce-scattered onto its slices, the modules reading a split norm all-gathering its output; "seq" on the final
  norm or the positions (over tp): each rank on its tokens, the gain and bias or the table whole, their gradients
  summed over tp (measure/hidden_splits.py);
- "seq" on an MoE block's router (over tp, its experts Megatron's over tp): each rank routes its tokens, the
  routed copies and their probabilities all-gathered over tp for the experts, their partial outputs
  reduce-scattered back; the router whole beside them routes every token (measure/moe_splits.py).
Any other config a tree may give an op (a batch split, a lookup by tokens, a row matmul by its output, mixes of
the above inside a module) is priced by predict, not measured: refused here in one line. The measured model runs
each module's ops as a chain of stages of one split each: the attention's projections (qkv), its core (rope, the
core, an unfused softmax), its output projection; the MLP's first matmul(s), activation, second matmul; the head's
projection and cross-entropy. Between two Megatron stages of different degrees one side must be whole: a split
read whole is all-gathered over the split's ranks, a whole tensor read split is sliced (the layout changes
strategy.reshard prices; a change between two degrees above 1 is refused).
"""

from collections import Counter
from collections.abc import Sequence

from trainsim.errors import ConfigError
from trainsim.ir.graph import Op
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import COLUMN, UNSPLIT, megatron_tp, own_configs
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig

# each module's ops in stages, in the order its data flows (the ops of one stage run at one split)
ATTENTION_STAGES: tuple[tuple[str, ...], ...] = (("qkv",), ("rope", "attention", "softmax"), ("out_proj",))
MLP_STAGES: tuple[tuple[str, ...], ...] = (("fc1", "gate_up"), ("gelu", "swiglu"), ("fc2", "down"))
HEAD_STAGES: tuple[tuple[str, ...], ...] = (("logits",), ("cross_entropy",))
EMBED_STAGES: tuple[tuple[str, ...], ...] = (("lookup",),)
TOKEN_OPS = ("norm1", "residual1", "norm2", "residual2")  # a dense block's norms and residual adds
PART_OF_KIND = {"embedding": "embed", "head": "head"}  # a block's part is "block:<its index among the blocks>"
# the ops that may be split by their hidden features over tp (measure/hidden_splits.py)
FEATURE_OPS = (*TOKEN_OPS, "final_norm", "pos_add")
SPLIT_DIMS = ("reduce", "seq", "features")  # the splits other than Megatron's that the ranks run (module doc)

TpDegrees = dict[str, dict[str, int]]  # model part -> op name -> its tp degree (ops at the job's tp left out)
TpDims = dict[str, dict[str, str]]  # model part -> op name -> its split where not Megatron's (SPLIT_DIMS)
_WHERE = "split.compute@tp"


def plan_tp_degrees(plan: LoweredPlan, par: ParallelSpec) -> TpDegrees:
    """Per part of the model (PART_OF_KIND, "block:i"), the tp degree (parts) of each op the plan's tp configs
    split other than Megatron's way over tp; {} where every op takes Megatron's split (plan_tp_layout)."""
    return plan_tp_layout(plan, par)[0]


def plan_tp_layout(plan: LoweredPlan, par: ParallelSpec) -> tuple[TpDegrees, TpDims]:
    """Each op's degree where it is not Megatron's over tp, and its split dim where that is not Megatron's
    (module doc). Refuses, in one line, what the ranks do not run."""
    dev = DeviceSlice.of(par)
    given = plan.tp_configs()
    degrees: TpDegrees = {}
    dims: TpDims = {}
    blocks = 0
    for a in plan.layers:
        part = PART_OF_KIND.get(a.layer.kind, f"block:{blocks}")
        blocks += part.startswith("block:")
        configs = given.get(a.index, {})
        own = own_configs(a.layer.fwd, dev, lambda op, c=configs: c.get(op.module_path, UNSPLIT))
        found, split = _splits(part, a.layer.fwd, dev, own)
        if found:
            _check_stages(part, a.layer.fwd, found, split, par.tp)
            _check_splits(part, found, split, dev, {op.name for op in a.layer.fwd})
            degrees[part] = found
        if a.layer.kind == "moe_block":
            _check_moe(part, found, split, dev)
        if split:
            _check_kernel(part, split, par)
            dims[part] = split
    return degrees, dims


def _check_moe(part: str, degrees: dict[str, int], dims: dict[str, str], dev: DeviceSlice) -> None:
    """An MoE block runs its experts at Megatron's split over tp and its router whole or by seq over tp
    (measure/moe_splits.py); its norms and adds take Megatron's configs (_check_splits)."""
    experts = sorted(set(degrees) & set(sum(MLP_STAGES, ())))
    router = (dims.get("router"), degrees.get("router", 1))
    if experts or router not in ((None, 1), ("seq", dev.tp)) or (router[0] and dev.local_tokens
                                                                 // dev.micro_batch % dev.tp):
        raise ConfigError(f"{_WHERE} ({part})", {name: f"{dims.get(name, 'megatron')} {d}"
                                                 for name, d in sorted(degrees.items())},
                          f"measured where an MoE block's experts take Megatron's split over tp={dev.tp} and its "
                          f"router is whole or split by seq over tp={dev.tp} (seq_len a multiple of {dev.tp})")


def _check_kernel(part: str, dims: dict[str, str], par: ParallelSpec) -> None:
    """The core by query rows runs scaled_dot_product_attention (the flash2 path): no unfused core's dropout."""
    if dims.get("attention") == "seq" and par.attention != "flash2":
        raise ConfigError("attention", par.attention, f"the core split by seq ({part}) is measured with flash2")


def _splits(part: str, fwd: Sequence[Op], dev: DeviceSlice,
            own: frozenset[tuple[str, OpConfig]]) -> tuple[dict[str, int], dict[str, str]]:
    """The degree d of each op whose own config is measured (module doc), and the dim of those not Megatron's."""
    ops = {op.name: op for op in fwd}
    degrees: dict[str, int] = {}
    dims: dict[str, str] = {}
    for name, config in sorted(own, key=lambda item: item[0]):
        d = config.parts
        dim = _dim(ops[name], config, dev)
        if dim is None:
            raise ConfigError(f"{_WHERE} ({part})", f"{name} batch={config.batch} seq={config.seq} "
                              f"out={config.out} reduce={config.reduce}", "measured where an op takes Megatron's "
                              "split over d dividing tp, or none; qkv/fc1 by reduce, the core, a dense MLP or "
                              "the norms by seq; the norms, adds and positions by out (features); predict "
                              "prices the other configs")
        degrees[name] = d
        if dim != "megatron":
            dims[name] = dim
    return degrees, dims


def _dim(op: Op, config: OpConfig, dev: DeviceSlice) -> str | None:
    """"megatron", "reduce" or "seq" where the ranks run the config (module doc), else None."""
    d = config.parts
    if config == megatron_tp(op, dev, d):
        return "megatron"
    if dev.sp:
        return None
    if config == OpConfig(1, 1, d, 1) and op.name in FEATURE_OPS:
        return "features"
    if config.parts != max(config.reduce, config.seq):
        return None
    if config.reduce > 1:
        return "reduce" if op.name in COLUMN and op.name != "logits" else None
    dense_mlp = op.name in sum(MLP_STAGES, ()) and "moe" not in op.module_path.split(".")
    return "seq" if op.name in ("attention", "rope", "softmax", "router", *FEATURE_OPS) or dense_mlp else None


def _check_stages(part: str, fwd: Sequence[Op], degrees: dict[str, int], dims: dict[str, str], tp: int) -> None:
    """One split per stage; between two Megatron stages of different degrees one is whole; a column stage split
    by reduce feeds a stage at its degree or whole."""
    present = {op.name for op in fwd}
    for stages in (ATTENTION_STAGES, MLP_STAGES, HEAD_STAGES, EMBED_STAGES):
        previous: tuple[str, int, str] | None = None
        for stage in stages:
            ops = [name for name in stage if name in present]
            if not ops:
                continue
            found = {name: (degrees.get(name, tp), dims.get(name, "megatron")) for name in ops}
            if len(set(found.values())) > 1:
                raise ConfigError(f"{_WHERE} ({part})", {k: f"{v[1]} {v[0]}" for k, v in found.items()},
                                  f"measured with {', '.join(ops)} at one split")
            degree, dim = found[ops[0]]
            if previous is not None:
                _check_change(part, previous, (ops[0], degree, dim))
            previous = (ops[0], degree, dim)


def _check_change(part: str, before: tuple[str, int, str], after: tuple[str, int, str]) -> None:
    (name_a, d_a, dim_a), (name_b, d_b, dim_b) = before, after
    if "seq" in (dim_a, dim_b):
        return  # _check_splits: a split by seq fixes its neighbours
    if dim_a == "reduce" and d_b not in (1, d_a):
        raise ConfigError(f"{_WHERE} ({part})", f"{name_a} by reduce over {d_a}, {name_b} over {d_b}",
                          f"measured where {name_b} is split over the same {d_a} ranks or whole")
    if dim_b == "reduce":
        raise ConfigError(f"{_WHERE} ({part})", f"{name_b} by reduce", "measured on qkv, fc1 or gate_up only")
    if d_a > 1 and d_b > 1 and d_a != d_b:
        raise ConfigError(f"{_WHERE} ({part})", f"{name_a} over {d_a}, {name_b} over {d_b}",
                          "measured where the two degrees are equal or one of them is 1 (whole)")


def _check_splits(part: str, degrees: dict[str, int], dims: dict[str, str], dev: DeviceSlice,
                  present: set[str]) -> None:
    """The splits by seq the ranks run: the core with its qkv and projection Megatron's over its d (and s a
    multiple of 2 d: zig-zag rows), a dense MLP all at one d, the norms and residual adds all over tp."""
    seq = {name for name, dim in dims.items() if dim == "seq"}
    core = seq & {"attention", "rope", "softmax"}
    mlp = seq & set(sum(MLP_STAGES, ()))
    tokens = seq & set(TOKEN_OPS)
    if core:
        d = degrees[next(iter(core))]
        others = {name: degrees.get(name, dev.tp) for name in ("qkv", "out_proj")}
        if any(v != d or name in dims for name, v in others.items()) or (dev.local_tokens // dev.micro_batch) % (2 * d):
            raise ConfigError(f"{_WHERE} ({part})", f"attention by seq over {d}, qkv over {others['qkv']}, "
                              f"out_proj over {others['out_proj']}", f"measured with qkv and out_proj Megatron's "
                              f"over the same {d} ranks and seq_len a multiple of {2 * d} (zig-zag rows)")
    if mlp and (len({degrees[name] for name in mlp}) > 1 or mlp != present & set(sum(MLP_STAGES, ()))):
        raise ConfigError(f"{_WHERE} ({part})", {name: degrees[name] for name in sorted(degrees)},
                          "measured where every op of the MLP is split by seq over the same ranks")
    adds = {"residual1", "residual2"}
    if tokens and (not (tokens == set(TOKEN_OPS) or tokens <= adds) or set(degrees) != tokens
                   or any(degrees[name] != dev.tp for name in tokens) or "router" in present):
        raise ConfigError(f"{_WHERE} ({part})", {name: degrees[name] for name in sorted(degrees)},
                          f"measured where norm1, residual1, norm2 and residual2 are all split by seq over "
                          f"tp={dev.tp}, or the residual adds alone, and the block's other ops take Megatron's "
                          f"split, in a dense block")
    features = {name for name, dim in dims.items() if dim == "features" or name in ("final_norm", "pos_add")}
    if features and (any(degrees[name] != dev.tp for name in features) or set(degrees) - features - {"lookup"}
                     or "router" in present):
        raise ConfigError(f"{_WHERE} ({part})", {name: f"{dims.get(name, 'megatron')} {degrees[name]}"
                                                 for name in sorted(degrees)},
                          f"measured where the norms, adds and positions split by features (the final norm and "
                          f"the positions by seq too) are split over tp={dev.tp} and the other ops of their block "
                          f"(or head) take Megatron's split over tp, in a dense block")


def priced_tp_collectives(plan: LoweredPlan) -> Counter[tuple[str, int]]:
    """The tp collectives the predictor prices per micro-batch for a plan (each layer's Comm over tp, forward and
    backward), as (collective, bytes) rows: what measure.collective_log records of a run of the same plan."""
    return Counter((c.collective, int(c.buffer_bytes)) for a in plan.layers for c in a.layer.comms if c.axis == "tp")
