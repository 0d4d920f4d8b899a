"""The test tree itself: pytest imports test files by their basename (no __init__.py, rootdir-relative), so two
test files of the same name in different folders stop the whole collection."""

from collections import Counter

from conftest import TESTS_DIR


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(path.name for path in TESTS_DIR.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
