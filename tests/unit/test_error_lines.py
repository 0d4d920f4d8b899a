"""errors.py: the one place messages are made one short line, values shown bounded, and names checked."""

import pytest

from trainsim.errors import MAX_MESSAGE_CHARS, ConfigError, check_name, one_line, short_repr


def test_one_line_joins_lines_and_cuts_at_the_limit() -> None:
    assert one_line("a\n  b\tc") == "a b c"
    cut = one_line("x" * 10_000)
    assert len(cut) == MAX_MESSAGE_CHARS and cut.endswith("...")


def test_short_repr_is_bounded_whatever_the_value() -> None:
    nested: list[object] = []
    for _ in range(50):
        nested = [nested] * 9  # the shape of a billion-laughs document: 9^50 leaves, shared
    assert len(short_repr(nested)) < 200
    assert len(short_repr("y" * 10**6)) < 100
    assert short_repr({"b": 1, "a": 2}) == "{'b': 1, 'a': 2}"  # keys in their order
    assert "too large" in short_repr(10**5000)  # past Python's int-to-string digit limit


def test_config_error_shows_a_bounded_value() -> None:
    assert len(str(ConfigError("tp", "z" * 10**6, "must be an integer"))) < 200


@pytest.mark.parametrize("name", ["../victim", "a/b/c", ".hidden", "", "x" * 129, "a\\b", "a b", "nul\x00"])
def test_names_that_become_files_are_checked(name: str) -> None:
    assert check_name("run_id", name) is not None


@pytest.mark.parametrize("name", ["gpt-small_tp2-pp1-dp1_mb4-gb4_1f1b_fp32", "run.1+a=b@c"])
def test_plain_names_pass(name: str) -> None:
    assert check_name("run_id", name) is None
