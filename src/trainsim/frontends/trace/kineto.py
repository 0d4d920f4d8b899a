"""Measured times for an execution trace from the matching Kineto trace (torch.profiler's chrome trace JSON).

An execution-trace node and a Kineto event are the same op when the node's rf_id equals the event's
"Record function id" and the names agree. Ops left unmatched are paired by name and order (the k-th node of a
name with the k-th event of that name) when both sides count the same number. GPU kernels (and memcpy/memset)
carry the "External id" of the CPU op that launched them; their durations are summed into the op's
device_duration_s.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from trainsim.errors import ConfigError, InputFileError
from trainsim.frontends.trace.rank_trace import RankTrace, TraceOp

_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_US = 1e-6  # Kineto times are microseconds
# Kineto's timestamps are microseconds from its clock's origin (the epoch, or baseTimeNanoseconds); 2**53 us is
# 285 years, and the largest integer a double holds exactly.
_MAX_US = float(2**53)
# The world sizes a trace can come from (the largest jobs run on about 10^5 GPUs).
_MAX_WORLD = 2**24


def check_kineto(data: dict[str, Any], name: str) -> None:
    """Refuse a Kineto trace whose timed events or distributedInfo the matcher cannot use, naming the event and
    the field: every complete ("X") event has a timestamp and a duration that are numbers from 0 to 2**53 us,
    rank and world_size are integers with 0 <= rank < world_size."""
    events = data.get("traceEvents", [])
    if not isinstance(events, list):
        raise InputFileError(f"{name}: traceEvents={type(events).__name__} is invalid: a list of events")
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        try:
            _time_us(event.get("ts"), "ts")
            _time_us(event.get("dur", 0.0), "dur")
            if "args" in event and not isinstance(event["args"], dict):
                raise ConfigError("args", event["args"], "an object")
        except ConfigError as exc:
            raise InputFileError(f"{name}: traceEvents[{index}] ({str(event.get('name'))[:40]}): {exc}") from None
    info = data.get("distributedInfo")
    if info is None:
        return
    try:
        if not isinstance(info, dict):
            raise ConfigError("distributedInfo", info, "an object with rank and world_size")
        world = _int(info.get("world_size", 1), "distributedInfo.world_size", 1, _MAX_WORLD)
        if "rank" in info:
            _int(info["rank"], "distributedInfo.rank", 0, world - 1)
    except ConfigError as exc:
        raise InputFileError(f"{name}: {exc}") from None


def _time_us(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= _MAX_US:
        raise ConfigError(field, value, "a time in microseconds from 0 to 2**53")
    return float(value)


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(field, value, f"an integer from {low} to {high}")
    return value


@dataclass(frozen=True, slots=True)
class KinetoMatch:
    by_rf_id: int
    by_order: int
    unmatched: int  # ops and comm records without an event (containers of the trace root never have one)


def attach_kineto(trace: RankTrace, data: dict[str, Any]) -> KinetoMatch:
    """Set start_s, duration_s, external_id and device_duration_s of the trace's ops from a Kineto trace."""
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    host = [e for e in events if e.get("cat") not in _DEVICE_CATEGORIES and "ts" in e]
    by_rf: dict[int, dict[str, Any]] = {}
    for event in host:
        args = event.get("args")
        if isinstance(args, dict) and isinstance(args.get("Record function id"), int):
            by_rf.setdefault(args["Record function id"], event)
    used: set[int] = set()
    rf_matches = 0
    for op in trace.ops.values():
        event = by_rf.get(op.rf_id)
        if event is not None and event.get("name") == op.name and id(event) not in used:
            _set_times(op, event)
            used.add(id(event))
            rf_matches += 1
    order_matches = _match_by_order(trace, [e for e in host if id(e) not in used])
    _device_times(trace, events)
    wanted = [op for op in trace.ops.values() if op.role != "container" or op.name.startswith("ProfilerStep#")]
    return KinetoMatch(rf_matches, order_matches, sum(1 for op in wanted if not op.measured))


def _set_times(op: TraceOp, event: dict[str, Any]) -> None:
    op.start_s = float(event["ts"]) * _US
    op.duration_s = float(event.get("dur", 0.0)) * _US
    external = event.get("args", {}).get("External id")
    if isinstance(external, int):
        op.external_id = external


def _match_by_order(trace: RankTrace, events: list[dict[str, Any]]) -> int:
    ops_by_name: dict[str, list[TraceOp]] = defaultdict(list)
    for op in trace.ops.values():
        if not op.measured:
            ops_by_name[op.name].append(op)
    events_by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in sorted(events, key=lambda e: float(e["ts"])):
        events_by_name[str(event.get("name"))].append(event)
    matched = 0
    for name, ops in ops_by_name.items():
        candidates = events_by_name.get(name, [])
        if candidates and len(candidates) == len(ops):
            for op, event in zip(ops, candidates, strict=True):
                _set_times(op, event)
            matched += len(ops)
    return matched


def _device_times(trace: RankTrace, events: list[dict[str, Any]]) -> None:
    device: dict[int, float] = defaultdict(float)
    for event in events:
        external = event.get("args", {}).get("External id") if isinstance(event.get("args"), dict) else None
        if event.get("cat") in _DEVICE_CATEGORIES and isinstance(external, int):
            device[external] += float(event.get("dur", 0.0)) * _US
    if not device:
        return
    for op in trace.ops.values():
        if op.external_id >= 0:
            op.device_duration_s = device.get(op.external_id, 0.0)


def distributed_info(data: dict[str, Any]) -> dict[str, Any]:
    info = data.get("distributedInfo")
    return info if isinstance(info, dict) else {}
