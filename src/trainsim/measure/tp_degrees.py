"""The tp degree of each op of a strategy tree's per-op tp configs, as `trainsim measure --tree` hands them to the
ranks (measure/op_parallel.py runs them; no torch here: the command checks a plan before any rank starts).

A tree may give each op of a block's attention and MLP, the embedding's lookup, the head's vocabulary projection and
its cross-entropy Megatron's split over d consecutive tp ranks, d dividing tp, or none (d = 1: whole on each tp
rank; strategy.megatron.own_configs, Proteus Sec. IV-B); the other configs a tree may give an op (a matmul by its
reduction dimension or by tokens, the core by sequence) are priced, not measured: refused here. The measured model
runs each module's ops as a chain of stages whose degrees it reshards between: the attention's projections (qkv),
its core (rope, the core, an unfused softmax: one degree), its output projection; the MLP's first matmul(s),
activation, second matmul; the head's projection and cross-entropy. Between two stages of different degrees one side
must be whole: a split read whole is all-gathered over the split's ranks, a whole tensor read split is sliced (the
layout changes strategy.reshard prices; a change between two degrees above 1 is refused).
"""

from collections.abc import Sequence

from trainsim.errors import ConfigError
from trainsim.ir.graph import Op
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.lowered import LoweredPlan
from trainsim.strategy.megatron import UNSPLIT, megatron_tp, own_configs
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.placement import OpConfig

# each module's ops in stages, in the order its data flows (the ops of one stage run at one degree)
ATTENTION_STAGES: tuple[tuple[str, ...], ...] = (("qkv",), ("rope", "attention", "softmax"), ("out_proj",))
MLP_STAGES: tuple[tuple[str, ...], ...] = (("fc1", "gate_up"), ("gelu", "swiglu"), ("fc2", "down"))
HEAD_STAGES: tuple[tuple[str, ...], ...] = (("logits",), ("cross_entropy",))
EMBED_STAGES: tuple[tuple[str, ...], ...] = (("lookup",),)
PART_OF_KIND = {"embedding": "embed", "head": "head"}  # a block's part is "block:<its index among the blocks>"

TpDegrees = dict[str, dict[str, int]]  # model part -> op name -> its tp degree (ops at the job's tp left out)


def plan_tp_degrees(plan: LoweredPlan, par: ParallelSpec) -> TpDegrees:
    """Per part of the model (PART_OF_KIND, "block:i"), the tp degree of each op the plan's tp configs split over
    fewer ranks than tp, or leave whole (1); {} where every op takes Megatron's split. Refuses, in one line, a
    layout change between two degrees above 1 inside a module."""
    dev = DeviceSlice.of(par)
    given = plan.tp_configs()
    out: TpDegrees = {}
    blocks = 0
    for a in plan.layers:
        part = PART_OF_KIND.get(a.layer.kind, f"block:{blocks}")
        blocks += part.startswith("block:")
        configs = given.get(a.index, {})
        degrees = _degrees(part, a.layer.fwd, dev, own_configs(
            a.layer.fwd, dev, lambda op, c=configs: c.get(op.module_path, UNSPLIT)))
        if degrees:
            _check_stages(part, a.layer.fwd, degrees, par.tp)
            out[part] = degrees
    return out


def _degrees(part: str, fwd: Sequence[Op], dev: DeviceSlice, own: frozenset[tuple[str, OpConfig]]) -> dict[str, int]:
    """The degree d of each op whose own config is Megatron's split over d (1: whole); any other config refused."""
    ops = {op.name: op for op in fwd}
    out: dict[str, int] = {}
    for name, config in sorted(own, key=lambda item: item[0]):
        d = max(config.out, config.reduce)
        if config != megatron_tp(ops[name], dev, d):
            raise ConfigError(f"split.compute@tp ({part})", f"{name} batch={config.batch} seq={config.seq} "
                              f"out={config.out} reduce={config.reduce}", "measured where an op takes Megatron's "
                              "split over d dividing tp, or none; predict prices the other configs")
        out[name] = d
    return out


def _check_stages(part: str, fwd: Sequence[Op], degrees: dict[str, int], tp: int) -> None:
    present = {op.name for op in fwd}
    for stages in (ATTENTION_STAGES, MLP_STAGES, HEAD_STAGES, EMBED_STAGES):
        previous: tuple[str, int] | None = None
        for stage in stages:
            ops = [name for name in stage if name in present]
            if not ops:
                continue
            found = {name: degrees.get(name, tp) for name in ops}
            if len(set(found.values())) > 1:
                raise ConfigError(f"split.compute@tp ({part})", found,
                                  f"measured with {', '.join(ops)} at one tp degree")
            degree = found[ops[0]]
            if previous is not None and degree > 1 and previous[1] > 1 and degree != previous[1]:
                raise ConfigError(f"split.compute@tp ({part})", f"{previous[0]} over {previous[1]}, {ops[0]} over "
                                  f"{degree}", "measured where the two degrees are equal or one of them is 1 (whole)")
            previous = (ops[0], degree)
