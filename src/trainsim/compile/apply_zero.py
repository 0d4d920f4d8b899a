"""Pass: ZeRO model states and ZeRO-3 / FSDP parameter gathers.

Model states (weights, gradients, Adam states) are resident for the whole iteration, sharded over the dp x cp
ranks by ZeRO stage, an MoE's experts' over their expert data-parallel ranks (cost.memory.model_state_bytes).

ZeRO-3 / FSDP: every layer-phase that uses a layer's weights (forward; recompute + backward) needs them
all-gathered first, and every backward's gradients are reduce-scattered after it, on the gradient stream.
Prefetch (the stack's fsdp_prefetch_depth d >= 1): when layer-phase k's compute starts, the gradient stream
reduce-scatters the gradients of layer-phase k - 1 and gathers the weights of layer-phase k + d (the first d
are gathered at the start); the next layer-phase waits for its gather and for the scatter issued a window
before. Without prefetch (d = 0) the window opens when layer-phase k's compute ends: layer-phase k + 1's gather
is exposed, the reduce-scatter still runs beside the next compute. Per layer-phase, what does not fit under
the compute is exposed, as the analytical engine's Pricer.fsdp_exposed_s counts it, up to one layer-phase at
the ends of the stage's work. NB: the window also hides behind the layer-phase's own feature collectives,
which follow its compute in the chain.
Gradient buckets (the stack's fsdp_bucket_params > 0, with prefetch: DeepSpeed ZeRO-3's reduce_bucket_size):
a layer-phase's gradients wait in a bucket, reduce-scattered when it holds that many parameters or the
micro-batch's backward ends. The bucket's reduce-scatter queues on the gradient stream, behind and before the
gathers, and the compute does not wait for it: DeepSpeed (deepspeed/runtime/zero/stage3.py, 0.12.6) reduces on
a stream of its own (reduce_and_partition_stream, which waits for the compute stream, never the other way) and
synchronizes it only after each micro-batch's backward (independent_gradient_partition_epilogue): here the
layer-phase after the next waits for a bucket sent when the micro-batch changes. The analytical engine runs the
same stream layer by layer (Pricer.fsdp_bucketed_backward_s). NB: DeepSpeed's host also waits once more than
two buckets are in flight (max_param_reduce_events), not modeled: the stream is then the bottleneck anyway.
NB: DeepSpeed's all-gathers have a stream of their own and share the NIC with the reduce-scatters; here both
queue on the gradient stream, in the order issued.
Memory: a gather allocates the layer's unsharded weights when it starts; the layer-phase that used them frees
them; a backward allocates the unsharded gradients, freed when their reduce-scatter ends.
"""

from dataclasses import dataclass

from trainsim.compile.context import BuildContext, StageWriter
from trainsim.cost.memory import model_state_bytes


def stage_model_state(ctx: BuildContext, stage: int) -> dict[str, float]:
    """The stage's resident model states: its held parameters', the MoE experts' sharded over their expert
    data-parallel ranks (BuildContext.stage_expert_params)."""
    params = sum(ctx.held_params(a.index, a.layer.param_count) for a in ctx.plan.layers if a.stage == stage)
    states = model_state_bytes(params, ctx.par, ctx.stage_expert_params(stage))
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

    __slots__ = ("ahead", "bucket", "ctx", "gathers", "group", "main_end", "needs", "overlaps", "resources",
                 "scatters", "w", "waited")

    def __init__(self, ctx: BuildContext, w: StageWriter, needs: list[FsdpNeed]) -> None:
        self.ctx = ctx
        self.w = w
        self.needs = needs
        self.overlaps = ctx.job.cluster.device.comm_overlaps_compute
        self.ahead = max(1, ctx.job.stack.fsdp_prefetch_depth)  # layer-phases a window gathers ahead
        self.resources = ctx.link_resources(ctx.layout("grad"), (w.stage,))
        self.gathers: dict[int, int] = {}  # layer-phase -> its gather tid
        self.scatters: dict[int, int] = {}  # layer-phase -> its reduce-scatter tid
        self.main_end: dict[int, int] = {}  # layer-phase -> its last compute tid
        # fsdp_bucket_params > 0 (prefetching): gradients wait in a bucket until it holds that many parameters
        # or the micro-batch's backward ends (DeepSpeed ZeRO-3's reduce_bucket_size), then reduce-scatter at once
        self.bucket = ctx.job.stack.fsdp_bucket_params if ctx.job.stack.fsdp_prefetch_depth > 0 else 0.0
        self.group: list[int] = []  # layer-phases whose gradients wait in the bucket
        self.waited: set[int] = set()  # bucketed reduce-scatters a layer-phase waits for: those of a micro-batch's end

    def gathered_bytes(self, k: int) -> float:
        return self.needs[k].gather_params * self.ctx.policy.weight_bytes

    def grad_bytes(self, k: int) -> float:
        return self.needs[k].scatter_params * self.ctx.policy.grad_bytes

    def start(self) -> None:
        """The first layer-phases' gathers (as many as the prefetch runs ahead): nothing before them to hide
        behind."""
        for k in range(min(self.ahead, len(self.needs))):
            self._gather(k, ())

    def before(self, k: int) -> None:
        """Layer-phase k waits for its gather and for the scatter issued in the same window (with buckets, only
        for the bucket that ends a micro-batch's backward)."""
        scatter = self.scatters.get(k - 2)
        if scatter is not None and self.bucket > 0.0 and scatter not in self.waited:
            scatter = None
        self.w.wait_for(*[tid for tid in (self.gathers.get(k), scatter) if tid is not None])

    def issue(self, k: int) -> None:
        """Layer-phase k's window opens (deps: the chain's current last task): scatter k - 1, gather k + ahead."""
        deps = (self.w.prev,) if self.w.prev >= 0 else ()
        if k >= 1:
            self._bucket(k - 1, deps, flush=self.needs[k].micro_batch != self.needs[k - 1].micro_batch)
        if k + self.ahead < len(self.needs):
            self._gather(k + self.ahead, deps)

    def finish(self) -> list[int]:
        """After the last layer-phase: its own scatter. Returns the scatters the optimizer must wait for."""
        last = len(self.needs) - 1
        if last < 0:
            return []
        self._bucket(last, (self.main_end[last],), flush=True)
        return list(dict.fromkeys(tid for k, tid in self.scatters.items() if k >= last - 1))

    def _bucket(self, k: int, deps: tuple[int, ...], flush: bool) -> None:
        """Layer-phase k's gradients: reduce-scattered now, or into the bucket (sent when full or flushed)."""
        if self.bucket <= 0.0:
            self._scatter(k, deps)
            return
        if self.needs[k].scatter_params > 0.0:
            self.group.append(k)
        params = sum(self.needs[i].scatter_params for i in self.group)
        if self.group and (flush or params >= self.bucket):
            self._scatter_group(self.group, deps)
            if flush:
                self.waited.add(self.scatters[self.group[-1]])
            self.group = []

    def _gather(self, k: int, deps: tuple[int, ...]) -> None:
        need = self.needs[k]
        if need.gather_params <= 0.0:
            return
        size = self.gathered_bytes(k)
        seconds = self.ctx.collective_s("all-gather", size, "grad")
        tid = self.ctx.add(name=f"fsdp all-gather mb{need.micro_batch} {need.label}", device=self.w.stage,
                            stream="gradient", kind="comm", duration_s=seconds, deps=deps, phase="comm",
                            category="dp_comm", layer=need.label,
                            micro_batch=need.micro_batch, resources=self.resources, alloc_bytes=size)
        self.gathers[k] = tid

    def _scatter(self, k: int, deps: tuple[int, ...]) -> None:
        if self.needs[k].scatter_params > 0.0:
            self._scatter_group([k], deps)

    def _scatter_group(self, group: list[int], deps: tuple[int, ...]) -> None:
        need = self.needs[group[-1]]
        size = sum(self.grad_bytes(k) for k in group)
        label = need.label if len(group) == 1 else f"{self.needs[group[0]].label}..{need.label}"
        tid = self.ctx.add(name=f"fsdp reduce-scatter mb{need.micro_batch} {label}", device=self.w.stage,
                            stream="gradient", kind="comm",
                            duration_s=self.ctx.collective_s("reduce-scatter", size, "grad"), deps=deps,
                            phase="comm", category="dp_comm", layer=need.label, micro_batch=need.micro_batch,
                            resources=self.resources, free_bytes=size, priority=1)
        for k in group:
            self.scatters[k] = tid
