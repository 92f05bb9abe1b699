"""Rank a new method against stored runs: are the stored runs still those this code would make?

``pflower tune <method> --suite cpu --out <folder>`` tunes and runs only ``<method>``; the
leaderboard (``pflower report --leaderboard <folder>``) then ranks it among the methods whose
final runs the folder already holds. That comparison is fair only where those runs are what the
installed code would compute for them, under the same protocol. `check_stored_runs` checks
both before anything runs, and refuses otherwise (exit code 2), naming what changed and the
command that refreshes the runs:

- the code: each stored run's ``summary.json`` records one fingerprint per part of the code that
  decides its numbers
  ([`pflower.provenance.component_fingerprints`][pflower.provenance.component_fingerprints]: data,
  partition, split, model, training and evaluation, configuration, tuning) and one of its method's
  own modules ([`pflower.provenance.method_fingerprint`][pflower.provenance.method_fingerprint]);
  each must equal the installed code's. A run recorded before pflower kept these has only the
  fingerprint of all of pflower's code: it is accepted where that equals the installed code's, and
  otherwise cannot be checked part by part, which the refusal says (``--trust-unchecked`` accepts
  such runs, never ones whose parts differ);
- the protocol: the folder's ``suite.yaml`` (written by the command that made the runs) must
  hold the suite's trials, tuning seed, final seeds, validation share, shared knobs, number of
  studies, search plan and the setting's overrides (`PROTOCOL_KEYS`).

A part's fingerprint changes with any change to its code (not with its comments, docstrings
or blank lines: [`code_text`][pflower.provenance.code_text]), while most changes leave every
number as it was; a record made before fingerprints read code (no ``parts_read``) differs in
every part. ``pflower reproduce --stored <folder> --suite <suite>``
settles it by experiment: for each stale method of a setting it reruns one completed final run
per recorded code (`StoredMethod.stale_runs`) with the installed code, and where every final and
last-10% value agrees to the last digit it records the pair of fingerprints in the folder's
``verified.yaml`` ([`record_verified`][pflower.tuning.baselines.record_verified]); the check then
accepts that method's runs of that code in that setting (a method, a setting and a code at a
time: a run of one does not vouch for another).
"""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pflower.provenance import (
    CODE_FINGERPRINT,
    PARTS_READ,
    component_fingerprints,
    method_fingerprint,
)
from pflower.registry import ConfigError
from pflower.tuning.runner import read_summary
from pflower.tuning.schedule import SearchPlan
from pflower.tuning.suite import Setting, Suite


class StoredRunsChanged(ConfigError):
    """Stored runs that would be compared with new ones were made by other code or under
    another protocol."""


@dataclass
class StoredMethod:
    """What is known of one stored method's final runs in a setting."""

    method: str
    changed: set[str] = field(default_factory=set)
    """Parts of the code whose fingerprint differs from the installed code's."""
    unchecked: dict[int, str] = field(default_factory=dict)
    """Seed -> the whole-code fingerprint of a run recorded without per-part fingerprints."""
    stale_runs: list[Path] = field(default_factory=list)
    """One completed run of each recorded code whose parts differ (and are not verified): the
    runs a verification reruns."""


VERIFIED = "verified.yaml"
"""The file of a results folder that lists the stored runs' codes verified by rerunning a run
with later code ([`record_verified`][pflower.tuning.baselines.record_verified])."""


def _fingerprints(method: str, code: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's recorded part fingerprints and the installed code's, for ``method``."""
    now = {**component_fingerprints(), "method": method_fingerprint(method)}
    return dict(code.get("components") or {}), now


def load_verified(out: Path) -> list[dict[str, Any]]:
    """The entries of ``out``'s ``verified.yaml`` (none where it has none)."""
    path = out / VERIFIED
    return list(yaml.safe_load(path.read_text()) or []) if path.is_file() else []


def record_verified(out: Path, setting: str, method: str, run: Path, compared: str) -> None:
    """Add to ``out``'s ``verified.yaml`` that the installed code reran ``run`` (a final run of
    ``method`` in ``setting``, whose record is read from it) to the last digit over
    ``compared``: its recorded fingerprints, the installed code's, the run and the date."""
    code = (read_summary(run) or {}).get("code") or {}
    recorded, now = _fingerprints(method, code)
    entries = load_verified(out)
    entries.append(
        {
            "setting": setting,
            "method": method,
            "recorded": recorded,
            "installed": now,
            "run": run.relative_to(out).as_posix(),
            "compared": compared,
            "code": CODE_FINGERPRINT,
            "date": datetime.date.today().isoformat(),
        }
    )
    header = (
        "# pflower reproduce --stored: stored final runs rerun by later code, every final and\n"
        "# last-10% value equal to the last digit. pflower tune accepts the runs of a method\n"
        "# and setting recorded with `recorded` where the installed code's parts are `installed`.\n"
    )
    (out / VERIFIED).write_text(header + yaml.safe_dump(entries, sort_keys=False))


def _verified(
    entries: Sequence[Mapping[str, Any]], setting: str, method: str, code: Mapping[str, Any]
) -> bool:
    """Is a run of ``method`` in ``setting`` recorded with ``code`` verified for the installed
    code by an entry of ``verified.yaml``?"""
    recorded, now = _fingerprints(method, code)
    return any(
        e.get("setting") == setting
        and e.get("method") == method
        and e.get("recorded") == recorded
        and e.get("installed") == now
        for e in entries
    )


BYTES_READ = "every part: its fingerprints read the files' bytes"
"""What differs, for a record whose part fingerprints read its files' bytes (no ``parts_read``:
[`PARTS_READ`][pflower.provenance.PARTS_READ]): none of its parts can be told unchanged."""


def compare_code(method: str, code: Mapping[str, Any]) -> tuple[set[str], bool]:
    """The parts of ``method``'s code that differ between a run's ``summary.json`` ``code``
    record and the installed code (`BYTES_READ` for a record of the files' bytes), and whether
    the record can be checked part by part at all (a record without ``components`` is checked
    as a whole: unchanged where its fingerprint is the installed code's)."""
    recorded = code.get("components")
    if not isinstance(recorded, Mapping):
        return set(), code.get("fingerprint") == CODE_FINGERPRINT
    if code.get("parts_read") != PARTS_READ:
        return {BYTES_READ}, True
    now: dict[str, str | None] = {**component_fingerprints(), "method": method_fingerprint(method)}
    return {
        part for part in now.keys() | recorded.keys() if recorded.get(part) != now.get(part)
    }, True


def stored_methods(setting_dir: Path, skip: Sequence[str]) -> list[StoredMethod]:
    """Every method with completed final runs in ``setting_dir`` (but those in ``skip``), with
    what differs from the installed code and is not verified (``verified.yaml`` beside it)."""
    final = setting_dir / "final"
    verified = load_verified(setting_dir.parent)
    found = []
    for method_dir in sorted(p for p in final.iterdir() if p.is_dir()) if final.is_dir() else []:
        if method_dir.name in skip:
            continue
        stored = StoredMethod(method_dir.name)
        runs = [*method_dir.glob("seed_*"), *method_dir.glob("study_*/seed_*")]  # 1 or k studies
        for run_dir in sorted(runs):
            summary = read_summary(run_dir) or {}
            if summary.get("status") != "completed":
                continue
            code = summary.get("code") or {}
            changed, checkable = compare_code(stored.method, code)
            if changed and _verified(verified, setting_dir.name, stored.method, code):
                changed = set()
            recorded = code.get("components")
            if changed and not any(
                ((read_summary(r) or {}).get("code") or {}).get("components") == recorded
                for r in stored.stale_runs
            ):
                stored.stale_runs.append(run_dir)
            stored.changed |= changed
            if not checkable:
                seed = run_dir.name.removeprefix("seed_")
                stored.unchecked[int(seed) if seed.isdigit() else -1] = str(code.get("fingerprint"))
        found.append(stored)
    return found


PROTOCOL_KEYS = (
    "trials",
    "tune_seed",
    "final_seeds",
    "val_fraction",
    "train_knobs",
    "studies",
    "search",
)
"""The suite's keys that every method of a comparison must share (with the setting's
overrides)."""


def protocol_changes(out: Path, suite: Suite, setting: Setting) -> list[str]:
    """What of the suite's protocol for ``setting`` differs from the folder's ``suite.yaml``
    (nothing where the folder has none)."""
    path = out / "suite.yaml"
    if not path.exists():
        return []
    stored = yaml.safe_load(path.read_text()) or {}
    # a suite.yaml written before studies and search plans: one study, TPE with the median pruner
    stored.setdefault("studies", 1)
    stored.setdefault("search", SearchPlan().describe(stored.get("trials", suite.trials)))
    now = {
        "trials": suite.trials,
        "tune_seed": suite.tune_seed,
        "final_seeds": list(suite.final_seeds),
        "val_fraction": suite.val_fraction,
        "train_knobs": list(suite.train_knobs),
        "studies": suite.studies,
        "search": suite.search.describe(suite.trials),
    }
    changes = [
        f"{k} {stored.get(k)!r} -> {now[k]!r}" for k in PROTOCOL_KEYS if stored.get(k) != now[k]
    ]
    overrides = (stored.get("settings") or {}).get(setting.name)
    if overrides is not None and list(overrides) != list(setting.overrides):
        changes.append(f"the setting's overrides {overrides} -> {list(setting.overrides)}")
    return changes


def check_stored_runs(
    out: Path,
    suite: Suite,
    suite_arg: str,
    settings: Sequence[Setting],
    methods: Sequence[str],
    trust_unchecked: bool = False,
) -> None:
    """Refuse to add ``methods`` to the stored runs of ``settings`` in ``out`` unless the stored
    runs of the other methods are what the installed code would make under the suite's protocol
    (see the module docstring).

    Raises:
        StoredRunsChanged: naming, per setting, the methods, what changed, and the command that
            refreshes them.
    """
    problems = [
        found
        for setting in settings
        if (found := _setting_problems(out, suite, suite_arg, setting, methods, trust_unchecked))
    ]
    if problems:
        raise StoredRunsChanged(
            f"{', '.join(methods)} cannot be ranked against the stored runs in {out}, which are "
            f"not what this code (pflower {CODE_FINGERPRINT}) makes under this suite: "
            + " ".join(problems)
        )


def check_protocol(out: Path, suite: Suite, settings: Sequence[Setting]) -> None:
    """Refuse to run ``settings`` into ``out`` where it holds final runs made under another
    protocol than the suite's: its leaderboard would rank the two protocols' runs together (a
    method not run again keeps its old runs, and its old chosen values stand beside the new).

    Raises:
        StoredRunsChanged: naming the setting, what changed, and the way out.
    """
    for setting in settings:
        final = out / setting.name / "final"
        stored = final.is_dir() and any(final.iterdir())
        if stored and (changes := protocol_changes(out, suite, setting)):
            raise StoredRunsChanged(
                f"{out} holds final runs of {setting.name} made under another protocol than "
                f"{out / 'suite.yaml'}'s ({'; '.join(changes)}), which a leaderboard of the folder "
                "would rank together with this suite's: give another --out, or remove the "
                "folder's runs first"
            )


def _methods(some: Sequence[StoredMethod], stored: Sequence[StoredMethod]) -> str:
    """The names of ``some``, or "all N stored methods" where they are all of ``stored``."""
    if len(some) == len(stored) > 3:
        return f"all {len(stored)} stored methods"
    return ", ".join(s.method for s in some)


def _setting_problems(
    out: Path,
    suite: Suite,
    suite_arg: str,
    setting: Setting,
    methods: Sequence[str],
    trust_unchecked: bool,
) -> str:
    """What is wrong with one setting's stored runs, and the command that refreshes them ('' if
    nothing is)."""
    stored = stored_methods(out / setting.name, methods)
    protocol = protocol_changes(out, suite, setting) if stored else []
    changed = [s for s in stored if s.changed]
    unchecked = [s for s in stored if s.unchecked and not s.changed and not trust_unchecked]
    if not changed and not unchecked and not protocol:
        return ""
    lines = []
    if changed:
        lines.append(
            "changed code: "
            + ", ".join(f"{s.method} ({', '.join(sorted(s.changed))})" for s in changed)
        )
    if unchecked:
        codes = sorted({code for s in unchecked for code in s.unchecked.values()})
        lines.append(
            f"runs recorded before pflower kept per-part code fingerprints, by other code "
            f"({', '.join(codes)}), so what changed cannot be checked: "
            f"{_methods(unchecked, stored)} (--trust-unchecked ranks against them)"
        )
    if protocol:
        lines.append(f"another protocol than {out / 'suite.yaml'}'s: {'; '.join(protocol)}")
    stale = [s.method for s in (changed + unchecked)] or [s.method for s in stored]
    named = "" if set(stale) >= set(suite.methods_of(setting)) else " ".join(stale) + " "
    finals = shlex.quote(str(out / setting.name / "final"))
    every = len(stale) == len(stored)
    refresh = (
        f"rm -r {finals}{'' if every else '/{' + ','.join(stale) + '}'} && pflower tune {named}"
        f"--suite {shlex.quote(suite_arg)} --setting {setting.name} --out {shlex.quote(str(out))}"
    )
    said = f"[{setting.name}] {'; '.join(lines)}. Refresh them with: {refresh}"
    if changed:
        said += (
            "; or, where the change left their numbers as they were, verify that by rerunning "
            f"one run of each: pflower reproduce --stored {shlex.quote(str(out))} --suite "
            f"{shlex.quote(suite_arg)} --setting {setting.name}"
        )
    return said
