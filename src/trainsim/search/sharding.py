"""Pick an embedding sharding by prediction (Lin et al. Sec. V-A): plan the tables with each sharder of Table III,
predict each plan's iteration time, rank them. A sharder whose plan cannot fit (no rank has room under the cap)
is counted, not dropped silently."""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import NO_HOST_COST, DenseHostCost
from trainsim.embedding.lookup_model import LookupCostModel
from trainsim.embedding.sharders import MEMORY_CAP_FRACTION, SHARDERS, shard
from trainsim.embedding.sharding import Optimizer, ShardingPlan
from trainsim.embedding.tables import tables_from_spec
from trainsim.errors import ConfigError, InfeasiblePlanError
from trainsim.estimate.result import Result
from trainsim.estimate.sharded_dlrm import estimate_sharded
from trainsim.frontends.catalog.sharded_dlrm import sharded_job
from trainsim.hardware.cluster import ClusterSpec
from trainsim.ir.model_spec import DlrmSpec


@dataclass(frozen=True, slots=True)
class SharderOutcome:
    sharder: str
    plan: ShardingPlan | None
    result: Result | None
    refused: str = ""  # why the sharder found no plan

    @property
    def iteration_time_s(self) -> float:
        return self.result.iteration_time_s if self.result is not None else float("inf")


@dataclass(frozen=True, slots=True)
class ShardingReport:
    model: str
    num_ranks: int
    local_batch: int
    engine: str
    cap_bytes: float
    outcomes: tuple[SharderOutcome, ...]
    selection_s: float  # wall time of planning and predicting every sharder
    notes: tuple[str, ...] = field(default=())

    @property
    def ranked(self) -> list[SharderOutcome]:
        feasible = [o for o in self.outcomes if o.result is not None and not o.result.oom]
        return sorted(feasible, key=lambda o: (o.iteration_time_s, o.sharder))

    @property
    def best(self) -> SharderOutcome | None:
        ranked = self.ranked
        return ranked[0] if ranked else None


def compare_sharders(model: DlrmSpec, cluster: ClusterSpec, num_ranks: int, local_batch: int, *,
                     engine: str = "analytical", sharders: Sequence[str] = SHARDERS, pricer: Pricer | None = None,
                     lookups: LookupCostModel | None = None, optimizer: Optimizer = "sgd",
                     cap_fraction: float = MEMORY_CAP_FRACTION, ranks_per_node: int = 0,
                     seed: int = 0, host: DenseHostCost = NO_HOST_COST) -> ShardingReport:
    if not 0.0 < cap_fraction <= 1.0:
        raise ConfigError("cap_fraction", cap_fraction, "must be in (0, 1]")
    if num_ranks < 1:
        raise ConfigError("num_ranks", num_ranks, "must be at least 1")
    tables = tables_from_spec(model.tables)
    cap = cap_fraction * cluster.device.hbm_bytes
    pricer = pricer or Pricer()
    started = time.perf_counter()
    outcomes = []
    for name in sharders:
        try:
            plan = shard(tables, name, num_ranks, cap_bytes=cap, optimizer=optimizer,
                         ranks_per_node=ranks_per_node or num_ranks, seed=seed)
        except InfeasiblePlanError as exc:
            outcomes.append(SharderOutcome(name, None, None, str(exc)))
            continue
        sjob = sharded_job(model, plan, cluster, local_batch, optimizer)
        result = estimate_sharded(sjob.job, sjob.graph, plan, engine, pricer, lookups, optimizer, host)
        outcomes.append(SharderOutcome(name, plan, result))
    return ShardingReport(model.name, num_ranks, local_batch, engine, cap, tuple(outcomes),
                          time.perf_counter() - started)
