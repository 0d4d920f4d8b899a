"""A DLRM job with sharded embedding tables: the plan's ranks as data-parallel ranks of the dense part (one node
of the cluster's device, or its nodes), and the catalog graph of one rank (the dense ops the engines price; the
embedding ops are priced per piece from the plan, estimate.sharded_dlrm)."""

from dataclasses import dataclass

from trainsim.embedding.sharding import Optimizer, ShardingPlan
from trainsim.errors import ConfigError
from trainsim.frontends.catalog.dlrm import build_dlrm
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.graph import OpGraph
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.job import Job, make_job
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision


@dataclass(frozen=True, slots=True)
class ShardedDlrmJob:
    model: DlrmSpec
    plan: ShardingPlan
    job: Job
    graph: OpGraph
    optimizer: Optimizer = "sgd"


def sharded_job(model: DlrmSpec, plan: ShardingPlan, cluster: ClusterSpec, local_batch: int,
                optimizer: Optimizer = "sgd", precision: Precision = "bf16") -> ShardedDlrmJob:
    """The job of `plan.num_ranks` ranks on one node of `cluster`'s device (or its nodes when it has several),
    `local_batch` samples per rank; the model's tables must be the plan's tables. precision: the dense part's
    (measure.dlrm's CPU runs train in fp32, torch's default)."""
    if local_batch < 1:
        raise ConfigError("local_batch", local_batch, "must be at least 1")
    planned = sorted((s.table.rows, s.table.dim) for s in plan.shards)
    held = sorted((t.rows, t.dim) for t in model.tables for _ in range(t.count))
    if planned != held:
        raise ConfigError("plan", plan.sharder, f"places {len(planned)} tables; the model {model.name} has "
                          f"{len(held)} with other shapes")
    ranks = plan.num_ranks
    per_node = min(plan.ranks_per_node, ranks)
    cluster = cluster.model_copy(update={"gpus_per_node": per_node, "num_nodes": ranks // per_node})
    job = make_job(model, cluster, ParallelSpec(dp=ranks, micro_batch=local_batch, seq_len=1,
                                                          precision=precision))
    graph = build_dlrm(model, DeviceSlice.of(job.parallel))
    return ShardedDlrmJob(model, plan, job, graph, optimizer)



def dlrm_model(name: str, tables: tuple[EmbeddingTable, ...], *, dense_features: int = 13,
               bottom_hidden: tuple[int, ...] = (128, 64), top_mlp: tuple[int, ...] = (128, 64, 1)) -> DlrmSpec:
    """A DLRM around `tables` (one dim for all: the bottom MLP ends at it, as the dot interaction needs)."""
    dims = {t.dim for t in tables}
    if len(dims) != 1:
        raise ConfigError("tables.dim", sorted(dims), "the dot interaction needs one dim for every table")
    return DlrmSpec(name=name, dense_features=dense_features, bottom_mlp=(*bottom_hidden, dims.pop()),
                    top_mlp=top_mlp, tables=tables)
