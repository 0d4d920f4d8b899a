"""measure.dlrm with trace_dir: one more iteration per config recorded as each rank's PyTorch execution trace and
Kineto trace, in the form the trace front-end reads; every EmbeddingBag op of the real traces found by
frontends.trace.dlrm_predicted (one forward per piece, one backward per piece, the sparse updates), and the
predicted trace simulated to the engines' Result."""

import math
from pathlib import Path

from trainsim.catalog import load_cluster
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import price_sharded_iteration
from trainsim.embedding.plan_file import plan_from_mapping
from trainsim.embedding.tables import Table
from trainsim.estimate.sharded_dlrm import traced_result
from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
from trainsim.frontends.trace.dlrm_predicted import LOOKUP_BWD, LOOKUP_FWD, lookup_op_seconds
from trainsim.frontends.trace.load import load_trace_directory
from trainsim.frontends.trace.predicted import KernelModels, op_samples, predicted_trace_graph
from trainsim.ir.model_spec import EmbeddingTable
from trainsim.measure.dlrm import DlrmConfig, measure_dlrm

TABLES = (Table(0, 200, 8, 3.0, 1.0), Table(1, 100, 8, 25.0), Table(2, 300, 8, 2.0), Table(3, 50, 8, 1.0))
EVERY_KIND = {"sharding": [{"table": 0, "kind": "table-wise", "ranks": [1]},
                           {"table": 1, "kind": "column-wise", "ranks": [0, 1]},
                           {"table": 2, "kind": "row-wise"}, {"table": 3, "kind": "data-parallel"}]}
DENSE = {"dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1]}


def test_traced_dlrm_iteration_goes_through_the_trace_front_end(tmp_path: Path) -> None:
    plan = plan_from_mapping(EVERY_KIND, TABLES, 2, 2)
    folder = tmp_path / "traces"
    measured = measure_dlrm([DlrmConfig("tiny", plan, 4, DENSE, trace_dir=str(folder))], iterations=2, warmup=1,
                            timeout_s=300)[0]
    assert len(measured.iterations_s) == 2 and len(measured.rank_traced_s) == 2
    assert all(len(rank) == 1 and rank[0] > 0 for rank in measured.rank_traced_s)
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank0.et.json.gz", "rank0.kineto.json.gz", "rank1.et.json.gz", "rank1.kineto.json.gz"]
    traces = load_trace_directory(folder)
    pieces = plan.pieces(4)
    seconds = lookup_op_seconds(traces, RooflineLookup(load_cluster("local-cpu").device), pieces)
    for trace, mine, priced in zip(traces, pieces, seconds, strict=True):
        top = trace.top_level()
        assert sum(op.name == LOOKUP_FWD for op in top) == sum(op.name == LOOKUP_BWD for op in top) == len(mine)
        # every forward and backward priced; each piece's sparse gradient accumulated at 0 s, and each sharded
        # piece's sparse update (a data-parallel bag is updated densely in the step, not as a lookup)
        sharded = sum(p.kind != "data-parallel" for p in mine)
        assert len(priced) == 3 * len(mine) + sharded
        assert sum(v == 0.0 for v in priced.values()) == len(mine) + sharded
        kinds = {op.collective.kind for op in trace.collectives() if op.collective is not None}
        assert {"all-to-all", "all-reduce", "barrier"} <= kinds
    model = dlrm_model("tiny", tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling)
                                     for t in TABLES), dense_features=4, bottom_hidden=(16,), top_mlp=(16, 1))
    cluster = load_cluster("local-cpu").with_num_gpus(2).on_one_node()
    sjob = sharded_job(model, plan, cluster, 4, precision="fp32")
    it = price_sharded_iteration(sjob.graph, plan, sjob.job, Pricer(), RooflineLookup(cluster.device))
    graph = predicted_trace_graph(traces, KernelModels.fit(op_samples(traces)), {},
                                  lambda kind, nbytes, ranks: 1e-4, seconds)
    result = traced_result(sjob.job, sjob.graph, it, graph)
    assert 0.0 < result.iteration_time_s < math.inf and result.engine == "trace"
