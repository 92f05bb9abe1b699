"""Where a tuning suite's wall time goes (issue 59): read a ``pflower tune`` results folder and
say, per setting and method, how long the searches and the final runs took, how much compute the
searches spent, and how long the whole suite will take at that pace.

From each setting's ``study.db`` (Optuna's public API): every trial's start and end, its state,
its values and the rounds it ran as the suite's budget counts them
([`rounds_run`][pflower.tuning.ledger.rounds_run]: a trial evaluates only some rounds, so its
last reported round is not its rounds). From each final run's ``summary.json``: its wall time,
and, from the file's modification time, when it ended, for a run whose folder still has its
``run.log`` (it ran there). A run without one was copied from a results folder, which keeps only
the summaries: its file carries the time of the copy (or of a git checkout), so its end is
unknown, and it counts in the busy wall time as its wall time over ``--workers`` (the final runs
run that many at once). Run it on the suite's working folder, where most runs have their logs.

- *busy wall time*: the union of the intervals in which a trial or a final run was running, so
  that the gaps between sessions (the suite stopped, then run again) do not count;
- *worker-seconds*: the summed durations of trials and final runs (with ``--workers 2`` on two
  cores, at best twice the busy wall time);
- *seconds per round*: the trials' worker-seconds over the rounds they ran (trials left running
  by a stopped command are in neither: their end is when the next command failed them);
- *untimed final runs*: those copied without their ``run.log`` (above), their number said;
- the projection: per setting, the busy wall time per method with every study and final run
  done, times the setting's methods (a setting with no method done yet has no projection);
- ``--paused FILE``: times the suite's runs were stopped (SIGSTOP) while other work ran, a line
  ``<start> <end>`` (Unix seconds) each; they are taken out of every interval and duration (a
  stopped run's wall time includes its pause).

Run it on the suite's working folder while it runs or after; it reads, never writes there::

    python benchmarks/suite_timing.py /path/to/working/folder/tuning/cpu --workers 2 \
        --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

from pflower.results.failures import failed_by_itself
from pflower.tuning.ledger import rounds_run

Interval = tuple[float, float]


@dataclass
class MethodTime:
    """One method of one setting: its studies' trials and its final runs."""

    trials: int = 0
    configurations: set[tuple[tuple[str, Any], ...]] = field(default_factory=set)
    to_the_end: int = 0
    rounds: int = 0
    trial_seconds: float = 0.0
    final_runs: int = 0
    final_seconds: float = 0.0
    untimed_runs: int = 0
    untimed_seconds: float = 0.0
    """Final runs whose end is unknown (copied without their ``run.log``), and their wall time."""
    studies_done: int = 0
    intervals: list[Interval] = field(default_factory=list)
    durations: list[tuple[int, float]] = field(default_factory=list)
    """(rounds run, seconds) of each trial that ended by itself (completed or pruned)."""
    interrupted: int = 0
    """Trials left running by a stopped ``pflower tune`` (failed, then retried): their end is
    when the next command failed them, so their time is not counted."""


def union(intervals: Sequence[Interval]) -> list[Interval]:
    """``intervals`` merged where they overlap, in order."""
    merged: list[Interval] = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def busy(intervals: Sequence[Interval], paused: Sequence[Interval] = ()) -> float:
    """The length of the union of ``intervals`` (seconds), less the time in ``paused``."""
    stops = union(paused)
    return sum(
        stop - start - sum(max(0.0, min(stop, b) - max(start, a)) for a, b in stops)
        for start, stop in union(intervals)
    )


def read_pauses(path: Path | None) -> list[Interval]:
    """The pauses recorded in ``path``: a line ``<start> <end>`` (Unix seconds, start before
    end) for each time the suite's runs were stopped (SIGSTOP) while other work ran, which
    their wall times include; blank lines are skipped.

    Raises:
        ValueError: a line that is not such a pair.
    """
    if path is None:
        return []
    pauses = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            start, end = (float(v) for v in line.split())
        except ValueError:
            raise ValueError(f"{path}:{number}: not '<start> <end>': {line!r}") from None
        if not start < end:
            raise ValueError(f"{path}:{number}: the pause ends before it starts: {line!r}")
        pauses.append((start, end))
    return pauses


def read_trials(
    setting_dir: Path, methods: dict[str, MethodTime], paused: Sequence[Interval]
) -> None:
    storage = f"sqlite:///{setting_dir / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in optuna.study.get_all_study_names(storage):
        method = name.split("@")[0]
        entry = methods.setdefault(method, MethodTime())
        for trial in optuna.load_study(study_name=name, storage=storage).trials:
            if trial.datetime_start is None:
                continue
            entry.trials += 1
            entry.configurations.add(tuple(sorted(trial.params.items())))
            entry.rounds += rounds_run(trial)
            if trial.state == optuna.trial.TrialState.COMPLETE:
                entry.to_the_end += 1
            if trial.state == optuna.trial.TrialState.FAIL:
                entry.interrupted += 1
            elif trial.datetime_complete is not None:
                start = trial.datetime_start.timestamp()
                stop = trial.datetime_complete.timestamp()
                seconds = busy([(start, stop)], paused)
                entry.trial_seconds += seconds
                entry.intervals.append((start, stop))
                entry.durations.append((rounds_run(trial), seconds))


def read_finals(
    setting_dir: Path, methods: dict[str, MethodTime], seeds: int, paused: Sequence[Interval]
) -> None:
    """Each final run's wall time and, where its folder has its ``run.log``, its interval."""
    for method_dir in sorted((setting_dir / "final").iterdir()):
        entry = methods.setdefault(method_dir.name, MethodTime())
        per_study: dict[str, int] = {}
        for summary_path in method_dir.rglob("summary.json"):
            summary = json.loads(summary_path.read_text())
            if summary.get("status") != "completed" and not failed_by_itself(summary):
                continue  # interrupted: it has not run yet
            wall = float(summary.get("wall_time_s") or 0.0)
            entry.final_runs += 1
            study = summary_path.parent.parent.name
            per_study[study] = per_study.get(study, 0) + 1
            if not (summary_path.parent / "run.log").exists():
                entry.untimed_runs += 1
                entry.untimed_seconds += wall
                entry.final_seconds += wall
                continue
            ended = summary_path.stat().st_mtime
            entry.final_seconds += busy([(ended - wall, ended)], paused)
            entry.intervals.append((ended - wall, ended))
        entry.studies_done = sum(1 for count in per_study.values() if count >= seeds)


def measure(root: Path, paused: Sequence[Interval] = (), workers: int = 2) -> dict[str, Any]:
    """The timing report of the suite in ``root``, with the times in ``paused`` taken out and
    each untimed final run counted as its wall time over ``workers``."""
    suite = yaml.safe_load((root / "suite.yaml").read_text())
    studies, seeds = int(suite.get("studies") or 1), len(suite.get("final_seeds") or [])
    report: dict[str, Any] = {
        "suite": suite.get("name"),
        "studies": studies,
        "final_seeds": seeds,
        "settings": {},
        "methods_in_suite": sum(len(m) for m in (suite.get("setting_methods") or {}).values()),
        "workers": workers,
    }
    every: list[Interval] = []
    for setting_dir in sorted(p for p in root.iterdir() if (p / "study.db").exists()):
        methods: dict[str, MethodTime] = {}
        read_trials(setting_dir, methods, paused)
        if (setting_dir / "final").is_dir():
            read_finals(setting_dir, methods, seeds, paused)
        report["settings"][setting_dir.name] = setting_report(methods, studies, paused, workers)
        every += [i for e in methods.values() for i in e.intervals]
    report["projected_by_setting_h"] = projection(report["settings"], suite)
    projected = report["projected_by_setting_h"].values()
    report["projected_busy_h"] = None if None in projected else sum(projected)
    report["paused_h"] = (busy(every) - busy(every, paused)) / 3600  # what overlapped the runs
    return report


def busy_wall(entries: Sequence[MethodTime], paused: Sequence[Interval], workers: int) -> float:
    """The busy seconds of ``entries``: the union of their timed intervals less the pauses,
    plus their untimed final runs' wall time over ``workers``."""
    timed = busy([i for e in entries for i in e.intervals], paused)
    return timed + sum(e.untimed_seconds for e in entries) / workers


def setting_report(
    methods: dict[str, MethodTime], studies: int, paused: Sequence[Interval], workers: int
) -> dict[str, Any]:
    """One setting's times: busy wall, worker-seconds, the trials' cost per round (and a line
    fitted to their durations), and each method's."""
    done = {m: e for m, e in methods.items() if e.studies_done >= studies}
    per_method = [busy_wall([e], paused, workers) for e in done.values()]
    trial_s = sum(e.trial_seconds for e in methods.values())
    durations = [d for e in methods.values() for d in e.durations]
    timed = sum(r for r, _ in durations)  # the rounds of the trials whose time is counted
    fixed, per_round = (
        np.polyfit([r for r, _ in durations], [t for _, t in durations], 1)[::-1]
        if len(durations) > 2
        else (None, None)
    )
    return {
        "methods_done": sorted(done),
        "methods_started": len(methods),
        "busy_wall_s": busy_wall(list(methods.values()), paused, workers),
        "untimed_final_runs": sum(e.untimed_runs for e in methods.values()),
        "trial_worker_s": trial_s,
        "final_worker_s": sum(e.final_seconds for e in methods.values()),
        "trial_rounds": sum(e.rounds for e in methods.values()),
        "trial_s_per_round": trial_s / timed if timed else None,
        "trial_fit_fixed_s": fixed,
        "trial_fit_per_round_s": per_round,
        "trials_interrupted": sum(e.interrupted for e in methods.values()),
        "busy_s_per_done_method": statistics.fmean(per_method) if per_method else None,
        "by_method": {
            m: {
                "busy_wall_s": busy_wall([e], paused, workers),
                "trials": e.trials,
                "configurations": len(e.configurations),
                "to_the_end": e.to_the_end,
                "trial_rounds": e.rounds,
                "trial_worker_s": e.trial_seconds,
                "final_runs": e.final_runs,
                "final_worker_s": e.final_seconds,
                "untimed_final_runs": e.untimed_runs,
                "studies_done": e.studies_done,
            }
            for m, e in methods.items()
        },
    }


def projection(settings: dict[str, Any], suite: dict[str, Any]) -> dict[str, float | None]:
    """Each setting's projected busy hours: its busy time per done method times its methods
    (None where no method is done, or the suite.yaml does not list the setting's methods; a
    setting not started yet is listed, with None)."""
    methods = suite.get("setting_methods") or {}
    found: dict[str, float | None] = {name: None for name in methods}
    for name, setting in settings.items():
        pace = setting["busy_s_per_done_method"]
        found[name] = pace * len(methods[name]) / 3600 if pace and name in methods else None
    return found


def markdown(report: dict[str, Any], root: Path) -> str:
    lines = [
        f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC: suite "
        f"{report['suite']}, `{root}`",
        "",
        f"| setting | methods done ({report['studies']} studies x {report['final_seeds']} seeds) "
        "| busy wall | trials | finals | "
        "trial s / round | a trial: fixed + per round | busy per done method |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in report["settings"].items():
        per_round = s["trial_s_per_round"]
        pace = s["busy_s_per_done_method"]
        lines.append(
            f"| {name} | {len(s['methods_done'])} of {s['methods_started']} started | "
            f"{s['busy_wall_s'] / 3600:.2f} h | {s['trial_worker_s'] / 3600:.2f} worker-h, "
            f"{s['trial_rounds']} rounds | {s['final_worker_s'] / 3600:.2f} worker-h | "
            f"{per_round:.2f} | {s['trial_fit_fixed_s']:.1f} s + "
            f"{s['trial_fit_per_round_s']:.2f} s x rounds | {pace / 60:.1f} min |"
            if per_round and pace
            else f"| {name} | {len(s['methods_done'])} | - | - | - | - | - | - |"
        )
    untimed = [
        f"{name} {s['untimed_final_runs']}"
        for name, s in report["settings"].items()
        if s.get("untimed_final_runs")
    ]
    if untimed:
        lines += [
            "",
            "Final runs copied without their run.log (their end unknown), each counted in the "
            f"busy wall as its wall time / {report['workers']}: {', '.join(untimed)}.",
        ]
    by_setting = report["projected_by_setting_h"]
    measured = [f"{name} {h:.1f} h" for name, h in by_setting.items() if h is not None]
    missing = [name for name, h in by_setting.items() if h is None]
    if measured:
        total = (
            f"the suite's {report['methods_in_suite']} method-settings take "
            f"{report['projected_busy_h']:.1f} h"
            if not missing
            else f"{', '.join(missing)} not measured yet (no method done)"
        )
        lines += [
            "",
            "At each setting's pace (its busy wall time per done method, times its methods): "
            f"{', '.join(measured)}; {total}{_pauses(report)}.",
        ]
    return "\n".join(lines) + "\n"


def _pauses(report: dict[str, Any]) -> str:
    paused = report.get("paused_h")
    return f" ({paused:.2f} h of recorded pauses taken out)" if paused else ""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a pflower tune results folder")
    parser.add_argument("--out", type=Path, help="append to <out>/suite_timing.md, write .json")
    parser.add_argument(
        "--paused", type=Path, help="a file of pauses, '<start> <end>' (Unix seconds) a line"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="how many final runs ran at once (pflower tune --workers): an untimed final run "
        "counts as its wall time over this (default 2)",
    )
    args = parser.parse_args(argv)
    paused = read_pauses(args.paused)
    report = measure(args.root, paused, args.workers)
    text = markdown(report, args.root)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "suite_timing.json").write_text(json.dumps(report, indent=1) + "\n")
        with (args.out / "suite_timing.md").open("a") as handle:
            handle.write("\n" + text + "\n")  # a reading is its own section


if __name__ == "__main__":
    main(sys.argv[1:])
