"""``benchmarks/suite_timing.py``: the busy wall time of a suite is the union of its runs'
intervals, less the time the runs were paused (stopped while other work used the cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.suite_timing import busy, projection, read_pauses


def test_busy_time_is_the_union_of_the_runs_less_the_pauses(tmp_path: Path) -> None:
    runs = [(0.0, 10.0), (5.0, 20.0), (30.0, 40.0)]  # two overlap; a gap between sessions
    assert busy(runs) == 30.0
    pauses = tmp_path / "pauses.txt"
    pauses.write_text("15 35\n\n36 38\n")  # across the gap, then inside a run
    paused = read_pauses(pauses)
    assert paused == [(15.0, 35.0), (36.0, 38.0)]
    assert busy(runs, paused) == 30.0 - 5.0 - 5.0 - 2.0
    assert busy([(16.0, 18.0)], paused) == 0.0  # a run stopped throughout costs nothing
    assert read_pauses(None) == []


def test_a_malformed_pause_is_refused_and_an_unmeasured_setting_has_no_projection(
    tmp_path: Path,
) -> None:
    pauses = tmp_path / "pauses.txt"
    for text, said in (("15\n", "not '<start> <end>'"), ("20 10\n", "ends before it starts")):
        pauses.write_text(text)
        with pytest.raises(ValueError, match=said):
            read_pauses(pauses)
    settings = {"a": {"busy_s_per_done_method": 1800.0}, "b": {"busy_s_per_done_method": None}}
    suite = {"setting_methods": {"a": ["x", "y"], "b": ["x"], "c": ["x"]}}
    assert projection(settings, suite) == {"a": 1.0, "b": None, "c": None}
    assert projection(settings, {}) == {"a": None, "b": None}  # methods unknown: no projection
