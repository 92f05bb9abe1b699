"""Profiles: one knob varied at a method's chosen values, on validation (``tune --profile``).

A suite's few trials per method are a seeded random search that sets all of a method's knobs at
once. A knob whose effect is small beside the others' (ALA's η beside the learning rate) is then
chosen by whichever trial drew the best of the others, and lands at an end of its range about as
often as anywhere: in this project's cpu suite ALA's η, widened a decade past both ends after
tuning had chosen both, was chosen at both new ends again. The leaderboard lists every chosen
value at an end of its range, where the best value may lie beyond; a profile says whether it
does.

``pflower tune METHOD --setting S --profile KEY`` runs the method's chosen values
(``chosen/<method>.yaml``; in a suite of several studies each study's,
``chosen/<method>/study_<k>.yaml``) with KEY set to each value of a grid
([`profile_grid`][pflower.tuning.profile.profile_grid]), each as a
trial of the study ran (the study's tuning seed, only stage L1, scored on the clients'
validation shares, so no test sample is read), to its last round (no pruning); the objective
is the study's (`OBJECTIVE`). The point at the chosen value repeats the chosen
trial's run, so it reproduces the trial's objective (runs are deterministic; the record keeps the
difference). ``--profile ends`` profiles every knob the method chose at an end of its range
([`chosen_at_ends`][pflower.tuning.profile.chosen_at_ends]).

What a profile says, and what not: where the objective goes along one knob with the others held
at their chosen values, on one seed. It is not what a search with a wider range would choose
(the other knobs would move too), and a difference of a few tenths of a point is within one
seed's noise (across the final seeds of the cpu suite a method's std is 0.1-2.5 points).

Results: ``<out>/<setting>/profiles/<method>/<key>.yaml`` (each point's value, objective or
error, whether it lies inside the searched range, the code and CPU kernels of its run; the best
point and where it lies), the runs in
``<out>/<setting>/profiles/<method>/<key>/<value>/``; a study's in
``profiles/<method>/study_<k>/``. Completed and failed points are kept when
the command runs again, as final runs are; the leaderboard shows a profile beside the end it
explains ([`describe_profile`][pflower.tuning.profile.describe_profile]).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from pflower.registry import ConfigError
from pflower.results.failures import error_line, failed_by_itself, was_interrupted
from pflower.searchspace import RANGE_END, Param, format_value
from pflower.tuning.finals import read_chosen
from pflower.tuning.layout import Layout, in_study
from pflower.tuning.runner import (
    Runner,
    RunRefused,
    TrialFailed,
    objective_of,
    read_summary,
    run_pflower,
    runs_stop_together,
)
from pflower.tuning.search import OBJECTIVE, run_command, trial_overrides
from pflower.tuning.suite import Setting, Suite

LINEAR_POINTS = 5
"""Points of a linear range's grid, its ends included
([`profile_grid`][pflower.tuning.profile.profile_grid])."""


def chosen_at_ends(
    chosen: Mapping[str, Any], margin: float = RANGE_END
) -> list[tuple[str, float, str, str]]:
    """The chosen values (a ``chosen/<method>.yaml``) at an end of the range their search used
    ([`end_of`][pflower.searchspace.Param.end_of]): (key, value, ``"low"``/``"high"``, the range as
    the file records it)."""
    params = chosen.get("params") or {}
    found = []
    for key, description in (chosen.get("space") or {}).items():
        param = Param.from_description(str(description))
        end = None if param is None else param.end_of(params.get(key), margin)
        if end is not None:
            found.append((key, params[key], end, str(description)))
    return found


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")


def profile_grid(param: Param, chosen: Any) -> list[Any]:
    """The values a profile of ``param`` runs, ascending, ``chosen`` among them.

    A log range (or a choice of positive numbers spanning a decade: a coarse log range) gets
    its decades from its least value up, its greatest value, and a decade past each end (a
    choice: its values and a decade past each end); a linear range
        [`LINEAR_POINTS`][pflower.tuning.profile.LINEAR_POINTS] evenly
    spaced points from end to end (on its step; integers for an integer range), nothing past its
    ends, which are often the option's own (a fraction, a percentage, one epoch); any other
    choice its values."""
    span = param.log_span()
    if span is not None:
        low, high = span
        if param.kind == "choice":
            values = {*(float(c) for c in param.choices), low / 10, high * 10}
        else:
            decades = math.floor(math.log10(high / low) + 1e-9)
            values = {low * 10**k for k in range(-1, decades + 1)} | {high, high * 10}
        values = {_rounded(v) for v in values}
    elif param.kind == "choice":
        return list(param.choices) + ([] if chosen in param.choices else [chosen])
    else:
        assert param.low is not None and param.high is not None
        width = param.high - param.low
        points = [param.low + width * i / (LINEAR_POINTS - 1) for i in range(LINEAR_POINTS)]
        if param.step:
            points = [param.low + round((p - param.low) / param.step) * param.step for p in points]
        values = {round(p) if param.kind == "int" else _rounded(p) for p in points}
    return sorted(values | {chosen})


def _inside(param: Param | None, value: Any) -> bool | None:
    """Does ``value`` lie in ``param``'s range (None: no range known)?"""
    if param is None:
        return None
    if param.kind == "choice" and param.log_span() is None:
        return value in param.choices
    position = param.position(value)
    return position is not None and -1e-9 <= position <= 1 + 1e-9


def _where(param: Param | None, value: Any) -> str:
    if param is None:
        return "a key the study did not search"
    if _inside(param, value):
        return "inside the range"
    below = param.position(value)
    return "past the low end" if below is not None and below < 0 else "past the high end"


def run_profile(
    suite: Suite,
    setting: Setting,
    method: str,
    key: str,
    layout: Layout,
    values: Sequence[Any] | None = None,
    workers: int = 1,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    runner: Runner | None = None,
    study: int | None = None,
) -> dict[str, Any]:
    """Profile ``key`` at the values ``method``'s study ``study`` chose on ``setting`` (None: a
    suite of one study), with that study's tuning seed (``values``: the grid; None:
    [`profile_grid`][pflower.tuning.profile.profile_grid] of the range searched); write and return
    the record.

    Raises:
        ConfigError: the method has no chosen values here, or ``key`` was not searched and no
            ``values`` are given.
    """
    execute = runner or run_pflower
    chosen_path = layout.chosen_file(setting.name, method, study)
    named = method if study is None else f"{method} (study {study})"
    if not chosen_path.exists():
        raise ConfigError(f"{named} has no chosen values on {setting.name}: tune it first")
    chosen = read_chosen(chosen_path)
    params = dict(chosen.get("params") or {})
    space = chosen.get("space") or {}
    if not params:
        raise ConfigError(f"{named} on {setting.name}: no trial completed, nothing to profile")
    param = Param.from_description(str(space[key])) if key in space else None
    evaluated = suite.search.evaluated_rounds(setting.rounds(method))  # as its trials were
    if values is None:
        if param is None:
            raise ConfigError(
                f"{named} on {setting.name} did not search {key} (it searched "
                f"{', '.join(space)}): give the values to run with --profile-values"
            )
        values = profile_grid(param, params[key])

    _runs_made_at(layout.profile_runs_dir(setting.name, method, key, study), chosen)

    def point(value: Any) -> dict[str, Any]:
        run_dir = layout.profile_run_dir(setting.name, method, key, value, study)
        summary = read_summary(run_dir) or {}
        if summary.get("status") != "completed" and not failed_by_itself(summary):
            shutil.rmtree(run_dir, ignore_errors=True)  # never ran, or interrupted: run it
            overrides = trial_overrides(
                suite,
                setting,
                method,
                {**params, key: value},
                seed=suite.study_seed(study),
                evaluated=evaluated,
            )
            try:
                summary = execute(run_command(overrides, run_dir), run_dir, timeout_s=timeout_s)
            except TrialFailed:
                summary = read_summary(run_dir) or {"error": "the run left no summary"}
            except RunRefused as refused:  # a value past an end that the option does not take
                summary = {"error": f"refused: {refused.reason}"}
        found: dict[str, Any] = {"value": value, "inside": _inside(param, value)}
        if summary.get("status") == "completed":
            found["objective"] = objective_of(summary)
            found["wall_time_s"] = summary.get("wall_time_s")
        else:
            again = " (it runs again at the next --profile)" if was_interrupted(summary) else ""
            found["error"] = error_line(summary) + again
        found["code"] = (summary.get("code") or {}).get("fingerprint")
        found["kernels"] = (summary.get("numerics") or {}).get("cpu_capability")
        shown = f"{found['objective']:.4f}" if "objective" in found else found["error"]
        log(f"{setting.name} {named} profile {key}={format_value(value)}: {shown}")
        return found

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, runs_stop_together():
        points = list(pool.map(point, values))
    record = _record(suite, setting, method, key, chosen, space.get(key), points, study)
    path = layout.profile_file(setting.name, method, key, study)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# pflower tune --profile {key}: {named} on {setting.name} (suite {suite.name}), the "
        "chosen values with this one key varied, scored on validation.\n"
    )
    path.write_text(header + yaml.safe_dump(record, sort_keys=False, allow_unicode=True))
    return record


def _record(
    suite: Suite,
    setting: Setting,
    method: str,
    key: str,
    chosen: Mapping[str, Any],
    description: str | None,
    points: Sequence[Mapping[str, Any]],
    study: int | None = None,
) -> dict[str, Any]:
    params = chosen.get("params") or {}
    at_chosen = [p for p in points if p["value"] == params.get(key) and "objective" in p]
    scored = [p for p in points if "objective" in p]
    param = None if description is None else Param.from_description(description)
    record: dict[str, Any] = {
        "method": method,
        "setting": setting.name,
        "suite": suite.name,
        "key": key,
        "objective": OBJECTIVE,
        **({} if study is None else {"study": study}),
        "seed": suite.study_seed(study),
        "space": description or "not searched",
        "chosen": params.get(key),
        **chosen_identity(chosen),
        "reproduced": (
            at_chosen[0]["objective"] - chosen["value"]
            if at_chosen and chosen.get("value") is not None
            else None
        ),
        "points": [dict(p) for p in points],
    }
    if scored:
        # a tie is not evidence past an end: the chosen value, then a value inside, wins it
        best = max(
            scored,
            key=lambda p: (p["objective"], p["value"] == params.get(key), p["inside"] is not False),
        )
        record["best"] = {
            "value": best["value"],
            "objective": best["objective"],
            "where": _where(param, best["value"]),
        }
    return record


def read_profiles(
    setting_dir: Path, method: str, study: int | None = None
) -> dict[str, dict[str, Any]]:
    """The profiles recorded for ``method`` (its study ``study``) in a setting folder, by key."""
    folder = in_study(setting_dir / "profiles" / method, study)
    if not folder.is_dir():
        return {}
    return {p.stem: yaml.safe_load(p.read_text()) or {} for p in sorted(folder.glob("*.yaml"))}


def chosen_identity(chosen: Mapping[str, Any]) -> dict[str, Any]:
    """What names a study's chosen values in a profile: the chosen trial's number and objective
    (a study searched again chooses another trial, or one of the same number with other values,
    since a widened range draws other values, and another objective)."""
    return {"chosen_trial": chosen.get("best_trial"), "chosen_objective": chosen.get("value")}


def made_at(record: Mapping[str, Any], chosen: Mapping[str, Any]) -> bool:
    """Was a profile (or a profile's runs, by their marker) made at these chosen values?"""
    identity = chosen_identity(chosen)
    return {key: record.get(key) for key in identity} == identity


def current_profiles(
    setting_dir: Path, method: str, chosen: Mapping[str, Any], study: int | None = None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The profiles made at the values ``method``'s study chose (``chosen``), by key, and the
    keys of those made at values chosen before (the study was searched again since): those
    describe other runs."""
    profiles = read_profiles(setting_dir, method, study)
    current = {key: record for key, record in profiles.items() if made_at(record, chosen)}
    return current, sorted(profiles.keys() - current.keys())


def _runs_made_at(folder: Path, chosen: Mapping[str, Any]) -> None:
    """Keep a profile's runs (an interrupted profile resumes from them) only if they were made
    at these chosen values; otherwise remove them, so that no point of another search is
    reused."""
    marker = folder / "chosen.yaml"
    if not marker.exists() or not made_at(yaml.safe_load(marker.read_text()) or {}, chosen):
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    marker.write_text(yaml.safe_dump(chosen_identity(chosen)))


def describe_profile(record: Mapping[str, Any]) -> str:
    """One line: the best point and where it lies, the points past the range's ends, and the
    chosen point (with how well it reproduced the chosen trial)."""
    points = record.get("points") or []
    if "best" not in record:
        return f"profile of {record.get('key')}: no point completed ({len(points)} failed)"

    def score(p: Mapping[str, Any]) -> str:
        shown = f"{100 * p['objective']:.2f} %" if "objective" in p else "failed"
        return f"{format_value(p['value'])}: {shown}"

    best = record["best"]
    parts = [
        f"profile of {record['key']} at the other chosen values (validation, seed "
        f"{record.get('seed')}): best {format_value(best['value'])} ({100 * best['objective']:.2f}"
        f" %), {best['where']}"
    ]
    beyond = [p for p in points if p.get("inside") is False]
    if beyond:
        parts.append("past the ends " + ", ".join(score(p) for p in beyond))
    chosen = [p for p in points if p["value"] == record.get("chosen")]
    if chosen:
        reproduced = record.get("reproduced")
        again = "" if reproduced is None else f", the chosen trial's run again: {reproduced:+.4f}"
        parts.append(f"chosen {score(chosen[0])}{again}")
    return "; ".join(parts)
