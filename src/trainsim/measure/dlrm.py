"""Measure DLRM iterations with sharded embedding tables on local gloo ranks (measure.dlrm_rank does one rank's
work). One process group runs a list of configurations (plan, batch) one after another, so 20 tasks cost one
start-up; a deadline bounds the run.

The iteration time of a configuration is the median, over its measured iterations, of the slowest rank's time
from the barrier to the end of its step. The per-rank spans of the median iteration come back as well: the
per-rank traces the predictive trace simulation reads. Beside them, per rank and span, the median over the
iterations of the span's thread CPU time (measure.dlrm_rank: the compute's work without the time other processes
held the cores), and the host's 1-minute load average before and after the run, so that every measured figure
says how loaded the host was. Each rank sets its malloc policy (measure.allocator) before torch loads. With
probes (measure.dlrm_probe), each rank's probe timings around every iteration come back too, and the run file
carries them with the phase-normalised iteration (measure.dlrm_phase) beside the raw one.
"""

import contextlib
import multiprocessing
import os
import queue
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np

from trainsim.embedding.sharding import ShardingPlan
from trainsim.errors import ConfigError, TrainsimError
from trainsim.measure.allocator import DEFAULT_POLICY, apply_policy, check_policy
from trainsim.measure.dlrm_phase import (
    campaign_fast_reference_s,
    check_probes,
    iteration_references_s,
    phase_normalised_iteration_s,
)
from trainsim.measure.launch import free_port

MAX_TRACED_ITERATIONS = 20


@dataclass(frozen=True, slots=True)
class DlrmConfig:
    name: str
    plan: ShardingPlan
    local_batch: int
    dense: dict[str, Any]  # dense_features, bottom_mlp (ending at the tables' dim), top_mlp
    seed: int = 0
    # a folder: one more iteration after the measured ones is traced there on every rank (measure.dlrm_trace)
    trace_dir: str = ""
    traced_iterations: int = 1  # with trace_dir: this many traced iterations, in trace_dir/t<k> when more than 1


@dataclass(frozen=True, slots=True)
class DlrmMeasurement:
    config: DlrmConfig
    iteration_s: float  # median over iterations of the slowest rank
    iterations_s: tuple[float, ...]
    rank_events: tuple[tuple[tuple[str, float, float], ...], ...]  # per rank: (op, start, end) of the median iteration
    rank_cpu_s: tuple[tuple[float, ...], ...] = ()  # per rank, per span: median thread CPU seconds over iterations
    load_avg: tuple[float, float] = (0.0, 0.0)  # the host's 1-minute load average before and after the run
    rank_faults: tuple[tuple[float, ...], ...] = ()  # per rank, per span: median minor page faults over iterations
    allocator: str = "system"  # the ranks' allocator policy (measure.allocator), as applied on every rank
    # per probe name (measure.dlrm_probe), per rank, per measured iteration: its thread CPU seconds just before the
    # iteration's barrier and just after its last step; empty when measured without probes
    rank_probe_s: dict[str, tuple[tuple[tuple[float, float], ...], ...]] = field(default_factory=dict)
    rank_iterations_s: tuple[tuple[float, ...], ...] = ()  # per rank, per measured iteration (wall seconds)
    rank_traced_s: tuple[tuple[float, ...], ...] = ()  # per rank, per traced iteration: wall seconds (trace_dir)

    def references_s(self, probe: str) -> list[float]:
        """Per iteration, the probe's reference (measure.dlrm_phase.iteration_references_s)."""
        return iteration_references_s(self.rank_probe_s[probe])


def check_dense(plan: ShardingPlan, dense: dict[str, Any]) -> None:
    """The dense part measure.dlrm_rank builds around the plan's tables, checked before any rank starts: one
    embedding dim for every table (the dot interaction), the bottom MLP ending at it, the top MLP at one logit
    (the binary cross-entropy loss)."""
    dims = sorted({s.table.dim for s in plan.shards})
    if len(dims) != 1:
        raise ConfigError("tables.dim", dims, "the dot interaction needs one dim for every table")
    if dense["bottom_mlp"][-1] != dims[0]:
        raise ConfigError("bottom_mlp", list(dense["bottom_mlp"]), f"must end at the tables' dim {dims[0]}")
    if dense["top_mlp"][-1] != 1:
        raise ConfigError("top_mlp", list(dense["top_mlp"]), "must end at 1 (one logit per sample)")


def measurement_to_dict(m: DlrmMeasurement) -> dict[str, Any]:
    """The measurement as plain data (a run file's body): the iteration (median, p10, p90, every iteration of the
    slowest rank), the per-rank spans of the median iteration with each span's median thread CPU time and minor
    page faults, and the host's load average before and after."""
    slowest = np.asarray(m.iterations_s)
    return {"iteration_s": m.iteration_s, "p10_s": float(np.percentile(slowest, 10)),
            "p90_s": float(np.percentile(slowest, 90)), "iterations_s": list(m.iterations_s),
            "local_batch": m.config.local_batch, "num_ranks": m.config.plan.num_ranks,
            "sharder": m.config.plan.sharder, "load_avg": list(m.load_avg),
            "rank_events": [[list(e) for e in rank] for rank in m.rank_events],
            "rank_cpu_s": [list(c) for c in m.rank_cpu_s], "rank_faults": [list(f) for f in m.rank_faults],
            "allocator": m.allocator, **_phase_dict(m)}


def _phase_dict(m: DlrmMeasurement) -> dict[str, Any]:
    """With probes: every probe timing (per probe, rank, iteration: before, after), each iteration's reference,
    and per probe the phase-normalised iteration (median) against this run's own fast-phase reference (a campaign
    of many runs takes one reference over all of them instead: measure.dlrm_phase.campaign_fast_reference_s)."""
    if not m.rank_probe_s:
        return {}
    references = {name: m.references_s(name) for name in m.rank_probe_s}
    fast = {name: campaign_fast_reference_s([refs]) for name, refs in references.items()}
    return {"rank_iterations_s": [list(r) for r in m.rank_iterations_s],
            "probe_s": {name: [[list(pair) for pair in rank] for rank in ranks]
                        for name, ranks in m.rank_probe_s.items()},
            "probe_reference_s": references, "fast_probe_s": fast,
            "phase_iteration_s": {name: phase_normalised_iteration_s(m.iterations_s, references[name], fast[name])
                                  for name in references}}


def _worker(rank: int, world: int, port: int, configs: list[DlrmConfig], iterations: int, warmup: int,
            timeout_s: float, out: Any, group: int = 1, allocator: str = DEFAULT_POLICY,
            probe_names: tuple[str, ...] = ()) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    applied = apply_policy(allocator)  # before torch loads and allocates
    import torch
    import torch.distributed as dist

    from trainsim.measure.dlrm_probe import make_probes
    from trainsim.measure.dlrm_rank import run_interleaved

    torch.set_num_threads(1)
    probes = make_probes(probe_names) if probe_names else {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        for start in range(0, len(configs), group):
            chosen = configs[start:start + group]
            block = [(c.plan, c.dense, c.local_batch, c.seed) for c in chosen]
            folders = [(c.trace_dir, c.traced_iterations) for c in chosen]
            for index, result in enumerate(run_interleaved(torch, dist, rank, world, block, iterations, warmup,
                                                           probes, folders), start):
                out.put((index, rank, {**result, "allocator": allocator if applied else "system"}))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which fails the run with it
        out.put((-1, rank, f"{type(exc).__name__}: {exc}"))


def measure_dlrm(configs: list[DlrmConfig], *, iterations: int = 5, warmup: int = 2,
                 timeout_s: float = 1800.0, group: int = 1, allocator: str = DEFAULT_POLICY,
                 probes: tuple[str, ...] = ()) -> list[DlrmMeasurement]:
    """group > 1: consecutive blocks of `group` configs are measured interleaved (one iteration of each in turn,
    measure.dlrm_rank.run_interleaved), so configs meant to be compared see the same host load. allocator: the
    ranks' allocator policy (measure.allocator; "keep" holds freed memory as a GPU's caching allocator does).
    probes: measure.dlrm_phase.PROBES to time around every iteration on every rank (none: no probe runs)."""
    check_policy(allocator)
    check_probes(probes)
    if group < 1:
        raise ConfigError("group", group, "must be a positive integer")
    if not configs:
        return []
    worlds = {c.plan.num_ranks for c in configs}
    if len(worlds) != 1:
        raise ConfigError("configs", sorted(worlds), "one run measures one number of ranks")
    if iterations < 1 or warmup < 0:
        raise ConfigError("iterations/warmup", (iterations, warmup), "need iterations >= 1 and warmup >= 0")
    world = worlds.pop()
    for config in configs:
        check_dense(config.plan, config.dense)
        if not 1 <= config.traced_iterations <= MAX_TRACED_ITERATIONS:
            raise ConfigError("traced_iterations", config.traced_iterations,
                              f"an integer from 1 to {MAX_TRACED_ITERATIONS}")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    load_before = os.getloadavg()[0]
    procs = [ctx.Process(target=_worker, args=(r, world, port, configs, iterations, warmup, timeout_s, out, group,
                                               allocator, tuple(probes))) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict[int, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while sum(len(v) for v in results.values()) < world * len(configs):
            try:
                index, rank, payload = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TrainsimError(f"DLRM measurement timed out after {timeout_s:.0f} s") from None
            if index < 0:
                raise TrainsimError(f"DLRM measurement failed on rank {rank}: {payload}")
            results.setdefault(index, {})[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.kill()
    load = (load_before, os.getloadavg()[0])
    return [_summarize(config, results[i], world, load) for i, config in enumerate(configs)]


def _summarize(config: DlrmConfig, by_rank: dict[int, Any], world: int,
               load: tuple[float, float] = (0.0, 0.0)) -> DlrmMeasurement:
    records = [by_rank[r]["records"] for r in range(world)]
    slowest = [max(records[r][i]["iteration_s"] for r in range(world)) for i in range(len(records[0]))]
    median_index = int(np.argsort(slowest)[len(slowest) // 2])
    events = tuple(tuple((str(n), float(a), float(b)) for n, a, b in records[r][median_index]["events"])
                   for r in range(world))
    cpu, faults = (tuple(tuple(float(v) for v in np.median([rec[key] for rec in records[r]], axis=0))
                         for r in range(world)) for key in ("cpu_s", "faults"))
    policies = {str(by_rank[r].get("allocator", "system")) for r in range(world)}
    allocator = policies.pop() if len(policies) == 1 else "mixed"
    probed = records[0][0].get("probe_s", {}) if records[0] else {}
    probes = {name: tuple(tuple((float(rec["probe_s"][name][0]), float(rec["probe_s"][name][1]))
                                for rec in records[r]) for r in range(world)) for name in probed}
    per_rank = tuple(tuple(float(rec["iteration_s"]) for rec in records[r]) for r in range(world))
    traced = tuple(tuple(float(t) for t in by_rank[r]["traced_s"]) for r in range(world) if "traced_s" in by_rank[r])
    return DlrmMeasurement(config, float(np.median(slowest)), tuple(slowest), events, cpu, load, faults, allocator,
                           probes, per_rank, traced)
