"""Parse and format human units at the edges. Inside trainsim everything is SI: s, bytes, FLOP/s, bytes/s."""

import math
import re

from trainsim.errors import ConfigError

_NUMBER_AND_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")

_BYTE_UNITS = {
    "": 1.0, "b": 1.0,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
}
_BANDWIDTH_UNITS = {
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "gbit/s": 1e9 / 8, "gbps": 1e9 / 8, "tbit/s": 1e12 / 8, "mbit/s": 1e6 / 8,
}
_FLOPS_UNITS = {"flop/s": 1.0, "gflop/s": 1e9, "tflop/s": 1e12, "pflop/s": 1e15}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _parse(text: str | float | int, table: dict[str, float], field: str, kind: str) -> float:
    """A finite number (NaN, infinity, booleans and sizes that overflow, such as '1e400GiB', are refused)."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ConfigError(field, text, f"expected a number or a {kind} such as " + ", ".join(_examples(table)))
    if isinstance(text, int | float):
        value = float(text) if abs(text) < 1e308 else math.inf
    else:
        match = _NUMBER_AND_UNIT.match(text[:200])
        unit = match.group(2).lower() if match else None
        if match is None or unit not in table:
            raise ConfigError(field, text, f"expected a {kind} such as " + ", ".join(_examples(table)))
        value = float(match.group(1)) * table[unit]
    if not math.isfinite(value):
        raise ConfigError(field, text, f"must be a finite {kind}")
    return value


def _examples(table: dict[str, float]) -> list[str]:
    return [f"'1{unit}'" for unit in list(table)[1:4]]


def parse_bytes(text: str | float | int, field: str = "size") -> float:
    """'80GiB' -> 85899345920.0; a bare number is bytes."""
    return _parse(text, _BYTE_UNITS, field, "size")


def parse_bandwidth(text: str | float | int, field: str = "bandwidth") -> float:
    """'900GB/s' -> 9e11 bytes/s; '200Gbit/s' -> 2.5e10 bytes/s; a bare number is bytes/s."""
    return _parse(text, _BANDWIDTH_UNITS, field, "bandwidth")


def parse_flops(text: str | float | int, field: str = "flops") -> float:
    """'989TFLOP/s' -> 9.89e14 FLOP/s."""
    return _parse(text, _FLOPS_UNITS, field, "FLOP rate")


def parse_duration(text: str | float | int, field: str = "duration") -> float:
    """'5us' -> 5e-6 s."""
    return _parse(text, _TIME_UNITS, field, "duration")


def format_bytes_gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def format_duration(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_count(value: float) -> str:
    """Decimal prefixes for counts (never binary)."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= threshold:
            return f"{value / threshold:.2f}{suffix}"
    return f"{value:.0f}"
