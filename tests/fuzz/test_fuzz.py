"""The fuzz property on generated inputs, a short seeded run (TRAINSIM_FUZZ_EXAMPLES for more; the long run
is benchmarks/fuzz.py)."""

import os
import tempfile
from pathlib import Path

from hypothesis import given, seed, settings
from tests.fuzz.cases import SLOW_INPUTS_ARE_FINE, Case, any_case
from tests.fuzz.harness import FAILURES, run_case

EXAMPLES = int(os.environ.get("TRAINSIM_FUZZ_EXAMPLES", "150"))


@seed(12)
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=SLOW_INPUTS_ARE_FINE)
@given(any_case())
def test_every_input_is_a_result_or_one_line(case: Case) -> None:
    with tempfile.TemporaryDirectory() as folder:
        outcome = run_case(case, Path(folder))
    assert outcome.kind not in FAILURES, (outcome, case.argv, case.note)
