"""The test tree itself: `make test` collects every test module in one run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique() -> None:
    """Test folders are not packages, so pytest imports each module by its file name: two
    modules of one name (say a unit and an integration test of the same part) stop the whole
    collection with "import file mismatch"."""
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
