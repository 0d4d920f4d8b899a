"""What several test files share: tiny models, test clusters, a tiny job, a constant op cost and a measured run.

Plain constants and factories, importable at collection time (`from conftest import TINY_GPT`) because
parametrize lists, subprocess code and model files written to disk need them, plus fixtures for the common
cases. The two tiny GPTs differ on purpose: each keeps the numbers its tests were written against.
"""

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from trainsim.calibrate.fit import fit_micro
from trainsim.catalog import load_cluster, load_model
from trainsim.catalog.calibration import MEASUREMENTS_DIR, Calibration, load_calibration
from trainsim.catalog.model_files import parse_model
from trainsim.cost.pricing import Pricer
from trainsim.estimate.analytical import AnalyticalEstimator
from trainsim.estimate.simulation import SimEstimator
from trainsim.hardware.cluster import ClusterSpec
from trainsim.hardware.device import DeviceSpec
from trainsim.hardware.links import FABRIC, NIC, UPLINK, fabric_shared, nic_name, nic_rails, uplinks_shared
from trainsim.ir.graph import Layer, Op
from trainsim.job import Job, make_job
from trainsim.measure.results import MeasuredRun, job_to_dict
from trainsim.pipeline import GraphCache, graph_for
from trainsim.profile.database import Environment
from trainsim.strategy.parallel import ParallelSpec
from trainsim.validate.runs import RunRow, job_from_row, read_runs

if TYPE_CHECKING:
    from trainsim.frontends.catalog.sharded_dlrm import ShardedDlrmJob
    from trainsim.strategy.lowered import LoweredPlan

TESTS_DIR = Path(__file__).resolve().parent  # tests/: unit/ mirrors src/trainsim, then golden/, validation/
REPO_DIR = TESTS_DIR.parent
EXEC_TRACES = TESTS_DIR / "fixtures" / "exec_trace"  # a 2-rank DDP run's execution and Kineto traces

# Two layers, hidden 32: small enough to price op by op (the profile database, profiled costs, precision-aware).
TINY_GPT: dict[str, Any] = {"name": "tiny-gpt", "num_layers": 2, "hidden": 32, "num_heads": 2, "ffn_hidden": 64,
                            "vocab": 128, "max_seq_len": 16}
# The models `trainsim measure` runs for real on local CPU ranks (tp 2 divides their heads and vocab).
MEASURED_GPT: dict[str, Any] = {"name": "tiny-gpt", "arch": "gpt", "num_layers": 2, "hidden": 64, "num_heads": 4,
                                "ffn_hidden": 256, "vocab": 512, "max_seq_len": 32}
MEASURED_LLAMA: dict[str, Any] = {"name": "tiny-llama", "arch": "llama", "num_layers": 2, "hidden": 64,
                                  "num_heads": 4, "num_kv_heads": 2, "ffn_hidden": 192, "vocab": 512,
                                  "max_seq_len": 32, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
                                  "bias": False, "tied_embeddings": False}
# The smallest GPT whose stages `trainsim stages collect` measures on local CPU ranks (a model file's text).
STAGE_GPT_YAML = """name: {name}
arch: gpt
num_layers: 2
hidden: 16
ffn_hidden: 32
num_heads: 2
vocab: 64
max_seq_len: 8
"""

# a 2-block GPT as a model file (`trainsim measure --model FILE` builds it on gloo ranks in seconds)
TINY_GPT_MODEL_YAML = """\
kind: transformer
name: tiny-gpt
arch: gpt
mlp: gelu
norm: layernorm
position: learned
bias: true
tied_embeddings: true
vocab: 256
max_seq_len: 32
num_layers: 2
hidden: 32
num_heads: 4
ffn_hidden: 128
"""

# the tiny GPT without biases, every block a mixture of 4 experts, top-2
TINY_MOE_MODEL_YAML = (TINY_GPT_MODEL_YAML.replace("name: tiny-gpt", "name: tiny-moe")
                       .replace("bias: true", "bias: false") + "num_experts: 4\ntop_k: 2\nmoe_every: 1\n")


def tiny_moe_job(tp: int = 2, ep: int = 2, sp: bool = True, num_gpus: int = 8, **settings: Any) -> Job:
    """The tiny MoE (TINY_MOE_MODEL_YAML) on num_gpus A100s (8 a server) at tp x ep x dp (num_gpus / tp), 2
    sequences of 32 tokens a micro-batch, 32 a step; `settings`: more ParallelSpec keys (zero, cp ...)."""
    spec = parse_model(yaml.safe_load(TINY_MOE_MODEL_YAML))
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 32, "tp": tp, "ep": ep, "sp": sp,
                              **settings})
    return make_job(spec, a100_cluster(num_gpus), par)


# Where hand-filled profile measurements are filed: this machine's CPU, one thread.
PROFILE_ENV = Environment("cpu-local", "torch test", 1, "test cpu")


def a100_cluster(num_gpus: int) -> ClusterSpec:
    """DGX A100-80GB nodes (NVSwitch inside a node), scaled to num_gpus."""
    return load_cluster("dgx-a100-80gb").with_num_gpus(num_gpus)


def link_shares_by_rank(blocks: Sequence[tuple[int, int]], level: str, direction: str,
                        cluster: ClusterSpec) -> dict[str, int]:
    """The reference for hardware.links.link_runs, rank by rank: one share of the link of `level` behind each rank
    of the (first rank, count) runs, in the order the ranks first name the links; none at a level whose links are
    not shared (NVLink or NVSwitch ports, non-blocking up-links)."""
    gpus, rails = cluster.gpus_per_node, nic_rails(cluster)
    uses: dict[str, int] = {}
    for first, count in blocks:
        for rank in range(first, first + count):
            node = rank // gpus
            if level == NIC:
                name = nic_name(node, rank % gpus // (gpus // rails), direction, rails)
            elif level == UPLINK and uplinks_shared(cluster):
                name = f"leaf{node // (cluster.nodes_per_leaf or 1)}.{UPLINK}.{direction}"
            elif level == FABRIC and fabric_shared(cluster):
                name = f"node{node}.{FABRIC}"
            else:
                return {}
            uses[name] = uses.get(name, 0) + 1
    return uses


def local_cluster(ranks: int) -> ClusterSpec:
    """`ranks` processes of this machine's CPU, all on one node."""
    return load_cluster("local-cpu").with_num_gpus(ranks).on_one_node()


def tiny_tp_job(sp: bool, tp: int = 2, **model: Any) -> Job:
    """The tiny GPT (TINY_GPT_MODEL_YAML, its keys overridden by `model`: arch, norm ...) on 8 A100s at tp x
    8 / tp dp, 2 sequences of 32 tokens a micro-batch, 16 a step."""
    import yaml

    from trainsim.ir.model_spec import TransformerSpec

    spec = parse_model({**yaml.safe_load(TINY_GPT_MODEL_YAML), **model})
    assert isinstance(spec, TransformerSpec)
    par = ParallelSpec.parse({"micro_batch": 2, "seq_len": 32, "global_batch": 16, "tp": tp, "dp": 8 // tp,
                              "sp": sp})
    return make_job(spec, a100_cluster(8), par)


def tp_split_plan(job: Job, splits: list[tuple[str, str, int]]) -> "LoweredPlan":
    """The job's plan shaped (compile.shape_layers) with Megatron's splits, each (path, dim, parts) of `splits` set
    over tp in its place."""
    from trainsim.compile.shape_layers import shape_layers
    from trainsim.frontends.catalog.transformer import build_transformer
    from trainsim.ir.model_spec import TransformerSpec
    from trainsim.strategy.device_slice import DeviceSlice
    from trainsim.strategy.tree import StrategyTree

    assert isinstance(job.model, TransformerSpec)
    tree = StrategyTree.from_parallel(build_transformer(job.model, DeviceSlice.of(job.parallel)), job.parallel)
    for path, dim, parts in splits:
        tree = tree.split(path, "compute", dim, parts, axis="tp", override=True)
    return shape_layers(job, tree.lower(job.parallel))


def comm_rows(layer: Layer) -> list[tuple[str, str, str, float]]:
    """(name, collective, phase, buffer bytes) of each of the layer's collectives, in order."""
    return [(c.name, c.collective, c.phase, c.buffer_bytes) for c in layer.comms]


def forward_op(layer: Layer, name: str) -> Op:
    return next(op for op in layer.fwd if op.name == name)


def tiny_job(ranks: int, model: dict[str, Any] | None = None, **strategy: Any) -> Job:
    """MEASURED_GPT (or `model`) on `ranks` local ranks: 32 tokens, micro-batch 2, fp32 unless `strategy` says."""
    settings = {"seq_len": 32, "micro_batch": 2, "precision": "fp32", **strategy}
    return make_job(parse_model(model or MEASURED_GPT), local_cluster(ranks), ParallelSpec.parse(settings))


def fake_run(run_id: str = "r1", job: Job | None = None, times: list[float] | None = None) -> MeasuredRun:
    """A measured run as `trainsim measure` writes it, with made-up times (default job: tiny_job(2, dp=2))."""
    job = job or tiny_job(2, dp=2)
    return MeasuredRun(run_id=run_id, job=job_to_dict(job), iteration_times_s=times or [0.10, 0.12, 0.11, 0.30],
                       peak_memory_bytes=[3 * 2**30, 2 * 2**30], peak_memory_kind="rss-high-water-mark",
                       tokens_per_iteration=job.tokens_per_iteration,
                       settings={"iterations": 4, "warmup": 1, "device": "cpu", "nodes": 1},
                       versions={"python": "3.11"}, machine={"host_sha256": "abc", "cpu_model": "test cpu"},
                       started_at="2026-01-01T00:00:00+00:00", final_loss=6.2)


class ConstantCosts:
    """An op cost model in which every op takes `seconds`: sums of op times become counts."""

    name = "constant"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def op_time_s(self, op: Op, device: DeviceSpec) -> float:
        return self.seconds


@pytest.fixture(scope="session")
def cluster8() -> ClusterSpec:
    """One DGX A100-80GB node: 8 GPUs."""
    return a100_cluster(8)


@pytest.fixture(scope="session")
def package_micro_fit() -> Calibration:
    """The GEMM and collective fits on the package's measurements (calibrate.fit.fit_micro; seconds of least
    squares), which the tests of the committed fit compare with fitted.yaml."""
    return fit_micro(MEASUREMENTS_DIR)


@dataclass(frozen=True)
class CalibrationRuns:
    """The package's runs.csv as the validation tests predict it with several engines: every row carrying its
    run's job (job_from_row, once per run; rows whose job cannot be built keep none, and predict_rows gives their
    reason), and the jobs' OpGraphs and parameter counts, built once for all engines (validate.predict_runs)."""

    rows: list[RunRow]
    graphs: GraphCache
    params_by_run: dict[str, float]


@pytest.fixture(scope="session")
def calibration_runs() -> CalibrationRuns:
    jobs: dict[str, Job | None] = {}
    rows = []
    for row in read_runs(MEASUREMENTS_DIR / "runs.csv"):
        if row.run_id not in jobs:
            jobs[row.run_id] = job_from_row(row.fields).job
        rows.append(replace(row, job=jobs[row.run_id]))
    return CalibrationRuns(rows, GraphCache(), {})


# --- the scale-agreement tests' ladder of GPU counts and the walk up it ---

LADDER = (1, 8, 64, 1024, 16384, 131072, 2**20)
LadderGaps = Callable[[AnalyticalEstimator, SimEstimator, str, dict[str, object], int, int], list[tuple[int, float]]]


def _ladder_gaps(analytical: AnalyticalEstimator, sim: SimEstimator, model: str, axes: dict[str, object],
                 seq_len: int, micro_batches: int) -> list[tuple[int, float]]:
    """(GPUs, sim / analytical - 1) up the ladder, on H100 nodes, data-parallel over what tp x pp leaves."""
    spec = load_model(model)
    model_parallel = int(axes.get("tp", 1)) * int(axes.get("pp", 1))  # type: ignore[call-overload]
    checked = []
    for gpus in LADDER:
        if gpus < model_parallel:
            continue
        dp = gpus // model_parallel
        par = ParallelSpec.parse({**axes, "micro_batch": 1, "global_batch": dp * micro_batches, "seq_len": seq_len})
        job = make_job(spec, load_cluster("dgx-h100-80gb").with_num_gpus(gpus), par)
        graph = graph_for(job)
        expected = analytical.estimate(job, graph).iteration_time_s
        got = sim.estimate(job, graph).iteration_time_s
        checked.append((gpus, round(got / expected - 1.0, 4)))
    return checked


@pytest.fixture
def ladder_gaps() -> LadderGaps:
    return _ladder_gaps


def no_effect_engines() -> tuple[AnalyticalEstimator, SimEstimator]:
    """The analytical engine and the simulator over the package's fit with the runtime effects off (no overlap
    slow-down, no bandwidth sharing): the pair the scale-agreement tests hold within 2% of each other."""
    cal = load_calibration()
    no_effects = cal.model_copy(update={"sim_runtime": None,
                                        "runtime": cal.runtime.model_copy(update={"overlap_slowdown": 0.0})})
    pricer = Pricer(no_effects)
    return AnalyticalEstimator(pricer), SimEstimator(pricer, overlap=False, sharing=False)


def three_table_dlrm_job(batch: int = 16) -> "ShardedDlrmJob":
    """A DLRM of three small tables on 2 local CPU ranks: two table-wise, one data-parallel (fp32)."""
    from trainsim.embedding.sharding import ShardingPlan, TableShard
    from trainsim.embedding.tables import Table
    from trainsim.frontends.catalog.sharded_dlrm import dlrm_model, sharded_job
    from trainsim.ir.model_spec import EmbeddingTable

    tables = (Table(0, 1000, 16, 4.0), Table(1, 500, 16, 2.0), Table(2, 200, 16, 1.0))
    plan = ShardingPlan(2, 2, (TableShard(tables[0], "table-wise", (0,)), TableShard(tables[1], "table-wise", (1,)),
                               TableShard(tables[2], "data-parallel", (0, 1))))
    model = dlrm_model("three", tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling)
                                      for t in tables))
    return sharded_job(model, plan, load_cluster("local-cpu"), batch, precision="fp32")


REPO_ROOT = Path(__file__).resolve().parents[1]


def module_from_file(relative_path: str) -> ModuleType:
    """Import a file of the repository that is no package module (a script, a shipped model factory) by its path
    under the repository root, as a module named after its stem."""
    path = REPO_ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
