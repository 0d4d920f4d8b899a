"""Lower a priced sharded-DLRM iteration to an ExecGraph: one simulated device per rank (ranks differ: each holds
its own tables), three streams, collectives synchronized across ranks by sync_key.

Per rank, in program order (torchrec's TrainPipelineBase order, torchrec 0.8, without pipelining):
  feature stream:  index all-to-all -> pooled all-to-all (fwd) -> pooled-gradient all-to-all (bwd)
  compute stream:  bottom MLP fwd -> lookups fwd -> interaction + top MLP fwd -> their bwd -> bottom MLP bwd
                   -> lookups bwd (fused update) -> dense optimizer step
  gradient stream: all-reduce of the dense gradients (after the bottom MLP's backward)
The bottom MLP runs while the indices travel; the lookups wait for the indices; the interaction waits for the
pooled embeddings of every rank (inter-rank synchronization, Lin et al. Sec. III-D); the lookups' backward waits
for the gradients of the pooled embeddings, the optimizer step for the all-reduce.
"""

import math

from trainsim.cost.sharded_dlrm import ShardedIteration
from trainsim.ir.exec_graph import ExecGraph, SimDevice

INDEX_A2A, POOLED_FWD_A2A, POOLED_BWD_A2A, GRAD_ALLREDUCE = ("index-a2a", "pooled-a2a-fwd", "pooled-a2a-bwd",
                                                            "grad-allreduce")


def lower_sharded_iteration(iteration: ShardedIteration) -> ExecGraph:
    devices = [SimDevice(index=r, stage=0, ranks=1, capacity_bytes=iteration.capacity_bytes,
                         static_bytes=m.total_bytes, static_breakdown=m.breakdown())
               for r, m in enumerate(iteration.memory)]
    graph = ExecGraph(devices=devices, tasks=[])
    for rank, work in enumerate(iteration.ranks):
        def compute(name: str, seconds: float, deps: tuple[int, ...], phase: str = "fwd",
                    category: str = "compute", rank: int = rank) -> int:
            return graph.add(name=f"r{rank}:{name}", device=rank, stream="compute", kind="compute",
                             duration_s=seconds, deps=deps, phase=phase, category=category,
                             layer=name.split(" ")[0]).tid

        def comm(name: str, seconds: float, deps: tuple[int, ...], stream: str = "feature",
                 rank: int = rank) -> int:
            return graph.add(name=f"r{rank}:{name}", device=rank, stream=stream, kind="comm", duration_s=seconds,
                             deps=deps, sync_key=name, phase="comm",
                             category="dp_comm" if stream == "gradient" else "comm").tid

        index = comm(INDEX_A2A, iteration.index_a2a_s, ())
        bottom = compute("bottom_mlp fwd", work.bottom_fwd_s, ())
        lookup = compute("embeddings fwd", work.lookup_fwd_s, (index, bottom))
        pooled = comm(POOLED_FWD_A2A, iteration.pooled_fwd_a2a_s, (lookup,))
        top = compute("top_mlp fwd", work.top_fwd_s, (pooled, lookup))
        top_bwd = compute("top_mlp bwd", work.top_bwd_s, (top,), "bwd")
        grads = comm(POOLED_BWD_A2A, iteration.pooled_bwd_a2a_s, (top_bwd,))
        bottom_bwd = compute("bottom_mlp bwd", work.bottom_bwd_s, (top_bwd,), "bwd")
        reduce = comm(GRAD_ALLREDUCE, iteration.grad_allreduce_s, (bottom_bwd,), "gradient")
        lookup_bwd = compute("embeddings bwd", work.lookup_bwd_s, (grads, bottom_bwd), "bwd")
        compute("optimizer step", work.optimizer_s, (reduce, lookup_bwd), "optimizer", "optimizer")
    return graph


def closed_form_ends_s(iteration: ShardedIteration) -> list[float]:
    """Each rank's end of iteration by the same dependencies as the ExecGraph, in closed form (every collective
    starts when its last rank is ready and ends together; streams do not slow each other)."""
    works = iteration.ranks
    if not works:
        return []
    index_end = iteration.index_a2a_s
    lookup_end = [max(w.bottom_fwd_s, index_end) + w.lookup_fwd_s for w in works]
    pooled_end = max(lookup_end) + iteration.pooled_fwd_a2a_s
    top_bwd_end = [pooled_end + w.top_fwd_s + w.top_bwd_s for w in works]
    grads_end = max(top_bwd_end) + iteration.pooled_bwd_a2a_s
    bottom_bwd_end = [t + w.bottom_bwd_s for t, w in zip(top_bwd_end, works, strict=True)]
    reduce_end = max(bottom_bwd_end) + iteration.grad_allreduce_s
    return [max(reduce_end, max(grads_end, b) + w.lookup_bwd_s) + w.optimizer_s
            for b, w in zip(bottom_bwd_end, works, strict=True)]


def rank_compute_s(iteration: ShardedIteration, rank: int) -> float:
    w = iteration.ranks[rank]
    return math.fsum((w.bottom_fwd_s, w.lookup_fwd_s, w.top_fwd_s, w.top_bwd_s, w.bottom_bwd_s, w.lookup_bwd_s))
