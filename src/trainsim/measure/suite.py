"""The local ground-truth suite: small GPT and LLaMA jobs that cover every strategy the harness measures, sized
to run on a 2-core machine in minutes (at most 4 ranks, one intra-op thread each).

`trainsim measure --suite local --out DIR [--repeats 2]` measures each job `repeats` times (run ids
JOB.r1, JOB.r2, ...), skipping every run whose result file already exists (resumable), and
`trainsim validate DIR` scores the engines against them. Documented in docs/measure.md.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.catalog import load_cluster
from trainsim.catalog.model_files import parse_model
from trainsim.errors import UnknownNameError
from trainsim.ir.model_spec import TransformerSpec
from trainsim.job import Job, make_job
from trainsim.measure.launch import launch, make_spec
from trainsim.measure.results import MeasuredRun, load_run, measured_stack, result_path
from trainsim.strategy.parallel import ParallelSpec

LOCAL_CLUSTER = "local-cpu"
# Layouts as the calibration rows' arch defaults (catalog/data/calibration/row_defaults.yaml), so a measured
# run read back as a runs.csv row (validate/measured.py) rebuilds exactly this model.
SUITE_MODELS: dict[str, dict[str, Any]] = {
    "gpt-small": {"name": "gpt-small", "arch": "gpt", "num_layers": 4, "hidden": 256, "num_heads": 4,
                  "ffn_hidden": 1024, "vocab": 4096, "max_seq_len": 128, "mlp": "gelu", "norm": "layernorm",
                  "position": "learned", "bias": True, "tied_embeddings": True},
    "llama-small": {"name": "llama-small", "arch": "llama", "num_layers": 4, "hidden": 256, "num_heads": 4,
                    "num_kv_heads": 2, "ffn_hidden": 768, "vocab": 4096, "max_seq_len": 128, "mlp": "swiglu",
                    "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": False},
}
# optimizer_impl: torch.optim's default on a CPU, which the committed ground truth ran
BASE = {"micro_batch": 4, "seq_len": 128, "optimizer_impl": "loop"}


@dataclass(frozen=True, slots=True)
class SuiteJob:
    name: str
    model: str  # a key of SUITE_MODELS
    num_gpus: int
    strategy: dict[str, Any] = field(default_factory=dict)

    def job(self) -> Job:
        model = parse_model(SUITE_MODELS[self.model], f"suite model {self.model}")
        cluster = load_cluster(LOCAL_CLUSTER).with_num_gpus(self.num_gpus).on_one_node()
        parallel = ParallelSpec.parse({**BASE, **self.strategy}, f"suite job {self.name}")
        return make_job(model, cluster, parallel, measured_stack(make_job(model, cluster, parallel).parallel))


def _jobs(model: str, short: str, precision: str, *specs: tuple[str, int, dict[str, Any]]) -> list[SuiteJob]:
    return [SuiteJob(f"{short}-{name}-{precision.removeprefix('amp-')}", model, ranks,
                     {"precision": precision, **strategy}) for name, ranks, strategy in specs]


PP4 = {"global_batch": 16}  # 4 micro-batches through 2 stages
LOCAL_SUITE: tuple[SuiteJob, ...] = tuple(
    _jobs("gpt-small", "gpt", "fp32",
          ("1rank", 1, {}),
          ("dp2", 2, {"dp": 2}),
          ("dp2-recompute", 2, {"dp": 2, "recompute": "full"}),
          ("fsdp2", 2, {"dp": 2, "zero": 3}),
          ("tp2", 2, {"tp": 2}),
          ("tp2-sp", 2, {"tp": 2, "sp": True}),
          ("pp2-gpipe", 2, {"pp": 2, "schedule": "gpipe", **PP4}),
          ("pp2-1f1b", 2, {"pp": 2, "schedule": "1f1b", **PP4}),
          ("pp2-interleaved", 2, {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", **PP4}),
          ("dp2-pp2", 4, {"dp": 2, "pp": 2, "global_batch": 32}))
    + _jobs("gpt-small", "gpt", "amp-bf16",
            ("1rank", 1, {}),
            ("dp2", 2, {"dp": 2}))
    + _jobs("llama-small", "llama", "amp-bf16",
            ("1rank", 1, {}),
            ("dp2", 2, {"dp": 2}),
            ("fsdp2", 2, {"dp": 2, "zero": 3}),
            ("tp2-sp", 2, {"tp": 2, "sp": True}),
            ("pp2-1f1b", 2, {"pp": 2, "schedule": "1f1b", **PP4}))
    + _jobs("llama-small", "llama", "fp32",
            ("dp2", 2, {"dp": 2}))
)
SUITES: dict[str, tuple[SuiteJob, ...]] = {"local": LOCAL_SUITE}


def suite_jobs(name: str) -> tuple[SuiteJob, ...]:
    if name not in SUITES:
        raise UnknownNameError("suite", name, list(SUITES))
    return SUITES[name]


def run_id(job: SuiteJob, repeat: int) -> str:
    return f"{job.name}.r{repeat}"


@dataclass(frozen=True, slots=True)
class SuiteRun:
    job: SuiteJob
    repeat: int
    run: MeasuredRun
    skipped: bool  # the result file existed: not measured again


Progress = Callable[[str, bool], None]  # (run id, skipped) after each run
Tick = Callable[[], None]


def run_suite(name: str, out_dir: Path, *, repeats: int = 2, iterations: int = 20, warmup: int = 5,
              timeout_s: float = 300.0, progress: Progress | None = None, tick: Tick | None = None,
              only: tuple[str, ...] = ()) -> list[SuiteRun]:
    """Measure every job `repeats` times (repeats interleaved: all jobs once, then all again, so slow drifts of
    the machine's load show up as run-to-run spread rather than as differences between jobs)."""
    jobs = [j for j in suite_jobs(name) if not only or j.name in only]
    done: list[SuiteRun] = []
    for repeat in range(1, repeats + 1):
        for job in jobs:
            rid = run_id(job, repeat)
            path = result_path(out_dir, rid)
            skipped = path.exists()
            if not skipped:
                built = job.job()
                spec = make_spec(built, out_dir, run_id=rid, iterations=iterations, warmup=warmup,
                                 timeout_s=timeout_s, device="cpu",
                                 labels={"suite": name, "job": job.name, "repeat": str(repeat)})
                path = launch(spec, built.num_gpus, on_tick=tick)
            done.append(SuiteRun(job, repeat, load_run(path), skipped))
            if progress:
                progress(rid, skipped)
    return done


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job over its repeats: the median of the per-run medians, p10/p90 over every timed iteration of
    every repeat, and the run-to-run spread (max - min of the per-run medians, over their mean)."""

    name: str
    ranks: int
    runs: int
    median_s: float
    p10_s: float
    p90_s: float
    run_medians_s: tuple[float, ...]
    spread_pct: float
    tokens_per_s: float
    peak_memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def summarize_suite(runs: list[SuiteRun]) -> list[JobSummary]:
    by_job: dict[str, list[SuiteRun]] = {}
    for r in runs:
        by_job.setdefault(r.job.name, []).append(r)
    out = []
    for name, group in by_job.items():
        medians = tuple(r.run.stats.median_s for r in group)
        times = np.concatenate([np.asarray(r.run.iteration_times_s) for r in group])
        p10, p90 = (float(v) for v in np.percentile(times, [10, 90]))
        median = float(np.median(medians))
        spread = (max(medians) - min(medians)) / float(np.mean(medians)) * 100 if len(medians) > 1 else 0.0
        first = group[0].run
        out.append(JobSummary(name, first.world_size, len(group), median, p10, p90, medians, spread,
                              first.tokens_per_iteration / median,
                              max(r.run.max_peak_memory_bytes for r in group)))
    return out


SUITE_PROFILE_DB = "profile.db"
def describe_suite(name: str) -> list[tuple[str, str]]:
    """(job name, strategy) for the docs and `--suite NAME --list`."""
    rows = []
    for job in suite_jobs(name):
        built = job.job()
        assert isinstance(built.model, TransformerSpec)
        rows.append((job.name, f"{built.model.name} x {built.num_gpus} ranks: {built.parallel.describe()}"))
    return rows
