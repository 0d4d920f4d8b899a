"""A DLRM measuring campaign (Lin et al. Sec. IV-B: generated tasks x batch sizes x ranks, one or every sharder of
Table III), as `trainsim measure --generated N | --dlrm-tasks FILE` and the recsys scripts run it.

Per task and number of ranks, every (sharder, batch) config not yet in the campaign's CSV is measured in one
process group (measure.dlrm), interleaved by default (one iteration of each config in turn, so a change in the
host's load falls on all of them alike). After each group the CSV (one row per config) and the traces JSONL (the
per-rank spans measure.dlrm records, the input of estimate.trace_predict) are rewritten whole through a temporary
file (catalog.files.write_atomic): an interrupted campaign leaves every file as it was after the last group, and
rerunning the same command skips the configs already there. With trace_root, one more iteration of every config
is recorded as PyTorch execution traces (measure.dlrm_trace) in trace_root/<config>/, the input of the trace
front-end's predictive simulation (frontends.trace.dlrm_predicted).
"""

import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.catalog.files import read_mapping, write_atomic
from trainsim.embedding.sharders import MEMORY_CAP_FRACTION, SHARDERS, shard
from trainsim.embedding.synthetic import TaskKind, generate_task
from trainsim.embedding.tables import Table
from trainsim.errors import ConfigError
from trainsim.ir.model_spec import DlrmSpec, EmbeddingTable
from trainsim.measure.dlrm import MAX_TRACED_ITERATIONS, DlrmConfig, DlrmMeasurement, measure_dlrm
from trainsim.measure.results import usable_cores

# cores: the host's usable cores when measured (measure.results.usable_cores): ranks beyond them take turns on
# them (hardware.device.core_share); empty in rows measured before it was recorded
FIELDS = ("experiment", "ranks", "task", "kind", "seed", "tables", "sharder", "local_batch", "measured_s",
          "fastest_s", "load_before", "load_after", "cores")
KEY = ("ranks", "task", "sharder", "local_batch")  # a config: a CSV row is skipped on a rerun when its key is there
TASK_KINDS = ("heavy", "normal")
MIXES = ("mixed", "heavy", "normal")
NORMAL_SEED0 = 100  # generated normal tasks take seeds 100, 101, ... (heavy: 0, 1, ...), as the recsys campaigns
MAX_TASKS = 1000
MAX_RANKS = 64
MAX_BATCH = 1 << 20
MAX_SEED = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CampaignTask:
    """A generated task (embedding.synthetic.generate_task): its kind and seed; its tables depend on the ranks."""

    kind: TaskKind
    seed: int

    def __post_init__(self) -> None:
        if self.kind not in TASK_KINDS:
            raise ConfigError("task.kind", self.kind, f"choose one of: {', '.join(TASK_KINDS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("task.seed", self.seed, f"an integer from 0 to {MAX_SEED}")

    def name(self, ranks: int) -> str:
        """The name of the task's DLRM on `ranks` ranks: <kind><seed>-r<ranks>."""
        return f"{self.kind}{self.seed}-r{ranks}"

    def model(self, ranks: int) -> tuple[DlrmSpec, tuple[Table, ...]]:
        """The task's DLRM on `ranks` ranks (named as name(ranks)) and its tables."""
        from trainsim.frontends.catalog.sharded_dlrm import dlrm_model

        tables = generate_task(self.kind, ranks, self.seed)
        specs = tuple(EmbeddingTable(rows=t.rows, dim=t.dim, pooling_factor=t.pooling, zipf_alpha=t.zipf_alpha)
                      for t in tables)
        return dlrm_model(self.name(ranks), specs), tables


def generated_tasks(count: int, mix: str = "mixed") -> list[CampaignTask]:
    """`count` generated tasks: heavy (seeds 0, 1, ...), normal (seeds 100, 101, ...) or mixed (heavy and normal
    alternated, so that a partial campaign covers both: 20 = 10 heavy + 10 normal, Lin et al. Sec. IV-B1)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_TASKS:
        raise ConfigError("generated", count, f"a number of tasks from 1 to {MAX_TASKS}")
    if mix not in MIXES:
        raise ConfigError("task_kind", mix, f"choose one of: {', '.join(MIXES)}")
    if mix == "heavy":
        return [CampaignTask("heavy", i) for i in range(count)]
    if mix == "normal":
        return [CampaignTask("normal", NORMAL_SEED0 + i) for i in range(count)]
    return [CampaignTask("heavy", i // 2) if i % 2 == 0 else CampaignTask("normal", NORMAL_SEED0 + i // 2)
            for i in range(count)]


def read_task_file(path: Path) -> list[CampaignTask]:
    """A task file: `tasks:` a list of {kind: heavy|normal, seed: N} (generated tasks)."""
    data = read_mapping(path)
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks or len(tasks) > MAX_TASKS:
        raise ConfigError("dlrm_tasks", str(path), f"a YAML file with `tasks:` a list of 1 to {MAX_TASKS} "
                          "{kind: heavy|normal, seed: N}")
    out = []
    for index, entry in enumerate(tasks):
        if not isinstance(entry, dict) or set(entry) != {"kind", "seed"}:
            raise ConfigError(f"tasks[{index}]", entry, "a mapping with exactly the keys kind and seed")
        out.append(CampaignTask(entry["kind"], entry["seed"]))
    if len(set(out)) != len(out):
        raise ConfigError("dlrm_tasks", str(path), "lists a task twice")
    return out


@dataclass(frozen=True, slots=True)
class Campaign:
    """What to measure: every task x ranks x sharder x batch. interleave: a task's configs on one number of ranks
    measured one iteration each in turn (measure.dlrm's group); else one after another."""

    tasks: tuple[CampaignTask, ...]
    batches: tuple[int, ...] = (32, 128)
    ranks: tuple[int, ...] = (2, 4)
    sharders: tuple[str, ...] = ("size-lookup-greedy",)
    iterations: int = 5
    warmup: int = 1
    allocator: str = "keep"
    probes: tuple[str, ...] = ()
    interleave: bool = True
    experiment: str = "e2e"  # the CSV's experiment column
    cap_fraction: float = MEMORY_CAP_FRACTION  # the sharders' per-rank memory cap, a share of the device's
    timeout_s: float = 600.0  # per process group
    traced_iterations: int = 1  # with a trace root: traced iterations per config (measure.dlrm.DlrmConfig)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("tasks", [], "give at least one task")
        _check_ints("batch", self.batches, 1, MAX_BATCH)
        _check_ints("ranks", self.ranks, 2, MAX_RANKS)
        for name in self.sharders:
            if name not in SHARDERS:
                raise ConfigError("sharder", name, f"choose one of: {', '.join(SHARDERS)}, or all")
        if not self.sharders or len(set(self.sharders)) != len(self.sharders):
            raise ConfigError("sharder", list(self.sharders), "one or more distinct sharders")
        if not 1 <= self.traced_iterations <= MAX_TRACED_ITERATIONS:
            raise ConfigError("traced_iterations", self.traced_iterations,
                              f"an integer from 1 to {MAX_TRACED_ITERATIONS}")
        if self.iterations < 1 or self.warmup < 0:
            raise ConfigError("iterations/warmup", (self.iterations, self.warmup),
                              "need iterations >= 1 and warmup >= 0")


def _check_ints(name: str, values: Sequence[int], low: int, high: int) -> None:
    if not values or len(set(values)) != len(values):
        raise ConfigError(name, list(values), "one or more distinct values")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(name, value, f"an integer from {low} to {high}")


def parse_int_list(name: str, text: str) -> tuple[int, ...]:
    """'32,128' -> (32, 128); anything else is refused naming the flag."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(name, text, "comma-separated integers, e.g. 32,128") from None


@dataclass(frozen=True, slots=True)
class PlannedConfig:
    """One config of the campaign: its CSV key fields and what measure.dlrm runs."""

    row: dict[str, Any]  # the CSV fields known before measuring
    config: DlrmConfig

    @property
    def key(self) -> tuple[str, ...]:
        return row_key(self.row)


def row_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """A config's KEY fields of a CSV row (or a planned one's), as the CSV holds them."""
    return tuple(str(row[k]) for k in KEY)


def campaign_keys(campaign: Campaign) -> set[tuple[str, ...]]:
    """The row_key of every config of the campaign."""
    return {(str(r), t.name(r), s, str(b)) for t in campaign.tasks for r in campaign.ranks
            for s in campaign.sharders for b in campaign.batches}


def planned_configs(campaign: Campaign, task: CampaignTask, ranks: int, trace_root: Path | None = None
                    ) -> list[PlannedConfig]:
    """The task's configs on `ranks` ranks, sharder by sharder, batch by batch."""
    from trainsim.catalog import load_cluster

    model, tables = task.model(ranks)
    cap = campaign.cap_fraction * load_cluster("local-cpu").device.hbm_bytes
    dense = {"dense_features": model.dense_features, "bottom_mlp": list(model.bottom_mlp),
             "top_mlp": list(model.top_mlp)}
    out = []
    for sharder in campaign.sharders:
        plan = shard(tables, sharder, ranks, cap_bytes=cap, seed=task.seed)
        for batch in campaign.batches:
            row = {"experiment": campaign.experiment, "ranks": ranks, "task": model.name, "kind": task.kind,
                   "seed": task.seed, "tables": len(tables), "sharder": sharder, "local_batch": batch}
            folder = "" if trace_root is None else str(trace_root / f"{model.name}-{sharder}-b{batch}")
            out.append(PlannedConfig(row, DlrmConfig(f"{model.name}/{sharder}/{batch}", plan, batch, dense,
                                                     seed=1, trace_dir=folder,
                                                     traced_iterations=campaign.traced_iterations)))
    return out


@dataclass(slots=True)
class CampaignFiles:
    """The campaign's CSV and traces JSONL, held in memory and rewritten whole after every group."""

    csv_path: Path
    traces_path: Path
    rows: list[dict[str, str]] = field(default_factory=list)
    trace_lines: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, csv_path: Path, traces_path: Path) -> "CampaignFiles":
        files = cls(csv_path, traces_path)
        if csv_path.exists():
            with csv_path.open(newline="") as handle:
                files.rows = list(csv.DictReader(handle))
            missing = set(KEY) - set(files.rows[0]) if files.rows else set()
            if missing:
                raise ConfigError("csv", str(csv_path), f"is not a campaign CSV (no {', '.join(sorted(missing))})")
        if traces_path.exists():
            files.trace_lines = [line for line in traces_path.read_text().splitlines() if line.strip()]
        return files

    def done(self) -> set[tuple[str, ...]]:
        return {row_key(row) for row in self.rows}

    def add(self, planned: PlannedConfig, m: DlrmMeasurement, warmup: int) -> None:
        self.rows.append({k: str(v) for k, v in {
            **planned.row, "measured_s": m.iteration_s, "fastest_s": min(m.iterations_s),
            "load_before": m.load_avg[0], "load_after": m.load_avg[1], "cores": usable_cores()}.items()})
        self.trace_lines.append(json.dumps(trace_record(planned, m, warmup)))

    def save(self) -> None:
        buffer = io.StringIO()
        fields = list(FIELDS) + [k for k in (self.rows[0] if self.rows else {}) if k not in FIELDS]
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.csv_path, buffer.getvalue())
        write_atomic(self.traces_path, "".join(line + "\n" for line in self.trace_lines))


def trace_record(planned: PlannedConfig, m: DlrmMeasurement, warmup: int) -> dict[str, Any]:
    """One config's line of the traces JSONL: the slowest rank's iterations, the per-rank spans of the median
    iteration with their thread CPU times and page faults, the load, and (where recorded) the probes and the
    execution traces' folder with each rank's traced iteration."""
    record: dict[str, Any] = {"task": planned.row["task"], "sharder": planned.row["sharder"],
                              "local_batch": planned.row["local_batch"], "ranks": planned.row["ranks"],
                              "iterations_s": m.iterations_s, "events": m.rank_events, "cpu_s": m.rank_cpu_s,
                              "faults": m.rank_faults, "load": m.load_avg, "allocator": m.allocator,
                              "warmup": warmup}
    if m.rank_probe_s:
        record.update(rank_iterations_s=m.rank_iterations_s, probe_s=m.rank_probe_s)
    if planned.config.trace_dir:
        record.update(trace_dir=planned.config.trace_dir, traced_iterations=planned.config.traced_iterations,
                      rank_traced_s=m.rank_traced_s,
                      rank_iterations_s=m.rank_iterations_s)
    return record


Progress = Callable[[str, int], None]  # (what was measured, configs measured so far)


def campaign_size(campaign: Campaign) -> int:
    return len(campaign.tasks) * len(campaign.ranks) * len(campaign.sharders) * len(campaign.batches)


def run_campaign(campaign: Campaign, files: CampaignFiles, *, trace_root: Path | None = None,
                 budget_s: float = math.inf, progress: Progress | None = None) -> int:
    """Measure every config of the campaign not in `files` yet, task by task (each on every number of ranks,
    so a partial campaign covers them all); returns the configs measured. budget_s: no new group starts once
    this much time is spent."""
    began, measured = time.monotonic(), 0
    done = files.done()
    for task in campaign.tasks:
        for ranks in campaign.ranks:
            todo = [p for p in planned_configs(campaign, task, ranks, trace_root) if p.key not in done]
            if not todo:
                continue
            if time.monotonic() - began > budget_s:
                return measured
            results = measure_dlrm([p.config for p in todo], iterations=campaign.iterations,
                                   warmup=campaign.warmup, timeout_s=campaign.timeout_s,
                                   group=len(todo) if campaign.interleave else 1, allocator=campaign.allocator,
                                   probes=campaign.probes)
            for planned, result in zip(todo, results, strict=True):
                files.add(planned, result, campaign.warmup)
                done.add(planned.key)
            files.save()
            measured += len(todo)
            if progress is not None:
                load = results[0].load_avg
                progress(f"{todo[0].row['task']}: {len(todo)} configs, load {load[0]:.1f}->{load[1]:.1f}",
                         measured)
    return measured


def sharders_from(name: str) -> tuple[str, ...]:
    """--sharder NAME or all (the six of Table III)."""
    if name == "all":
        return tuple(SHARDERS)
    if name not in SHARDERS:
        raise ConfigError("sharder", name, f"choose one of: {', '.join(SHARDERS)}, or all")
    return (name,)
