"""Consistency of the fidelity ladder: with the overlap slow-down and bandwidth sharing off, the simulator
("sim") agrees with the analytical engine within 2% on every calibration run (issue 3's acceptance).

Both engines price the same work with the same cost models; the simulator composes it by running the
schedule. What remains between them, by design (measured maximum 1.6%, on pp=1 dp=8 runs):
- the last data-parallel bucket: the simulator's buckets hold whole layers (the embedding alone can exceed
  the stack's grad_bucket_params), the analytical engine takes total / (parameters / grad_bucket_params);
- the end stages of a pipeline send in one direction only, where the analytical engine charges every stage
  2 v sends per micro-batch;
- ZeRO-3 and the data-parallel window: edge effects of one layer-phase at the ends of a stage's work.
"""

from conftest import CalibrationRuns
from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import load_calibration
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import Job, make_job
from trainsim.pipeline import graph_for
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision
from trainsim.strategy.stack import load_stack

TOLERANCE = 0.02


def _jobs(runs: CalibrationRuns) -> list[Job]:
    jobs: dict[str, Job] = {}
    for row in runs.rows:
        job = row.job
        if job is not None:  # rows of the same job differ only in the metric measured
            jobs.setdefault(f"{job.model!r} {job.cluster!r} {job.parallel!r}", job)
    return list(jobs.values())


def test_sim_agrees_with_analytical_on_every_calibration_run(calibration_runs: CalibrationRuns) -> None:
    jobs = _jobs(calibration_runs)
    assert len(jobs) >= 1500
    # Same costs and the same runtime parameters (not the simulator's own fit), the overlap slow-down off in both
    # engines (the analytical engine applies the fitted one to overlapped gathers and reductions): they must agree.
    calibration = load_calibration()
    runtime = calibration.runtime.model_copy(update={"overlap_slowdown": 0.0})
    pricer = Pricer(calibration.model_copy(update={"sim_runtime": None, "runtime": runtime}))
    analytical = AnalyticalEstimator(pricer)
    sim = SimEstimator(pricer, overlap=False, sharing=False)
    worst: list[tuple[float, str, float, float]] = []
    for job in jobs:
        graph = calibration_runs.graphs.get(job)  # the job's OpGraph (graph_for), built once for every engine
        expected = analytical.estimate(job, graph).iteration_time_s
        got = sim.estimate(job, graph).iteration_time_s
        worst.append((abs(got / expected - 1.0), job.describe(), got, expected))
    worst.sort(reverse=True)
    failures = [w for w in worst if w[0] > TOLERANCE]
    assert not failures, f"{len(failures)} of {len(jobs)} runs differ by more than 2%, worst: {failures[:5]}"
    assert worst[0][0] < TOLERANCE


INTERLEAVED_TOLERANCE = 0.10


def test_interleaved_pipelines_at_scale_agree() -> None:
    """Megatron's interleaved schedule on 1,024-10,752 GPUs with overlapped gradient reduction and parameter
    gathers (megatron-core): the analytical engine's windows (stack_effects.window_micro_batches) against the
    simulator running the schedule, runtime effects off. Measured 0.1-8.4% apart (the rest: pipeline sends and
    bubble); with one micro-batch's window, as before, the 10,752-GPU plans were 18-27% slower than simulated."""
    calibration = load_calibration()
    runtime = calibration.runtime.model_copy(update={"overlap_slowdown": 0.0})
    pricer = Pricer(calibration.model_copy(update={"sim_runtime": None, "runtime": runtime}))
    analytical = AnalyticalEstimator(pricer)
    sim = SimEstimator(pricer, overlap=False, sharing=False)
    model, stack = load_model("gpt3-175b"), load_stack("megatron-core")
    plans: list[tuple[int, int, int, Precision]] = [(1024, 2, 256, "bf16"), (1024, 4, 1536, "bf16"),
                                                    (1024, 12, 256, "bf16"), (10752, 12, 2688, "bf16"),
                                                    (10752, 12, 2688, "fp8")]
    for gpus, vpp, global_batch, precision in plans:
        parallel = ParallelSpec(tp=4, pp=8, vpp=vpp, sp=True, zero=1, micro_batch=1, global_batch=global_batch,
                                seq_len=2048, schedule="interleaved-1f1b", precision=precision)
        job = make_job(model, load_cluster("dgx-h100-80gb").with_num_gpus(gpus), parallel, stack)
        expected = analytical.estimate(job, graph_for(job)).iteration_time_s
        got = sim.estimate(job, graph_for(job)).iteration_time_s
        assert abs(got / expected - 1.0) < INTERLEAVED_TOLERANCE, (job.describe(), got, expected)
