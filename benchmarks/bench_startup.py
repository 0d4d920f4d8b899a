"""Start-up cost of the command line: `trainsim predict` (defaults) as a whole process, run N times.

    python benchmarks/bench_startup.py [--runs N] [--no-bytecode-cache] [-- extra predict arguments]

Prints the median and min of the wall seconds of `python -m trainsim predict` (import, prediction, report and
exit) after one untimed warm-up run, and of its CPU seconds (user + system: steadier than wall time when
other work shares the cores). Python's bytecode is cached in a temporary folder (PYTHONPYCACHEPREFIX)
as an installed package has it, even where the environment says PYTHONDONTWRITEBYTECODE; --no-bytecode-cache
keeps the environment as it is (every run then compiles trainsim's sources again). For where the time goes:
`python -X importtime -m trainsim predict 2>imports.txt`.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run."""
    cpu, start = _children_cpu_s(), time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description="Whole-process time of `trainsim predict`.")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-bytecode-cache", action="store_true")
    parser.add_argument("predict_args", nargs="*", help="extra arguments of trainsim predict")
    args = parser.parse_args()

    command = [sys.executable, "-m", "trainsim", "predict", *args.predict_args]
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ)
        if not args.no_bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
        _run_once(command, env)  # warm-up: fills the bytecode cache and the OS file cache
        runs = [_run_once(command, env) for _ in range(args.runs)]
    wall, cpu = [run[0] for run in runs], [run[1] for run in runs]
    print(f"{' '.join(command[1:])}, {args.runs} runs"
          + ("" if args.no_bytecode_cache else ", bytecode cached") + ":")
    print(f"  wall median {statistics.median(wall):.3f} s (min {min(wall):.3f} s, max {max(wall):.3f} s)")
    print(f"  CPU (user + system) median {statistics.median(cpu):.3f} s (min {min(cpu):.3f} s)")


if __name__ == "__main__":
    main()
