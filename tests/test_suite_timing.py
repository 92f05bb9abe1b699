"""``benchmarks/suite_timing.py``: the busy wall time of a suite is the union of its runs'
intervals, less the time the runs were paused (stopped while other work used the cores)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.suite_timing import busy, read_pauses


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
