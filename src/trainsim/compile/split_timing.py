"""The LayerTiming of a layer instance under computation configs (compile.splits): scaled compute and the
reshard collectives among it. Layers without configs keep BuildContext.timing's (the plain path).

At task_level "op" each op is priced as one device runs it (splits.scaled_op) and each collective follows the
op it comes after; at task_level "layer" the layer's price per phase is scaled by the ratio of op times under
the configs to op times in the plain graph, and the collectives follow the phase's compute (merged, as the
plain path merges a layer's feature collectives per axis).

A reshard's host copies (compile.splits.SplitCopy: the parts laid out for the collective and back) are compute
work priced as a memory-bound op by the op-cost model, and so is the split executor's host cost per reshard step
(Pricer.executor_reshard_s: measured, else none): after the op the reshard follows, before its collectives (op
level), or after the phase's compute (layer level).
"""

import dataclasses

from trainsim.compile.context import BuildContext, CommWork, LayerTiming, Work
from trainsim.compile.splits import LayerSplit, config_of, scaled_op
from trainsim.ir.graph import Op
from trainsim.strategy.lowered import LayerAssignment

SPLIT_AXIS = "split"  # CommWork axis of reshard collectives (their layout: BuildContext.comm_layout)


def timing_for(ctx: BuildContext, a: LayerAssignment) -> LayerTiming:
    split = ctx.splits.get(a.index)
    base = ctx.timing(a.layer, a.index)
    if split is None or (not split.comms and not split.copies
                         and all(c.parts == ctx.par.dp for c in split.configs.values())):
        return base
    key = (id(a.layer), split.key())
    cached = ctx.split_timings.get(key)
    if cached is None:
        cached = ctx.split_timings[key] = _timing(ctx, a, split, base)
    return cached


def _timing(ctx: BuildContext, a: LayerAssignment, split: LayerSplit, base: LayerTiming) -> LayerTiming:
    group = ctx.par.dp
    pricer, job = ctx.pricer, ctx.job

    def seconds(op: Op, scaled: bool) -> float:
        config = config_of(split, op) if scaled else None
        return pricer.op_time_s(scaled_op(op, config, group) if config is not None else op, job)

    comms = {phase: [CommWork(f"{s.step.collective} x{s.step.ranks} {s.tensor}", SPLIT_AXIS,
                              ctx.reshard_s(s.step), s.after, s.step.ranks)
                     for s in split.comms if s.phase == phase] for phase in ("fwd", "bwd")}
    copies = {phase: _host_works(ctx, split, phase) for phase in ("fwd", "bwd")}
    if ctx.level == "op":
        def works(ops: tuple[Op, ...], phase: str) -> tuple[Work, ...]:
            """Each op, then the host copies of the reshards that follow it (before their collectives)."""
            out: list[Work] = []
            for op in ops:
                out.append(Work(op.name, seconds(op, True), op.name))
                out += [work for after, work in copies[phase] if after == op.name]
            names = {op.name for op in ops}
            return tuple(out) + tuple(work for after, work in copies[phase] if after not in names)

        fwd, bwd = works(a.layer.fwd, "fwd"), works(a.layer.bwd, "bwd")
        sites = {w.name: w.site for w in base.fwd + base.bwd}  # the plain site of each op (attn, mlp, ...)
        merged = {phase: _resite(base.comms[phase], a.layer.fwd if phase == "fwd" else a.layer.bwd, sites)
                  + tuple(comms[phase]) for phase in ("fwd", "bwd")}
        return LayerTiming(fwd, bwd, tuple(w for w in bwd if not w.name.endswith(".wgrad")),
                           tuple(w for w in bwd if w.name.endswith(".wgrad")),
                           tuple(Work(op.name, seconds(op, True), op.name) for op in a.layer.fwd
                                 if op.recompute_selective), merged)

    def ratio(ops: tuple[Op, ...]) -> float:
        plain = sum(seconds(op, False) for op in ops)
        return sum(seconds(op, True) for op in ops) / plain if plain > 0.0 else 1.0

    fwd_r, bwd_r = ratio(a.layer.fwd), ratio(a.layer.bwd)
    wgrad_r = ratio(tuple(op for op in a.layer.bwd if op.name.endswith(".wgrad")))
    dgrad_r = ratio(tuple(op for op in a.layer.bwd if not op.name.endswith(".wgrad")))
    sel_r = ratio(tuple(op for op in a.layer.fwd if op.recompute_selective))

    def scale(items: tuple[Work, ...], r: float, phase: str = "") -> tuple[Work, ...]:
        """The layer's price per phase scaled, then the phase's reshard copies."""
        return tuple(Work(w.name, w.seconds * r, w.site) for w in items) + tuple(
            work for _, work in copies.get(phase, ()))

    merged_l: dict[str, tuple[CommWork, ...]] = {}
    for phase in ("fwd", "bwd"):
        per_group: dict[int, float] = {}  # ranks a reshard spans -> its seconds (each group on its own links)
        for c in comms[phase]:
            per_group[c.ranks] = per_group.get(c.ranks, 0.0) + c.seconds
        extra = tuple(CommWork(f"{SPLIT_AXIS} comm" + (f" x{ranks}" if len(per_group) > 1 else ""), SPLIT_AXIS,
                               seconds, "", ranks) for ranks, seconds in per_group.items() if seconds > 0.0)
        merged_l[phase] = base.comms[phase] + extra
    return LayerTiming(scale(base.fwd, fwd_r, "fwd"), scale(base.bwd, bwd_r, "bwd"), scale(base.dgrad, dgrad_r, "bwd"),
                       scale(base.wgrad, wgrad_r), scale(base.selective, sel_r), merged_l)


def _host_works(ctx: BuildContext, split: LayerSplit, phase: str) -> list[tuple[str, Work]]:
    """(the op it follows, the work) of each host task of the phase's reshards: the copies of their parts, then
    the split executor's cost per collective step (none unless measured)."""
    pricer, job = ctx.pricer, ctx.job
    out = [(c.after, Work(f"{c.after} reshard copy", pricer.op_time_s(c.op(), job), c.after))
           for c in split.copies if c.phase == phase]
    for s in split.comms:
        host_s = pricer.executor_reshard_s(s.step.collective, phase, job) if s.phase == phase else 0.0
        if host_s > 0.0:
            out.append((s.after, Work(f"{s.after} reshard host", host_s, s.after)))
    return out


def _resite(comms: tuple[CommWork, ...], ops: tuple[Op, ...], sites: dict[str, str]) -> tuple[CommWork, ...]:
    """The plain feature collectives, placed after the last op of their site (ops are now sited by name)."""
    out = []
    for c in comms:
        names = [op.name for op in ops if sites.get(op.name) == c.site] if c.site else []
        out.append(dataclasses.replace(c, site=names[-1] if names else ""))
    return tuple(out)
