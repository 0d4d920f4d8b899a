"""Measured stage latencies in the profile database (a `stage_times` table next to profile.database's op and
collective tables), and the "measured" stage cost source of the stage planners.

A row is keyed by the model (its spec, hashed), the pipeline micro-batch and sequence length, the stage (unit
range, mesh, intra plan) and the thread count; every measurement is its own transaction, so an interrupted
collection loses at most the batch in flight and a rerun measures only what is missing (resumable, as
`trainsim profile` is). Only the standard library at import: torch is loaded when something is measured.
"""

import hashlib
import json
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainsim.ir.model_spec import DEEPSEEK_LAYOUT_FIELDS, TransformerSpec
from trainsim.measure.phase import fast_reference_s, phase_normalised_s
from trainsim.strategy.stage_plan import StageEstimate, StageSpec

if TYPE_CHECKING:
    from trainsim.measure.stage import StageTiming

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stage_times (
    model TEXT NOT NULL, micro_batch INTEGER NOT NULL, seq_len INTEGER NOT NULL, threads INTEGER NOT NULL,
    first INTEGER NOT NULL, end_unit INTEGER NOT NULL, nodes INTEGER NOT NULL, devices_per_node INTEGER NOT NULL,
    tp INTEGER NOT NULL, dp INTEGER NOT NULL, sp INTEGER NOT NULL,
    latency_s REAL NOT NULL, state_bytes REAL NOT NULL, activation_bytes REAL NOT NULL, samples TEXT NOT NULL,
    measured_at REAL NOT NULL,
    PRIMARY KEY (model, micro_batch, seq_len, threads, first, end_unit, nodes, devices_per_node, tp, dp, sp)
);
"""
_PHASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS stage_phase (
    model TEXT NOT NULL, micro_batch INTEGER NOT NULL, seq_len INTEGER NOT NULL, threads INTEGER NOT NULL,
    first INTEGER NOT NULL, end_unit INTEGER NOT NULL, nodes INTEGER NOT NULL, devices_per_node INTEGER NOT NULL,
    tp INTEGER NOT NULL, dp INTEGER NOT NULL, sp INTEGER NOT NULL,
    raw_latency_s REAL NOT NULL, references_s TEXT NOT NULL,
    PRIMARY KEY (model, micro_batch, seq_len, threads, first, end_unit, nodes, devices_per_node, tp, dp, sp)
);
"""
# stage_phase: for stages collected with a reference probe (`trainsim stages collect --phase-normalise`), the raw
# median and the probe's time around each run; stage_times' latency_s is then the phase-normalised latency. Made
# on the first probed stage, so databases collected without the probe are left as they were.


def model_key(model: TransformerSpec) -> str:
    """The model's name and a hash of its full spec (two specs of one name never share rows). DeepSeek's layout
    came to the spec after stage databases were recorded: its fields are left out at their defaults, so a model
    that does not use them keeps the key (and the measured rows) it had."""
    spec = model.model_dump()
    for name in DEEPSEEK_LAYOUT_FIELDS:
        if spec[name] == TransformerSpec.model_fields[name].default:
            del spec[name]
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{model.name}:{digest}"


def _stage_key(stage: StageSpec) -> tuple[int, ...]:
    return (stage.first, stage.end, stage.mesh.nodes, stage.mesh.devices_per_node, stage.intra.tp, stage.intra.dp,
            int(stage.intra.sp))


@dataclass(frozen=True, slots=True)
class PhaseRow:
    key: tuple[int, ...]  # first, end, nodes, devices_per_node, tp, dp, sp
    raw_latency_s: float
    samples_s: list[float]
    references_s: list[float]


def normalise_phases(db: "StageDatabase", model: str, micro_batch: int, seq_len: int, threads: int) -> float:
    """Set every probed stage's latency_s to its phase-normalised latency, the fast-phase reference taken per mesh
    over all its probed stages of the model and shape (so a resumed collection is normalised as a whole; on
    several ranks the probe is the slowest rank's, slower than one rank's, so meshes do not share it); returns
    the fast-phase reference of the first mesh in key order (NaN when nothing was probed)."""
    by_mesh: dict[tuple[int, ...], list[PhaseRow]] = {}
    for row in db.phase_rows(model, micro_batch, seq_len, threads):
        by_mesh.setdefault(row.key[2:], []).append(row)  # key[2:]: nodes, devices_per_node, tp, dp, sp
    fast_by_mesh = {mesh: fast_reference_s([r for row in rows for r in row.references_s])
                    for mesh, rows in by_mesh.items()}
    for mesh, rows in by_mesh.items():
        for row in rows:
            db.set_latency(model, micro_batch, seq_len, threads, row.key,
                           phase_normalised_s(row.samples_s, row.references_s, fast_by_mesh[mesh]))
    return fast_by_mesh[min(fast_by_mesh)] if fast_by_mesh else float("nan")


class StageDatabase:
    """The stage_times table of one SQLite file (WAL, a transaction per row)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(_SCHEMA)

    def close(self) -> None:
        self.conn.close()

    def get(self, model: str, micro_batch: int, seq_len: int, threads: int, stage: StageSpec) -> StageEstimate | None:
        row = self.conn.execute(
            "SELECT latency_s, state_bytes, activation_bytes FROM stage_times WHERE model=? AND micro_batch=? AND "
            "seq_len=? AND threads=? AND first=? AND end_unit=? AND nodes=? AND devices_per_node=? AND tp=? AND "
            "dp=? AND sp=?", (model, micro_batch, seq_len, threads, *_stage_key(stage))).fetchone()
        return None if row is None else StageEstimate(*row)

    def put(self, model: str, micro_batch: int, seq_len: int, threads: int, stage: StageSpec,
            estimate: StageEstimate, samples: Iterable[float]) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO stage_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              (model, micro_batch, seq_len, threads, *_stage_key(stage), estimate.latency_s,
                               estimate.state_bytes, estimate.activation_bytes, json.dumps(list(samples)),
                               time.time()))

    def put_phase(self, model: str, micro_batch: int, seq_len: int, threads: int, stage: StageSpec,
                  raw_latency_s: float, references_s: Iterable[float]) -> None:
        self.conn.executescript(_PHASE_SCHEMA)
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO stage_phase VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              (model, micro_batch, seq_len, threads, *_stage_key(stage), raw_latency_s,
                               json.dumps(list(references_s))))

    def phase_rows(self, model: str, micro_batch: int, seq_len: int, threads: int) -> list[PhaseRow]:
        """Every probed stage of a model and shape: its key, raw median, runs and the probe around each run."""
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name='stage_phase'").fetchone() is None:
            return []
        rows = self.conn.execute(
            "SELECT p.first, p.end_unit, p.nodes, p.devices_per_node, p.tp, p.dp, p.sp, p.raw_latency_s, "
            "p.references_s, t.samples FROM stage_phase p JOIN stage_times t USING (model, micro_batch, seq_len, "
            "threads, first, end_unit, nodes, devices_per_node, tp, dp, sp) WHERE p.model=? AND p.micro_batch=? "
            "AND p.seq_len=? AND p.threads=?", (model, micro_batch, seq_len, threads)).fetchall()
        return [PhaseRow(tuple(r[:7]), r[7], json.loads(r[9]), json.loads(r[8])) for r in rows]

    def set_latency(self, model: str, micro_batch: int, seq_len: int, threads: int, key: tuple[int, ...],
                    latency_s: float) -> None:
        with self.conn:
            self.conn.execute(
                "UPDATE stage_times SET latency_s=? WHERE model=? AND micro_batch=? AND seq_len=? AND threads=? AND "
                "first=? AND end_unit=? AND nodes=? AND devices_per_node=? AND tp=? AND dp=? AND sp=?",
                (latency_s, model, micro_batch, seq_len, threads, *key))

    def count(self, model: str) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM stage_times WHERE model=?", (model,)).fetchone()[0])


# Passes over a batch of stages. In one pass (the stages in unit order, 5 iterations each) the MoE job's same-DAG
# stages came out up to 71% apart on 1 rank (median 48%), slower the later they were measured: the machine's load
# rose during the pass, and the exhaustive plan took the stages measured first (docs/planning.md, tenth session).
# Three passes in rotated order put every stage early, midway and late; 3 is the fewest with a median.
MEASURE_ROUNDS = 3


def measured_rounds(batch: list[StageSpec], rounds: int,
                    measure: Callable[[list[StageSpec]], list["StageTiming"]]) -> list["StageTiming"]:
    """`measure` the batch `rounds` times, pass r starting r / rounds of the way along (rotated), and give each
    stage the median of its passes' latencies (states and activations from the first pass; every sample kept)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: must be at least 1")
    passes: dict[StageSpec, list[StageTiming]] = {stage: [] for stage in batch}
    for r in range(rounds):
        shift = r * len(batch) // rounds
        order = batch[shift:] + batch[:shift]
        for stage, timing in zip(order, measure(order), strict=True):
            passes[stage].append(timing)
    out = []
    for stage in batch:
        done = passes[stage]
        out.append(replace(done[0], latency_s=statistics.median(t.latency_s for t in done),
                           samples_s=tuple(s for t in done for s in t.samples_s)))
    return out


@dataclass(slots=True)
class MeasuredStageCosts:
    """Stage estimates measured for real (measure.stage), kept in the database; `profiled_configurations`
    counts the stages this source measured or read (each distinct stage once)."""

    model: TransformerSpec
    micro_batch: int
    seq_len: int
    db: StageDatabase
    warmup: int = 2
    iterations: int = 5
    threads: int = 1
    # passes over a batch, each in another order, a stage's latency the median of its passes' (measured_rounds)
    rounds: int = MEASURE_ROUNDS
    measured_now: int = 0
    measure_wall_s: float = 0.0  # wall time spent measuring (rank start-up included)
    _seen: dict[StageSpec, StageEstimate | None] = field(default_factory=dict)

    @property
    def profiled_configurations(self) -> int:
        return len(self._seen)

    def _runnable(self, stage: StageSpec) -> bool:
        """What measure.stage runs: dp dividing the micro-batch; tp only over dense blocks dividing the heads."""
        if self.micro_batch % stage.intra.dp:
            return False
        tp = stage.intra.tp
        return tp == 1 or not (self.model.num_experts > 1 or self.model.num_heads % tp or self.model.vocab % tp
                               or self.model.ffn_hidden % tp)

    def prefetch(self, stages: Iterable[StageSpec]) -> None:
        """Measure every stage not yet in the database, batched per mesh size (one set of ranks per batch)."""
        from trainsim.measure.stage import measure_stages

        key = model_key(self.model)
        missing: dict[int, list[StageSpec]] = {}
        for stage in dict.fromkeys(stages):
            if stage in self._seen:
                continue
            if not self._runnable(stage):
                self._seen[stage] = None
                continue
            found = self.db.get(key, self.micro_batch, self.seq_len, self.threads, stage)
            if found is not None:
                self._seen[stage] = found
            else:
                missing.setdefault(stage.mesh.size, []).append(stage)
        for size in sorted(missing):
            batch = missing[size]
            start = time.perf_counter()
            timings = measured_rounds(batch, self.rounds, lambda order: measure_stages(
                self.model, order, self.micro_batch, self.seq_len, self.warmup, self.iterations,
                threads=self.threads))
            self.measure_wall_s += time.perf_counter() - start
            for stage, timing in zip(batch, timings, strict=True):
                estimate = StageEstimate(timing.latency_s, timing.state_bytes, timing.activation_bytes)
                self.db.put(key, self.micro_batch, self.seq_len, self.threads, stage, estimate, timing.samples_s)
                self._seen[stage] = estimate
                self.measured_now += 1

    def estimate(self, stage: StageSpec) -> StageEstimate | None:
        if stage not in self._seen:
            self.prefetch([stage])
        return self._seen[stage]

    def cost_detail(self) -> dict[str, object]:
        """Stages measured in this run and the wall time their measurement took."""
        return {"measured_now": self.measured_now, "measure_wall_s": self.measure_wall_s}
