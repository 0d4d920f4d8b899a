"""Calibration parameters of the cost models, read from catalog/data/calibration/fitted.yaml.

That file is written by `trainsim calibrate --update-package` (trainsim.calibrate.fit) from the measurements
the package ships in catalog/data/measurements (copied from the project's shared/data/calibration by
scripts/sync_calibration_data.py); nobody edits it by hand. A user's own fit (`trainsim calibrate --runs MY.csv
--output MY.yaml`) is read by read_calibration. Without a file, the priors below apply: round, physically
motivated starting points of the fit, not fitted values.
"""

from functools import cache
from pathlib import Path

from pydantic import Field

from trainsim.catalog.files import DATA_DIR, read_mapping
from trainsim.catalog.uncertainty import Uncertainty
from trainsim.errors import InputFileError
from trainsim.hardware.device import DType
from trainsim.specbase import Spec

FITTED_PATH = DATA_DIR / "calibration" / "fitted.yaml"
# The measurements the package ships (runs in the runs.csv schema, GEMM and collective microbenchmarks).
MEASUREMENTS_DIR = DATA_DIR / "measurements"
DEFAULT_RUNS_FILES = ("runs.csv", "runs_multinode.csv")  # the runs the package's own fit is fitted on
CALIBRATION_HELP = ("calibration file written by `trainsim calibrate --runs MY.csv --output MY.yaml` (default: the "
                    "package's fit)")
Collective = str  # "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" | "send-recv"


class ComputeParams(Spec):
    """Roofline efficiency of one device. NB: matmul efficiency follows a saturating curve of the GEMM's work:
    eff(W) = max_eff / (1 + (half_work / W) ** exponent), where half_work scales with the device's peak."""

    matmul_half_work_flop_per_tflops: float = Field(default=2.0e7, gt=0)
    matmul_exponent: float = Field(default=1.0, gt=0)
    # NB: a skinny GEMM fills the tiles poorly whatever its work: extra time W (half_dim / d)^e for its
    # smallest dimension d (compute.matmul_efficiency); e <= 1 keeps smaller GEMMs no slower.
    matmul_half_dim: float = Field(default=16.0, gt=0)
    matmul_dim_exponent: float = Field(default=1.0, gt=0, le=1.0)
    matmul_training_factor: float = Field(default=1.0, gt=0)  # microbenchmark -> in-training efficiency
    attention_efficiency: float = Field(default=0.5, gt=0)  # flash2 kernels, of the matmul efficiency
    # Hopper-native fused attention (FlashAttention-3, cuDNN), of the matmul efficiency. The prior: FlashAttention-3
    # (Shah et al. 2024) reports about 1.5-2x FlashAttention-2's throughput on H100.
    flash3_attention_efficiency: float = Field(default=0.9, gt=0)
    # NB: a fused attention kernel's fixed cost per query tile, amortised over its key loop: its rate at kv keys is
    # kv / (kv + this) of its long-sequence rate (cost.compute.key_loop_efficiency). 0: no such cost (the priors,
    # and fits written before it was priced).
    attention_half_kv_tokens: float = Field(default=0.0, ge=0)
    memory_efficiency: float = Field(default=0.8, gt=0, le=1.0)
    kernel_overhead_s: float = Field(default=4.0e-6, ge=0)


class CommParams(Spec):
    """Correction of one collective's algorithm model (comm.collectives), on top of NCCL's own constants per
    algorithm and protocol (comm/nccl_tuning.py): extra start-up of a call, extra latency per step and achieved /
    link bandwidth of its ring (or tree) over the NVLink fabric; nvls_bw_efficiency: achieved / link bandwidth of
    NVLink SHARP (all-reduce on a multicast NVSwitch). As `comm_network`: the extra latency per step that crosses
    NVLink domains (over NCCL's and the link's) and the achieved / NIC bandwidth."""

    latency_s: float = Field(default=5.0e-6, ge=0)
    bw_efficiency: float = Field(default=0.8, gt=0, le=1.5)
    nvls_bw_efficiency: float = Field(default=0.6, gt=0, le=1.5)
    # Start-up of one call beyond NCCL's baseLat per algorithm and protocol (what NCCL's model leaves out: the
    # host side and the kernel launch); the prior: none.
    base_latency_s: float = Field(default=0.0, ge=0)


class RuntimeParams(Spec):
    """Framework behaviour shared by every stack: the slow-down of overlapped work and fixed costs. What a
    stack overlaps is the stack's (strategy/stack.py); how much that costs follows from the mechanism
    (cost/stack_effects.py) and this one factor."""

    iteration_overhead_s: float = Field(default=0.0, ge=0)
    micro_batch_overhead_s: float = Field(default=0.0, ge=0)  # host-side cost of each micro-batch
    # Proteus's overlap factor gamma: compute and communication running together on one GPU both slow by
    # 1 + gamma, in both engines (cost/stack_effects.py; the simulator applies it per task, sim/engine.py).
    overlap_slowdown: float = Field(default=0.0, ge=0, le=4.0)
    pipeline_overhead_per_micro_batch_s: float = Field(default=0.0, ge=0)


class Calibration(Spec):
    source: str = "priors"
    compute: ComputeParams = ComputeParams()
    # device name -> dtype -> best achievable matmul efficiency (MAMF / peak), from gemm.csv
    matmul_max_efficiency: dict[str, dict[str, float]] = {}
    default_matmul_max_efficiency: float = Field(default=0.8, gt=0, le=1.0)
    comm: dict[Collective, CommParams] = {}  # fitted over every system: the fallback
    # generation -> collective -> params, fitted on that generation's systems alone
    comm_by_generation: dict[str, dict[Collective, CommParams]] = {}
    # The scale-out network per fabric (a LinkSpec kind: efa, infiniband, ...), fitted on the multi-node
    # measurements of that fabric; `comm_network` serves a fabric without measurements (calibrate.microbenchmarks:
    # NCCL's own per-step network latency, the measured fabrics' bandwidth efficiency).
    comm_network_by_fabric: dict[str, CommParams] = {}
    comm_network: CommParams = CommParams()
    runtime: RuntimeParams = RuntimeParams()
    # The simulator's runtime behaviours, fitted through the simulator (None: use `runtime`).
    sim_runtime: RuntimeParams | None = None
    # device name -> generation, and generation -> in-training matmul factor fitted on runs (multiplies
    # compute.matmul_training_factor); a device without runs of its generation uses 1.
    device_generation: dict[str, str] = {}
    generation_factor: dict[str, float] = {}
    fit_report: dict[str, float] = {}
    # The held-out error of the fit per group of comparable jobs (catalog.uncertainty); None: not measured.
    uncertainty: Uncertainty | None = None

    def training_factor(self, device_name: str) -> float:
        generation = self.device_generation.get(device_name, "")
        return self.compute.matmul_training_factor * self.generation_factor.get(generation, 1.0)

    def max_efficiency(self, device_name: str, dtype: DType) -> float:
        per_dtype = self.matmul_max_efficiency.get(device_name, {})
        if dtype in per_dtype:
            return per_dtype[dtype]
        if dtype in ("fp16", "tf32") and "bf16" in per_dtype:
            return per_dtype["bf16"]
        return self.default_matmul_max_efficiency

    def network_params(self, fabric: str) -> CommParams:
        """The scale-out network's corrections on a fabric (a LinkSpec kind)."""
        return self.comm_network_by_fabric.get(fabric, self.comm_network)

    def comm_params(self, collective: Collective, device_name: str = "") -> CommParams:
        own = self.comm_by_generation.get(self.device_generation.get(device_name, ""), {})
        return own.get(collective) or self.comm.get(collective, CommParams())


@cache
def load_calibration(path: Path = FITTED_PATH) -> Calibration:
    """The package's fit (the priors where the file is missing)."""
    if not path.exists():
        return Calibration()
    return Calibration.parse(read_mapping(path), str(path))


def read_calibration(path: Path | None) -> Calibration:
    """A calibration file a user names (`--calibration`), which must exist; None: the package's fit."""
    if path is None:
        return load_calibration()
    if not path.is_file():
        raise InputFileError(f"calibration file {path} does not exist (write one with `trainsim calibrate "
                             "--runs MY.csv --output MY.yaml`)")
    return _read_calibration(path.resolve(), path.stat().st_mtime_ns)


@cache
def _read_calibration(path: Path, mtime_ns: int) -> Calibration:
    """Cached per path and modification time, so the engines of one command share one parse."""
    return Calibration.parse(read_mapping(path), str(path))
