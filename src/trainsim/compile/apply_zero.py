"""Pass: ZeRO model states and ZeRO-3 / FSDP parameter gathers.

Model states (weights, gradients, Adam states) are resident for the whole iteration, sharded over the dp x cp
ranks by ZeRO stage (cost.memory.model_state_bytes).

ZeRO-3 / FSDP: every layer-phase that uses a layer's weights (forward; recompute + backward) needs them
all-gathered first, and every backward's gradients are reduce-scattered after it, on the gradient stream.
Prefetch is a window: while layer-phase k runs the last `fsdp_overlap` fraction of its compute, the gradient
stream gathers the weights of layer-phase k + 1 and reduce-scatters the gradients of layer-phase k - 1; the
next layer-phase waits for both. With fsdp_overlap = 1 the next gather is issued when the current layer's
compute starts (full prefetch); with 0 nothing overlaps. Per layer-phase this costs
max(0, gather + scatter - overlap x compute) beyond the compute, the analytical engine's formula
(cost.pricing.Pricer.fsdp_exposed_s), up to one layer-phase at the ends of the stage's work. NB: the window
also hides behind the layer-phase's own feature collectives, which follow its compute in the chain.
Memory: a gather allocates the layer's unsharded weights when it starts; the layer-phase that used them frees
them; a backward allocates the unsharded gradients, freed when their reduce-scatter ends.
"""

from dataclasses import dataclass

from trainsim.compile.context import BuildContext, StageWriter
from trainsim.cost.memory import model_state_bytes


def stage_model_state(ctx: BuildContext, stage: int) -> dict[str, float]:
    params = sum(ctx.held_params(a.index, a.layer.param_count) for a in ctx.plan.layers if a.stage == stage)
    states = model_state_bytes(params, ctx.par)
    states["runtime_reserved"] = ctx.job.cluster.device.runtime_reserved_bytes
    return states


def fsdp_enabled(ctx: BuildContext) -> bool:
    par = ctx.par
    return par.zero >= 3 and ctx.layout("grad").size > 1


@dataclass(frozen=True, slots=True)
class FsdpNeed:
    """One layer-phase's FSDP traffic: weights to gather before it, gradients to scatter after it."""

    label: str
    micro_batch: int
    gather_params: float
    scatter_params: float


class FsdpChain:
    """The gather / reduce-scatter tasks of one stage, issued by the layer-phases' windows."""

    __slots__ = ("ctx", "gathers", "main_end", "needs", "overlap", "resources", "scatters", "w")

    def __init__(self, ctx: BuildContext, w: StageWriter, needs: list[FsdpNeed]) -> None:
        self.ctx = ctx
        self.w = w
        self.needs = needs
        self.overlap = ctx.pricer.overlap("fsdp", ctx.job)
        self.resources = ctx.link_resources(ctx.layout("grad"), (w.stage,))
        self.gathers: dict[int, int] = {}  # layer-phase -> its gather tid
        self.scatters: dict[int, int] = {}  # layer-phase -> its reduce-scatter tid
        self.main_end: dict[int, int] = {}  # layer-phase -> its last compute tid

    def gathered_bytes(self, k: int) -> float:
        return self.needs[k].gather_params * self.ctx.policy.weight_bytes

    def grad_bytes(self, k: int) -> float:
        return self.needs[k].scatter_params * self.ctx.policy.grad_bytes

    def start(self) -> None:
        """The first layer-phase's gather: nothing before it to hide behind."""
        if self.needs:
            self._gather(0, ())

    def before(self, k: int) -> None:
        """Layer-phase k waits for its gather and for the scatter issued in the same window."""
        waits = [tid for tid in (self.gathers.get(k), self.scatters.get(k - 2)) if tid is not None]
        self.w.wait_for(*waits)

    def issue(self, k: int) -> None:
        """Layer-phase k's window opens (deps: the chain's current last task): scatter k - 1, gather k + 1."""
        deps = (self.w.prev,) if self.w.prev >= 0 else ()
        if k >= 1:
            self._scatter(k - 1, deps)
        if k + 1 < len(self.needs):
            self._gather(k + 1, deps)

    def finish(self) -> list[int]:
        """After the last layer-phase: its own scatter. Returns the scatters the optimizer must wait for."""
        last = len(self.needs) - 1
        if last < 0:
            return []
        self._scatter(last, (self.main_end[last],))
        return [tid for k, tid in self.scatters.items() if k >= last - 1]

    def _gather(self, k: int, deps: tuple[int, ...]) -> None:
        need = self.needs[k]
        if need.gather_params <= 0.0:
            return
        size = self.gathered_bytes(k)
        seconds = self.ctx.collective_s("all-gather", size, "grad")
        task = self.ctx.add(name=f"fsdp all-gather mb{need.micro_batch} {need.label}", device=self.w.stage,
                            stream="gradient", kind="comm", duration_s=seconds, deps=deps, phase="comm",
                            category="dp_comm", layer=need.label,
                            micro_batch=need.micro_batch, resources=self.resources, alloc_bytes=size)
        self.gathers[k] = task.tid

    def _scatter(self, k: int, deps: tuple[int, ...]) -> None:
        need = self.needs[k]
        if need.scatter_params <= 0.0:
            return
        size = self.grad_bytes(k)
        task = self.ctx.add(name=f"fsdp reduce-scatter mb{need.micro_batch} {need.label}", device=self.w.stage,
                            stream="gradient", kind="comm",
                            duration_s=self.ctx.collective_s("reduce-scatter", size, "grad"), deps=deps,
                            phase="comm", category="dp_comm", layer=need.label, micro_batch=need.micro_batch,
                            resources=self.resources, free_bytes=size, priority=1)
        self.scatters[k] = task.tid
