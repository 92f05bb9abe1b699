"""The notes under a setting's leaderboard table: ranks above a higher mean, collapsed
methods, failed final runs, runs that did without some clients' replies, chosen values at an end
of their searched range (with their profiles), the methods run with changes or refused, and the
methods with no final runs yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pflower.reporting import studies
from pflower.reporting.leaderboard_ranks import ranked_above_higher_means
from pflower.reporting.leaderboard_runs import Entry, final_runs, run_name, studies_chosen
from pflower.reporting.leaderboard_table import mean_std
from pflower.results.failures import LEFT_OUT_SCORE, REJECTION_NOTE, error_line, failed_by_itself
from pflower.searchspace import RANGE_END
from pflower.tuning.profile import chosen_at_ends, describe_profile


def inversion_notes(entries: Sequence[Entry]) -> list[str]:
    """The methods ranked above a higher mean
    ([`ranked_above_higher_means`][pflower.reporting.leaderboard_ranks.ranked_above_higher_means])."""
    inversions = ranked_above_higher_means(entries)
    if not inversions:
        return []
    lines = [
        "Ranks above a higher mean (a rank counts the methods significantly better; a method "
        "whose differences to the others vary from seed to seed is separated from few, so read "
        "its rank with its per-seed values):",
        "",
    ]
    for entry, higher in inversions:
        names = ", ".join(other.label for other in higher[:3])
        more = f" and {len(higher) - 3} more" if len(higher) > 3 else ""
        lines.append(
            f"- {entry.label} (rank {entry.rank}, {mean_std(entry.final)}) is ranked above "
            f"{len(higher)} method(s) with a higher mean: {names}{more}"
        )
    return [*lines, ""]


def range_ends(chosen: Mapping[str, Any], margin: float = RANGE_END) -> list[str]:
    """The chosen values (``chosen/<method>.yaml``) that lie within ``margin`` of an end of the
    range searched for them ([`position`][pflower.searchspace.Param.position]), e.g.
    ``train.lr = 0.0001, low end of log-uniform [0.0001, 0.01]``. A choice counts only where it
    is a coarse log range (positive numbers spanning a decade or more, such as FedDyn's α in
    0.001, 0.01, 0.1) and the least or greatest value was chosen."""
    return [
        f"{key} = {value:.3g}, {end} end of {description}"
        for key, value, end, description in chosen_at_ends(chosen, margin)
    ]


def _ends(entry: Entry) -> list[str]:
    """`range_ends` of a method's choice, or of each study's (named) where it has several."""
    if not entry.study_chosen:
        return range_ends(entry.chosen)
    return [
        f"study {k}: {end}"
        for k, chosen in sorted(entry.study_chosen.items())
        for end in range_ends(chosen)
    ]


def range_end_notes(entries: Sequence[Entry]) -> list[str]:
    """The chosen values at an end of their searched range (`range_ends`; each study's, where
    the suite has several), each with its profile where one was run."""
    ends = [(e, found) for e in entries if (found := _ends(e))]
    if not ends:
        return []
    lines = [
        f"Chosen at an end of the searched range (within {RANGE_END:.0%} of it, in log scale for "
        "a log range; the least or greatest value of a choice spanning a decade or more): the "
        "best value may lie beyond it, so the method may be held back by its declared range "
        "rather than by the budget. Where a profile was run (`pflower tune --profile`: the "
        "chosen values with that one key varied, on validation), it follows the key:",
        "",
    ]
    for entry, found in ends:
        lines.append(f"- {entry.label}: {'; '.join(found)}")
        for study, chosen in studies_chosen(entry):
            named = "" if study is None else f"study {study}: "
            profiles = entry.profiles.get(study, {})
            for key, *_ in chosen_at_ends(chosen):
                if key in profiles:
                    lines.append(f"    - {named}{describe_profile(profiles[key])}")
                elif key in entry.stale_profiles.get(study, []):
                    lines.append(
                        f"    - {named}its profile of {key} was made at the values chosen before "
                        f"the study was searched again, and is not shown (`pflower tune --profile "
                        f"{key}` profiles the values chosen now)"
                    )
    return [*lines, ""]


def collapse_notes(entries: Sequence[Entry]) -> list[str]:
    """The methods whose final runs are another method (``Entry.collapse``), with why."""
    collapsed = [e for e in entries if e.collapse[0]]
    if not collapsed:
        return []
    lines = [
        "Collapsed: at these settings the method computes what another method computes "
        "(`=`: its declared neutral point, or a model that leaves it nothing of its own; the "
        "rows are the same to the last digit, `tests/test_collapses.py`) or all but does "
        "(`≈`: within 5% of the searched range's neutral end, or most of its final runs give the "
        "final accuracy of a simpler method, one that searched fewer of the same keys, to the last "
        "digit), so its row ranks that method, with its own tuned values, not the method itself"
        + (
            " (`study k`: tuned in several studies, only study k's choice collapsed, and its "
            "share of the row's runs is the other method's):"
            if any(e.collapse[0].startswith("study") for e in collapsed)
            else ":"
        ),
        "",
    ]
    lines += [f"- {e.label} {e.collapse[0]} ({e.collapse[1]})" for e in collapsed]
    return [*lines, ""]


def failure_notes(entries: Sequence[Entry]) -> list[str]:
    """The final runs that failed by themselves, with the first line of their error: tuned in
    several studies, scored [`FAILED`][pflower.reporting.studies.FAILED]; in one, left out of
    the means."""
    scored = [
        f"- {e.label}, {run_name(study, seed)}: {error}"
        for e in entries
        for study, runs in sorted(e.study_failed.items())
        for seed, error in sorted(runs.items())
    ]
    left_out = [
        f"- {e.label}, {run_name(None, seed)}: {error}"
        for e in entries
        if not e.study_failed
        for seed, error in sorted(e.failed.items())
    ]
    lines = []
    if scored:
        lines += [
            f"Final runs that failed, scored {studies.FAILED:.0%} in the means, the ranks and "
            "their intervals (the run gave no model; leaving it out would rank the method by "
            "the seeds it survived). A run that failed for a reason outside the method, a "
            "timeout on a loaded machine or memory, is not the method's failure: run it again "
            "with `pflower tune --retry-failed` before reading the ranks:",
            "",
            *scored,
            "",
        ]
    if left_out:
        lines += [
            "Final runs that failed (in no mean and no test, so the method's mean over its "
            "other seeds flatters it; the seeds column counts them apart):",
            "",
            *left_out,
            "",
        ]
    return lines


def rejection_notes(entries: Sequence[Entry]) -> list[str]:
    """The completed final runs that did without some clients' replies, with the score in the
    means of those that left clients out of the final evaluation."""
    runs = [(e, run, r) for e in entries for run, r in sorted(e.rejected.items())]
    if not runs:
        return []
    lines = [
        "Final runs that completed without some clients' replies, in the means. "
        f"{REJECTION_NOTE} The means score each client left out of an evaluation "
        f"{LEFT_OUT_SCORE:.0%}, as they score a failed run: a client rejected as not finite "
        "left no usable model, and averaging the clients that replied would score the method on "
        "those that did not diverge (a client lost to a crash or a timeout counts the same: "
        "where its error is the machine's, delete the run's folder and run it again).",
        "",
    ]
    lines += [
        f"- {e.label}, {run_name(*run)}: {r.describe()}"
        + (f"; in the means {_score(e, *run):.2%}" if r.missing_at_end else "")
        for e, run, r in runs
    ]
    return [*lines, ""]


def _score(entry: Entry, study: int | None, seed: int) -> float:
    """A completed final run's score in the means."""
    return entry.by_seed[seed] if study is None else entry.studies[study][seed]


def exception_notes(setting_dir: Path, changes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The methods whose runs differ from the setting's configuration (with the overrides and
    the reason), and those the setting refuses (with the refusal)."""
    lines = []
    if changes:
        lines += ["Methods run with changes to the setting (the suite's `per_method`):", ""]
        lines += [
            f"- {method}: `{' '.join(change.get('overrides', []))}`: {change.get('reason', '')}"
            for method, change in sorted(changes.items())
        ]
        lines.append("")
    refused = sorted((setting_dir / "refused").glob("*.txt"))
    if refused:
        lines += ["Methods this setting refuses (not run):", ""]
        lines += [f"- {path.stem}: {path.read_text().strip()}" for path in refused]
        lines.append("")
    return lines


def pending_note(
    setting_dir: Path,
    methods: Sequence[str],
    entries: Sequence[Entry],
    in_progress: Mapping[str, tuple[int, int]] = MappingProxyType({}),
) -> list[str]:
    """The suite's methods not ranked here yet (nor refused): how far the setting is, since a
    suite completes over several invocations. ``in_progress``: the methods with some of their
    studies' final runs in, as (the runs planned, those still missing); one the suite does not
    list (a method added to its folder) is named too."""
    finished = {e.method for e in entries} & set(methods)
    refused = {p.stem for p in (setting_dir / "refused").glob("*.txt")}
    pending = [m for m in methods if m not in finished | refused]
    extra = sorted(set(in_progress) - set(methods))
    if not pending and not extra:
        return []
    tuned = {p.stem for p in (setting_dir / "chosen").glob("*.yaml")}
    tuned |= {p.name for p in (setting_dir / "chosen").glob("*") if p.is_dir()}  # by study

    def state(method: str) -> str:
        failed = {
            seed: error_line(summary)
            for seed, _, summary in final_runs(setting_dir / "final" / method)
            if failed_by_itself(summary)
        }
        if method in in_progress:
            planned, missing = in_progress[method]
            return f"{method} ({planned - missing} of its {planned} final runs in)"
        if failed:
            first = min(failed)
            seeds = ", ".join(map(str, sorted(failed)))
            error = f"seed {first}: {failed[first]}"
            return f"{method} (every final run so far failed, seeds {seeds}; {error})"
        return f"{method} (tuned, final runs pending)" if method in tuned else method

    said = []
    if pending:
        shown = ", ".join(map(state, pending))
        said.append(f"{len(finished)} of {len(methods)} methods are ranked; not yet: {shown}.")
    if extra:
        said.append(f"Also under way: {', '.join(map(state, extra))}.")
    return [" ".join(said), ""]
