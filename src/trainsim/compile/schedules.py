"""Pipeline schedules: the order in which each pipeline stage runs its micro-batches' passes.

A schedule is a pure function (stages p, model chunks v, micro-batches m) -> one ordered list of Steps per
stage. A Step is (phase, micro_batch, chunk): phase "F" (forward), "B" (backward; the whole backward pass,
or only the input-gradient half when the schedule has "W" steps), "W" (weight-gradient half, zero-bubble
schedules). chunk is the model chunk (virtual stage) on that rank, 0 .. v - 1; virtual stage
chunk * p + stage holds the chunk, as Megatron-LM places it.
"""

from collections.abc import Callable
from typing import Literal, NamedTuple

from trainsim.errors import ConfigError
from trainsim.registry import Registry

StepPhase = Literal["F", "B", "W"]


class Step(NamedTuple):
    phase: StepPhase
    micro_batch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.phase}{self.micro_batch}" + (f".{self.chunk}" if self.chunk else "")


ScheduleFn = Callable[[int, int, int], list[list[Step]]]
SCHEDULES: Registry[ScheduleFn] = Registry("schedule")


def _check(name: str, stages: int, chunks: int, micro_batches: int, chunked: bool = False) -> None:
    if stages < 1 or micro_batches < 1 or chunks < 1:
        raise ConfigError(f"{name} schedule", (stages, chunks, micro_batches),
                          "needs at least one stage, one model chunk and one micro-batch")
    if not chunked and chunks != 1:
        raise ConfigError("vpp", chunks, f"the {name} schedule runs one model chunk per stage (vpp=1)")


@SCHEDULES.register("gpipe")
def gpipe(stages: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """GPipe (Huang et al. 2019): every forward, then every backward, in micro-batch order."""
    _check("gpipe", stages, chunks, micro_batches)
    order = [Step("F", mb, 0) for mb in range(micro_batches)] + [Step("B", mb, 0) for mb in range(micro_batches)]
    return [list(order) for _ in range(stages)]


@SCHEDULES.register("1f1b")
def one_f_one_b(stages: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021, sec. 2.2.1): stage s runs p - s - 1 warm-up forwards,
    then alternates one forward and one backward, then drains the remaining backwards."""
    _check("1f1b", stages, chunks, micro_batches)
    orders = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        order = [Step("F", mb, 0) for mb in range(warmup)]
        for i in range(micro_batches - warmup):
            order += [Step("F", warmup + i, 0), Step("B", i, 0)]
        order += [Step("B", mb, 0) for mb in range(micro_batches - warmup, micro_batches)]
        orders.append(order)
    return orders


def _interleaved_step(phase: StepPhase, k: int, stages: int, chunks: int) -> Step:
    """The k-th forward (or backward) of a rank: Megatron-LM's get_model_chunk_id and
    get_microbatch_id_in_model_chunk. Micro-batches go in groups of p through chunk 0, 1, ..., v - 1
    (backward: v - 1, ..., 0)."""
    group, position = divmod(k, stages * chunks)
    chunk = position // stages
    if phase == "B":
        chunk = chunks - 1 - chunk
    return Step(phase, group * stages + k % stages, chunk)


@SCHEDULES.register("interleaved-1f1b")
def interleaved_one_f_one_b(stages: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2) in Megatron-LM's order
    (forward_backward_pipelining_with_interleaving): rank r warms up with 2(p - r - 1) + (v - 1)p forwards
    (all of them when m = p), then alternates forward k + warm-up and backward k, then drains."""
    _check("interleaved-1f1b", stages, chunks, micro_batches, chunked=True)
    if micro_batches % stages:
        raise ConfigError("num_micro_batches", micro_batches,
                          f"interleaved-1f1b needs a multiple of pp={stages} micro-batches")
    total = micro_batches * chunks
    # NB: the k-th forward and backward are the same steps on every rank; only the warm-up differs
    forwards = [_interleaved_step("F", k, stages, chunks) for k in range(total)]
    backwards = [_interleaved_step("B", k, stages, chunks) for k in range(total)]
    orders = []
    for rank in range(stages):
        if micro_batches == stages:
            warmup = total
        else:
            warmup = min(2 * (stages - rank - 1) + (chunks - 1) * stages, total)
        steady = forwards[:1] * (2 * (total - warmup))  # forward k + warm-up, then backward k
        steady[0::2] = forwards[warmup:]
        steady[1::2] = backwards[:total - warmup]
        orders.append(forwards[:warmup] + steady + backwards[total - warmup:])
    return orders


@SCHEDULES.register("zb-h1")
def zero_bubble_h1(stages: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", sec. 3.1, Fig. 3 top): the backward is split
    into B (input gradient, on the critical path) and W (weight gradient, free to move). The order follows
    1F1B with W after B, except that stage s defers its W passes by s micro-batches; the deferred W passes
    fill the cool-down bubble. Every stage then holds p micro-batches in flight (F done, W not), the first
    stage's 1F1B peak, and the bubble shrinks from (p - 1)(F + B + W) to about (p - 1)(F + B - W)."""
    _check("zb-h1", stages, chunks, micro_batches)
    orders = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        delay = min(stage, micro_batches)
        order = [Step("F", mb, 0) for mb in range(warmup)]
        for i in range(micro_batches):
            if warmup + i < micro_batches:
                order.append(Step("F", warmup + i, 0))
            order.append(Step("B", i, 0))
            if i >= delay:
                order.append(Step("W", i - delay, 0))
        order += [Step("W", mb, 0) for mb in range(micro_batches - delay, micro_batches)]
        orders.append(order)
    return orders


def schedule_order(name: str, stages: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """The per-stage step lists of the schedule registered as `name` (unknown names list the choices)."""
    return SCHEDULES.get(name)(stages, chunks, micro_batches)


def splits_backward(name: str) -> bool:
    """Whether the schedule runs the weight-gradient half of the backward as separate W steps."""
    return name == "zb-h1"


def format_order(order: list[Step]) -> str:
    """'F0 F1 B0 F2 ...' (chunk shown as F0.1 when > 0): for golden tests and --explain."""
    return " ".join(str(step) for step in order)
