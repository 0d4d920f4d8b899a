"""catalog.files: the measurement entry lists `trainsim profile` keeps."""

from pathlib import Path

import pytest

from trainsim.errors import InputFileError


def test_a_measurement_entry_list_is_read_replaced_by_key_and_refused_when_not_a_list(tmp_path: Path) -> None:
    from trainsim.catalog.files import read_entry_list, store_entry

    path = tmp_path / "m.yaml"
    assert read_entry_list(path, "{device}") == []
    store_entry(path, [], {"device": "b", "x": 1}, ("device",), "header")
    store_entry(path, read_entry_list(path, "{device}"), {"device": "a", "x": 2}, ("device",), "header")
    store_entry(path, read_entry_list(path, "{device}"), {"device": "b", "x": 3}, ("device",), "header")
    assert read_entry_list(path, "{device}") == [{"device": "a", "x": 2}, {"device": "b", "x": 3}]
    assert path.read_text().startswith("# header\n")
    assert [p.name for p in tmp_path.iterdir()] == ["m.yaml"]  # no temporary file left
    path.write_text("device: a\n")
    with pytest.raises(InputFileError, match=r"must hold a list of \{device\} entries"):
        read_entry_list(path, "{device}")
