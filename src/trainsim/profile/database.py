"""The profile database: measured op and collective times in one SQLite file.

Rows are keyed by what was measured (op signature, or collective + ranks + message size) and by where it was
measured: the trainsim device name, the library versions (torch) and the intra-op thread count, which changes CPU
timings by integer factors. The file is opened in WAL mode and every measurement is its own transaction, so a
killed `trainsim profile` loses at most the measurement in flight and a rerun skips everything already stored.

Only the standard library is imported here: `trainsim predict --costs profiled` reads this file without torch.
"""

import json
import os
import sqlite3
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.catalog.files import shown_path
from trainsim.errors import InputFileError
from trainsim.measure.phase import pair_means_s, phase_scaled_s
from trainsim.profile.paths import default_db_path

SCHEMA_VERSION = "1"
STOP_AFTER_ENV = "TRAINSIM_PROFILE_STOP_AFTER"  # test hook: exit hard after N stored measurements
STOP_EXIT_CODE = 75

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS op_times (
    device TEXT NOT NULL, versions TEXT NOT NULL, threads INTEGER NOT NULL,
    kind TEXT NOT NULL, impl TEXT NOT NULL, phase TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL,
    size REAL NOT NULL, median_s REAL NOT NULL, p10_s REAL NOT NULL, p90_s REAL NOT NULL,
    repeats INTEGER NOT NULL, detail TEXT NOT NULL, hardware TEXT NOT NULL, measured_at REAL NOT NULL,
    samples TEXT NOT NULL,
    PRIMARY KEY (device, versions, threads, kind, impl, phase, dtype, shape)
);
CREATE TABLE IF NOT EXISTS collective_times (
    device TEXT NOT NULL, versions TEXT NOT NULL, threads INTEGER NOT NULL,
    backend TEXT NOT NULL, collective TEXT NOT NULL, world_size INTEGER NOT NULL, message_bytes INTEGER NOT NULL,
    median_s REAL NOT NULL, p10_s REAL NOT NULL, p90_s REAL NOT NULL, repeats INTEGER NOT NULL,
    hardware TEXT NOT NULL, measured_at REAL NOT NULL,
    PRIMARY KEY (device, versions, threads, backend, collective, world_size, message_bytes)
);
CREATE TABLE IF NOT EXISTS op_phase (
    device TEXT NOT NULL, versions TEXT NOT NULL, threads INTEGER NOT NULL,
    kind TEXT NOT NULL, impl TEXT NOT NULL, phase TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL,
    samples TEXT NOT NULL, probe_pairs TEXT NOT NULL,
    PRIMARY KEY (device, versions, threads, kind, impl, phase, dtype, shape)
);
CREATE TABLE IF NOT EXISTS state_census (
    model TEXT NOT NULL, samples INTEGER NOT NULL, layer INTEGER NOT NULL,
    params REAL NOT NULL, zero_state_params REAL NOT NULL, steps INTEGER NOT NULL,
    detail TEXT NOT NULL, measured_at REAL NOT NULL,
    PRIMARY KEY (model, samples, layer)
);
"""


@dataclass(frozen=True, slots=True)
class Environment:
    """Where a measurement was taken. device: the trainsim device name (catalog/data/devices); versions: the
    library versions that produced the kernels ("torch 2.13.0+cpu"); hardware: what the machine reports."""

    device: str
    versions: str
    threads: int
    hardware: str = ""

    def describe(self) -> str:
        return f"{self.device} ({self.hardware or 'unknown hardware'}), {self.versions}, {self.threads} threads"


@dataclass(frozen=True, slots=True)
class OpSignature:
    """What an op measurement is keyed by. impl: the kernel that stands in for the op ("mm", "mm.wgrad",
    "sdpa.causal", "norm", "gelu" ...); shape: the trainsim Op shape (matmul (batch, m, n, k), attention
    (batch*heads, q, kv, head_dim), pointwise (elements,))."""

    kind: str
    impl: str
    phase: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> float:
        """The product of the shape: elements for pointwise ops, proportional to FLOPs for matmul/attention.
        Interpolation between measured sizes runs on this."""
        product = 1.0
        for dim in self.shape:
            product *= dim
        return product

    @property
    def shape_text(self) -> str:
        return "x".join(str(d) for d in self.shape)

    def describe(self) -> str:
        return f"{self.phase} {self.impl} {self.dtype} [{self.shape_text}]"


@dataclass(frozen=True, slots=True)
class TimingStats:
    """Seconds per call over `repeats` samples (each sample averages `inner` back-to-back calls)."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    inner: int = 1

    @classmethod
    def of(cls, samples: list[float], inner: int = 1) -> "TimingStats":
        assert samples, "no samples"
        ordered = sorted(samples)
        if len(ordered) == 1:
            return cls(ordered[0], ordered[0], ordered[0], 1, inner)
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        return cls(statistics.median(ordered), deciles[0], deciles[-1], len(ordered), inner)


@dataclass(frozen=True, slots=True)
class OpRow:
    env: Environment
    signature: OpSignature
    stats: TimingStats
    detail: str


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    env: Environment
    backend: str
    collective: str
    world_size: int
    message_bytes: int
    stats: TimingStats


@dataclass(frozen=True, slots=True)
class StateCensus:
    """Per layer instance (the op graph's expanded index), its parameters and, of them, the mean count whose
    optimizer state (exp_avg_sq) is exactly zero over the timed steps of a run of `steps` steps on `samples`
    samples per step (profile/state_census.py)."""

    model: str
    samples: int
    steps: int
    layers: dict[int, tuple[float, float]]
    detail: str = ""

    @property
    def zero_state_share(self) -> float:
        params = sum(p for p, _ in self.layers.values())
        return sum(z for _, z in self.layers.values()) / params if params > 0 else 0.0


def parse_shape(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("x")) if text else ()


class ProfileDB:
    """A connection to one profile database. Use ProfileDB.open (read-write, creates the file) or
    ProfileDB.open_read_only (for cost lookups: a missing file is an error with a remedy)."""

    def __init__(self, connection: sqlite3.Connection, path: Path, stop_after: int | None = None) -> None:
        self._conn = connection
        self.path = path
        self.stop_after = stop_after
        self.stored = 0  # measurements stored through this connection

    @classmethod
    def open(cls, path: Path, stop_after: int | None = None) -> "ProfileDB":
        """Open (creating the file and its folder if needed) for writing. stop_after: exit the process hard
        (os._exit) right after that many measurements are committed; the interrupted-run test uses it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        except sqlite3.Error as exc:  # a folder, a file that is no SQLite database, a read-only place
            raise InputFileError(f"cannot open the profile database {shown_path(path)}: {exc}") from None
        cls._check_version(conn, path)
        return cls(conn, path, stop_after)

    @classmethod
    def open_read_only(cls, path: Path) -> "ProfileDB":
        if not path.exists():
            if path == default_db_path():
                hint = "run `trainsim profile` first (it writes there), or pass --db with a profile database"
            else:
                hint = (f"run `trainsim profile --db {path}` first, or leave out --db to use the default "
                        f"({default_db_path()})")
            raise InputFileError(f"profile database {path} does not exist: {hint}")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
            conn.execute("SELECT count(*) FROM op_times").fetchone()
        except sqlite3.DatabaseError as exc:
            raise InputFileError(f"{path} is not a trainsim profile database: {exc}") from None
        cls._check_version(conn, path)
        return cls(conn, path)

    @staticmethod
    def _check_version(conn: sqlite3.Connection, path: Path) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and row[0] != SCHEMA_VERSION:
            raise InputFileError(f"{path} has profile schema {row[0]}, this trainsim reads {SCHEMA_VERSION}: "
                                 "profile again into a new file")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ProfileDB":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- writing: one transaction per measurement ---

    def op_repeats(self, env: Environment, sig: OpSignature) -> int:
        """Samples stored for the signature in the environment (0: not measured)."""
        row = self._conn.execute(
            "SELECT repeats FROM op_times WHERE device=? AND versions=? AND threads=? AND kind=? AND impl=? "
            "AND phase=? AND dtype=? AND shape=?",
            (env.device, env.versions, env.threads, sig.kind, sig.impl, sig.phase, sig.dtype, sig.shape_text),
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def has_op(self, env: Environment, sig: OpSignature) -> bool:
        return self.op_repeats(env, sig) > 0

    def add_op_samples(self, env: Environment, sig: OpSignature, samples: list[float], detail: str = "") -> TimingStats:
        """Store samples (seconds per call) of one op, merged with the ones already stored, in one transaction;
        the median and p10/p90 are over all of them."""
        key = (env.device, env.versions, env.threads, sig.kind, sig.impl, sig.phase, sig.dtype, sig.shape_text)
        with self._conn:  # NB: isolation_level=None + `with` = one BEGIN/COMMIT per measurement
            self._conn.execute("BEGIN IMMEDIATE")
            row = self._conn.execute(
                "SELECT samples FROM op_times WHERE device=? AND versions=? AND threads=? AND kind=? AND impl=? "
                "AND phase=? AND dtype=? AND shape=?", key).fetchone()
            merged = (json.loads(row[0]) if row is not None else []) + list(samples)
            stats = TimingStats.of(merged)
            self._conn.execute(
                "INSERT OR REPLACE INTO op_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (*key, sig.size, stats.median_s, stats.p10_s, stats.p90_s, stats.repeats, detail, env.hardware,
                 time.time(), json.dumps(merged)),
            )
        self._stored()
        return stats

    def add_op_probes(self, env: Environment, sig: OpSignature, samples: list[float],
                      pairs_s: list[tuple[float, float]]) -> None:
        """The raw samples of one op measured with the reference probe (measure.phase) and the probe's thread CPU
        time just before and just after each, merged with the ones stored (op_phase: made by every open, filled
        only by a probed profile)."""
        if len(samples) != len(pairs_s):
            raise ValueError(f"{len(samples)} samples and {len(pairs_s)} probe pairs: one per sample")
        key = (env.device, env.versions, env.threads, sig.kind, sig.impl, sig.phase, sig.dtype, sig.shape_text)
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            row = self._conn.execute(
                "SELECT samples, probe_pairs FROM op_phase WHERE device=? AND versions=? AND threads=? AND kind=? "
                "AND impl=? AND phase=? AND dtype=? AND shape=?", key).fetchone()
            old_samples, old_pairs = (json.loads(row[0]), json.loads(row[1])) if row is not None else ([], [])
            self._conn.execute("INSERT OR REPLACE INTO op_phase VALUES (?,?,?,?,?,?,?,?,?,?)",
                               (*key, json.dumps(old_samples + list(samples)),
                                json.dumps(old_pairs + [list(p) for p in pairs_s])))

    def op_phase_rows(self) -> list[tuple[tuple[str, ...], list[float], list[list[float]]]]:
        """(op_times key, raw samples, probe pairs) of every op profiled with the probe."""
        try:
            rows = self._conn.execute("SELECT * FROM op_phase").fetchall()
        except sqlite3.OperationalError:  # a read-only database from before the table
            return []
        return [(tuple(row[:8]), json.loads(row[8]), json.loads(row[9])) for row in rows]

    def probe_timings_s(self) -> list[float]:
        """Every probe timing of the op_phase table."""
        return [t for _, _, pairs in self.op_phase_rows() for pair in pairs for t in pair]

    def op_samples(self, key: tuple[Any, ...]) -> list[float]:
        """One op's stored samples (op_times key: device, versions, threads, kind, impl, phase, dtype, shape)."""
        row = self._conn.execute(
            "SELECT samples FROM op_times WHERE device=? AND versions=? AND threads=? AND kind=? AND impl=? AND "
            "phase=? AND dtype=? AND shape=?", key).fetchone()
        return json.loads(row[0]) if row is not None else []

    def replace_op_samples(self, key: tuple[Any, ...], samples: list[float]) -> None:
        """Set one op's stored samples (and its median and deciles) to `samples`."""
        stats = TimingStats.of(samples)
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "UPDATE op_times SET median_s=?, p10_s=?, p90_s=?, repeats=?, samples=? WHERE device=? AND "
                "versions=? AND threads=? AND kind=? AND impl=? AND phase=? AND dtype=? AND shape=?",
                (stats.median_s, stats.p10_s, stats.p90_s, stats.repeats, json.dumps(samples), *key))

    def normalise_op_phases(self, fast_s: float, reference: str = "mean") -> int:
        """Rewrite every probed op's samples as phase-normalised ones (measure.phase.phase_scaled_s: each sample x
        fast_s / the mean of the probe just before and just after it, or the one before: measure.phase.
        pair_means_s's reference); returns the ops rewritten. An op whose
        stored samples are not all probed (op_times holds more than op_phase) is refused."""
        rewritten = 0
        for key, samples, pairs in self.op_phase_rows():
            stored = self._conn.execute(
                "SELECT repeats FROM op_times WHERE device=? AND versions=? AND threads=? AND kind=? AND impl=? "
                "AND phase=? AND dtype=? AND shape=?", key).fetchone()
            if stored is None:
                continue
            if int(stored[0]) != len(samples):
                raise ValueError(f"op {key}: {stored[0]} samples stored, {len(samples)} of them probed")
            self.replace_op_samples(key, phase_scaled_s(samples, pair_means_s(pairs, reference), fast_s))
            rewritten += 1
        return rewritten

    def has_collective(self, env: Environment, backend: str, collective: str, world_size: int,
                       message_bytes: int) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM collective_times WHERE device=? AND versions=? AND threads=? AND backend=? "
            "AND collective=? AND world_size=? AND message_bytes=?",
            (env.device, env.versions, env.threads, backend, collective, world_size, message_bytes),
        ).fetchone()
        return row is not None

    def put_collective(self, env: Environment, backend: str, collective: str, world_size: int, message_bytes: int,
                       stats: TimingStats) -> None:
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR REPLACE INTO collective_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (env.device, env.versions, env.threads, backend, collective, world_size, message_bytes,
                 stats.median_s, stats.p10_s, stats.p90_s, stats.repeats, env.hardware, time.time()),
            )
        self._stored()

    def _stored(self) -> None:
        self.stored += 1
        if self.stop_after is not None and self.stored >= self.stop_after:
            self._conn.close()
            os._exit(STOP_EXIT_CODE)  # NB: deliberately hard, like a kill: no cleanup, no flush of anything else

    # --- reading ---

    def op_rows(self, device: str | None = None) -> Iterator[OpRow]:
        query = "SELECT * FROM op_times" + (" WHERE device=?" if device is not None else "")
        for row in self._conn.execute(query, () if device is None else (device,)):
            (dev, versions, threads, kind, impl, phase, dtype, shape, _size, median, p10, p90, repeats, detail,
             hardware, _at, _samples) = row
            yield OpRow(Environment(dev, versions, threads, hardware),
                        OpSignature(kind, impl, phase, dtype, parse_shape(shape)),
                        TimingStats(median, p10, p90, repeats), detail)

    def collective_rows(self, device: str | None = None) -> Iterator[CollectiveRow]:
        query = "SELECT * FROM collective_times" + (" WHERE device=?" if device is not None else "")
        for row in self._conn.execute(query, () if device is None else (device,)):
            dev, versions, threads, backend, collective, world, size, median, p10, p90, repeats, hardware, _ = row
            yield CollectiveRow(Environment(dev, versions, threads, hardware), backend, collective, world, size,
                                TimingStats(median, p10, p90, repeats))

    def put_state_census(self, census: "StateCensus") -> None:
        """Store a census of zero optimizer states (profile/state_census.py), replacing one of the same model and
        samples."""
        with self._conn:
            self._conn.execute("DELETE FROM state_census WHERE model=? AND samples=?", (census.model, census.samples))
            self._conn.executemany(
                "INSERT INTO state_census VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(census.model, census.samples, layer, params, zeros, census.steps, census.detail, time.time())
                 for layer, (params, zeros) in census.layers.items()])
        self.stored += 1

    def state_census_rows(self) -> Iterator["StateCensus"]:
        """Every stored census (none in a database written before the table existed, opened read-only)."""
        try:
            rows = self._conn.execute("SELECT model, samples, layer, params, zero_state_params, steps, detail "
                                      "FROM state_census ORDER BY model, samples, layer").fetchall()
        except sqlite3.OperationalError:
            return
        by_key: dict[tuple[str, int], StateCensus] = {}
        for model, samples, layer, params, zeros, steps, detail in rows:
            census = by_key.setdefault((model, samples), StateCensus(model, samples, steps, {}, detail))
            census.layers[layer] = (params, zeros)
        yield from by_key.values()

    def count(self, table: str = "op_times") -> int:
        assert table in ("op_times", "collective_times"), table
        return int(self._conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
