"""tests/README.md, the index of where each algorithm is tested, names every registered algorithm
and only test modules that exist and mention it."""

from __future__ import annotations

import re
from pathlib import Path

import pflower.strategies  # noqa: F401  (registers every algorithm)
from pflower.core.algorithm import ALGORITHMS

INDEX = Path(__file__).with_name("README.md")


def _rows() -> dict[str, list[str]]:
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (.*) \|$", INDEX.read_text(), flags=re.M)
    return {name: re.findall(r"`([^`]+)`", files) for name, files in rows}


def test_every_registered_algorithm_has_a_row_naming_modules_that_test_it() -> None:
    rows = _rows()
    assert len(ALGORITHMS) >= 33
    assert sorted(rows) == sorted(ALGORITHMS)
    for name, files in rows.items():
        assert files, f"no test module listed for {name}"
        for file in files:
            text = (INDEX.parent / file).read_text()
            assert name in text, f"tests/README.md lists {file} for {name}, which it never mentions"
