"""A DLRM's execution traces through Algorithm 1 (frontends.trace.dlrm_predicted + predicted): a hand-made 2-rank
trace with an EmbeddingBag forward, a synchronous all-to-all, the EmbeddingBag backward with its sparse update and
a dense op, predicted with known kernel times; exact start and end times by hand. Also the realignment after the
barrier and to_exec_graph's blocking waits on hand-made traces."""

import math
import random

import pytest

from trainsim.catalog import load_cluster
from trainsim.cost.embedding_lookup import RooflineLookup
from trainsim.cost.pricing import Pricer
from trainsim.cost.sharded_dlrm import price_sharded_iteration
from trainsim.embedding.lookup_model import LookupPhase
from trainsim.embedding.sharders import shard
from trainsim.embedding.sharding import ShardPiece
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError
from trainsim.estimate.sharded_dlrm import traced_result
from trainsim.estimate.trace_predict import iteration_s
from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
from trainsim.frontends.trace.dlrm_predicted import lookup_op_seconds, piece_from_op, realign_after_barrier
from trainsim.frontends.trace.predicted import KernelModels, deduct_profiler, predicted_trace_graph
from trainsim.frontends.trace.rank_trace import Collective, RankTrace, TensorRef, TraceOp
from trainsim.frontends.trace.to_exec_graph import _RankLowering, to_exec_graph
from trainsim.ir.model_spec import EmbeddingTable

MS = 1e-3


def _tensor(storage: int, *shape: int) -> TensorRef:
    return TensorRef(storage, storage, 0, math.prod(shape), 4, "cpu", "float32", shape)


def _op(node: int, name: str, start_ms: float, duration_ms: float, inputs: tuple[TensorRef, ...],
        parent: int = -1, role: str = "op", phase: str = "fwd") -> TraceOp:
    return TraceOp(node, name, role, parent, 1, node, -1, 0, inputs, (), phase,  # type: ignore[arg-type]
                   start_s=start_ms * MS, duration_s=duration_ms * MS)


def _rank(rank: int, rows: int, send: int, recv: int) -> RankTrace:
    """embedding_bag (weight storage 10, indices 11, offsets 12) -> all-to-all (send, recv floats) ->
    EmbeddingBagBackward0 (its kernel reads indices 11) -> the sparse add_ on weight 10 -> relu. Every op starts
    where the one before it ended (no host gaps)."""
    ops = [_op(1, "aten::embedding_bag", 0.0, 1.0, (_tensor(10, rows, 4), _tensor(11, 40), _tensor(12, 8))),
           _op(2, "c10d::alltoall_base_", 1.0, 1.0, (_tensor(20, recv), _tensor(21, send)), role="collective"),
           _op(3, "EmbeddingBagBackward0", 2.0, 1.0, (_tensor(30, 8, 4),), phase="bwd"),
           _op(4, "aten::_embedding_bag_backward", 2.0, 1.0, (_tensor(30, 8, 4), _tensor(11, 40), _tensor(12, 8)),
               parent=3, phase="bwd"),
           _op(5, "aten::add_", 3.0, 1.0, (_tensor(10, rows, 4), _tensor(0, rows, 4)), phase="bwd"),
           _op(6, "aten::relu", 4.0, 1.0, (_tensor(40, 8, 4),), phase="bwd")]
    ops[2].children.append(4)
    ops[1].collective = Collective("all-to-all", "0", 0, float(4 * max(send, recv)))
    return RankTrace(rank, f"rank{rank}", {op.node_id: op for op in ops}, {}, world_size=2)


class PerRowLookup:
    """A lookup model with known times: 1 us a row forward, 3 us a row backward (with the update)."""

    name = "per-row"

    def lookup_s(self, piece: ShardPiece, phase: LookupPhase) -> float:
        return piece.rows * (1e-6 if phase == "fwd" else 3e-6)


def _piece(rank: int, rows: int) -> ShardPiece:
    return ShardPiece(Table(rank, rows, 4, 5.0), "table-wise", rank, rows, 4, 16, 5.0)


TRACES = [_rank(0, 1000, send=2000, recv=1000), _rank(1, 2000, send=1000, recv=3000)]
PIECES = [[_piece(0, 1000)], [_piece(1, 2000)]]
RELU_S = 0.5 * MS
KERNELS = KernelModels({"aten::relu": (math.log(RELU_S), 0.0)}, fallback_s=7 * MS)


def _collective_s(kind: str, nbytes: float, ranks: int) -> float:
    assert (kind, ranks) == ("all-to-all", 2)
    return 1 * MS + nbytes * 1e-7  # rank 0: 8,000 bytes -> 1.8 ms; rank 1: 12,000 bytes -> 2.2 ms


def test_lookup_ops_take_the_lookup_model_and_the_sparse_update_nothing() -> None:
    seconds = lookup_op_seconds(TRACES, PerRowLookup(), PIECES)
    assert seconds == [{1: 1 * MS, 3: 3 * MS, 5: 0.0}, {1: 2 * MS, 3: 6 * MS, 5: 0.0}]
    # without a plan, the piece comes from the op's shapes: rows x dim, samples = offsets, L = indices / samples
    shaped = piece_from_op(TRACES[1].ops[1], 1)
    assert (shaped.rows, shaped.dim, shaped.samples, shaped.pooling) == (2000, 4, 8, 5.0)
    assert lookup_op_seconds(TRACES, PerRowLookup()) == seconds
    with pytest.raises(ConfigError, match="one piece per op"):
        lookup_op_seconds(TRACES, PerRowLookup(), [PIECES[0] * 2, PIECES[1]])


def test_lookups_take_turns_on_shared_cores_by_the_ranks_share() -> None:
    # 4 ranks on 2 cores: a rank has half a core, so each priced lookup lasts twice its uncontended price; the
    # sparse update stays at 0 s
    assert lookup_op_seconds(TRACES, PerRowLookup(), PIECES, core_share=0.5) == [
        {1: 2 * MS, 3: 6 * MS, 5: 0.0}, {1: 4 * MS, 3: 12 * MS, 5: 0.0}]
    for bad in (0.0, 1.5, -0.5):
        with pytest.raises(ConfigError, match="core_share"):
            lookup_op_seconds(TRACES, PerRowLookup(), PIECES, core_share=bad)


def test_predicted_dlrm_trace_has_exact_times() -> None:
    seconds = lookup_op_seconds(TRACES, PerRowLookup(), PIECES)
    graph = predicted_trace_graph(TRACES, KERNELS, {}, _collective_s, seconds)
    durations = {t.name: t.duration_s for t in graph.tasks if t.duration_s > 0.0}
    # the all-to-all: both ranks take the larger member's price (rank 1 receives 12,000 bytes)
    assert durations == pytest.approx({
        "r0:aten::embedding_bag#1": 1 * MS, "r0:c10d::alltoall_base_#2": 2.2 * MS,
        "r0:EmbeddingBagBackward0#3": 3 * MS, "r0:aten::relu#6": RELU_S,
        "r1:aten::embedding_bag#1": 2 * MS, "r1:c10d::alltoall_base_#2": 2.2 * MS,
        "r1:EmbeddingBagBackward0#3": 6 * MS, "r1:aten::relu#6": RELU_S}, rel=1e-12)
    # rank 0 waits at the all-to-all for rank 1's forward (2 ms), then 2.2 ms moving; rank 1: 6 + 0.5 after it
    assert iteration_s(graph) == pytest.approx((2 + 2.2 + 6 + 0.5) * MS, rel=1e-12)
    # without the lookup model every op takes its kernel model (the fallback for names never seen)
    plain = predicted_trace_graph(TRACES, KERNELS, {}, _collective_s)
    assert iteration_s(plain) == pytest.approx((7 + 2.2 + 7 + 7 + 0.5) * MS, rel=1e-12)


def test_profiler_cost_is_not_deducted_from_the_lookup_models_ops() -> None:
    seconds = lookup_op_seconds(TRACES, PerRowLookup(), PIECES)
    graph = predicted_trace_graph(TRACES, KERNELS, {}, _collective_s, seconds)
    deduct_profiler(graph, TRACES, 0.1 * MS, keep=seconds)
    durations = {t.name: t.duration_s for t in graph.tasks}
    assert durations["r1:EmbeddingBagBackward0#3"] == pytest.approx(6 * MS)  # kept
    assert durations["r1:aten::relu#6"] == pytest.approx(RELU_S - 0.1 * MS)  # one recorded op, its cost out


def test_traced_result_is_the_engines_result_of_the_simulated_trace() -> None:
    tables = tuple(EmbeddingTable(rows=r, dim=4, pooling_factor=5.0) for r in (1000, 2000))
    model = dlrm_model("hand", tables)
    cluster = load_cluster("local-cpu").with_num_gpus(2).on_one_node()
    plan = shard([Table(i, t.rows, t.dim, t.pooling_factor) for i, t in enumerate(tables)], "naive", 2,
                 cap_bytes=cluster.device.hbm_bytes)
    sjob = sharded_job(model, plan, cluster, 8, precision="fp32")
    it = price_sharded_iteration(sjob.graph, plan, sjob.job, Pricer(), RooflineLookup(cluster.device))
    seconds = lookup_op_seconds(TRACES, PerRowLookup(), PIECES)
    result = traced_result(sjob.job, sjob.graph, it, predicted_trace_graph(TRACES, KERNELS, {}, _collective_s,
                                                                           seconds))
    assert result.engine == "trace"
    assert result.iteration_time_s == pytest.approx((2 + 2.2 + 6 + 0.5) * MS, rel=1e-12)
    # the slowest rank (1): 8.5 ms of compute, the all-to-all's 2.2 ms as comm
    assert result.breakdown["compute"] == pytest.approx(8.5 * MS) and result.breakdown["optimizer"] == 0.0
    assert result.breakdown["comm"] == pytest.approx(2.2 * MS)
    assert result.peak_memory_bytes == max(m.total_bytes for m in it.memory)
    assert result.timeline is not None
    # ranks outnumbering the cores (compute_share 0.5) add no turns: the trace's durations were recorded with them
    device = cluster.device.replaced(compute_share=0.5)
    shared = sharded_job(model, plan, cluster.replaced(device=device), 8, precision="fp32")
    assert shared.job.cluster.device.compute_share == 0.5
    again = traced_result(shared.job, shared.graph, it, predicted_trace_graph(TRACES, KERNELS, {}, _collective_s,
                                                                             seconds))
    assert again.iteration_time_s == pytest.approx(result.iteration_time_s, rel=1e-12)
    assert "core_sharing" not in again.breakdown


def _async_collective(node: int, kind: str, start_ms: float, exec_start_ms: float, exec_ms: float) -> TraceOp:
    op = _op(node, f"c10d::{kind}", start_ms, 0.1, (), role="collective")
    op.collective = Collective(kind, "0", 0, 4.0, exec_node=99, exec_start_s=exec_start_ms * MS,
                               exec_duration_s=exec_ms * MS)
    return op


def test_realign_starts_the_step_where_the_rank_left_the_barrier() -> None:
    step = _op(0, "ProfilerStep#1", 0.0, 10.0, (), role="container")
    barrier = _async_collective(1, "barrier", 0.1, 0.15, 2.0)
    barrier.collective = Collective("barrier", "0", 0, 0.0, exec_node=99, exec_start_s=0.15 * MS,
                                    exec_duration_s=2.0 * MS)
    trace = RankTrace(0, "r0", {0: step, 1: barrier}, {}, step=0)
    realign_after_barrier([trace])
    assert trace.step_window_s() == pytest.approx((2.15 * MS, 10 * MS))
    untouched = RankTrace(0, "r0", {0: _op(0, "ProfilerStep#1", 0.0, 10.0, (), role="container")}, {}, step=0)
    realign_after_barrier([untouched])
    assert untouched.step_window_s() == pytest.approx((0.0, 10 * MS))


def test_blocking_waits_make_an_op_wait_for_a_collective_that_ended_before_it() -> None:
    """relu 0-1 ms; an all-to-all called at 1.0-1.1 ms whose execution ran 1.1-3.1 ms; detach 3.5-4.0 ms, which
    reads nothing the all-to-all wrote (gloo's wait is no op in the trace)."""
    ops = [_op(1, "aten::relu", 0.0, 1.0, ()), _async_collective(2, "alltoall_base_", 1.0, 1.1, 2.0),
           _op(3, "aten::detach", 3.5, 0.5, ())]
    trace = RankTrace(0, "r0", {op.node_id: op for op in ops}, {}, world_size=1)
    for blocking, gap_ms, waits_comm in ((False, 2.4, False), (True, 0.4, True)):
        graph = to_exec_graph([trace], start_offsets="zero", blocking_waits=blocking)
        comm = next(t.tid for t in graph.tasks if t.kind == "comm")
        gap = next(t for t in graph.tasks if t.name == "r0:host gap before aten::detach")
        assert gap.duration_s == pytest.approx(gap_ms * MS) and (comm in gap.deps) == waits_comm
        assert iteration_s(graph) == pytest.approx(4.0 * MS)


def _scan_blocked(self: _RankLowering, after_s: float, until_s: float) -> list[int]:
    """The scan blocked() replaced (every collective per op), kept as the oracle."""
    return [t for t, end in self.comm_end.items() if after_s < end <= until_s]


@pytest.mark.parametrize("seed", range(5))
def test_blocking_waits_bisect_as_the_scan_did(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A random trace of 300 ops, a third of them asynchronous collectives whose executions end out of order,
    on a clock of 1/1024 s steps (exact in binary, so that ends fall exactly on ops' starts and ends, the
    interval's two edges): the same tasks, durations and dependencies as the scan over every collective gave."""
    rng = random.Random(seed)
    tick_s = 1.0 / 1024
    ops: list[TraceOp] = []
    clock = 0
    for node in range(1, 301):
        clock += rng.choice((0, 1, 2))
        if rng.random() < 0.35:
            op = _async_collective(node, "allreduce_", 0.0, 0.0, 0.0)
            op.start_s, op.duration_s = clock * tick_s, tick_s
            assert op.collective is not None
            op.collective.exec_start_s = (clock + 1) * tick_s
            op.collective.exec_duration_s = rng.randint(1, 12) * tick_s
        else:
            op = _op(node, "aten::mm", 0.0, 0.0, ())
            op.start_s, op.duration_s = clock * tick_s, rng.randint(1, 3) * tick_s
            clock += rng.randint(1, 3)
        ops.append(op)
    trace = RankTrace(0, "r0", {op.node_id: op for op in ops}, {}, world_size=1)

    def tasks() -> list[tuple[str, float, tuple[int, ...], str]]:
        graph = to_exec_graph([trace], start_offsets="zero", blocking_waits=True)
        return [(t.name, t.duration_s, tuple(t.deps), t.stream) for t in graph.tasks]

    bisected = tasks()
    monkeypatch.setattr(_RankLowering, "blocked", _scan_blocked)
    scanned = tasks()
    assert bisected == scanned
    assert sum(len(deps) > 1 for _, _, deps, _ in bisected) > 10  # the waits were exercised
