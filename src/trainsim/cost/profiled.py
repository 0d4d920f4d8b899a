"""Op costs from the profile database: exact signature, else interpolation over size, else the roofline fitted
to the nearest measured size, else the fallback.

For an op, ProfiledCosts looks up the measurement of its signature (trainsim.profile.ops.signature_of: kernel,
phase, dtype, shape) on the device the estimator asks about. Without an exact match it interpolates log-log in
the signature's size (elements for pointwise ops, the shape product - proportional to FLOPs - for matmul and
attention) between the two nearest measured sizes of the same kernel, phase and dtype. Outside the measured range
the op is "scaled": the slower of the fallback model's time (the calibrated roofline: about the fastest the op
could run) and the nearest measured size's time x the fallback's ratio between the op and the op shrunk (or
grown) to that size (FLOPs and bytes x the size ratio), the level this device reached on the kernel carried to
the op's size along the roofline's curve. So a micro-batch of 2 never comes out faster than the measured
micro-batch of 1 because the roofline (a placeholder peak on CPUs) is faster than the measurements, and where
the roofline is the slower answer (GPU kernels measured at a small size run less efficiently than at the job's)
it stands, as before. Only a kernel, phase and dtype never measured on the device asks the fallback alone.
Which source answered each op is counted (coverage(): ops and seconds per source), so a report can say how much
of a prediction rests on measurements.

No torch here: the database is plain SQLite, read once at construction.
"""

import bisect
import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from trainsim.catalog.calibration import load_calibration
from trainsim.comm.collectives import CommCostModel
from trainsim.cost.compute import OpCostModel, RooflineCosts
from trainsim.cost.step import StepCosts
from trainsim.hardware.cluster import ClusterSpec, GroupLayout
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.graph import Op, OpGraph
from trainsim.profile.database import CollectiveRow, OpRow, OpSignature, ProfileDB
from trainsim.profile.executor_overhead import executor_signature
from trainsim.profile.framework import framework_signature, frameworks_for
from trainsim.profile.ops import (
    GRAD_COPY_SIGNATURE_KIND,
    OPTIMIZER_SIGNATURE_KIND,
    ZERO_STATE_ADAM_IMPL,
    overhead_signature,
    signature_of,
)
from trainsim.profile.reshard_overhead import reshard_signature
from trainsim.strategy.parallel import ParallelSpec
from trainsim.strategy.precision import Precision

Source = Literal["exact", "interpolated", "scaled", "fallback"]
SOURCES: tuple[Source, ...] = ("exact", "interpolated", "scaled", "fallback")
MEASURED: tuple[Source, ...] = ("exact", "interpolated")
UNMEASURED_WARN_SHARE = 0.5  # warn when the scaled + fallback share of a job's op time exceeds this
_Group = tuple[str, str, str, str, str]  # device, kind, impl, phase, dtype


@dataclass(frozen=True, slots=True)
class _Curve:
    """Measured (size, seconds) points of one kernel, sorted by size; equal sizes averaged in log space."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, points: list[tuple[float, float]]) -> "_Curve":
        by_size: dict[float, list[float]] = {}
        for size, seconds in points:
            by_size.setdefault(size, []).append(seconds)
        sizes = sorted(by_size)
        means = [math.exp(sum(math.log(max(s, 1e-12)) for s in by_size[x]) / len(by_size[x])) for x in sizes]
        return cls(tuple(sizes), tuple(means))

    def interpolate(self, size: float) -> float | None:
        """log-log interpolation inside [min size, max size]; None outside (no extrapolation)."""
        if not self.sizes or size < self.sizes[0] or size > self.sizes[-1]:
            return None
        hi = bisect.bisect_left(self.sizes, size)
        if self.sizes[hi] == size:
            return self.seconds[hi]
        lo = hi - 1
        x0, x1 = math.log(self.sizes[lo]), math.log(self.sizes[hi])
        y0, y1 = math.log(self.seconds[lo]), math.log(self.seconds[hi])
        return math.exp(y0 + (math.log(size) - x0) / (x1 - x0) * (y1 - y0))


class ProfiledCosts:
    """An OpCostModel answering from a profile database.

    device_name: the trainsim device whose measurements to use; None (the default) uses the device each call
    names, so one instance serves any cluster. versions / threads pick one measurement environment when the
    database holds several for a device; by default the one with the most measurements wins.
    """

    name = "profiled"

    def __init__(self, db: Path | ProfileDB, device_name: str | None = None, fallback: OpCostModel | None = None,
                 *, versions: str | None = None, threads: int | None = None) -> None:
        if fallback is None:
            fallback = RooflineCosts(load_calibration())
        self.fallback: OpCostModel = fallback
        self.device_name = device_name
        self.sources: Counter[Source] = Counter()
        self.answers: dict[tuple[str, str, str], Source] = {}  # (module path, op name, phase) -> last source
        handle = db if isinstance(db, ProfileDB) else ProfileDB.open_read_only(db)
        try:
            rows = list(handle.op_rows(device_name))
            collective_rows = list(handle.collective_rows(device_name))
            self._census = {(c.model, c.samples): c for c in handle.state_census_rows()}
        finally:
            if handle is not db:
                handle.close()
        self.environments = _pick_environments(rows, versions, threads)
        self._exact: dict[tuple[str, str, str, str, str, tuple[int, ...]], float] = {}
        points: dict[_Group, list[tuple[float, float]]] = {}
        for row in rows:
            env = self.environments.get(row.env.device)
            if env is None or (row.env.versions, row.env.threads) != env:
                continue
            sig = row.signature
            self._exact[(row.env.device, sig.kind, sig.impl, sig.phase, sig.dtype, sig.shape)] = row.stats.median_s
            points.setdefault((row.env.device, sig.kind, sig.impl, sig.phase, sig.dtype), []).append(
                (sig.size, row.stats.median_s))
        self._curves = {group: _Curve.of(pts) for group, pts in points.items()}
        self._collectives = _collective_curves(collective_rows, self.environments)

    def collective_curve(self, device_name: str, collective: str, world_size: int) -> "_Curve | None":
        """Measured (message bytes, seconds) of a collective among `world_size` local processes, or None."""
        return self._collectives.get((self.device_name or device_name, collective, world_size))

    @property
    def measurements(self) -> int:
        return len(self._exact)

    def lookup(self, op: Op, device_name: str) -> tuple[float, Source] | None:
        """The measured (or interpolated) seconds of `op` on
        `device_name`, or None: outside the measured sizes, or never measured there."""
        sig = signature_of(op)
        if sig is None:
            return None
        exact = self._exact.get((device_name, sig.kind, sig.impl, sig.phase, sig.dtype, sig.shape))
        if exact is not None:
            return exact, "exact"
        curve = self._curves.get((device_name, sig.kind, sig.impl, sig.phase, sig.dtype))
        seconds = curve.interpolate(sig.size) if curve is not None else None
        return (seconds, "interpolated") if seconds is not None else None

    def answer(self, op: Op, device: DeviceSpec) -> tuple[float, Source]:
        """The seconds of `op` and which source gave them (nothing is counted)."""
        name = self.device_name or device.name
        found = self.lookup(op, name)
        if found is not None:
            return found
        scaled = self._scaled(op, name, device)
        return (scaled, "scaled") if scaled is not None else (self.fallback.op_time_s(op, device), "fallback")

    def _scaled(self, op: Op, device_name: str, device: DeviceSpec) -> float | None:
        """Outside the measured sizes of the op's kernel: the nearest measurement x fallback(op) / fallback(the op
        at the measured size), and never less than fallback(op); None where the kernel was never measured on the
        device."""
        sig = signature_of(op)
        curve = None if sig is None else self._curves.get((device_name, sig.kind, sig.impl, sig.phase, sig.dtype))
        if sig is None or curve is None or not curve.sizes or sig.size <= 0:
            return None
        end = 0 if sig.size < curve.sizes[0] else len(curve.sizes) - 1
        ratio = curve.sizes[end] / sig.size
        at_measured = replace(op, flops=op.flops * ratio, bytes_moved=op.bytes_moved * ratio)
        model_s, model_at_measured_s = self.fallback.op_time_s(op, device), self.fallback.op_time_s(at_measured, device)
        if not (model_s > 0 and model_at_measured_s > 0):
            return curve.seconds[end] / ratio  # NB: a fallback that prices nothing: the measured time per unit of size
        return max(model_s, curve.seconds[end] * model_s / model_at_measured_s)

    def op_time_s(self, op: Op, device: DeviceSpec) -> float:
        seconds, source = self.answer(op, device)
        self.sources[source] += 1
        self.answers[(op.module_path, op.name, op.phase)] = source
        return seconds

    def optimizer_step_s(self, params: float, device_name: str, zero_state_params: float = 0.0) -> float | None:
        """Measured Adam step over `params` parameters: exact, or interpolated inside the measured range. With
        `zero_state_params` of them holding a zero state (cost/optimizer_zeros.py, profile/state_census.py) and
        the step over zero gradients measured (profile.ops.zero_state_optimizer_signature): plus a surcharge per
        zero state, the zero step's excess over the random step per parameter at the probe's size (the nearest
        measured one outside its range). At the probe's own size this is the two steps mixed by the zero share.
        NB: per element, not per step: torch's step costs ~0.1 ms per tensor, so a model of many tensors (a CNN)
        and the probe's few (a DLRM's tables) differ in the step, not in what a zero costs the sqrt."""
        device = self.device_name or device_name
        curve = self._curves.get((device, OPTIMIZER_SIGNATURE_KIND, "adam", "step", "fp32"))
        nonzero_s = curve.interpolate(float(round(params))) if curve is not None else None
        if nonzero_s is None or curve is None or zero_state_params <= 0.0 or params <= 0.0:
            return nonzero_s
        surcharge = self._zero_state_surcharge_s(device, params)
        return nonzero_s if surcharge is None else nonzero_s + min(zero_state_params, params) * surcharge

    def _zero_state_surcharge_s(self, device: str, params: float) -> float | None:
        """Per zero state, the zero step's excess over the random step measured over the same tensors (both probes
        at one size), at the probed size nearest to `params` (log scale); None without such a pair."""
        zeros = self._curves.get((device, OPTIMIZER_SIGNATURE_KIND, ZERO_STATE_ADAM_IMPL, "step", "fp32"))
        pairs = [] if zeros is None else [
            (size, zero_s, self._exact.get((device, OPTIMIZER_SIGNATURE_KIND, "adam", "step", "fp32", (round(size),))))
            for size, zero_s in zip(zeros.sizes, zeros.seconds, strict=True)]
        pairs = [(size, zero_s, random_s) for size, zero_s, random_s in pairs if random_s is not None and size > 0]
        if not pairs or params <= 0:
            return None
        size, zero_s, random_s = min(pairs, key=lambda pair: abs(math.log(pair[0] / params)))
        return max(0.0, zero_s - random_s) / size

    def zero_state_share(self, model: str, samples: int, layer: int) -> float | None:
        """The measured share of layer instance `layer`'s parameters whose optimizer state stays zero in a
        split-executor run of `model` on `samples` samples per step (profile/state_census.py), or None."""
        census = self._census.get((model, samples))
        entry = census.layers.get(layer) if census is not None else None
        if entry is None or entry[0] <= 0:
            return None
        return entry[1] / entry[0]

    def grad_copies_s(self, params: float, device_name: str) -> float | None:
        """Measured gradient bucket copies over `params` gradients: exact, or interpolated inside the measured
        range (profile.ops.measure_grad_copies)."""
        curve = self._curves.get((self.device_name or device_name, GRAD_COPY_SIGNATURE_KIND, "cat-div-copy", "step",
                                  "fp32"))
        return curve.interpolate(float(round(params))) if curve is not None else None

    def _measured_s(self, device_name: str, sig: OpSignature) -> float | None:
        """The database's exact figure for a signature that is not an op (a per-op or per-step cost), or None."""
        return self._exact.get((self.device_name or device_name, sig.kind, sig.impl, sig.phase, sig.dtype,
                                sig.shape))

    def framework_overhead_per_layer_s(self, device_name: str, framework: str, precision: Precision) -> float | None:
        """Measured cost of a framework (profile/framework.py) per transformer layer and micro-batch, or None."""
        sig = framework_signature(framework, precision)
        return self._measured_s(device_name, sig)

    def overhead_per_op_s(self, device_name: str) -> float | None:
        """Measured framework cost per graph op (autograd recording and engine) beyond the op kernels."""
        sig = overhead_signature()
        return self._measured_s(device_name, sig)

    def executor_per_op_s(self, device_name: str, family: str, phase: str) -> float | None:
        """Measured split executor's cost per graph op of `phase` for a model family, or None
        (profile/executor_overhead.py)."""
        sig = executor_signature(family, phase)
        return self._measured_s(device_name, sig)

    def executor_reshard_s(self, device_name: str, collective: str, phase: str) -> float | None:
        """Measured split executor's cost per reshard step running `collective` in `phase`, or None
        (profile/reshard_overhead.py)."""
        sig = reshard_signature(collective, phase)
        return self._measured_s(device_name, sig)

    def source_counts(self) -> dict[str, int]:
        """How many op lookups each source answered: exact, interpolated, scaled, fallback."""
        return {source: self.sources.get(source, 0) for source in SOURCES}

    def coverage(self, graph: OpGraph, device: DeviceSpec) -> "Coverage":
        """Which source answers each op of one micro-batch of `graph` (repeated layers counted each time), in ops
        and in seconds."""
        ops: Counter[Source] = Counter()
        seconds: dict[Source, float] = dict.fromkeys(SOURCES, 0.0)
        for layer in graph.layers:
            for op in (*layer.fwd, *layer.bwd):
                op_s, source = self.answer(op, device)
                ops[source] += layer.count
                seconds[source] += op_s * layer.count
        return Coverage({source: ops.get(source, 0) for source in SOURCES}, seconds)

    def describe(self) -> str:
        envs = ", ".join(f"{dev}: {ver}, {thr} threads" for dev, (ver, thr) in sorted(self.environments.items()))
        counts = ", ".join(f"{k} {v}" for k, v in self.source_counts().items())
        return f"profiled costs ({self.measurements} measurements; {envs or 'none'}); ops answered: {counts}"


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a job's op time the profile answers: ops and seconds per source (SOURCES)."""

    ops: dict[Source, int]
    seconds: dict[Source, float]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def share(self, *sources: Source) -> float:
        """The fraction of the op time the given sources answered (0 for a graph without ops)."""
        total = self.total_s
        return sum(self.seconds[s] for s in sources) / total if total > 0 else 0.0

    @property
    def unmeasured_dominates(self) -> bool:
        return self.share("scaled", "fallback") > UNMEASURED_WARN_SHARE

    def describe(self) -> str:
        """One line: the ops and share of op time each source answered."""
        measured = sum(self.ops[s] for s in MEASURED)
        total = sum(self.ops.values())
        return (f"profiled costs: {measured} of {total} ops measured ({self.share(*MEASURED):.0%} of the op "
                f"time; exact {self.ops['exact']}, interpolated {self.ops['interpolated']}), "
                f"{self.ops['scaled']} scaled from another measured size of their kernel "
                f"({self.share('scaled'):.0%}), {self.ops['fallback']} on the roofline ({self.share('fallback'):.0%})")


def _collective_curves(rows: list[CollectiveRow], environments: dict[str, tuple[str, int]]
                       ) -> dict[tuple[str, str, int], _Curve]:
    """(device, collective, world size) -> curve, in each device's op environment where it has one."""
    points: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for row in rows:
        env = environments.get(row.env.device)
        if env is not None and (row.env.versions, row.env.threads) != env:
            continue
        points.setdefault((row.env.device, row.collective, row.world_size), []).append(
            (float(row.message_bytes), row.stats.median_s))
    return {key: _Curve.of(pts) for key, pts in points.items()}


class ProfiledComm:
    """A CommCostModel answering from the collectives of a profile database: a group of one node whose size was
    measured takes the measured curve (log-log inside the measured sizes; below them the smallest message's
    time, the latency floor; above them the largest message's time scaled with the bytes, the bandwidth
    regime); anything else, the fallback."""

    name = "profiled"

    def __init__(self, profiled: ProfiledCosts, fallback: CommCostModel) -> None:
        self.profiled = profiled
        self.fallback = fallback

    def collective_time_s(self, collective: str, buffer_bytes: float, layout: GroupLayout,
                          cluster: ClusterSpec) -> float:
        curve = None
        if layout.num_nodes == 1 and layout.size > 1 and buffer_bytes > 0:
            curve = self.profiled.collective_curve(cluster.device.name, collective, layout.size)
        if curve is None:
            return self.fallback.collective_time_s(collective, buffer_bytes, layout, cluster)
        inside = curve.interpolate(buffer_bytes)
        if inside is not None:
            return inside
        if buffer_bytes < curve.sizes[0]:
            return curve.seconds[0]
        return curve.seconds[-1] * buffer_bytes / curve.sizes[-1]


def _pick_environments(rows: list[OpRow], versions: str | None, threads: int | None) -> dict[str, tuple[str, int]]:
    """device -> (versions, threads) with the most measurements (optionally restricted)."""
    counts: Counter[tuple[str, str, int]] = Counter()
    for row in rows:
        if (versions is None or row.env.versions == versions) and (threads is None or row.env.threads == threads):
            counts[(row.env.device, row.env.versions, row.env.threads)] += 1
    chosen: dict[str, tuple[str, int]] = {}
    for (device, ver, thr), _ in counts.most_common():
        chosen.setdefault(device, (ver, thr))
    return chosen


class ProfiledStepCosts:
    """The Adam step measured by `trainsim profile` (inside its measured range of parameter counts), and the
    measured framework cost per graph op x the ops of a micro-batch in place of the fitted overheads, on the
    devices the database holds; the fallback elsewhere."""

    name = "profiled"

    def __init__(self, profiled: ProfiledCosts, fallback: StepCosts) -> None:
        self.profiled = profiled
        self.fallback = fallback

    def optimizer_step_s(self, params: float, precision: Precision, device: DeviceSpec,
                         zero_state_params: float = 0.0) -> float:
        measured = self.profiled.optimizer_step_s(params, device.name, zero_state_params)
        return measured if measured is not None else self.fallback.optimizer_step_s(params, precision, device,
                                                                                      zero_state_params)

    def zero_state_share(self, model: str, samples: int, layer: int) -> float | None:
        return self.profiled.zero_state_share(model, samples, layer)

    def grad_copies_s(self, params: float, device: DeviceSpec) -> float:
        measured = self.profiled.grad_copies_s(params, device.name)
        return measured if measured is not None else self.fallback.grad_copies_s(params, device)

    def iteration_overhead_s(self, device: DeviceSpec) -> float:
        measured = self.profiled.overhead_per_op_s(device.name) is not None
        return 0.0 if measured else self.fallback.iteration_overhead_s(device)

    def executor_overhead_s(self, family: str, fwd_ops: int, bwd_ops: int, device: DeviceSpec) -> float:
        """The measured split executor's cost per op of each phase x the ops (0 for a phase not measured)."""
        per_op = {phase: self.profiled.executor_per_op_s(device.name, family, phase) for phase in ("fwd", "bwd")}
        if all(v is None for v in per_op.values()):
            return self.fallback.executor_overhead_s(family, fwd_ops, bwd_ops, device)
        return (per_op["fwd"] or 0.0) * fwd_ops + (per_op["bwd"] or 0.0) * bwd_ops

    def executor_reshard_s(self, collective: str, phase: str, device: DeviceSpec) -> float:
        measured = self.profiled.executor_reshard_s(device.name, collective, phase)
        return measured if measured is not None else self.fallback.executor_reshard_s(collective, phase, device)

    def micro_batch_overhead_s(self, num_ops: int, num_layers: int, par: ParallelSpec,
                               device: DeviceSpec, tp_module_wrappers: bool = True) -> float:
        """The measured per-op cost x the ops, plus the measured per-layer cost of DTensor (tensor parallelism,
        where the stack wraps its modules in it: `tp_module_wrappers`) and FSDP2 (ZeRO-2/3) x the layers
        (profile/framework.py; none where the database lacks it)."""
        per_op = self.profiled.overhead_per_op_s(device.name)
        if per_op is None:
            return self.fallback.micro_batch_overhead_s(num_ops, num_layers, par, device, tp_module_wrappers)
        wrapped_tp = par.tp if tp_module_wrappers else 1  # a stack's own tp layers pay no DTensor cost
        frameworks = frameworks_for(wrapped_tp, par.sp, par.zero if par.dp * par.cp > 1 else 0)
        per_layer = sum(self.profiled.framework_overhead_per_layer_s(device.name, framework, par.precision) or 0.0
                        for framework in frameworks)
        return per_op * num_ops + per_layer * num_layers
