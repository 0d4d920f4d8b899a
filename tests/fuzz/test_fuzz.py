"""The fuzz property on generated inputs, a short seeded run (TRAINSIM_FUZZ_EXAMPLES for more; the long run
is benchmarks/fuzz.py)."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis.strategies import SearchStrategy
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


KIND_EXAMPLES = int(os.environ.get("TRAINSIM_FUZZ_KIND_EXAMPLES", "25"))


def _kind(strategy_name: str) -> SearchStrategy[Case]:
    from tests.fuzz import cases_more

    return getattr(cases_more, strategy_name)()


@pytest.mark.parametrize("kind", ["tree_file_cases", "trace_cases", "measured_folder_layout_cases",
                                  "measure_flag_cases"])
def test_each_newer_input_kind_is_a_result_or_one_line(kind: str) -> None:
    """A few examples of each kind any_case draws rarely (the trace front-end, strategy trees, measured-run
    folders, measure's checks): every kind runs in CI whatever the draw above."""

    @seed(12)
    @settings(max_examples=KIND_EXAMPLES, deadline=None, database=None, suppress_health_check=SLOW_INPUTS_ARE_FINE)
    @given(_kind(kind))
    def one(case: Case) -> None:
        with tempfile.TemporaryDirectory() as folder:
            outcome = run_case(case, Path(folder))
        assert outcome.kind not in FAILURES, (outcome, case.argv, case.note)

    one()  # type: ignore[call-arg]  # hypothesis supplies case
