"""The final runs of a ``pflower tune`` suite's setting, read into one
[`Entry`][pflower.reporting.leaderboard_runs.Entry] per method: final and last-10% accuracy by
seed, failed and rejected runs, cost, code and CPU kernels, the chosen hyperparameters with their
profiles, and whether the configuration collapses the method into another
([`pflower.reporting.leaderboard`][pflower.reporting.leaderboard] ranks and renders them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pflower.compose import meta_model
from pflower.core.algorithm import ALGORITHMS
from pflower.core.options import collapse_of
from pflower.reporting import studies
from pflower.results.failures import (
    Rejected,
    error_line,
    every_client_acc,
    failed_by_itself,
    rejected_replies,
)
from pflower.results.summary import recorded_cost
from pflower.searchspace import Param
from pflower.tuning.profile import current_profiles


@dataclass
class Entry:
    """One method on one setting."""

    method: str
    final: list[float] = field(default_factory=list)
    """Each completed final run's L1 Acc(L) over every client it evaluated
    ([`every_client_acc`][pflower.results.failures.every_client_acc]); ``last10`` likewise."""
    seeds: list[int] = field(default_factory=list)
    """The final seed of each value of ``final`` (none given: 1, 2, ... in order)."""
    failed: dict[int, str] = field(default_factory=dict)
    """A suite of one study: final runs that stopped with an error (a diverged run, say): seed
    -> the error's first line. They are in no mean and no test; the table and a note under it
    say so (a suite of several studies keeps them in ``study_failed``)."""
    rejected: dict[tuple[int | None, int], Rejected] = field(default_factory=dict)
    """Completed final runs that went on without some clients' replies, by study (None: one)
    and seed
    ([`rejected_replies`][pflower.results.failures.rejected_replies]). They are in the means, each
    client left out of an evaluation scored 0
    ([`every_client_acc`][pflower.results.failures.every_client_acc]); a note under the table
    names them."""
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
    ([`fdr_better_counts`][pflower.reporting.leaderboard_ranks.fdr_better_counts])."""
    profiles: dict[int | None, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """Profiles recorded at the chosen values, by study (None: a suite of one) and key
    ([`pflower.tuning.profile`][pflower.tuning.profile])."""
    stale_profiles: dict[int | None, list[str]] = field(default_factory=dict)
    """By study, the keys whose profile was made at values chosen before the study was searched
    again."""
    collapse: tuple[str, str] = ("", "")
    """``("= FedAvg", why)`` or ``("≈ Local", why)`` where the method is another method
    (`collapse`); empty strings where it is itself."""
    studies: dict[int, dict[int, float]] = field(default_factory=dict)
    """A suite of several studies: final accuracy by study, then seed (empty: one study)."""
    study_chosen: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    """A suite of several studies: each study's chosen file."""
    study_failed: dict[int, dict[int, str]] = field(default_factory=dict)
    """A suite of several studies: the final runs that failed by themselves, by study, then
    seed, with the error's first line (``failed`` keeps the same by seed alone)."""
    study_collapse: dict[int, tuple[str, str]] = field(default_factory=dict)
    """A suite of several studies: `collapse` of each study's final runs, where it collapses."""

    @property
    def scores(self) -> dict[int, dict[int, float]]:
        """A suite of several studies: final accuracy by study, then seed, with each failed run
        at [`FAILED`][pflower.reporting.studies.FAILED] (empty: one study)."""
        return studies.scored(self.studies, self.study_failed)

    def missing(self, planned: int, seeds: Sequence[int]) -> int:
        """How many of a suite's final runs (``planned`` studies x ``seeds``) this method has
        neither completed nor failed by itself yet (an interrupted run is missing). Runs in the
        one-study layout (no ``study_<k>`` folders) are never missing: that layout plans one."""
        if not (self.studies or self.study_failed):
            return 0
        done = {(s, seed) for s, runs in self.studies.items() for seed in runs}
        done |= {(s, seed) for s, runs in self.study_failed.items() for seed in runs}
        return sum((s, seed) not in done for s in range(planned) for seed in seeds)

    @property
    def failed_runs(self) -> int:
        """How many final runs failed by themselves (every study's)."""
        return sum(map(len, self.study_failed.values())) or len(self.failed)

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


def final_runs(method_dir: Path) -> Iterator[tuple[int, Path, dict[str, Any]]]:
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
        for seed, run_dir, summary in final_runs(folder):
            yield study, seed, run_dir, summary


def studies_chosen(entry: Entry) -> list[tuple[int | None, Mapping[str, Any]]]:
    """Each study's chosen values, by study number; ``[(None, chosen)]`` for a suite of one."""
    if not entry.study_chosen:
        return [(None, entry.chosen)]
    return [(study, chosen) for study, chosen in sorted(entry.study_chosen.items())]


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


def read_setting(setting_dir: Path) -> list[Entry]:
    """Every method of a setting folder with completed final runs (and the failed ones of each,
    in [`Entry.failed`][pflower.reporting.leaderboard_runs.Entry.failed]), by name, not ranked
    yet."""
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
        for study, chosen in studies_chosen(entry):
            current, stale = current_profiles(setting_dir, method, chosen, study)
            entry.profiles[study], entry.stale_profiles[study] = current, stale
        for study, seed, run_dir, summary in _study_runs(final_root / method):
            if failed_by_itself(summary):  # an interrupted run has not run yet
                if study is None:
                    entry.failed[seed] = error_line(summary)
                else:
                    entry.study_failed.setdefault(study, {})[seed] = error_line(summary)
            if summary.get("status") != "completed":
                continue
            if not entry.final:
                entry.collapse = collapse(method, summary.get("config") or {}, entry.chosen)
            if study is not None and study not in entry.studies:
                chosen = entry.study_chosen.get(study, entry.chosen)
                if (found := collapse(method, summary.get("config") or {}, chosen))[0]:
                    entry.study_collapse[study] = found
            cost = recorded_cost(run_dir, summary)
            if rejected := rejected_replies(summary):
                entry.rejected[study, seed] = rejected
            entry.final.append(every_client_acc(summary, "final"))
            entry.seeds.append(seed)
            if study is not None:
                entry.studies.setdefault(study, {})[seed] = entry.final[-1]
            entry.last10.append(every_client_acc(summary, "last10"))
            entry.seconds_per_round.append(seconds_per_round(cost, summary))
            entry.mb_per_client_round.append(mb_per_client_round(cost))
            entry.codes.add(str((summary.get("code") or {}).get("fingerprint")))
            numerics = summary.get("numerics") or {}
            entry.kernels.append(str(numerics.get("cpu_capability") or "not recorded"))
        if entry.final or entry.study_failed:  # several studies: every run failed counts too
            entries.append(entry)
    _name_same_runs(entries)
    for entry in entries:
        if entry.study_collapse:
            entry.collapse = _studies_collapse(entry)
    return entries


def _runs_of(entry: Entry, study: int | None) -> dict[int, float]:
    """Final accuracy by seed of one study's completed final runs (study None: a suite of one)."""
    return entry.by_seed if study is None else entry.studies.get(study, {})


def _searched(entry: Entry, study: int | None) -> set[str]:
    """The keys a study searched (its chosen file's ``space``)."""
    chosen = entry.chosen if study is None else entry.study_chosen.get(study, {})
    return set(chosen.get("space") or {})


def same_runs(entry: Entry, study: int | None, entries: Sequence[Entry]) -> tuple[str, str]:
    """``("≈ <base>", why)`` where most of a study's final runs give the final accuracy of the
    same-numbered study and seed of a simpler method of the setting (one that searched a strict
    subset of the study's keys) to the last digit; ``("", "")`` otherwise.

    A collapse that no declared neutral point names: Ditto's pull λ = 0.017, at 10% of its
    searched range, left 4 of 5 of a study's final runs with local training's accuracy to the
    last digit (`collapse` names only a choice within 5% of a neutral end). Two unrelated
    methods share a run's accuracy by chance now and then (a client's test share holds tens of
    samples), one run in five, rarely two; most of a study's runs alike is the method's own
    term all but doing nothing. A run where every client scores 100% is not counted: any two
    methods that learn a setting share it. The simpler method with the most such runs is named
    (on a tie, the first by name)."""
    runs = _runs_of(entry, study)
    keys = _searched(entry, study)
    found = []
    for other in entries:
        if other is entry or not _searched(other, study) < keys:
            continue
        theirs = _runs_of(other, study)
        same = sum(theirs.get(seed) == value < 1 for seed, value in runs.items())
        if 2 * same > len(runs):
            found.append((-same, other.label, other))
    if not found:
        return "", ""
    negative, label, _ = min(found, key=lambda f: (f[0], f[1]))
    return f"≈ {label}", (
        f"{-negative} of {len(runs)} final runs give {label}'s final accuracy to the last digit"
    )


def _name_same_runs(entries: Sequence[Entry]) -> None:
    """Mark the studies that no declared collapse names but whose final runs are, by their
    numbers, a simpler method's ([`same_runs`][pflower.reporting.leaderboard_runs.same_runs])."""
    for entry in entries:
        for study, _ in studies_chosen(entry):
            if entry.study_collapse.get(study) if study is not None else entry.collapse[0]:
                continue
            if not (found := same_runs(entry, study, entries))[0]:
                continue
            if study is None:
                entry.collapse = found
            else:
                entry.study_collapse[study] = found


def _studies_collapse(entry: Entry) -> tuple[str, str]:
    """The collapse of a method tuned in several studies: ``= FedAvg`` where every study's
    final runs collapse alike, else each collapsing study named (``study 2 = FedAvg``): a
    study whose search chose another method makes that share of the method's runs another
    method's."""
    found = entry.study_collapse
    if len(found) == len(entry.scores) and len(set(found.values())) == 1:
        return next(iter(found.values()))
    marks = "; ".join(f"study {k} {mark}" for k, (mark, _) in sorted(found.items()))
    if len(found) == 1:
        return marks, next(iter(found.values()))[1]
    return marks, "; ".join(f"study {k}: {why}" for k, (_, why) in sorted(found.items()))


def run_name(study: int | None, seed: int) -> str:
    """A final run in words: ``study 1 seed 2``, or ``seed 2`` where the suite has one study."""
    return f"seed {seed}" if study is None else f"study {study} seed {seed}"


def in_progress(
    entries: Sequence[Entry], planned: int, seeds: Sequence[int]
) -> dict[str, tuple[int, int]]:
    """The methods of a setting whose studies' final runs are not all in, with the runs planned
    and those missing ([`Entry.missing`][pflower.reporting.leaderboard_runs.Entry.missing]):
    ``planned`` studies x ``seeds``, the suite's final seeds (none recorded: every seed a
    method of the setting ran)."""
    if not seeds:
        ran: set[int] = set()
        for e in entries:
            ran.update(*e.studies.values(), *e.study_failed.values())
        seeds = sorted(ran)
    return {
        e.method: (planned * len(seeds), missing)
        for e in entries
        if (missing := e.missing(planned, seeds))
    }


def shared_knobs(entries: Sequence[Entry]) -> list[str]:
    """The ``train.*`` keys every method of a setting searched, read from the chosen files'
    spaces (a setting may search more than the suite's ``train_knobs``, e.g. the local epochs)."""
    spaces = [set((e.chosen.get("space") or {}).keys()) for e in entries if e.chosen]
    if not spaces:
        return []
    common = set.intersection(*spaces)
    return sorted(k for k in common if k.startswith("train."))
