"""``pflower report --leaderboard <folder>``: the tuned comparison of a ``pflower tune`` suite.

For every setting of the folder (``<root>/<setting>/``), one row per method with final runs:

- **rank**, with ties: a method's rank is 1 + the number of methods whose final-round accuracy is
  higher *beyond the seeds' noise*, i.e. with a two-sided paired t-test p < 0.05 over the final
  seeds both methods ran. The test pairs the seeds because a final seed fixes the partition, the
  initial model and the batches for every method alike, and partitions differ in difficulty for
  all methods at once, which an unpaired test would count as noise (differences that are all
  equal and positive count as separated). Methods no other method beats significantly share
  rank 1, and so on: a rank is a statement about the evidence, not about the order of the means;
- **FDR rank**: the same count when the p-values of all the setting's pairs are adjusted
  together for a 5% false discovery rate (Benjamini-Hochberg;
  [`fdr_better_counts`][pflower.reporting.leaderboard.fdr_better_counts]). With
  33 methods the plain rank makes 528 tests at 5% each, so some of its separations are expected
  to be chance; of those that remain in the FDR rank, about 5% at most (an approximation: the
  procedure's bound is proven for independent or positively dependent tests, and the tests of
  all pairs share methods and seeds);
- final-round and last-10%-of-rounds stage-L1 Acc(L) (the deployable models on the clients' test
  shares), mean ± std (ddof=1) over the seeds, and the number of seeds;
- the chosen hyperparameters (``chosen/<method>.yaml``), the validation objective they reached
  and the trials spent (complete / pruned / failed; trials interrupted by a stopped command and
  retried with the same values are listed apart, they are not part of the budget);
- seconds per round and MB per client-round (array megabytes down and up per training
  client), the runs' ``summary.json`` ``cost``
  ([`pflower.results.rundir.run_cost`][pflower.results.rundir.run_cost]),
  computed from ``metrics.jsonl`` for a run that predates it; where neither holds it, seconds
  per round is the run's wall time over its rounds and the megabytes are not known;
- **collapse**: ``= FedAvg`` where the final runs' configuration is another method (a declared
  neutral point, [`pflower.core.options.collapse_of`][pflower.core.options.collapse_of], or a model
  that leaves the method nothing of its own: FedBN without BatchNorm), ``≈ Local`` where it is next
  to one (`collapse`): such a row ranks its base method at other settings, not a method.

Under each setting's table: the methods ranked above a method with a higher mean (their
differences to the others vary from seed to seed, so the test separates few methods from
them: [`ranked_above_higher_means`][pflower.reporting.leaderboard.ranked_above_higher_means]),
the final runs that failed (a diverged run, say: in no mean and no test, counted in the seeds
column and named with the error, since the mean over the other seeds flatters the method; an
interrupted run, one stopped by a signal, has not run yet and counts nowhere), the final runs
that completed without some clients' replies
([`rejected_replies`][pflower.results.rundir.rejected_replies]: a client whose model diverged is
rejected and
the run goes on without it; a client left out of the final evaluation is in no client mean,
which flatters the method, so the seeds column counts those runs), the chosen values
at an end of their searched range ([`range_ends`][pflower.reporting.leaderboard.range_ends]: the
range, not the budget, may hold the
method back), each with its profile where one was run
([`pflower.tuning.profile`][pflower.tuning.profile]),
the methods run with the suite's ``per_method`` changes (with the overrides and the reason),
those the setting refuses, and those with no final runs yet. Above it, the shared ``train.*``
knobs every method of the setting searched (from the chosen files).

The page records the code fingerprint(s) of the final runs and of the code rendering it, the
CPU kernels the final runs used ([`pflower.provenance.numerics`][pflower.provenance.numerics]), the
date, the machine(s)
and the exact ``pflower tune`` commands from ``<root>/commands.log``. It is written to
``<root>/leaderboard.md`` and ``<root>/leaderboard.csv``, with one figure per setting
(``<root>/leaderboard_<setting>.png``: every method's final accuracy, its seeds and the methods
that share rank 1;
[`pflower.reporting.figures.leaderboard`][pflower.reporting.figures.leaderboard]).
"""

from __future__ import annotations

import collections
import csv
import datetime
import inspect
import json
import math
import re
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from scipy import stats

from pflower.blocks import blocks
from pflower.compose import meta_model
from pflower.core.algorithm import ALGORITHMS
from pflower.core.options import collapse_of
from pflower.provenance import code_version
from pflower.reporting import figures, studies
from pflower.results.rundir import (
    REJECTION_NOTE,
    Rejected,
    error_line,
    failed_by_itself,
    recorded_cost,
    rejected_replies,
)
from pflower.searchspace import RANGE_END, Param
from pflower.tuning.profile import chosen_at_ends, current_profiles, describe_profile
from pflower.tuning.schedule import TPE_STARTUP_TRIALS

ALPHA = 0.05
"""Significance level of the paired t-tests that separate ranks."""


@dataclass
class Entry:
    """One method on one setting."""

    method: str
    final: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    """The final seed of each value of ``final`` (none given: 1, 2, ... in order)."""
    failed: dict[int, str] = field(default_factory=dict)
    """Final runs that stopped with an error (a diverged run, say): seed -> the error's first
    line. They are in no mean and no test; the table and a note under it say so."""
    rejected: dict[int, Rejected] = field(default_factory=dict)
    """Completed final runs that went on without some clients' replies, by seed
    ([`rejected_replies`][pflower.results.rundir.rejected_replies]). They are in the means; a note
    under the
    table names them."""
    last10: list[float] = field(default_factory=list)
    seconds_per_round: list[float] = field(default_factory=list)
    mb_per_client_round: list[float] = field(default_factory=list)
    chosen: Mapping[str, Any] = field(default_factory=dict)
    codes: set[str] = field(default_factory=set)
    kernels: list[str] = field(default_factory=list)
    """Each final run's CPU kernel capability
    ([`pflower.provenance.numerics`][pflower.provenance.numerics]), "not
    recorded" for a run made before pflower recorded it."""
    rank: int = 0
    rank_fdr: int = 0
    """The rank with the false discovery rate controlled
    ([`fdr_better_counts`][pflower.reporting.leaderboard.fdr_better_counts])."""
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Profiles recorded at the chosen values, by key
    ([`pflower.tuning.profile`][pflower.tuning.profile])."""
    stale_profiles: list[str] = field(default_factory=list)
    """Keys whose profile was made at values chosen before the study was searched again."""
    collapse: tuple[str, str] = ("", "")
    """``("= FedAvg", why)`` or ``("≈ Local", why)`` where the method is another method
    (`collapse`); empty strings where it is itself."""
    studies: dict[int, dict[int, float]] = field(default_factory=dict)
    """A suite of several studies: final accuracy by study, then seed (empty: one study)."""
    study_chosen: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    """A suite of several studies: each study's chosen file."""

    @property
    def by_seed(self) -> dict[int, float]:
        """Final accuracy by final seed."""
        seeds = self.seeds or range(1, len(self.final) + 1)
        return dict(zip(seeds, self.final, strict=True))

    @property
    def label(self) -> str:
        algorithm = ALGORITHMS.get(self.method)
        return algorithm.options.display_name if algorithm else self.method


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def seconds_per_round(cost: Mapping[str, float], summary: Mapping[str, Any]) -> float:
    """The run's recorded seconds per round; its wall time over its rounds otherwise (a run
    with fewer than two rounds, or one made before pflower recorded the figure and whose
    ``metrics.jsonl`` is gone)."""
    if "seconds_per_round" in cost:
        return float(cost["seconds_per_round"])
    rounds = max(1, int(summary.get("final_round") or summary.get("rounds") or 1))
    return float(summary.get("wall_time_s") or math.nan) / rounds


def mb_per_client_round(cost: Mapping[str, float]) -> float:
    """Array megabytes down and up per training client and round (NaN where not recorded)."""
    sizes = [cost[k] for k in ("mb_down_per_client_round", "mb_up_per_client_round") if k in cost]
    return float(sum(sizes)) if sizes else math.nan


def _final_runs(method_dir: Path) -> Iterator[tuple[int, Path, dict[str, Any]]]:
    """``(seed, run folder, summary)`` of every ``seed_<n>`` folder of a method that has a
    summary (other folders, a copy say, are not runs)."""
    for run_dir in sorted(method_dir.glob("seed_*")):
        suffix = run_dir.name.removeprefix("seed_")
        summary = _load_json(run_dir / "summary.json") if suffix.isdigit() else None
        if summary:
            yield int(suffix), run_dir, summary


def _study_files(folder: Path, suffix: str) -> list[tuple[int, Path]]:
    """``(k, path)`` of every ``study_<k>`` entry of ``folder`` (``.<suffix>`` files, or
    folders for ``suffix=""``), by ``k``."""
    found = []
    for path in folder.glob(f"study_*{'.' + suffix if suffix else ''}"):
        number = path.name.removeprefix("study_").removesuffix(f".{suffix}" if suffix else "")
        if number.isdigit() and (path.is_dir() != bool(suffix)):
            found.append((int(number), path))
    return sorted(found)


def _study_runs(method_dir: Path) -> Iterator[tuple[int | None, int, Path, dict[str, Any]]]:
    """``(study, seed, run folder, summary)`` of a method's final runs: ``final/<method>/
    study_<k>/seed_<n>`` for a suite of several studies, ``final/<method>/seed_<n>`` (study
    None) for one."""
    folders: list[tuple[int | None, Path]] = [*_study_files(method_dir, "")]
    for study, folder in folders or [(None, method_dir)]:
        for seed, run_dir, summary in _final_runs(folder):
            yield study, seed, run_dir, summary


def collapse(method: str, config: Mapping[str, Any], chosen: Mapping[str, Any]) -> tuple[str, str]:
    """Whether the final runs' resolved ``config`` makes ``method`` another method: ``("= <base>",
    why)`` at a declared neutral point of its options or on a model that leaves it nothing of
    its own, ``("≈ <base>", why)`` next to a neutral point of the range it was searched in
    ([`collapse_of`][pflower.core.options.collapse_of]); ``("", "")`` otherwise."""
    algorithm = ALGORITHMS.get(method)
    if algorithm is None or not config:
        return "", ""
    options = algorithm.options
    base = options.collapse_on(meta_model(config["dataset"], config["model"]))
    if base is not None:
        return f"= {ALGORITHMS[base].options.display_name}", f"on model={config['model']['name']}"
    space = {
        key: param
        for key, description in (chosen.get("space") or {}).items()
        if (param := Param.from_description(str(description))) is not None
    }
    found = collapse_of(options, config.get("strategy") or {}, space)
    if found is None:
        return "", ""
    declared, mark = found
    name = ALGORITHMS[declared.base].options.display_name
    if mark == "=":
        return f"= {name}", f"at {declared.describe()}"
    strategy = config["strategy"]
    chosen_values = ", ".join(f"{key}={strategy[key]:.3g}" for key, _ in declared.at)
    return f"≈ {name}", f"{chosen_values}, next to {declared.describe()}"


def load_setting(setting_dir: Path) -> list[Entry]:
    """Every method of a setting folder with completed final runs (and the failed ones of each,
    in [`Entry.failed`][pflower.reporting.leaderboard.Entry.failed])."""
    entries = []
    final_root = setting_dir / "final"
    methods = sorted(p.name for p in final_root.iterdir()) if final_root.is_dir() else []
    for method in methods:
        entry = Entry(method)
        chosen_path = setting_dir / "chosen" / f"{method}.yaml"
        if chosen_path.exists():
            entry.chosen = yaml.safe_load(chosen_path.read_text()) or {}
        for number, path in _study_files(setting_dir / "chosen" / method, "yaml"):
            entry.study_chosen[number] = yaml.safe_load(path.read_text()) or {}
        entry.chosen = entry.chosen or entry.study_chosen.get(
            min(entry.study_chosen, default=0), {}
        )
        entry.profiles, entry.stale_profiles = current_profiles(setting_dir, method, entry.chosen)
        for study, seed, run_dir, summary in _study_runs(final_root / method):
            if failed_by_itself(summary):  # an interrupted run has not run yet
                entry.failed[seed] = error_line(summary)
            if summary.get("status") != "completed":
                continue
            if not entry.final:
                entry.collapse = collapse(method, summary.get("config") or {}, entry.chosen)
            cost = recorded_cost(run_dir, summary)
            if rejected := rejected_replies(summary):
                entry.rejected[seed] = rejected
            entry.final.append(float(summary["final"]["L1"]["acc_local"]["mean"]))
            entry.seeds.append(seed)
            if study is not None:
                entry.studies.setdefault(study, {})[seed] = entry.final[-1]
            entry.last10.append(float(summary["last10"]["L1"]["acc_local"]["mean"]))
            entry.seconds_per_round.append(seconds_per_round(cost, summary))
            entry.mb_per_client_round.append(mb_per_client_round(cost))
            entry.codes.add(str((summary.get("code") or {}).get("fingerprint")))
            numerics = summary.get("numerics") or {}
            entry.kernels.append(str(numerics.get("cpu_capability") or "not recorded"))
        if entry.final:
            entries.append(entry)
    rank_with_ties(entries)
    return sorted(entries, key=lambda e: (e.rank, -statistics.fmean(e.final)))


def shared_knobs(entries: Sequence[Entry]) -> list[str]:
    """The ``train.*`` keys every method of a setting searched, read from the chosen files'
    spaces (a setting may search more than the suite's ``train_knobs``, e.g. the local epochs)."""
    spaces = [set((e.chosen.get("space") or {}).keys()) for e in entries if e.chosen]
    if not spaces:
        return []
    common = set.intersection(*spaces)
    return sorted(k for k in common if k.startswith("train."))


def paired_test(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float] | None:
    """The mean difference ``a - b`` over the final seeds both ran and the two-sided p-value of a
    paired t-test on the differences (see the module docstring); None with fewer than two common
    seeds. Equal differences give p = 0 (1 when they are all zero)."""
    # rounded: equal differences stay equal, and twins one ulp apart are not "separated"
    differences = [round(a[seed] - b[seed], 12) for seed in sorted(a.keys() & b.keys())]
    if len(differences) < 2:
        return None
    mean = statistics.fmean(differences)
    if statistics.stdev(differences) == 0:
        return mean, 1.0 if mean == 0 else 0.0
    p_value = float(stats.ttest_1samp(differences, 0.0).pvalue)
    return mean, p_value if math.isfinite(p_value) else 1.0


def significantly_better(
    a: Mapping[int, float], b: Mapping[int, float], alpha: float = ALPHA
) -> bool:
    """Is ``a`` above ``b`` beyond the seeds' noise? Both map a final seed to an accuracy: a
    positive mean paired difference with p < ``alpha``
    ([`paired_test`][pflower.reporting.leaderboard.paired_test]; equal positive
    differences count as separated, fewer than two common seeds never do)."""
    test = paired_test(a, b)
    return test is not None and test[0] > 0 and test[1] < alpha


def fdr_better_counts(entries: Sequence[Entry], alpha: float = ALPHA) -> dict[str, int]:
    """Per method, how many methods are significantly better when the p-values of all the
    setting's pairs are adjusted together with Benjamini and Hochberg's procedure
    (``scipy.stats.false_discovery_control``): of all the separations the table then makes,
    about a fraction ``alpha`` at most is expected to be chance (approximately: see the module
    docstring), where the plain rank allows each pair that chance on its own (528 pairs among 33
    methods)."""
    pairs = [
        (a, b, test)
        for i, a in enumerate(entries)
        for b in entries[i + 1 :]
        if (test := paired_test(a.by_seed, b.by_seed)) is not None
    ]
    counts = {entry.method: 0 for entry in entries}
    if not pairs:
        return counts
    adjusted = stats.false_discovery_control([p_value for *_, (_, p_value) in pairs])
    for (a, b, (mean, _)), q_value in zip(pairs, adjusted, strict=True):
        if q_value < alpha and mean != 0:
            counts[(b if mean > 0 else a).method] += 1
    return counts


def rank_with_ties(entries: Sequence[Entry]) -> None:
    """rank = 1 + the number of methods significantly better (see the module docstring), and
    rank_fdr the same with the false discovery rate controlled
    ([`fdr_better_counts`][pflower.reporting.leaderboard.fdr_better_counts])."""
    fdr = fdr_better_counts(entries)
    for entry in entries:
        entry.rank = 1 + sum(
            significantly_better(other.by_seed, entry.by_seed)
            for other in entries
            if other is not entry
        )
        entry.rank_fdr = 1 + fdr[entry.method]


def ranked_above_higher_means(entries: Sequence[Entry]) -> list[tuple[Entry, list[Entry]]]:
    """The methods holding a better rank than some method with a higher mean, each with those
    methods. A rank counts the methods significantly better, and with few seeds a method whose
    differences to the others vary widely across seeds (one bad seed, say) is separated from few:
    it can share rank 1 far below the leaders, above a steadier method with a higher mean.
    Listed under the table so the rank is read with its per-seed values. Every entry has final runs
    ([`load_setting`][pflower.reporting.leaderboard.load_setting] keeps no other).
    """
    means = [statistics.fmean(e.final) for e in entries]
    inversions = []
    for entry, mean in zip(entries, means, strict=True):
        higher = [
            o for o, m in zip(entries, means, strict=True) if o.rank > entry.rank and m > mean
        ]
        if higher:
            inversions.append((entry, higher))
    return sorted(inversions, key=lambda item: -len(item[1]))


def _inversion_notes(entries: Sequence[Entry]) -> list[str]:
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
            f"- {entry.label} (rank {entry.rank}, {_mean_std(entry.final)}) is ranked above "
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


def _range_end_notes(entries: Sequence[Entry]) -> list[str]:
    ends = [(e, found) for e in entries if (found := range_ends(e.chosen))]
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
        for key, *_ in chosen_at_ends(entry.chosen):
            if key in entry.profiles:
                lines.append(f"    - {describe_profile(entry.profiles[key])}")
            elif key in entry.stale_profiles:
                lines.append(
                    f"    - its profile of {key} was made at the values chosen before the study "
                    f"was searched again, and is not shown (`pflower tune --profile {key}` "
                    "profiles the values chosen now)"
                )
    return [*lines, ""]


def _collapse_notes(entries: Sequence[Entry]) -> list[str]:
    collapsed = [e for e in entries if e.collapse[0]]
    if not collapsed:
        return []
    lines = [
        "Collapsed: at these settings the method computes what another method computes "
        "(`=`: its declared neutral point, or a model that leaves it nothing of its own; the "
        "rows are the same to the last digit, `tests/test_collapses.py`) or all but does "
        "(`≈`: within 5% of the searched range's neutral end), so its row ranks that method, with "
        "its own tuned values, not the method itself:",
        "",
    ]
    lines += [f"- {e.label} {e.collapse[0]} ({e.collapse[1]})" for e in collapsed]
    return [*lines, ""]


def _failure_notes(entries: Sequence[Entry]) -> list[str]:
    failures = [(e, seed, error) for e in entries for seed, error in sorted(e.failed.items())]
    if not failures:
        return []
    lines = [
        "Final runs that failed (in no mean and no test, so the method's mean over its other "
        "seeds flatters it; the seeds column counts them apart):",
        "",
    ]
    lines += [f"- {e.label}, seed {seed}: {error}" for e, seed, error in failures]
    return [*lines, ""]


def _rejection_notes(entries: Sequence[Entry]) -> list[str]:
    runs = [(e, seed, r) for e in entries for seed, r in sorted(e.rejected.items())]
    if not runs:
        return []
    lines = [
        f"Final runs that completed without some clients' replies, in the means. {REJECTION_NOTE}",
        "",
    ]
    lines += [f"- {e.label}, seed {seed}: {r.describe()}" for e, seed, r in runs]
    return [*lines, ""]


def _seeds(entry: Entry) -> str:
    """The seeds column: the runs in the means, those that failed, and how many of the first
    scored their final accuracy on fewer clients (a client's reply rejected)."""
    notes = []
    if entry.failed:
        notes.append(f"+{len(entry.failed)} failed")
    if short := sum(r.missing_at_end > 0 for r in entry.rejected.values()):
        notes.append(f"{short} short of clients")
    return str(len(entry.final)) + (f" ({'; '.join(notes)})" if notes else "")


def _mean_std(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
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


def _trials_drawn(trials: Any) -> str:
    """How a suite's trials were drawn: Optuna's TPE sampler draws its first
    [`TPE_STARTUP_TRIALS`][pflower.tuning.schedule.TPE_STARTUP_TRIALS] at random."""
    if isinstance(trials, int) and trials <= TPE_STARTUP_TRIALS:
        return (
            f"{trials} trials per method and setting, each a seeded random draw from the "
            f"method's space, as Optuna's TPE sampler draws its first {TPE_STARTUP_TRIALS}"
        )
    return (
        f"{trials if trials is not None else '?'} Optuna TPE trials per method and setting, "
        f"the first {TPE_STARTUP_TRIALS} drawn at random"
    )


def table(entries: Sequence[Entry]) -> list[list[str]]:
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
                _mean_std(e.final),
                _mean_std(e.last10),
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


def _method_row(entry: Entry) -> studies.MethodRow:
    """What the table of a suite of several studies shows of ``entry`` beside its scores."""
    return studies.MethodRow(
        label=entry.label,
        collapse=entry.collapse[0],
        chosen={k: _chosen(c) for k, c in entry.study_chosen.items()},
        searched={k: c.get("search") or {} for k, c in entry.study_chosen.items()},
        seconds_per_round=_number(entry.seconds_per_round, 2),
        mb_per_client_round=_number(entry.mb_per_client_round, 3),
    )


def _markdown_table(rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += [
        "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]
    ]
    return lines


def _commands(root: Path) -> list[dict[str, Any]]:
    path = root / "commands.log"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def _exceptions(setting_dir: Path, changes: Mapping[str, Mapping[str, Any]]) -> list[str]:
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


def _pending(setting_dir: Path, methods: Sequence[str], entries: Sequence[Entry]) -> list[str]:
    """The suite's methods with no completed final run here yet (nor refused): how far the
    setting is, since a suite completes over several invocations."""
    finished = {e.method for e in entries} & set(methods)
    refused = {p.stem for p in (setting_dir / "refused").glob("*.txt")}
    pending = [m for m in methods if m not in finished | refused]
    if not pending:
        return []
    tuned = {p.stem for p in (setting_dir / "chosen").glob("*.yaml")}

    def state(method: str) -> str:
        failed = {
            seed: error_line(summary)
            for seed, _, summary in _final_runs(setting_dir / "final" / method)
            if failed_by_itself(summary)
        }
        if failed:
            first = min(failed)
            seeds = ", ".join(map(str, sorted(failed)))
            error = f"seed {first}: {failed[first]}"
            return f"{method} (every final run so far failed, seeds {seeds}; {error})"
        return f"{method} (tuned, final runs pending)" if method in tuned else method

    shown = [state(m) for m in pending]
    return [
        f"{len(finished)} of {len(methods)} methods have final runs; not yet: {', '.join(shown)}.",
        "",
    ]


def render(root: Path) -> tuple[str, list[list[str]]]:
    """The leaderboard page (markdown) and its CSV rows."""
    suite = (
        yaml.safe_load((root / "suite.yaml").read_text()) if (root / "suite.yaml").exists() else {}
    )
    settings = sorted(p for p in root.iterdir() if p.is_dir() and (p / "final").is_dir())
    name = suite.get("name", root.name)
    lines = [f"# pflower leaderboard: suite {name}", ""]
    lines += [
        "Every method was tuned on the clients' validation shares with the same budget "
        f"({_trials_drawn(suite.get('trials'))}, tuning seed "
        f"{suite.get('tune_seed', '?')}, the same shared train.* knobs for every method of a "
        "setting, listed under it), then run with the "
        f"chosen values and new seeds {suite.get('final_seeds', '?')} on test. Accuracy is "
        "stage L1 Acc(L), the clients' deployable models on their own test shares, mean ± std "
        "over seeds; never the best round. Ranks are tied unless a paired t-test over the final "
        f"seeds separates them (two-sided, p < {ALPHA}; a seed fixes the partition, the initial "
        "model and the batches for every method alike, so the seeds pair up). The FDR rank "
        "counts only the separations that remain when the p-values of all the setting's pairs "
        f"are adjusted together for a {ALPHA:.0%} false discovery rate (Benjamini-Hochberg). "
        "s / round is the median time between successive rounds (a run's wall time over its "
        "rounds where the run recorded none) and MB / client-round the array megabytes one "
        "training client receives and sends per round, '-' where the runs recorded none; both "
        "are means over the seeds, measured on the machines named below.",
        "",
    ]
    if suite.get("budget"):
        lines += [f"Budget: {suite['budget']}", ""]
    csv_rows: list[list[str]] = []
    codes: set[str] = set()
    kernels: collections.Counter[str] = collections.Counter()
    for setting_dir in settings:
        entries = load_setting(setting_dir)
        overrides = (suite.get("settings") or {}).get(setting_dir.name, [])
        lines += [f"## {setting_dir.name}", ""]
        if overrides:
            lines += [f"Setting: `{' '.join(overrides)}`", ""]
        knobs = shared_knobs(entries)
        if knobs:
            lines += [f"Shared knobs searched for every method: {', '.join(knobs)}.", ""]
        results = {e.method: e.studies for e in entries if e.studies}
        ranked = studies.rank_intervals(results) if results else []
        single: list[Entry] = []
        if ranked:  # a suite of several studies: ranked by the mean, with intervals
            by_method = {e.method: e for e in entries}
            for r in ranked:
                by_method[r.method].rank = r.rank
            single = [e for e in entries if not e.studies]
            entries = [by_method[r.method] for r in ranked]
            rows = studies.table(ranked, {e.method: _method_row(e) for e in entries})
        else:
            rows = table(entries)
        if entries:
            figure = figures.leaderboard(
                [(e.label, e.final, e.rank) for e in entries],
                root / f"leaderboard_{setting_dir.name}.png",
                setting_in_words(setting_dir),
            )
            lines += [f"![{setting_dir.name}: final accuracy by method]({figure.name})", ""]
        lines += [*_markdown_table(rows), ""]
        lines += studies.notes(results, ranked) if ranked else _inversion_notes(entries)
        if single:  # runs of another protocol in the same folder: shown apart, not ranked
            lines += [
                "Tuned in a single study (another protocol), not ranked with the methods above: "
                + ", ".join(f"{e.label} {_mean_std(e.final)}" for e in single)
                + ".",
                "",
            ]
        lines += _collapse_notes(entries)
        lines += _failure_notes(entries)
        lines += _rejection_notes(entries)
        lines += _range_end_notes(entries)
        lines += _exceptions(setting_dir, (suite.get("per_method") or {}).get(setting_dir.name, {}))
        compared = (suite.get("setting_methods") or {}).get(setting_dir.name)
        lines += _pending(setting_dir, compared or suite.get("methods") or [], entries)
        if not csv_rows or csv_rows[0][1:] != rows[0]:  # a header wherever the columns change
            csv_rows += [["setting", *rows[0]]]
        csv_rows += [[setting_dir.name, *row] for row in rows[1:]]
        for entry in entries:
            codes |= entry.codes
            kernels.update(entry.kernels)
    now = code_version()
    commands = _commands(root)
    machines = sorted({c.get("machine", "?") for c in commands})
    lines += [
        "## Provenance",
        "",
        f"- rendered {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} by "
        f"pflower {now['fingerprint']} (commit {now.get('commit')}, "
        f"{'uncommitted changes' if now.get('dirty') else 'clean'})",
        f"- code fingerprint(s) of the final runs: {', '.join(sorted(codes)) or '-'}",
        f"- machine(s): {'; '.join(machines) or '-'}",
        "- CPU kernels of the final runs (torch's CPU capability; results differ in the last "
        "bits between AVX2 and AVX-512 kernels, and `numerics=avx2`, the default, or for runs "
        "made before it `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
        "MKL_ENABLE_INSTRUCTIONS=AVX2`, make them agree): "
        + (", ".join(f"{name} ({count} runs)" for name, count in sorted(kernels.items())) or "-"),
        "- commands:",
        "",
        "```",
        *(f"# {c.get('date')} in {c.get('cwd')}\n{c.get('command')}" for c in commands),
        f"pflower report --leaderboard {root}",
        "```",
        "",
    ]
    return "\n".join(lines), csv_rows


def setting_in_words(setting_dir: Path) -> str:
    """A setting as a figure's title says it ("Fashion-MNIST, DiversiFed Dirichlet, 20 clients"),
    from a final run's configuration and the first words of its dataset's and partition scheme's
    docstrings (an option they name reads as its value); the setting's folder name where no final
    run is recorded."""
    configs = sorted(setting_dir.glob("final/*/seed_*/config.yaml"))
    if not configs:
        return setting_dir.name
    cfg = yaml.safe_load(configs[0].read_text()) or {}

    def words(group: str) -> str:
        block = cfg.get(group) or {}
        name = str(block.get("name", "?"))
        doc = inspect.getdoc(blocks(group).get(name)) or name
        text = re.split(r" \(|: |\.(?:\s|$)", doc, maxsplit=1)[0].strip() or name
        # an option the sentence names (``classes_per_client``) reads as its value
        return re.sub(r"``(\w+)``", lambda m: str(block.get(m.group(1), m.group(1))), text)

    partition = words("partition")
    first = partition.split(" ", 1)[0]
    if first[1:].islower():  # a sentence's first word ("Each client holds ..."), not a name
        partition = partition[0].lower() + partition[1:]
    return f"{words('dataset')}, {partition}, {cfg.get('num_clients', '?')} clients"


def write_leaderboard(root: Path) -> Path:
    """Write ``leaderboard.md`` and ``leaderboard.csv`` into ``root``; returns the markdown."""
    text, rows = render(root)
    (root / "leaderboard.md").write_text(text)
    with (root / "leaderboard.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return root / "leaderboard.md"
