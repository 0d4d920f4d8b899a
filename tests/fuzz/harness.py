"""Run one fuzz case through the `trainsim` entry point in this process and classify what came back.

The property (issue 12): exit 0 with finite, non-negative, sane figures (MFU in [0, 1], OOM exactly when the
peak exceeds the capacity), or exit 2 with one line of at most 300 characters; never a traceback, never a hang.
"""

import contextlib
import io
import json
import math
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fuzz.cases import Case

from trainsim.errors import MAX_MESSAGE_CHARS

# A case that computes longer than this (CPU seconds of this process, so that a loaded shared machine does not
# turn a slow start into a "hang") is a hang; one that waits longer than HANG_WALL_S (a read that blocks) too.
# The bounds are generous: the cases themselves take well under a second of CPU.
HANG_S = float(os.environ.get("TRAINSIM_FUZZ_HANG_S", "20"))
HANG_WALL_S = float(os.environ.get("TRAINSIM_FUZZ_HANG_WALL_S", "600"))
FAILURES = ("traceback", "bad_exit", "long_error", "non_finite", "insane", "hang", "not_refused")
_NON_FINITE_TEXT = re.compile(r"(?<![A-Za-z_])(nan|inf|infinity)(?![A-Za-z_])", re.IGNORECASE)


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok, refused, or one of FAILURES
    detail: str = ""


class _Hang(BaseException):
    pass


class _Launched(BaseException):
    """Raised by the stand-in for measure's launcher: the case passed every check a rank would start after."""


def _no_ranks(*args: object, **kwargs: object) -> None:
    raise _Launched()


@contextlib.contextmanager
def _launcher_stubbed(argv: list[str]) -> Iterator[None]:
    """`measure` never starts a rank under the fuzzer: its launcher (and the suite runner) raise _Launched."""
    if not argv or argv[0] != "measure":
        yield
        return
    from unittest import mock

    with mock.patch("trainsim.measure.launch.launch", _no_ranks), \
            mock.patch("trainsim.measure.suite.run_suite", _no_ranks):
        yield


@contextlib.contextmanager
def _time_limit(cpu_s: float, wall_s: float) -> Iterator[None]:
    def stop(signum: int, frame: object) -> None:
        raise _Hang()

    previous = {number: signal.signal(number, stop) for number in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, handler in previous.items():
            signal.signal(number, handler)


def write_files(case: Case, folder: Path) -> None:
    for name, data in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def run_case(case: Case, folder: Path) -> Outcome:
    """Run `trainsim <argv>` with cwd = folder (holding the case's files) and classify the result."""
    from trainsim.cli.main import command_line

    write_files(case, folder)
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    argv = sys.argv
    try:
        with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _time_limit(HANG_S, HANG_WALL_S), _launcher_stubbed(case.argv):
            sys.argv = ["trainsim", *case.argv]
            try:
                command_line()
            except SystemExit as exc:
                code = exc.code
    except _Hang:
        return Outcome("hang", f"over {HANG_S:.0f} s of CPU or {HANG_WALL_S:.0f} s")
    except _Launched:
        return Outcome("not_refused", "would start ranks") if case.must_refuse else Outcome("ok", "checks passed")
    except Exception as exc:  # the property under test: nothing escapes the command line
        return Outcome("traceback", f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        sys.argv = argv
    return classify(code, out.getvalue(), err.getvalue(), case)


def classify(code: object, stdout: str, stderr: str, case: Case) -> Outcome:
    if code not in (0, 2, None):
        return Outcome("bad_exit", f"exit {code}: {stderr[-200:]}")
    if code == 2:
        lines = stderr.strip().splitlines()
        if len(lines) != 1 or len(lines[0]) > MAX_MESSAGE_CHARS:
            return Outcome("long_error", f"{len(lines)} lines, {len(stderr)} chars: {stderr[:120]!r}")
        return Outcome("refused", lines[0])
    if case.must_refuse:
        return Outcome("not_refused", f"exit {code}: {stdout[:120]!r}")
    return _check_output(stdout, "--json" in case.argv, case.argv[0])


def _check_output(stdout: str, is_json: bool, command: str) -> Outcome:
    if not is_json:
        found = _NON_FINITE_TEXT.search(stdout)
        return Outcome("non_finite", found.group(0)) if found else Outcome("ok")
    try:
        data = json.loads(stdout, parse_constant=_refuse)
    except ValueError as exc:
        return Outcome("non_finite", str(exc)[:200])
    problem = _insane(data) if command == "predict" else None
    return Outcome("insane", problem) if problem else Outcome("ok")


def _refuse(name: str) -> float:
    raise ValueError(f"{name} in the JSON output")


def numbers(data: Any, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(data, bool):
        return
    if isinstance(data, int | float):
        yield path, float(data)
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from numbers(value, f"{path}.{key}")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from numbers(value, f"{path}[{index}]")


def _insane(result: dict[str, Any]) -> str | None:
    """What is wrong with one prediction's figures, or None."""
    for path, value in numbers(result):
        if not math.isfinite(value) or value < 0:
            return f"{path}={value}"
    if not 0 <= result["mfu"] <= 1:
        return f"mfu={result['mfu']}"
    if result["iteration_time_s"] <= 0:
        return f"iteration_time_s={result['iteration_time_s']}"
    if result["oom"] != (result["peak_memory_bytes"] > result["memory_capacity_bytes"]):
        return f"oom={result['oom']} with peak {result['peak_memory_bytes']} of {result['memory_capacity_bytes']}"
    return None
