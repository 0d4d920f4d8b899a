"""The long fuzz run: N seeded examples of every input kind, counted by outcome (issue 12).

    python benchmarks/fuzz.py [--examples 10000] [--seed 12] [--workers 1]

--workers N splits the run into N processes, worker i drawing examples/N cases from seed (seed, i): the same
(examples, seed, workers) draw the same cases.

Prints one line per outcome kind and, for each failure kind, its distinct messages with counts. Exit 1 when any
case failed (a traceback, a hang, a non-finite or insane figure, an error over 300 characters).
"""

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.cases import SLOW_INPUTS_ARE_FINE, Case, any_case
from tests.fuzz.harness import FAILURES, Outcome, run_case


def run(examples: int, seed_value: int) -> list[tuple[Case, Outcome]]:
    seen: list[tuple[Case, Outcome]] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=SLOW_INPUTS_ARE_FINE)
    @given(any_case())
    def one(case: Case) -> None:
        with tempfile.TemporaryDirectory() as folder:
            seen.append((case, run_case(case, Path(folder))))
        if seen[-1][1].kind in FAILURES:  # as it happens, for a long run
            print(f"  FAILED {seen[-1][1]} {case.argv[:8]} [{case.note[:80]}]", file=sys.stderr, flush=True)
        if len(seen) % 500 == 0:  # progress, for a run of an hour
            failed = sum(outcome.kind in FAILURES for _, outcome in seen)
            print(f"  ... {len(seen)} cases, {failed} failures", file=sys.stderr, flush=True)

    one()
    return seen


def _worker(job: tuple[int, int, int, int]) -> list[tuple[Case, Outcome]]:
    examples, seed_value, workers, index = job
    return run(examples, seed_value if workers == 1 else seed_value * 1000 + index)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--workers", type=int, default=1, help="processes, each with its own seed (seed, i)")
    args = parser.parse_args()
    start = time.perf_counter()
    workers = max(1, args.workers)
    shares = [args.examples // workers + (i < args.examples % workers) for i in range(workers)]
    jobs = [(share, args.seed, workers, i) for i, share in enumerate(shares)]
    if workers == 1:
        seen = _worker(jobs[0])
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            seen = [pair for part in pool.map(_worker, jobs) for pair in part]
    kinds = collections.Counter(outcome.kind for _, outcome in seen)
    print(f"{len(seen)} cases in {time.perf_counter() - start:.0f} s (seed {args.seed}, {workers} worker(s))")
    for kind in ("ok", "refused", *FAILURES):
        print(f"  {kind:12s} {kinds.get(kind, 0)}")
    for kind in FAILURES:
        details = collections.Counter((o.detail[:100], c.argv[0], c.note[:60]) for c, o in seen if o.kind == kind)
        for (detail, command, note), count in details.most_common(40):
            print(f"  {kind} x{count}: {command} [{note}] {detail}")
    return 1 if any(kinds.get(kind) for kind in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
