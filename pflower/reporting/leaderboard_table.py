"""The cells of a leaderboard's table (one row per method of a setting) and the table as
Markdown; the row of a suite of several studies
([`pflower.reporting.studies`][pflower.reporting.studies]) takes its columns beside the scores
from here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pflower.reporting import studies, studies_board
from pflower.reporting.leaderboard_runs import Entry
from pflower.tuning.schedule import TPE_STARTUP_TRIALS


def _seeds(entry: Entry) -> str:
    """The seeds column: the runs in the means, those that failed, and how many of the first
    left clients out of their final evaluation (a client's reply rejected: scored 0)."""
    notes = []
    if entry.failed:
        notes.append(f"+{len(entry.failed)} failed")
    if short := _short(entry):
        notes.append(f"{short} short of clients")
    return str(len(entry.final)) + (f" ({'; '.join(notes)})" if notes else "")


def _short(entry: Entry) -> int:
    """How many of its completed final runs left clients out of their final evaluation."""
    return sum(r.missing_at_end > 0 for r in entry.rejected.values())


def mean_std(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` (ddof=1) of ``values`` times ``scale`` (percent by default); "-" for none."""
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _number(values: Sequence[float], digits: int) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{statistics.fmean(finite):.{digits}f}" if finite else "-"


def _chosen(chosen: Mapping[str, Any]) -> str:
    params = chosen.get("params") or {}
    if not params:
        return "defaults" if chosen else "-"
    parts = []
    for key, value in params.items():
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        parts.append(f"{key.split('.', 1)[-1]}={shown}")
    return ", ".join(parts)


def _trials(chosen: Mapping[str, Any]) -> str:
    budget = chosen.get("budget") or {}
    if not budget:
        return "-"
    done = [f"{budget.get(k, 0)} {k}" for k in ("complete", "pruned", "fail") if budget.get(k)]
    retried = f"; {budget['interrupted']} interrupted, retried" if budget.get("interrupted") else ""
    return f"{budget.get('trials', '?')} ({', '.join(done)}{retried})"


def trials_drawn(suite: Mapping[str, Any]) -> str:
    """How a suite of one study drew its trials: its recorded search plan
    ([`SearchPlan.describe`][pflower.tuning.schedule.SearchPlan.describe]), and where that is a
    count of TPE trials no larger than Optuna's random start
    ([`TPE_STARTUP_TRIALS`][pflower.tuning.schedule.TPE_STARTUP_TRIALS]), that it was a seeded
    random search. A suite.yaml written before search plans records none: TPE trials."""
    search, trials = suite.get("search"), suite.get("trials")
    random_start = isinstance(trials, int) and trials <= TPE_STARTUP_TRIALS
    if isinstance(search, str):
        counted = search.startswith(f"{trials} trials, TPE draws")
        note = (
            f" (Optuna's TPE sampler draws its first {TPE_STARTUP_TRIALS} at random: a seeded "
            "random search)"
            if counted and random_start
            else ""
        )
        return f"{search}, per method and setting{note}"
    if random_start:
        return (
            f"{trials} trials per method and setting, each a seeded random draw from the "
            f"method's space, as Optuna's TPE sampler draws its first {TPE_STARTUP_TRIALS}"
        )
    return (
        f"{trials if trials is not None else '?'} Optuna TPE trials per method and setting, "
        f"the first {TPE_STARTUP_TRIALS} drawn at random"
    )


def table(entries: Sequence[Entry]) -> list[list[str]]:
    """A setting's table: the header, then one row per method, in the order of ``entries``."""
    header = [
        "rank",
        "FDR rank",
        "method",
        "final Acc(L) %",
        "last-10% Acc(L) %",
        "seeds",
        "chosen hyperparameters",
        "val objective %",
        "trials",
        "s / round",
        "MB / client-round",
        "collapse",
    ]
    body = [header]
    for e in entries:
        value = e.chosen.get("value")
        body.append(
            [
                str(e.rank),
                str(e.rank_fdr),
                e.label,
                mean_std(e.final),
                mean_std(e.last10),
                _seeds(e),
                _chosen(e.chosen),
                "-" if value is None else f"{100 * float(value):.2f}",
                _trials(e.chosen),
                _number(e.seconds_per_round, 2),
                _number(e.mb_per_client_round, 3),
                e.collapse[0],
            ]
        )
    return body


def method_row(entry: Entry) -> studies_board.MethodRow:
    """What the table of a suite of several studies shows of ``entry`` beside its scores."""
    return studies_board.MethodRow(
        label=entry.label,
        collapse=entry.collapse[0],
        final=mean_std([*entry.final, *[studies.FAILED] * entry.failed_runs]),
        last10=mean_std([*entry.last10, *[studies.FAILED] * entry.failed_runs]),
        chosen={k: _chosen(c) for k, c in entry.study_chosen.items()},
        searched={k: c.get("search") or {} for k, c in entry.study_chosen.items()},
        seconds_per_round=_number(entry.seconds_per_round, 2),
        mb_per_client_round=_number(entry.mb_per_client_round, 3),
        failed=entry.failed_runs,
        short=_short(entry),
    )
