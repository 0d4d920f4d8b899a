"""A saved result is read like every other input (issue 12): a regular file of at most MAX_RESULT_FILE_BYTES,
UTF-8, no NaN or Infinity; every problem one InputFileError line naming the file, never its content."""

from pathlib import Path

import pytest

from trainsim.api import results
from trainsim.errors import InputFileError


@pytest.mark.parametrize(("content", "fragment"), [
    (b'{"schema": {"name": "trainsim.prediction"}, "iteration_time_s": NaN}', "NaN"),
    ("caf\xe9".encode("latin-1"), "not UTF-8"),
    (b'{"a": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nests deeper than 64"),
    (b"{not json", "not valid JSON"),
])
def test_broken_saved_results_are_one_line(content: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "saved.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=fragment) as caught:
        results.load(path)
    assert "saved.json" in str(caught.value) and len(str(caught.value)) <= 300


def test_special_and_oversize_files_are_not_read(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="not a regular file"):
        results.load("/dev/zero")
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(results.MAX_RESULT_FILE_BYTES + 1)
    with pytest.raises(InputFileError, match="more than the"):
        results.load(big)
