"""Pass: lower one stage's schedule steps into layer-phase tasks.

A step (F, B or W of one micro-batch on one model chunk) runs the chunk's layers in order (B and W in reverse);
each layer instance's share is a layer-phase: recompute (apply_recompute), then the main compute (one task per
layer, or per op at task_level="op") with its feature collectives placed among it (insert_collectives), all in
the stage's chain. Memory: a forward allocates the layer's saved_bytes[recompute mode], the backward (W for
zero-bubble schedules) frees them; the head's backward holds the logits' gradient while it runs (memory.py's
temporary). Zero-bubble schedules free at B what W does not need (_kept_for_w).

Cuts: a pass can ask for a callback at a point of a layer-phase's main compute (ZeRO-3 prefetch windows,
the data-parallel overlap window); the compute task there is split in two so the point is a task boundary.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from trainsim.compile.apply_recompute import recompute_specs, recompute_work
from trainsim.compile.context import CommWork, LayerTiming, StageWriter, TaskSpec, Work
from trainsim.compile.insert_collectives import feature_comm_spec, placements
from trainsim.compile.schedules import Step
from trainsim.compile.split_timing import timing_for
from trainsim.cost.memory import kept_bytes, loss_grad_bytes, rebuilt_bytes, saved_key
from trainsim.ir.exec_graph import Phase
from trainsim.strategy.lowered import LayerAssignment

Cut = tuple[float, Callable[[], None]]  # (seconds of the main compute before the point, callback)


class Unit(NamedTuple):  # NB: a NamedTuple, built tens of thousands of times per compile
    """One layer-phase: a step's work on one layer instance."""

    phase: str  # F | B | W
    micro_batch: int
    assignment: LayerAssignment

    @property
    def label(self) -> str:
        return f"L{self.assignment.index}.{self.assignment.layer.name}"

    def makes_gradient(self, split: bool) -> bool:
        """Whether this layer-phase produces the layer's weight gradient (B, or W when the backward is split)."""
        return self.phase == "W" or (self.phase == "B" and not split)


def step_units(step: Step, assignments: list[LayerAssignment]) -> list[Unit]:
    ordered = assignments if step.phase == "F" else assignments[::-1]
    return [Unit(step.phase, step.micro_batch, a) for a in ordered]


def main_work(unit: Unit, timing: LayerTiming, split: bool) -> tuple[Work, ...]:
    """The layer-phase's main compute (without recompute)."""
    if unit.phase == "F":
        return timing.fwd
    if unit.phase == "B":
        return timing.dgrad if split else timing.bwd
    return timing.wgrad


@dataclass(slots=True)
class UnitMemory:
    """Bytes the main compute allocates when it starts and frees when it ends, beyond activations: gathered
    weights (freed) and unsharded gradients (allocated) of ZeRO-3."""

    gathered: float = 0.0
    gradients: float = 0.0
    cuts: list[Cut] = field(default_factory=list)


def emit_unit(w: StageWriter, unit: Unit, split: bool, extra: UnitMemory) -> int:
    """Emit one layer-phase; returns the tid of its last compute task. A layer-phase no pass cuts into and that
    holds no ZeRO-3 bytes is the same for every micro-batch: its specs are built once (BuildContext.unit_specs)."""
    mb = unit.micro_batch
    if not extra.cuts and not extra.gathered and not extra.gradients:
        return w.emit_all(unit_specs(w, unit, split), mb)
    items = unit_items(w, unit, split, extra)
    last = -1
    for item in items:
        if isinstance(item, TaskSpec):
            tid = w.emit(item, mb)
            if item.stream == "compute":
                last = tid
        else:
            item()
    return last


def unit_specs(w: StageWriter, unit: Unit, split: bool) -> tuple[TaskSpec, ...]:
    """The chain tasks of a layer-phase no pass cuts into and that holds no ZeRO-3 bytes: the same for every
    micro-batch, built once per layer instance and phase (BuildContext.unit_specs)."""
    key = (unit.assignment.index, unit.phase)
    specs = w.ctx.unit_specs.get(key)
    if specs is None:
        specs = w.ctx.unit_specs[key] = tuple(item for item in unit_items(w, unit, split, UnitMemory())
                                              if isinstance(item, TaskSpec))
    return specs


def unit_items(w: StageWriter, unit: Unit, split: bool, extra: UnitMemory) -> list[TaskSpec | Callable[[], None]]:
    """One layer-phase in chain order: its tasks (recompute, then the main compute with its feature collectives
    placed among it) and, where the passes cut into it, their callbacks at those points."""
    a, label = unit.assignment, unit.label
    ctx = w.ctx
    timing = timing_for(ctx, a)
    stack = ctx.job.stack
    saved = kept_bytes(a.layer, saved_key(a.recompute, stack))
    rebuilt = rebuilt_bytes(a.layer, a.recompute, stack) if recompute_work(a, timing) else 0.0
    comms: tuple[CommWork, ...] = ()
    items: list[TaskSpec | Callable[[], None]] = []
    phase: Phase
    if unit.phase == "F":
        alloc, free, comms, phase = saved, extra.gathered, timing.comms["fwd"], "fwd"
    elif unit.phase == "B":
        items += recompute_specs(ctx, w.stage, a, timing, layer=label)
        logits_grad = loss_grad_bytes(a.layer, stack) if a.layer.kind == "head" else 0.0
        released = saved + rebuilt - (_kept_for_w(a, saved + rebuilt) if split else 0.0)
        alloc, free = logits_grad + extra.gradients, logits_grad + extra.gathered + released
        comms, phase = timing.comms["bwd"], "bwd"
    else:
        alloc, free, phase = extra.gradients, _kept_for_w(a, saved + rebuilt), "bwd"
    items += _main_items(w, main_work(unit, timing, split), comms, unit, phase, alloc, free, extra.cuts)
    return items


def _kept_for_w(a: LayerAssignment, held: float) -> float:
    """What a split backward keeps from B to W: the inputs of the weight-gradient GEMMs. NB: approximated by
    the layer's selective-recompute activations (everything but the attention scores), at most what it held."""
    return min(held, a.layer.saved_bytes.get("selective", held))


def _main_items(w: StageWriter, works: tuple[Work, ...], comms: tuple[CommWork, ...], unit: Unit, phase: Phase,
                alloc: float, free: float, cuts: list[Cut]) -> list[TaskSpec | Callable[[], None]]:
    label = unit.label
    if not works:  # a layer-phase without compute (a layer without weight gradients, say)
        works = (Work(phase, 0.0),)
    calls: dict[int, list[Callable[[], None]]] = {}
    items: list[TaskSpec | Callable[[], None]] = []
    if cuts:
        works, positions = cut_works(works, [head for head, _ in cuts])
        for position, (_, callback) in zip(positions, cuts, strict=True):
            calls.setdefault(position, []).append(callback)
        items += calls.get(-1, ())
    after = [list(comms)] if len(works) == 1 else placements([work.site for work in works], comms)
    for i, work in enumerate(works):
        items.append(TaskSpec(unit.phase, f" {label} {work.name}", "compute", "compute", work.seconds, phase,
                              "compute", label, alloc_bytes=alloc if i == 0 else 0.0,
                              free_bytes=free if i == len(works) - 1 else 0.0))
        items += calls.get(i, ())
        items += [feature_comm_spec(w.ctx, w.stage, comm, layer=label) for comm in after[i]]
    items += calls.get(len(works), ())
    return items


def cut_works(works: tuple[Work, ...], heads: list[float]) -> tuple[tuple[Work, ...], list[int]]:
    """Split works at the given times from their start. Returns the works and, per head, where it falls: -1
    before the first work (head <= 0), i after work i, len(works) after the whole layer-phase, feature
    collectives included (head >= the total)."""
    total = sum(work.seconds for work in works)
    inner = sorted({h for h in heads if 0.0 < h < total})
    out: list[Work] = []
    elapsed, j = 0.0, 0
    for work in works:
        end = elapsed + work.seconds
        piece_start, piece = elapsed, 0
        while j < len(inner) and inner[j] < end:
            if inner[j] > piece_start:
                piece += 1
                out.append(Work(f"{work.name} part{piece}", inner[j] - piece_start, work.site))
                piece_start = inner[j]
            j += 1
        name = f"{work.name} part{piece + 1}" if piece else work.name
        out.append(Work(name, end - piece_start, work.site))
        elapsed = end
    positions: list[int] = []
    for head in heads:
        if head <= 0.0:
            positions.append(-1)
        elif head >= total:
            positions.append(len(out))
        else:
            cumulative, index = 0.0, len(out) - 1
            for i, work in enumerate(out):
                cumulative += work.seconds
                if cumulative >= head * (1.0 - 1e-12):
                    index = i
                    break
            positions.append(index)
    return tuple(out), positions
