"""``pflower reproduce <run folder or summary.json>``: run a recorded run again from its record
alone, and say whether every metric matches to the last digit (docs: guide,
reproducing).

The record is the run's ``summary.json`` (its resolved configuration, seed included, the code that
ran, [`pflower.provenance.code_version`][pflower.provenance.code_version], and the CPU kernels it
ran on, [`pflower.provenance.numerics`][pflower.provenance.numerics]), else its ``config.yaml``. The
configuration becomes one override per recorded value (`config_overrides`), so nothing is taken from
today's defaults but the keys the record predates; the run goes into a fresh folder in a new process
whose kernels are held as the record's were (`recorded_numerics`), since they must be chosen before
torch is imported.

The comparison is value by value: every row of the two ``metrics.jsonl`` files (but the rows
that time the rounds), or, where the record kept no ``metrics.jsonl`` (the tuning results keep
only ``summary.json``), every final and last-10% value of the two summaries.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pflower.commands import HelpFormatter
from pflower.config import Numerics
from pflower.provenance import CODE_FINGERPRINT, HELD, KERNEL_CAPS, NUMERICS_ENV
from pflower.registry import ConfigError

REPRODUCE_HELP = """\
Run a recorded run again from its record alone (summary.json: the resolved configuration with
its seed, the code fingerprint and the CPU kernels it used; else config.yaml) into a fresh
folder, and say whether every metric matches to the last digit: every row of metrics.jsonl
(the rows that time the rounds aside), or every final and last-10% value of summary.json where
the record kept no metrics.jsonl. Warns where the code or torch differ from the record's, and
where the record predates the record of numerics (then --numerics says which to use).
Exit code 0: every value matches (a failed run matches where its rerun fails with the same
error); 1: a value differs (the first differing rows are printed) or the rerun ended without a
summary; 2: the record cannot be read or does not compose with this code, or the rerun was
refused before it started (no data root, a missing dataset).

With --stored FOLDER --suite SUITE instead of a run: the final runs stored in a `pflower tune`
results folder whose recorded code differs in a part from this code's are checked by
experiment: one run of each method and recorded code is rerun, and where it matches to the last
digit the folder's verified.yaml records it, so that `pflower tune <method> --out FOLDER` ranks
a new method against those runs instead of refusing them. Exit code 0 where every rerun
matched, 1 where one did not (its method's runs stay refused)."""

GROUPS = ("dataset", "partition", "model", "strategy", "backend", "attack", "robust", "tracking")
"""Config groups whose recorded block names its option (``name``): the override selects it."""

NOT_REPRODUCED = ("output_dir", "progress")
"""Recorded keys the rerun sets itself (its own folder, no live view)."""

SHOWN_DIFFERENCES = 5
"""How many differing rows (or values) a mismatch prints."""


@dataclass(frozen=True)
class Record:
    """What a run folder says about the run: where, its configuration, code and numerics."""

    run_dir: Path
    config: dict[str, Any]
    code: Mapping[str, Any] = field(default_factory=dict)
    numerics: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] | None = None


def read_record(path: Path) -> Record:
    """The record of the run in folder ``path`` (or of the ``summary.json`` at ``path``).

    Raises:
        ConfigError: no such run folder, or neither a readable summary.json nor config.yaml.
    """
    run_dir = path.parent if path.name == "summary.json" else path
    if not run_dir.is_dir():
        raise ConfigError(f"{path} is no run folder: give a run folder or its summary.json")
    summary_path, config_path = run_dir / "summary.json", run_dir / "config.yaml"
    try:
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            return Record(
                run_dir,
                dict(summary["config"]),
                summary.get("code") or {},
                summary.get("numerics"),
                summary,
            )
        if config_path.is_file():
            return Record(run_dir, dict(yaml.safe_load(config_path.read_text())))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the record in {run_dir}: {error}") from error
    raise ConfigError(f"{run_dir} holds neither summary.json nor config.yaml: nothing to rerun")


def _override_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted, so ``'1.0'`` stays a string)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, list):
        return "[" + ",".join(_override_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ",".join(f"{key}:{_override_value(item)}" for key, item in value.items())
        return "{" + items + "}"
    escaped = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _leaves(block: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every value of ``block`` (a nested empty mapping as one)."""
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_overrides(config: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that compose ``config`` (a resolved configuration): each group's option
    first, then every recorded value (but `NOT_REPRODUCED`)."""
    selected = [
        f"{group}={config[group]['name']}"
        for group in GROUPS
        if isinstance(config.get(group), Mapping) and "name" in config[group]
    ]
    values = [
        f"{key}={_override_value(value)}"
        for key, value in _leaves(config, "")
        if key.split(".")[0] not in NOT_REPRODUCED
        and not (key.endswith(".name") and key.split(".")[0] in GROUPS)
    ]
    return [*selected, *values]


def recorded_numerics(record: Record, asked: str | None) -> tuple[str, dict[str, str], list[str]]:
    """The ``numerics`` mode and kernel caps that rerun ``record`` as it ran, with notes.

    Records name the mode (``mode``), or only the caps that were set (``caps``; earlier still
    ``cpu_capability_env``, the ATen cap alone), or nothing at all (runs made before numerics
    were recorded: then ``asked``, else the default, with a note saying the record is silent).
    ``asked`` (``--numerics``) overrides the record (``native`` then runs without caps).
    """
    notes: list[str] = []
    numerics = record.numerics or {}
    caps = dict(numerics.get("caps") or {})
    if "cpu_capability_env" in numerics:
        caps = {"ATEN_CPU_CAPABILITY": numerics["cpu_capability_env"]}
    if asked is not None:
        return asked, {}, notes
    if not numerics:
        notes.append(
            "the record does not say which CPU kernels ran (it predates the record of "
            f"numerics): rerun with numerics={HELD}, the default; a run made without the caps "
            "on an AVX-512 CPU may differ in the last digits (then try --numerics native)"
        )
        return HELD, {}, notes
    mode = numerics.get("mode") or (HELD if caps == KERNEL_CAPS else "native")
    if mode == "native":
        notes.append(
            f"the record ran native CPU kernels ({numerics.get('cpu_capability')}"
            f"{', caps ' + str(caps) if caps else ''}): a CPU with other kernels may differ"
        )
    return mode, ({} if mode == HELD else caps), notes


def version_notes(record: Record) -> list[str]:
    """Where this code or torch differ from the record's."""
    notes = []
    fingerprint = record.code.get("fingerprint")
    if fingerprint is None:
        notes.append("the record does not name its code (no code fingerprint)")
    elif fingerprint != CODE_FINGERPRINT:
        commit = record.code.get("commit") or "unknown"
        notes.append(
            f"the record ran pflower code {fingerprint} (commit {str(commit)[:12]}), this is "
            f"{CODE_FINGERPRINT}: {_parts_note(record)}"
        )
    import torch

    recorded_torch = (record.numerics or {}).get("torch")
    installed = torch.__version__
    if recorded_torch is not None and recorded_torch != installed:
        notes.append(f"the record ran torch {recorded_torch}, this is torch {installed}")
    return notes


def _parts_note(record: Record) -> str:
    """Which parts that decide the numbers changed since the record's code (its method's
    modules included; [`compare_code`][pflower.tuning.baselines.compare_code])."""
    from pflower.tuning.baselines import BYTES_READ, compare_code

    method = str((record.config.get("strategy") or {}).get("name") or "")
    changed, checkable = compare_code(method, record.code)
    if not checkable or BYTES_READ in changed:
        return "a change since may change the numbers (the record cannot say which parts changed)"
    if changed:
        return f"changed since in {', '.join(sorted(changed))}, which may change the numbers"
    return (
        "none of the parts that decide the numbers changed since (only prose or files such as "
        "the command line and reports)"
    )


def _values(block: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every value of a JSON document (list items by index)."""
    if isinstance(block, Mapping):
        for key, value in block.items():
            yield from _values(value, f"{prefix}{key}.")
    elif isinstance(block, list):
        for index, value in enumerate(block):
            yield from _values(value, f"{prefix}{index}.")
    else:
        yield prefix.rstrip("."), block


def _differences(recorded: Any, rerun: Any) -> list[str]:
    """``key: recorded -> rerun`` for every value that differs (to the last digit)."""
    mine, theirs = dict(_values(recorded)), dict(_values(rerun))
    return [
        f"{key}: {mine.get(key, '(absent)')!r} -> {theirs.get(key, '(absent)')!r}"
        for key in sorted(mine.keys() | theirs.keys())
        if mine.get(key, "(absent)") != theirs.get(key, "(absent)")
    ]


def _metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` that are metrics (not the rows timing the rounds)."""
    from pflower.results.rows import TIME, read_rows

    return [dict(row) for row in read_rows(run_dir) if row.get("stage") != TIME]


def _row_name(row: Mapping[str, Any]) -> str:
    client = f", client {row['client']}" if "client" in row else ""
    return f"round {row.get('round')}, stage {row.get('stage')}{client}"


@dataclass(frozen=True)
class Comparison:
    """What was compared (``what``) and the differences found, first ones first."""

    what: str
    differences: list[str]


def compare_runs(recorded: Path, rerun: Path) -> Comparison:
    """Compare a recorded run folder with its rerun: row by row where the record has
    ``metrics.jsonl``, else the summaries' status, error, final and last-10% values (a failed
    run whose rerun fails with the same error at the same round reproduces)."""
    if (recorded / "metrics.jsonl").is_file():
        mine, theirs = _metric_rows(recorded), _metric_rows(rerun)
        differences = [
            f"row {index + 1} ({_row_name(row)}): " + "; ".join(_differences(row, other))
            for index, (row, other) in enumerate(zip(mine, theirs, strict=False))
            if row != other
        ]
        if len(mine) != len(theirs):
            differences.append(f"the record has {len(mine)} metric rows, the rerun {len(theirs)}")
        count = sum(len(row) for row in mine)
        return Comparison(f"{count} values in {len(mine)} metrics.jsonl rows", differences)
    mine_summary = json.loads((recorded / "summary.json").read_text())
    their_summary = json.loads((rerun / "summary.json").read_text())
    keys = ["status", "rounds", "final_round", "final", "last10", "last10_rounds"]
    if mine_summary.get("error") or their_summary.get("error"):  # a failed run: how it failed
        keys.insert(1, "error")
    mine_values = {key: mine_summary.get(key) for key in keys}
    their_values = {key: their_summary.get(key) for key in keys}
    count = len(dict(_values(mine_values)))
    what = f"{count} final and last-10% values of summary.json (the record keeps no metrics.jsonl)"
    return Comparison(what, _differences(mine_values, their_values))


def _check_composes(overrides: Sequence[str], record: Record) -> list[str]:
    """Compose ``overrides`` with this code (exit 2 where it refuses them); notes naming the
    keys the record lacks (their defaults are used)."""
    from pflower.compose import compose_config, validate
    from pflower.results.summary import resolved_config

    cfg = compose_config(list(overrides), check_scheme=False)
    validate(cfg, check_scheme=False)
    composed = dict(_leaves(resolved_config(cfg), ""))
    recorded = dict(_leaves(record.config, ""))
    missing = sorted(
        key for key in composed.keys() - recorded.keys() if key.split(".")[0] != "numerics"
    )
    if not missing:
        return []
    return [f"the record predates {', '.join(missing)}: their defaults are used"]


def _fresh_folder(record: Record, out: Path | None) -> Path:
    """``out``, else ``runs/reproduce/<run>-<time>``; refused (exit 2) where it holds files."""
    if out is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        out = Path("runs") / "reproduce" / f"{record.run_dir.name}-{stamp}"
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: the rerun needs a fresh folder (choose --out)")
    return out


def _environment(mode: str, caps: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with the rerun's kernel caps instead of its own."""
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_CAPS and k != NUMERICS_ENV}
    return {**base, NUMERICS_ENV: mode, **caps}


def _parser() -> argparse.ArgumentParser:
    """``pflower reproduce``'s arguments (its ``--help`` and the CLI reference)."""
    parser = argparse.ArgumentParser(
        prog="pflower reproduce", description=REPRODUCE_HELP, formatter_class=HelpFormatter
    )
    parser.add_argument("run", type=Path, nargs="?", help="a run folder, or its summary.json")
    parser.add_argument("--out", type=Path, help="the fresh folder of the rerun")
    parser.add_argument(
        "--stored",
        type=Path,
        metavar="FOLDER",
        help="instead of a run: verify the stale stored runs of this `pflower tune` folder",
    )
    parser.add_argument("--suite", help="with --stored: the suite the folder's runs were made by")
    parser.add_argument(
        "--setting", action="append", default=[], help="with --stored: only this setting"
    )
    parser.add_argument(
        "--numerics",
        choices=[mode.value for mode in Numerics],
        help="the CPU kernels of the rerun, where the record's are not wanted or not known",
    )
    return parser


def _rerun(
    record: Record,
    overrides: Sequence[str],
    out: Path,
    mode: str,
    caps: Mapping[str, str],
    quiet: bool = False,
) -> tuple[Comparison | None, int]:
    """Run ``overrides`` (``record``'s configuration) into ``out`` with the kernels of ``mode``
    and ``caps``, in a new process, and compare it with the record: the comparison (None where
    the rerun wrote no ``summary.json``) and the rerun's exit code. A rerun that failed is
    compared too: its summary says how, as the record of a failed run does."""
    from pflower.tuning.search import run_command

    output = subprocess.DEVNULL if quiet else None
    done = subprocess.run(
        run_command(overrides, out),
        env=_environment(mode, caps),
        check=False,
        stdout=output,
        stderr=output,
    )
    if not (out / "summary.json").is_file():
        return None, done.returncode
    return compare_runs(record.run_dir, out), done.returncode


def _plan(record: Record, asked: str | None) -> tuple[str, dict[str, str], list[str], list[str]]:
    """How to rerun ``record``: the numerics mode and kernel caps (`recorded_numerics`), the
    overrides, and the notes (numerics, keys the record predates).

    Raises:
        ConfigError: the overrides do not compose with this code.
    """
    mode, caps, notes = recorded_numerics(record, asked)
    overrides = [*config_overrides(record.config), f"numerics={mode}"]
    return mode, caps, overrides, [*notes, *_check_composes(overrides, record)]


def reproduces(run: Path, out: Path) -> tuple[Comparison | None, list[str]]:
    """Rerun the recorded run ``run`` into ``out`` as ``pflower reproduce`` does, without its
    output: the comparison with the record (None where the rerun failed) and the notes.

    Raises:
        ConfigError: the record cannot be read or does not compose with this code.
    """
    record = read_record(run)
    mode, caps, overrides, notes = _plan(record, None)
    return _rerun(record, overrides, out, mode, caps, quiet=True)[0], notes


def verify_stored(folder: Path, suite_arg: str, setting_names: Sequence[str]) -> int:
    """``pflower reproduce --stored``: rerun one final run of each stale method and recorded
    code in ``folder`` ([`StoredMethod.stale_runs`][pflower.tuning.baselines.StoredMethod]),
    and record in its ``verified.yaml`` those that match to the last digit. Exit code 0 where
    every rerun matched, 1 where one did not, 2 for a suite or folder that cannot be read."""
    from pflower.tuning.baselines import record_verified, stored_methods
    from pflower.tuning.suite import load_suite

    try:
        if not folder.is_dir():
            raise ConfigError(f"{folder} is not a folder of `pflower tune` results")
        suite = load_suite(suite_arg)
        settings = [suite.setting(n).name for n in setting_names] or [
            s.name for s in suite.settings
        ]
    except ConfigError as error:
        print(f"cannot verify: {error}")
        return 2
    matched, differed = 0, 0
    for setting in settings:
        for stored in stored_methods(folder / setting, ()):
            for run in stored.stale_runs:
                scratch = Path(tempfile.mkdtemp(prefix="pflower-verify-"))
                name = f"{setting} {run.relative_to(folder / setting / 'final')}"
                try:
                    comparison, notes = reproduces(run, scratch / "rerun")
                except ConfigError as error:
                    comparison, notes = None, [str(error)]
                for note in notes:
                    print(f"warning: {name}: {note}")
                if comparison is not None and not comparison.differences:
                    record_verified(folder, setting, stored.method, run, comparison.what)
                    shutil.rmtree(scratch)
                    matched += 1
                    print(f"MATCH {name}: all {comparison.what} agree", flush=True)
                    continue
                differed += 1
                why = comparison.differences[0] if comparison else "the rerun failed"
                print(f"MISMATCH {name}: {why} (the rerun: {scratch})", flush=True)
    print(
        f"{matched} stored runs reproduced by this code and recorded in "
        f"{folder / 'verified.yaml'}; {differed} did not (their methods' runs stay refused: "
        "refresh them as `pflower tune` says)"
    )
    return 1 if differed else 0


def main(argv: Sequence[str]) -> int:
    """``pflower reproduce``: rerun a recorded run and compare every metric."""
    args = _parser().parse_args(list(argv))
    if args.stored is not None:
        if args.suite is None or args.run is not None:
            print("cannot verify: --stored takes --suite and no run")
            return 2
        return verify_stored(args.stored, args.suite, args.setting)
    if args.run is None:
        print("cannot reproduce: give a run folder (or --stored FOLDER --suite SUITE)")
        return 2
    try:
        record = read_record(args.run)
        mode, caps, overrides, notes = _plan(record, args.numerics)
        notes = [*version_notes(record), *notes]
        out = _fresh_folder(record, args.out)
    except ConfigError as error:
        print(f"cannot reproduce: {error}")
        return 2
    for note in notes:
        print(f"warning: {note}")
    print(f"rerunning {record.run_dir} into {out} (numerics={mode})", flush=True)
    comparison, code = _rerun(record, overrides, out, mode, caps)
    if comparison is None and code == 2:
        print(
            "cannot reproduce: the rerun was refused before it started (its message is above: "
            "a data root, a dataset, an option of this code); nothing was computed"
        )
        return 2
    if comparison is None:
        print(f"MISMATCH: the rerun ended with exit code {code} and wrote no summary.json ({out})")
        return 1
    if not comparison.differences:
        print(f"MATCH: all {comparison.what} agree to the last digit ({out})")
        return 0
    print(f"MISMATCH: {len(comparison.differences)} differences in {comparison.what} ({out})")
    for difference in comparison.differences[:SHOWN_DIFFERENCES]:
        print(f"  {difference}")
    return 1
