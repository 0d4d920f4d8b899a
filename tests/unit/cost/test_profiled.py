"""ProfiledCosts: exact answers, log-log interpolation inside the measured range, scaled from the nearest
measured size outside it (by the fallback's ratio), the roofline for kernels never measured, counted by source;
make_engine wires it into the analytical engine. No torch: the database is filled by hand."""

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROFILE_ENV, TINY_GPT, ConstantCosts, local_cluster
from trainsim.catalog import load_cluster
from trainsim.catalog.calibration import load_calibration
from trainsim.catalog.model_files import parse_model
from trainsim.cost.profiled import ProfiledCosts
from trainsim.errors import ConfigError
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import make_engine
from trainsim.ir.graph import Op
from trainsim.job import make_job
from trainsim.pipeline import graph_for
from trainsim.profile.database import Environment, OpSignature, ProfileDB
from trainsim.profile.job import job_graph
from trainsim.profile.ops import optimizer_signature, overhead_signature, signature_of, unique_signatures
from trainsim.strategy.device_slice import DeviceSlice
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import policy_for

DEVICE = load_cluster("local-cpu").device


def _mm(m: int) -> Op:
    return Op("fc1", "matmul", "blocks.block.mlp.fc1", "fwd", "fp32", 2.0 * m * 64 * 32, 0.0, (1, m, 64, 32))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        for m, seconds in ((16, 1e-3), (256, 4e-3)):
            sig = signature_of(_mm(m))
            assert sig is not None
            db.add_op_samples(PROFILE_ENV, sig, [seconds])
    return path


class AffineCosts:
    """A fallback whose op time is a launch cost plus FLOPs at a rate: the shape a roofline gives a curve."""

    name = "affine"

    def __init__(self, launch_s: float, flops_per_s: float) -> None:
        self.launch_s, self.flops_per_s = launch_s, flops_per_s

    def op_time_s(self, op: Op, device: object) -> float:
        return self.launch_s + op.flops / self.flops_per_s


def test_exact_interpolated_scaled_and_fallback_answers_are_counted(db_path: Path) -> None:
    fallback = AffineCosts(1e-5, 1e9)
    costs = ProfiledCosts(db_path, "cpu-local", fallback)
    assert costs.op_time_s(_mm(16), DEVICE) == 1e-3
    # log-log between (size 16*64*32, 1 ms) and (256*64*32, 4 ms): size x4 of 16x -> time x2
    assert costs.op_time_s(_mm(64), DEVICE) == pytest.approx(2e-3)
    # outside the measured range: the nearest measurement x the fallback's ratio between the op and the op at the
    # measured size (m 1024 against 256 above; 4 against 16 below)
    big = fallback.op_time_s(_mm(1024), DEVICE) / fallback.op_time_s(_mm(256), DEVICE)
    small = fallback.op_time_s(_mm(4), DEVICE) / fallback.op_time_s(_mm(16), DEVICE)
    assert costs.op_time_s(_mm(1024), DEVICE) == pytest.approx(4e-3 * big, rel=1e-12)
    assert costs.op_time_s(_mm(4), DEVICE) == pytest.approx(1e-3 * small, rel=1e-12)
    assert 1 < big < 4 and 0.25 < small < 1  # the launch cost: less than proportional to the size
    other_dtype = Op("fc1", "matmul", "x", "fwd", "bf16", 1.0, 0.0, (1, 16, 64, 32))
    assert costs.op_time_s(other_dtype, DEVICE) == fallback.op_time_s(other_dtype, DEVICE)  # never measured
    assert costs.source_counts() == {"exact": 1, "interpolated": 1, "scaled": 2, "fallback": 1}
    assert costs.answers[("blocks.block.mlp.fc1", "fc1", "fwd")] == "scaled"  # the last lookup of that op


def test_a_scaled_op_is_never_faster_than_the_fallback(db_path: Path) -> None:
    """A fallback slower than the measured level (10 s an op): it stands, outside the measured sizes only."""
    costs = ProfiledCosts(db_path, "cpu-local", ConstantCosts(10.0))
    assert costs.op_time_s(_mm(1024), DEVICE) == 10.0 and costs.op_time_s(_mm(16), DEVICE) == 1e-3
    assert costs.source_counts()["scaled"] == 1


def test_a_fallback_that_prices_nothing_scales_by_the_size(db_path: Path) -> None:
    costs = ProfiledCosts(db_path, "cpu-local", ConstantCosts(0.0))
    assert costs.op_time_s(_mm(1024), DEVICE) == pytest.approx(16e-3)  # 4 ms x 1024 / 256


def test_a_larger_shape_than_measured_is_never_faster_than_the_measured_one(tmp_path: Path) -> None:
    """One size measured (a profile of micro-batch 1): micro-batch 2 keeps the measured level, whatever the
    roofline's own level (here 1000x faster than the measurement)."""
    path = tmp_path / "one.sqlite"
    with ProfileDB.open(path) as db:
        sig = signature_of(_mm(64))
        assert sig is not None
        db.add_op_samples(PROFILE_ENV, sig, [1e-3])
    costs = ProfiledCosts(path, "cpu-local", AffineCosts(0.0, 1e12))
    assert costs.op_time_s(_mm(64), DEVICE) == 1e-3
    assert costs.op_time_s(_mm(128), DEVICE) == pytest.approx(2e-3)


def test_coverage_counts_ops_and_seconds_per_source(db_path: Path) -> None:
    """Two layers: one of two ops (exact 1 ms + scaled 16 ms) repeated 3 times, one bf16 op (fallback 5 ms)."""
    from trainsim.ir.graph import Layer, OpGraph

    bf16 = Op("fc1", "matmul", "x", "fwd", "bf16", 5e6, 0.0, (1, 16, 64, 32))
    blocks = Layer("blocks", "block", 3, (_mm(16), _mm(1024)), (), (), 0.0, 0.0)
    head = Layer("head", "head", 1, (bf16,), (), (), 0.0, 0.0)
    graph = OpGraph("g", (blocks, head), 16, 1)
    coverage = ProfiledCosts(db_path, "cpu-local", AffineCosts(0.0, 1e9)).coverage(graph, DEVICE)
    assert coverage.ops == {"exact": 3, "interpolated": 0, "scaled": 3, "fallback": 1}
    assert coverage.seconds["exact"] == pytest.approx(3e-3)
    assert coverage.seconds["scaled"] == pytest.approx(48e-3)
    assert coverage.seconds["fallback"] == pytest.approx(5e-3)
    assert coverage.total_s == pytest.approx(56e-3)
    assert coverage.share("exact", "interpolated") == pytest.approx(3 / 56)
    assert coverage.unmeasured_dominates
    assert coverage.describe() == ("profiled costs: 3 of 7 ops measured (5% of the op time; exact 3, interpolated "
                                   "0), 3 scaled from another measured size of their kernel (86%), 1 on the "
                                   "roofline (9%)")


def test_device_name_none_uses_the_device_of_each_call(db_path: Path) -> None:
    costs = ProfiledCosts(db_path, None, ConstantCosts(99.0))
    assert costs.op_time_s(_mm(16), DEVICE) == 1e-3
    assert costs.op_time_s(_mm(16), load_cluster("dgx-a100-80gb").device) == 99.0


def test_the_environment_with_most_measurements_wins(db_path: Path) -> None:
    with ProfileDB.open(db_path) as db:
        sig = signature_of(_mm(16))
        assert sig is not None
        db.add_op_samples(Environment("cpu-local", "torch other", 4, "x"), sig, [7.0])
    assert ProfiledCosts(db_path, "cpu-local", ConstantCosts(0.0)).op_time_s(_mm(16), DEVICE) == 1e-3
    chosen = ProfiledCosts(db_path, "cpu-local", ConstantCosts(0.0), versions="torch other")
    assert chosen.op_time_s(_mm(16), DEVICE) == 7.0


def _fill(path: Path, precision: str, seconds: float, optimizer_s: float) -> tuple[int, int]:
    """Every op of the tiny GPT at `seconds`; returns (graph ops per micro-batch, parameters)."""
    graph = job_graph(parse_model(TINY_GPT), DeviceSlice(2, 16, policy_for(precision)))  # type: ignore[arg-type]
    signatures, _ = unique_signatures(graph)
    with ProfileDB.open(path) as db:
        for sig in signatures:
            db.add_op_samples(PROFILE_ENV, sig, [seconds])
        db.add_op_samples(PROFILE_ENV, optimizer_signature(round(graph.param_count())), [optimizer_s])
        db.add_op_samples(PROFILE_ENV, overhead_signature(), [1e-6])
    ops = sum(layer.count * (len(layer.fwd) + len(layer.bwd)) for layer in graph.layers)
    return ops, round(graph.param_count())


def test_make_engine_predicts_from_the_database_alone(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    ops, _ = _fill(path, "fp32", 1e-3, 0.25)
    job = make_job(parse_model(TINY_GPT), load_cluster("local-cpu"),
                   ParallelSpec(micro_batch=2, seq_len=16, precision="fp32", dp=1))
    estimator = make_engine("analytical", "profiled", path)
    result = estimator.estimate(job, graph_for(job))
    assert isinstance(estimator, AnalyticalEstimator)
    assert result.breakdown["compute"] == pytest.approx(ops * 1e-3)
    assert result.breakdown["optimizer"] == pytest.approx(0.25)
    assert result.breakdown["overhead"] == pytest.approx(ops * 1e-6)  # measured, not the GPU-fitted constants
    assert result.iteration_time_s == pytest.approx(ops * (1e-3 + 1e-6) + 0.25)
    assert isinstance(estimator, AnalyticalEstimator)
    costs = estimator.pricer.op_costs
    assert isinstance(costs, ProfiledCosts) and costs.source_counts()["fallback"] == 0


def test_an_empty_database_falls_back_to_the_roofline(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    ProfileDB.open(path).close()
    job = make_job(parse_model(TINY_GPT), load_cluster("dgx-a100-80gb"),
                   ParallelSpec(micro_batch=2, seq_len=16, precision="bf16"))
    profiled = make_engine("analytical", "profiled", path).estimate(job, graph_for(job))
    roofline = make_engine("analytical", "roofline").estimate(job, graph_for(job))
    assert math.isclose(profiled.iteration_time_s, roofline.iteration_time_s, rel_tol=1e-12)


def test_unknown_cost_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="choose one of: profiled, roofline"):
        make_engine("analytical", "learned")


def test_profiled_prediction_does_not_import_torch(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    _fill(path, "fp32", 1e-3, 0.25)
    code = ("import sys; from pathlib import Path; from trainsim.estimate.engines import make_engine; "
            "from trainsim.pipeline import graph_for; from trainsim.jobfile import job_from_settings; "
            f"job = job_from_settings(dict(model='gpt2-124m', cluster='local-cpu', seq_len=16)); "
            f"make_engine('analytical', 'profiled', Path({str(path)!r})).estimate(job, graph_for(job)); "
            "import trainsim.cli.main; assert 'torch' not in sys.modules, 'torch imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_signature_shape_text_round_trips() -> None:
    sig = OpSignature("attention", "sdpa.causal", "bwd", "bf16", (8, 16, 16, 8))
    assert sig.shape_text == "8x16x16x8" and sig.size == 8 * 16 * 16 * 8


class ConstantComm:
    name = "constant"

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: object, cluster: object) -> float:
        return 99.0


def test_measured_collectives_answer_their_group_size_only(db_path: Path) -> None:
    from trainsim.cost.profiled import ProfiledComm
    from trainsim.profile.database import TimingStats

    with ProfileDB.open(db_path) as db:
        for size, seconds in ((1024, 1e-4), (4096, 4e-4)):
            db.put_collective(PROFILE_ENV, "gloo", "all-reduce", 2, size, TimingStats(seconds, seconds, seconds, 1))
    comm = ProfiledComm(ProfiledCosts(db_path, fallback=ConstantCosts(1.0)), ConstantComm())
    cluster = local_cluster(4)
    pair, four = cluster.group_layout(2, 1), cluster.group_layout(4, 1)
    assert comm.collective_time_s("all-reduce", 4096, pair, cluster) == pytest.approx(4e-4)  # exact
    assert comm.collective_time_s("all-reduce", 2048, pair, cluster) == pytest.approx(2e-4)  # log-log
    assert comm.collective_time_s("all-reduce", 512, pair, cluster) == pytest.approx(1e-4)  # latency floor
    assert comm.collective_time_s("all-reduce", 16384, pair, cluster) == pytest.approx(16e-4)  # bytes-bound
    assert comm.collective_time_s("all-reduce", 4096, four, cluster) == 99.0  # 4 ranks: not measured
    assert comm.collective_time_s("all-gather", 4096, pair, cluster) == 99.0  # another collective


def test_profiled_engines_take_the_measured_collectives(db_path: Path) -> None:
    """dp=2 on local-cpu: the gradient all-reduce comes from the database, in the analytical and the simulation
    engines alike."""

    from trainsim.profile.database import TimingStats

    with ProfileDB.open(db_path) as db:
        for size in (1024, 2**30):
            db.put_collective(PROFILE_ENV, "gloo", "all-reduce", 2, size, TimingStats(5.0, 5.0, 5.0, 1))
    job = make_job(parse_model(TINY_GPT), local_cluster(2),
                   ParallelSpec(dp=2, micro_batch=1, seq_len=16, precision="fp32"))
    for engine in ("analytical", "sim"):
        result = make_engine(engine, "profiled", db_path).estimate(job, graph_for(job))
        assert result.breakdown["dp_comm"] == pytest.approx(5.0, rel=0.05), engine


def test_framework_overheads_are_added_per_layer_where_they_apply(db_path: Path) -> None:
    """A micro-batch's overhead: per-op cost x ops, plus DTensor's per-layer cost under tp and FSDP2's under
    zero 3 with data parallelism - exact sums over hand-filled measurements."""
    from trainsim.cost.profiled import ProfiledStepCosts
    from trainsim.cost.step import FittedStepCosts
    from trainsim.profile.framework import framework_signature

    with ProfileDB.open(db_path) as db:
        db.add_op_samples(PROFILE_ENV, overhead_signature(), [1e-5])
        db.add_op_samples(PROFILE_ENV, framework_signature("dtensor-tp", "fp32"), [2e-3])
        db.add_op_samples(PROFILE_ENV, framework_signature("fsdp2-zero3", "fp32"), [5e-3])
    steps = ProfiledStepCosts(ProfiledCosts(db_path, fallback=ConstantCosts(1.0)),
                              FittedStepCosts(load_calibration()))
    plain = ParallelSpec(micro_batch=1, seq_len=16, precision="fp32")
    tp = ParallelSpec(tp=2, micro_batch=1, seq_len=16, precision="fp32")
    both = ParallelSpec(tp=2, dp=2, zero=3, micro_batch=1, seq_len=16, precision="fp32")
    sp = ParallelSpec(tp=2, sp=True, micro_batch=1, seq_len=16, precision="fp32")
    assert steps.micro_batch_overhead_s(100, 4, plain, DEVICE) == pytest.approx(1e-3)
    assert steps.micro_batch_overhead_s(100, 4, tp, DEVICE) == pytest.approx(1e-3 + 4 * 2e-3)
    assert steps.micro_batch_overhead_s(100, 4, both, DEVICE) == pytest.approx(1e-3 + 4 * 7e-3)
    assert steps.micro_batch_overhead_s(100, 4, sp, DEVICE) == pytest.approx(1e-3)  # tp + sp not measured


def test_dtensor_overhead_is_paid_only_by_stacks_that_wrap_their_modules_in_it(tmp_path: Path) -> None:
    """A tp-2 job whose profile holds DTensor's per-layer cost pays it under generic (torch's parallelize_module)
    and not under megatron-core (its own tp layers), in both engines alike: per-op cost x ops, plus 2 ms x the 2
    transformer layers where the stack wraps its modules (StackSpec.tp_module_wrappers)."""
    from trainsim.profile.framework import framework_signature
    from trainsim.strategy.stack import make_stack

    path = tmp_path / "p.sqlite"
    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, overhead_signature(), [1e-6])
        db.add_op_samples(PROFILE_ENV, framework_signature("dtensor-tp", "fp32"), [2e-3])
    par = ParallelSpec(tp=2, micro_batch=2, seq_len=16, precision="fp32")
    expected = {"generic": 2 * 2e-3, "megatron-core": 0.0}
    for stack, dtensor_s in expected.items():
        job = make_job(parse_model(TINY_GPT), local_cluster(2), par, make_stack(stack))
        graph = graph_for(job)
        ops = sum(layer.count * (len(layer.fwd) + len(layer.bwd)) for layer in graph.layers)
        overheads = [make_engine(engine, "profiled", path).estimate(job, graph).breakdown["overhead"]
                     for engine in ("analytical", "sim")]
        assert overheads[0] == pytest.approx(ops * 1e-6 + dtensor_s, rel=1e-9), stack
        assert overheads[1] == pytest.approx(overheads[0], rel=1e-9), stack


def test_measured_gradient_bucket_copies_answer_inside_their_range_and_the_roofline_outside(db_path: Path) -> None:
    """The copies measured over 1e6 and 4e6 gradients: exact at those, log-log interpolated between; outside the
    measured range the fitted step costs' three memory-bound passes (no extrapolation)."""
    from trainsim.cost.profiled import ProfiledStepCosts
    from trainsim.cost.step import FittedStepCosts
    from trainsim.profile.ops import grad_copy_signature

    with ProfileDB.open(db_path) as db:
        db.add_op_samples(PROFILE_ENV, grad_copy_signature(1_000_000), [4e-3])
        db.add_op_samples(PROFILE_ENV, grad_copy_signature(4_000_000), [16e-3])
    fitted = FittedStepCosts(load_calibration())
    steps = ProfiledStepCosts(ProfiledCosts(db_path, fallback=ConstantCosts(1.0)), fitted)
    assert steps.grad_copies_s(1_000_000, DEVICE) == pytest.approx(4e-3)
    assert steps.grad_copies_s(2_000_000, DEVICE) == pytest.approx(8e-3)
    assert steps.grad_copies_s(8_000_000, DEVICE) == fitted.grad_copies_s(8_000_000, DEVICE)


def test_framework_overhead_is_measured_on_a_one_rank_mesh() -> None:
    """In a fresh process (it joins a one-rank process group): positive per-layer samples for every framework."""
    pytest.importorskip("torch")
    code = ("import torch; torch.set_num_threads(1); from trainsim.catalog.model_files import parse_model; "
            "from trainsim.profile.framework import FRAMEWORKS, measure_framework_overhead; "
            f"spec = parse_model({TINY_GPT!r}); "
            "out = [measure_framework_overhead(spec, 2, 16, 'fp32', f, 'cpu', 1, 3) for f in FRAMEWORKS]; "
            "assert all(len(s) == 3 and min(s) >= 0 and max(s) > 0 for s, _ in out), out; "
            "assert 'per layer' in out[0][1]; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def _executor_db(path: Path, family: str, fwd_s: float, bwd_s: float) -> None:
    from trainsim.profile.executor_overhead import executor_signature

    with ProfileDB.open(path) as db:
        db.add_op_samples(PROFILE_ENV, executor_signature(family, "fwd"), [fwd_s])
        db.add_op_samples(PROFILE_ENV, executor_signature(family, "bwd"), [bwd_s])


def test_the_split_executors_measured_cost_per_op_multiplies_each_phases_ops(db_path: Path) -> None:
    """80 us per forward op and 20 us per backward op, for the family measured only; unmeasured: nothing (no
    fitted constant stands in for it)."""
    from trainsim.cost.profiled import ProfiledStepCosts
    from trainsim.cost.step import FittedStepCosts

    _executor_db(db_path, "cnn", 8e-5, 2e-5)
    fitted = FittedStepCosts(load_calibration())
    steps = ProfiledStepCosts(ProfiledCosts(db_path, fallback=ConstantCosts(1.0)), fitted)
    assert steps.executor_overhead_s("cnn", 10, 12, DEVICE) == pytest.approx(10 * 8e-5 + 12 * 2e-5)
    assert steps.executor_overhead_s("transformer", 10, 12, DEVICE) == 0.0
    assert fitted.executor_overhead_s("cnn", 10, 12, DEVICE) == 0.0


@pytest.mark.parametrize("engine", ["analytical", "sim"])
def test_a_split_executor_stack_adds_its_per_op_cost_to_every_micro_batch(tmp_path: Path, engine: str) -> None:
    """Both engines: StackSpec.split_executor adds (forward ops x 90 us + backward ops x 30 us) to each of the
    2 micro-batches of a one-device job, and nothing without the flag."""
    path = tmp_path / "p.sqlite"
    _fill(path, "fp32", 1e-3, 0.25)
    _executor_db(path, "transformer", 9e-5, 3e-5)
    job = make_job(parse_model(TINY_GPT), load_cluster("local-cpu"),
                   ParallelSpec(micro_batch=2, seq_len=16, precision="fp32", dp=1, global_batch=4))
    graph = graph_for(job)
    fwd = sum(layer.count * len(layer.fwd) for layer in graph.layers)
    bwd = sum(layer.count * len(layer.bwd) for layer in graph.layers)
    split = dataclasses.replace(job, stack=job.stack.model_copy(update={"split_executor": True}))
    plain = make_engine(engine, "profiled", path).estimate(job, graph).iteration_time_s
    executed = make_engine(engine, "profiled", path).estimate(split, graph).iteration_time_s
    assert fwd > 0 and bwd > 0
    assert executed - plain == pytest.approx(2 * (fwd * 9e-5 + bwd * 3e-5), rel=1e-9)


def test_local_cpu_ranks_are_one_node_so_the_measured_curve_answers(db_path: Path) -> None:
    """local-cpu-ranks: trainsim measure's 2 gloo ranks on one node, their all-reduce from the database's curve;
    local-cpu makes each rank a node of its own, whose pair the fallback prices."""
    from trainsim.cost.profiled import ProfiledComm
    from trainsim.profile.database import TimingStats

    with ProfileDB.open(db_path) as db:
        db.put_collective(PROFILE_ENV, "gloo", "all-reduce", 2, 2048, TimingStats(3e-4, 3e-4, 3e-4, 1))
    comm = ProfiledComm(ProfiledCosts(db_path, fallback=ConstantCosts(1.0)), ConstantComm())
    ranks, nodes = load_cluster("local-cpu-ranks").with_num_gpus(2), load_cluster("local-cpu").with_num_gpus(2)
    assert (ranks.num_nodes, nodes.num_nodes) == (1, 2)
    assert comm.collective_time_s("all-reduce", 2048, ranks.group_layout(2, 1), ranks) == pytest.approx(3e-4)
    assert comm.collective_time_s("all-reduce", 2048, nodes.group_layout(2, 1), nodes) == 99.0
