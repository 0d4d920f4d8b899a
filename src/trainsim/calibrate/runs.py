"""Fit the framework-level parameters (in-training efficiency, overlap slow-down, fixed costs) on measured runs.

Every parameter is shared by all runs: nothing is fitted per run or per source, so a fitted model predicts
runs it has not seen. Each row weighs 1/sqrt(rows of its source), so a source counts as much as
sqrt(its rows), keeping the 1,440 vTrain rows from drowning the others.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.calibrate.jacobian import ParallelJacobian, can_fork
from trainsim.catalog.calibration import Calibration, ComputeParams, RuntimeParams
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.engines import Estimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.job import Job
from trainsim.pipeline import GraphCache
from trainsim.validate.runs import RunRow, job_from_row, source_group


@dataclass(frozen=True, slots=True)
class FitSample:
    run_id: str
    source: str
    job: Job
    measured_s: float


@dataclass(frozen=True, slots=True)
class Parameter:
    """One fitted parameter: where it lives, its prior, its bounds, and whether it is fitted in log space."""

    section: str  # "compute" or "runtime"
    name: str
    prior: float | None  # None: start from the microbenchmark fit's value (the base calibration)
    low: float
    high: float
    log: bool = False


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("compute", "matmul_half_work_flop_per_tflops", None, 1e5, 1e9, log=True),
    Parameter("compute", "matmul_exponent", None, 0.3, 3.0),
    Parameter("compute", "matmul_half_dim", None, 1.0, 4096.0, log=True),
    Parameter("compute", "matmul_dim_exponent", None, 0.2, 1.0),
    Parameter("compute", "matmul_training_factor", 1.0, 0.3, 1.3),
    Parameter("compute", "attention_efficiency", 0.5, 0.1, 1.5),
    Parameter("compute", "flash3_attention_efficiency", 0.9, 0.1, 1.5),
    # the prior: FlashAttention-2's and cuDNN's forward + backward on an H100 reach half their long-sequence rate
    # near a thousand keys (data/ground-truth/h100-kernels; cost.compute.key_loop_efficiency)
    Parameter("compute", "attention_half_kv_tokens", 1024.0, 16.0, 16384.0, log=True),
    Parameter("compute", "memory_efficiency", 0.8, 0.2, 1.0),
    Parameter("compute", "kernel_overhead_s", 4e-6, 1e-7, 1e-4, log=True),
    Parameter("runtime", "overlap_slowdown", 0.1, 0.0, 1.0),
    Parameter("runtime", "iteration_overhead_s", 1e-2, 1e-5, 1.0, log=True),
    Parameter("runtime", "micro_batch_overhead_s", 1e-3, 1e-6, 1e-1, log=True),
    Parameter("runtime", "pipeline_overhead_per_micro_batch_s", 1e-4, 1e-7, 1e-1, log=True),
)


def fit_samples(rows: Sequence[RunRow]) -> list[FitSample]:
    """One sample per run with a measured iteration time whose job can be built."""
    samples: list[FitSample] = []
    for row in rows:
        if row.metric != "iteration_time_s":
            continue
        built = job_from_row(row.fields)
        if built.job is not None:
            samples.append(FitSample(row.run_id, source_group(row.source), built.job, row.measured))
    return samples


GENERATION_PRIOR_WEIGHT = 0.1  # pulls each generation's factor towards the shared one (log space)
SOURCE_WEIGHT_POWER = 0.9  # a row weighs 1 / sqrt(rows of its source) ** this power
MAX_EVALUATIONS = 200  # least-squares function evaluations (each predicts every run once)
DIFF_STEP = 1e-3  # the finite differences' relative step


def _source_weights(samples: Sequence[FitSample]) -> np.ndarray:
    """Each sample's weight in the fits' residuals: 1 / sqrt(samples of its source) ** SOURCE_WEIGHT_POWER."""
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.source] = counts.get(s.source, 0) + 1
    return np.array([1.0 / math.sqrt(counts[s.source]) ** SOURCE_WEIGHT_POWER for s in samples])


def generations_of(samples: Sequence[FitSample], base: Calibration) -> list[str]:
    names = {base.device_generation.get(s.job.cluster.device.name, "") for s in samples}
    return sorted(name for name in names if name)


def calibration_with(base: Calibration, theta: Sequence[float] | np.ndarray,
                     generations: Sequence[str] = ()) -> Calibration:
    values: dict[str, dict[str, float]] = {"compute": {}, "runtime": {}}
    for param, raw in zip(PARAMETERS, theta[: len(PARAMETERS)], strict=True):
        values[param.section][param.name] = math.exp(raw) if param.log else float(raw)
    factors = {name: math.exp(raw) for name, raw in zip(generations, theta[len(PARAMETERS):], strict=True)}
    return base.model_copy(update={
        "generation_factor": factors,
        "compute": ComputeParams.model_validate({**base.compute.model_dump(), **values["compute"]}),
        "runtime": RuntimeParams.model_validate({**base.runtime.model_dump(), **values["runtime"]}),
    })


def log_errors(cal: Calibration, samples: Sequence[FitSample], graphs: GraphCache,
               engine: Callable[[Pricer], Estimator] = AnalyticalEstimator) -> np.ndarray:
    """log(predicted / measured) per sample under `cal`, with the engine `engine` builds from a pricer over
    `cal` (the analytical engine, or SimEstimator: the simulator takes its overlap slow-down from
    cal.sim_runtime where cal has one)."""
    estimator = engine(Pricer(cal))
    predicted = np.array([estimator.estimate(s.job, graphs.get(s.job)).iteration_time_s for s in samples])
    return np.log(predicted) - np.log(np.array([s.measured_s for s in samples]))


def _start(param: Parameter, base: Calibration) -> float:
    if param.prior is not None:
        return param.prior
    return float(getattr(getattr(base, param.section), param.name))


def _start_value(param: Parameter, start: Calibration, base: Calibration) -> float:
    """`start`'s value of a parameter; a log-space parameter at 0 there (a fit written before the parameter was
    priced: its "no such cost") starts from its own start instead."""
    value = float(getattr(getattr(start, param.section), param.name))
    return _start(param, base) if param.log and value <= 0.0 else value


def fit_runtime(base: Calibration, samples: Sequence[FitSample], progress: Callable[[], None] | None = None,
                start: Calibration | None = None, tolerance: float = 1e-8, workers: int = 1) -> Calibration:
    """progress: called once per evaluation of the residuals (each predicts every sample once). start: a fit to
    start from (its values of the fitted parameters, within their bounds) instead of the priors. tolerance:
    least squares stops when an iteration changes the cost, the parameters or the gradient by less than this
    (relative; scipy's ftol, xtol, gtol). workers: processes for the Jacobian's columns (calibrate.jacobian;
    1: scipy's own finite differences, the same steps)."""
    from scipy.optimize import least_squares

    weights = _source_weights(samples)
    graphs = GraphCache()

    def to_raw(value: float, param: Parameter) -> float:
        return math.log(value) if param.log else value

    generations = generations_of(samples, base)
    extra = len(generations)
    x0 = np.array([to_raw(_start(p, base), p) for p in PARAMETERS] + [0.0] * extra)
    low = np.array([to_raw(p.low, p) for p in PARAMETERS] + [math.log(0.5)] * extra)
    high = np.array([to_raw(p.high, p) for p in PARAMETERS] + [math.log(2.0)] * extra)
    if start is not None:
        values = [_start_value(p, start, base) for p in PARAMETERS]
        raw = [to_raw(max(v, p.low), p) for v, p in zip(values, PARAMETERS, strict=True)]
        x0 = np.clip(np.array(raw + [math.log(start.generation_factor.get(g, 1.0)) for g in generations]), low, high)

    def residuals(theta: np.ndarray) -> np.ndarray:
        if progress is not None:
            progress()
        cal = calibration_with(base, theta, generations)
        prior = GENERATION_PRIOR_WEIGHT * theta[len(PARAMETERS):]
        return np.concatenate([weights * log_errors(cal, samples, graphs), prior])

    options = {"bounds": (low, high), "loss": "soft_l1", "f_scale": 0.1, "max_nfev": MAX_EVALUATIONS,
               "ftol": tolerance, "xtol": tolerance, "gtol": tolerance}
    if workers <= 1 or not can_fork():
        fit = least_squares(residuals, x0=x0, diff_step=DIFF_STEP, **options)
        return calibration_with(base, fit.x, generations)
    with ParallelJacobian(residuals, (low, high), DIFF_STEP, workers, progress) as jacobian:
        fit = least_squares(jacobian.value, x0=x0, jac=jacobian, **options)  # pyright: ignore[reportArgumentType]
    return calibration_with(base, fit.x, generations)


SIM_PARAMETERS: tuple[Parameter, ...] = tuple(p for p in PARAMETERS if p.section == "runtime")
SIM_MAX_EVALUATIONS = 40


def fit_sim_runtime(base: Calibration, samples: Sequence[FitSample],
                    progress: Callable[[], None] | None = None) -> RuntimeParams:
    """The simulator's own runtime behaviours (Proteus's overlap slow-down gamma, fixed costs), refitted through
    the simulator from the analytical fit; compute costs stay as fitted. progress: called once per evaluation of
    the residuals."""
    from scipy.optimize import least_squares

    weights = _source_weights(samples)
    graphs = GraphCache()
    start = base.runtime.model_dump()

    def to_raw(value: float, param: Parameter) -> float:
        return math.log(max(value, param.low)) if param.log else min(max(value, param.low), param.high)

    def runtime_of(theta: np.ndarray) -> RuntimeParams:
        values = {p.name: (math.exp(raw) if p.log else float(raw)) for p, raw in zip(SIM_PARAMETERS, theta,
                                                                                          strict=True)}
        return RuntimeParams.model_validate({**start, **values})

    def residuals(theta: np.ndarray) -> np.ndarray:
        if progress is not None:
            progress()
        cal = base.model_copy(update={"runtime": runtime_of(theta)})
        return weights * log_errors(cal, samples, graphs, engine=SimEstimator)

    x0 = np.array([to_raw(float(start[p.name]), p) for p in SIM_PARAMETERS])
    low = np.array([to_raw(p.low, p) for p in SIM_PARAMETERS])
    high = np.array([to_raw(p.high, p) for p in SIM_PARAMETERS])
    fit = least_squares(residuals, x0=x0, bounds=(low, high), loss="soft_l1", f_scale=0.1, diff_step=1e-2,
                        max_nfev=SIM_MAX_EVALUATIONS)
    return runtime_of(fit.x)
