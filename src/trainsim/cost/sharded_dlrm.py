"""Prices of one iteration of a DLRM whose embedding tables are sharded across ranks (model-parallel) while its
dense MLPs and interaction are data-parallel (Naumov et al. 2019 Sec. 4; Lin et al. Sec. III-B, Fig. 2).

Per rank: the bottom MLP, the lookups of the pieces it holds (forward; backward with the fused sparse update),
the interaction and top MLP with the loss, their backward, the dense optimizer step. Shared by all ranks: the
index all-to-all, the pooled-embedding all-to-all forward and backward, the all-reduce of the dense gradients
(and of data-parallel tables' gradients). Per-rank memory: the table pieces with their optimizer state, the
dense model states, the activations and communication buffers, the runtime.

The dense ops come from the catalog DLRM builder (frontends.catalog.dlrm) on b samples per rank and are priced by
the Pricer like any op; the lookups by a LookupCostModel; the collectives by the Pricer's CommCostModel, with an
all-to-all's buffer taken as the largest amount any rank sends or receives (Lin et al. Sec. III-C) scaled to
the alpha-beta convention (a rank moves (n-1)/n of the buffer).
"""

from dataclasses import dataclass

from trainsim.cost.pricing import Pricer
from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.embedding.sharding import Optimizer, ShardingPlan, message_bytes
from trainsim.embedding.tables import WEIGHT_BYTES
from trainsim.errors import ConfigError
from trainsim.ir.graph import Layer, OpGraph
from trainsim.job import Job

# SGD on the dense weights: read weight and gradient, write weight (fp32).
_SGD_BYTES_PER_PARAM = 3 * WEIGHT_BYTES
MAX_KERNEL_SCALE = 100.0  # a bound on the fitted in-situ factor, so a broken fit is refused, not used
_DENSE_STATE = {"sgd": 0, "rowwise-adagrad": 1, "adagrad": 1, "adam": 2}  # fp32 values per dense parameter


@dataclass(frozen=True, slots=True)
class DenseHostCost:
    """What the dense part's spans take in an iteration beyond its ops' kernel prices (their microbenchmarks):
    the CPU-side overheads of Lin et al.'s Algorithm 1 (Sec. III-D, T1-T5, aggregated from collected traces) for
    the data-parallel MLPs and interaction. Per op of the forward (the module call and autograd's recording), per
    op of the backward (autograd's dispatch of each gradient op), per tensor of the dense optimizer step (a Python
    loop over the parameters, measure.dlrm_rank's SGD); and per phase a factor on the kernels' price, the in-situ
    kernels against their microbenchmarks (other work evicted the caches the benchmarks had, the allocator).
    Fitted from measured traces by calibrate.dense_host; the default prices nothing extra."""

    fwd_op_s: float = 0.0
    bwd_op_s: float = 0.0
    step_tensor_s: float = 0.0
    fwd_kernel_scale: float = 1.0
    bwd_kernel_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("fwd_op_s", "bwd_op_s", "step_tensor_s"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:  # NB: also refuses NaN
                raise ConfigError(f"dense_host.{name}", value, "must be in [0, 1) seconds")
        for name in ("fwd_kernel_scale", "bwd_kernel_scale"):
            value = getattr(self, name)
            if not 0.0 < value <= MAX_KERNEL_SCALE:
                raise ConfigError(f"dense_host.{name}", value, f"must be in (0, {MAX_KERNEL_SCALE:g}]")


NO_HOST_COST = DenseHostCost()


@dataclass(frozen=True, slots=True)
class DenseOpCounts:
    """What DenseHostCost is charged per: the ops of each dense span of an iteration (as the graph lists them)
    and the tensors of the dense optimizer step."""

    bottom_fwd: int
    top_fwd: int  # interaction + top MLP + loss
    top_bwd: int
    bottom_bwd: int
    step_tensors: int  # weight and bias of every linear layer, and every data-parallel table

    def host_s(self, host: DenseHostCost) -> tuple[float, float, float, float, float]:
        """Seconds added to bottom fwd, top fwd, top bwd, bottom bwd and the optimizer step."""
        return (self.bottom_fwd * host.fwd_op_s, self.top_fwd * host.fwd_op_s, self.top_bwd * host.bwd_op_s,
                self.bottom_bwd * host.bwd_op_s, self.step_tensors * host.step_tensor_s)


def dense_op_counts(graph: OpGraph, plan: ShardingPlan) -> DenseOpCounts:
    bottom, inter, top = (_layer(graph, n) for n in ("bottom_mlp", "interaction", "top_mlp"))
    linears = sum(op.kind == "matmul" for op in bottom.fwd + top.fwd)
    tables = sum(s.kind == "data-parallel" for s in plan.shards)
    return DenseOpCounts(len(bottom.fwd), len(inter.fwd + top.fwd), len(top.bwd + inter.bwd), len(bottom.bwd),
                         2 * linears + tables)


@dataclass(frozen=True, slots=True)
class RankWork:
    """Seconds of one rank's compute in one iteration, in program order."""

    bottom_fwd_s: float
    lookup_fwd_s: float
    top_fwd_s: float  # interaction + top MLP + loss
    top_bwd_s: float
    bottom_bwd_s: float
    lookup_bwd_s: float  # backward with the fused sparse update
    optimizer_s: float  # dense optimizer step


@dataclass(frozen=True, slots=True)
class RankMemory:
    tables_bytes: float
    dense_bytes: float
    activation_bytes: float
    runtime_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.tables_bytes + self.dense_bytes + self.activation_bytes + self.runtime_bytes

    def breakdown(self) -> dict[str, float]:
        return {"weights": self.tables_bytes + self.dense_bytes, "activations": self.activation_bytes,
                "runtime_reserved": self.runtime_bytes}


@dataclass(frozen=True, slots=True)
class ShardedIteration:
    plan: ShardingPlan
    local_batch: int
    ranks: tuple[RankWork, ...]
    memory: tuple[RankMemory, ...]
    index_a2a_s: float
    pooled_fwd_a2a_s: float
    pooled_bwd_a2a_s: float
    grad_allreduce_s: float
    capacity_bytes: float

    @property
    def oom_ranks(self) -> list[int]:
        return [r for r, m in enumerate(self.memory) if m.total_bytes > self.capacity_bytes]


def _layer(graph: OpGraph, name: str) -> Layer:
    return next(layer for layer in graph.layers if layer.name == name)


def price_sharded_iteration(graph: OpGraph, plan: ShardingPlan, job: Job, pricer: Pricer,
                            lookups: LookupCostModel, optimizer: Optimizer = "sgd",
                            host: DenseHostCost = NO_HOST_COST) -> ShardedIteration:
    """graph: the catalog DLRM graph of one rank (job.parallel.micro_batch samples); job: dp = the plan's ranks;
    host: the dense part's host cost per op and per optimizer tensor, added to its kernels' prices (scaled by
    its in-situ factors)."""
    ranks, batch = plan.num_ranks, job.parallel.micro_batch
    if job.num_gpus != ranks:
        raise ConfigError("num_gpus", job.num_gpus, f"must equal the sharding plan's ranks ({ranks})")
    bottom, inter, top = (_layer(graph, n) for n in ("bottom_mlp", "interaction", "top_mlp"))
    extra = dense_op_counts(graph, plan).host_s(host)
    fwd, bwd = host.fwd_kernel_scale, host.bwd_kernel_scale
    bottom_fwd = pricer.ops_time_s(bottom.fwd, job) * fwd + extra[0]
    top_fwd = pricer.ops_time_s(inter.fwd + top.fwd, job) * fwd + extra[1]
    top_bwd = pricer.ops_time_s(top.bwd + inter.bwd, job) * bwd + extra[2]
    bottom_bwd = pricer.ops_time_s(bottom.bwd, job) * bwd + extra[3]
    dense_params = bottom.param_count + top.param_count
    step = dense_params * _SGD_BYTES_PER_PARAM / job.cluster.device.hbm_bw_bytes_per_s + extra[4]
    pieces = plan.pieces(batch)
    works = tuple(RankWork(bottom_fwd, sum(lookups.lookup_s(p, "fwd") for p in rank_pieces), top_fwd, top_bwd,
                           bottom_bwd, sum(lookups.lookup_s(p, "bwd") for p in rank_pieces), step)
                  for rank_pieces in pieces)
    layout = job.cluster.group_layout(ranks, 1)
    scale = ranks / (ranks - 1) if ranks > 1 else 1.0

    def a2a(message: float) -> float:
        return pricer.collective_s("all-to-all", message * scale, layout, job)

    pooled = message_bytes(plan.pooled_bytes(batch))
    gradients = dense_params * WEIGHT_BYTES + plan.dense_table_gradient_bytes()
    memory = _memory(plan, pieces, graph, job, optimizer, dense_params)
    return ShardedIteration(plan, batch, works, memory, a2a(message_bytes(plan.index_bytes(batch))), a2a(pooled),
                            a2a(pooled), pricer.collective_s("all-reduce", gradients, layout, job),
                            job.cluster.device.hbm_bytes)


def _memory(plan: ShardingPlan, pieces: list, graph: OpGraph, job: Job, optimizer: Optimizer,
            dense_params: float) -> tuple[RankMemory, ...]:
    batch = job.parallel.micro_batch
    tables = plan.table_bytes(optimizer)
    dense = dense_params * WEIGHT_BYTES * (2 + _DENSE_STATE[optimizer])  # weights, gradients, state
    saved = sum(layer.saved_bytes.get("none", 0.0) for layer in graph.layers if layer.name != "embeddings")
    received = batch * sum(s.table.dim for s in plan.shards if s.kind != "data-parallel") * WEIGHT_BYTES
    out = []
    for rank, rank_pieces in enumerate(pieces):
        # Pooled outputs of the rank's pieces and what it receives, each with its gradient.
        produced = sum(p.samples * p.dim for p in rank_pieces) * WEIGHT_BYTES
        out.append(RankMemory(tables[rank], dense, saved + 2.0 * (produced + received),
                              job.cluster.device.runtime_reserved_bytes))
    return tuple(out)
