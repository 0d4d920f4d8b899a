"""The long fuzz run: N seeded examples of every input kind, counted by outcome (issue 12).

    python benchmarks/fuzz.py [--examples 10000] [--seed 12]

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
        if len(seen) % 500 == 0:  # progress, for a run of an hour
            failed = sum(outcome.kind in FAILURES for _, outcome in seen)
            print(f"  ... {len(seen)} cases, {failed} failures", file=sys.stderr, flush=True)

    one()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    start = time.perf_counter()
    seen = run(args.examples, args.seed)
    kinds = collections.Counter(outcome.kind for _, outcome in seen)
    print(f"{len(seen)} cases in {time.perf_counter() - start:.0f} s (seed {args.seed})")
    for kind in ("ok", "refused", *FAILURES):
        print(f"  {kind:12s} {kinds.get(kind, 0)}")
    for kind in FAILURES:
        details = collections.Counter((o.detail[:100], c.argv[0], c.note[:60]) for c, o in seen if o.kind == kind)
        for (detail, command, note), count in details.most_common(40):
            print(f"  {kind} x{count}: {command} [{note}] {detail}")
    return 1 if any(kinds.get(kind) for kind in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
