"""``benchmarks/suite_timing.py``: the busy wall time of a suite is the union of its runs'
intervals, less the time the runs were paused (stopped while other work used the cores); a
final run copied without its log has no known end and counts as its share of the workers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.suite_timing import (
    MethodTime,
    busy,
    busy_wall,
    projection,
    read_finals,
    read_pauses,
)


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


def test_a_final_run_copied_without_its_log_counts_as_its_wall_time_over_the_workers(
    tmp_path: Path,
) -> None:
    final = tmp_path / "final" / "fedavg"
    for seed, wall, logged in ((1, 100.0, True), (2, 100.0, True), (3, 60.0, False)):
        run = final / "study_0" / f"seed_{seed}"
        run.mkdir(parents=True)
        summary = run / "summary.json"
        summary.write_text(json.dumps({"status": "completed", "wall_time_s": wall}))
        if logged:
            (run / "run.log").write_text("")
        os.utime(summary, (1000.0 + 50 * seed, 1000.0 + 50 * seed))  # ends at 1050, 1100, 1150
    methods: dict[str, MethodTime] = {}
    read_finals(tmp_path, methods, seeds=3, paused=[])
    entry = methods["fedavg"]
    assert (entry.final_runs, entry.untimed_runs, entry.studies_done) == (3, 1, 1)
    assert entry.intervals == [(950.0, 1050.0), (1000.0, 1100.0)]  # the copy's time is not used
    assert entry.final_seconds == 260.0
    assert busy_wall([entry], [], workers=2) == 150.0 + 60.0 / 2
    assert busy_wall([entry], [(1000.0, 1040.0)], workers=2) == 110.0 + 30.0
