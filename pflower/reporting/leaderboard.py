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
  [`fdr_better_counts`][pflower.reporting.leaderboard_ranks.fdr_better_counts]). With
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
  ([`pflower.results.summary.run_cost`][pflower.results.summary.run_cost]),
  computed from ``metrics.jsonl`` for a run that predates it; where neither holds it, seconds
  per round is the run's wall time over its rounds and the megabytes are not known;
- **collapse**: ``= FedAvg`` where the final runs' configuration is another method (a declared
  neutral point, [`pflower.core.options.collapse_of`][pflower.core.options.collapse_of], or a model
  that leaves the method nothing of its own: FedBN without BatchNorm), ``≈ Local`` where it is next
  to one (`collapse`) or where most of its final runs give a simpler method's final accuracy to
  the last digit (`same_runs`): such a row ranks its base method at other settings, not a
  method. Tuned in several studies, each study is checked: ``study 2 = FedAvg`` where only some
  collapse.

Under each setting's table: the methods ranked above a method with a higher mean (their
differences to the others vary from seed to seed, so the test separates few methods from
them: [`ranked_above_higher_means`][pflower.reporting.leaderboard_ranks.ranked_above_higher_means]),
the final runs that failed (a diverged run, say, named with the error; tuned in one study, it is
in no mean and no test and the seeds column counts it apart, since the mean over the other seeds
flatters the method; tuned in several, where methods are ranked by their means, it is scored 0 in
the means, the rank and its interval, [`FAILED`][pflower.reporting.studies.FAILED]; an
interrupted run, one stopped by a signal, has not run yet and counts nowhere), the final runs
that completed without some clients' replies
([`rejected_replies`][pflower.results.failures.rejected_replies]: a client whose model diverged is
rejected and
the run goes on without it; the means score a client left out of an evaluation 0, as they
score a failed run, where the run's own summary averages the clients that replied
([`every_client_acc`][pflower.results.failures.every_client_acc]), and the seeds column counts
those runs), the chosen values
at an end of their searched range
([`range_ends`][pflower.reporting.leaderboard_notes.range_ends]: the range, not the budget, may
hold the method back), each with its profile where one was run
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
that share rank 1, or whose rank interval reaches 1;
[`pflower.reporting.figures.leaderboard`][pflower.reporting.figures.leaderboard]).

This module ranks a setting's methods and renders the page; beside it, the final runs are read
into entries ([`.leaderboard_runs`][pflower.reporting.leaderboard_runs]), the ranks' statistics
([`.leaderboard_ranks`][pflower.reporting.leaderboard_ranks]), the table's cells
([`.leaderboard_table`][pflower.reporting.leaderboard_table]) and the notes under it
([`.leaderboard_notes`][pflower.reporting.leaderboard_notes]).
"""

from __future__ import annotations

import collections
import csv
import datetime
import inspect
import json
import re
import statistics
from pathlib import Path
from typing import Any

import yaml

from pflower.blocks import blocks
from pflower.provenance import code_version
from pflower.reporting import figures, studies, studies_board
from pflower.reporting.leaderboard_notes import (
    collapse_notes,
    exception_notes,
    failure_notes,
    inversion_notes,
    pending_note,
    range_end_notes,
    rejection_notes,
)
from pflower.reporting.leaderboard_ranks import ALPHA, rank_with_ties
from pflower.reporting.leaderboard_runs import Entry, in_progress, read_setting, shared_knobs
from pflower.reporting.leaderboard_table import (
    mean_std,
    method_row,
    table,
    trials_drawn,
)
from pflower.reporting.tables import markdown_table


def load_setting(setting_dir: Path) -> list[Entry]:
    """Every method of a setting folder with completed final runs (and the failed ones of each,
    in [`Entry.failed`][pflower.reporting.leaderboard_runs.Entry.failed]), ranked
    ([`rank_with_ties`][pflower.reporting.leaderboard_ranks.rank_with_ties]), best first."""
    entries = read_setting(setting_dir)
    rank_with_ties(entries)
    return sorted(entries, key=lambda e: (e.rank, -statistics.fmean(e.final or [studies.FAILED])))


def suite_folder_problem(root: Path) -> str | None:
    """Why ``root`` is not a suite folder of `pflower tune` results (``<setting>/final/...``),
    for the command line to say in one line; None where it is one."""
    if not root.is_dir():
        return f"{root} is not a folder of `pflower tune` results"
    if (root / "final").is_dir():
        return f"{root} is one setting of a suite: give the suite's folder, {root.parent}"
    if not any((setting / "final").is_dir() for setting in root.iterdir()):
        return (
            f"{root} holds no setting with final runs (<setting>/final/<method>/...): not a "
            "folder of `pflower tune` results, or none of its final runs has started"
        )
    return None


def compare(root: Path, first: str, second: str) -> list[str]:
    """``first`` against ``second`` on every setting of the suite at ``root``, one line each:
    where both have final runs, the difference of their means over the seeds both ran, its 95%
    interval and p-value, counting the paired seeds and each method's studies
    ([`difference`][pflower.reporting.studies.difference]; a suite of one study: the paired
    t-test over the seeds); elsewhere, which of the two has none there.

    Raises:
        ValueError: a method with final runs on none of the settings, or ``root`` is not a
            suite folder
            ([`suite_folder_problem`][pflower.reporting.leaderboard.suite_folder_problem]).
    """
    if problem := suite_folder_problem(root):
        raise ValueError(problem)
    settings = sorted(p for p in root.iterdir() if p.is_dir() and (p / "final").is_dir())
    found: dict[str, dict[str, Entry]] = {}
    for setting_dir in settings:
        found[setting_dir.name] = {e.method: e for e in read_setting(setting_dir)}
    for method in (first, second):
        if not any(method in entries for entries in found.values()):
            known = sorted({m for entries in found.values() for m in entries})
            raise ValueError(
                f"no final runs of {method!r} in {root}; methods with final runs there: "
                f"{', '.join(known) or 'none'}"
            )
    lines = []
    for setting, entries in found.items():
        if missing := [method for method in (first, second) if method not in entries]:
            lines.append(f"{setting}: not compared, no final runs of {' or '.join(missing)} there")
            continue
        a, b = entries[first], entries[second]
        try:
            d = studies.difference(a.scores or {0: a.by_seed}, b.scores or {0: b.by_seed})
        except ValueError as error:
            lines.append(f"{setting}: {a.label} and {b.label} cannot be compared: {error}")
            continue
        low, high = (100 * x for x in d.interval)
        verdict = ("above" if d.mean > 0 else "below") if d.separated else "not separated"
        lines.append(
            f"{setting}: {a.label} - {b.label} = {100 * d.mean:+.2f} points, 95% interval "
            f"{low:+.2f} to {high:+.2f}, p = {d.p_value:.2g} ({verdict}; {d.studies[0]} and "
            f"{d.studies[1]} studies, {d.seeds} paired seeds)"
        )
    return lines


def codes_line(codes: dict[str, set[str]]) -> str:
    """The final runs' code fingerprints: one list where every setting ran the same code, else
    each setting's (a suite's settings may run at different times, each with one code)."""
    every = set().union(*codes.values()) if codes else set()
    if all(found == every for found in codes.values()):
        return ", ".join(sorted(every)) or "-"
    return "; ".join(f"{name}: {', '.join(sorted(found))}" for name, found in codes.items())


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


COSTS = (
    "s / round is the median time between successive rounds (a run's wall time over its "
    "rounds where the run recorded none) and MB / client-round the array megabytes one "
    "training client receives and sends per round, '-' where the runs recorded none; both "
    "are means over the runs, measured on the machines named below."
)


def _intro(suite: dict[str, Any]) -> str:
    """How the suite tuned and ranked, as its ``suite.yaml`` records: in several studies
    ([`pflower.reporting.studies`][pflower.reporting.studies]) or in one, ranked by paired
    tests."""
    final = f"new seeds {suite.get('final_seeds', '?')} on test"
    accuracy = (
        "Accuracy is stage L1 Acc(L), the clients' deployable models on their own test shares"
    )
    if int(suite.get("studies") or 1) > 1:
        return (
            "Every method was tuned on the clients' validation shares with the same budget "
            f"(below), in {suite['studies']} independent studies (tuning seeds "
            f"{suite.get('tune_seeds', '?')}), with the same shared train.* knobs for every "
            "method of a setting (listed under it); each study's chosen values then ran with "
            f"{final}. {accuracy}: mean ± sd over every study's final runs, at the final round "
            "and averaged over the last 10% of rounds; never the best round; a final run that "
            "failed (diverged) is scored 0, since its configuration gave no model. Methods are "
            "ranked by that mean, not by tests (a method whose seeds spread widely cannot be "
            "separated from anything and would rank first by them); the 95% rank interval "
            "holds where its rank lies given both the search's luck and the seeds' (a nested "
            "bootstrap over studies and paired seeds; the notes under each table give its error "
            "rate). 'between studies' is the range of the studies' means in points; 'rank by "
            "study' ranks each study's choice among the other methods' same-numbered studies "
            "('moves' where they differ); 'configurations' counts the distinct configurations "
            f"the studies tried and, in brackets, those run to the last round. {COSTS}"
        )
    return (
        "Every method was tuned on the clients' validation shares with the same budget "
        f"({trials_drawn(suite)}, tuning seed {suite.get('tune_seed', '?')}, "
        "the same shared train.* knobs for every method of a setting, listed under it), then "
        f"run with the chosen values and {final}. {accuracy}, mean ± std over seeds; never "
        "the best round. Ranks are tied unless a paired t-test over the final seeds separates "
        f"them (two-sided, p < {ALPHA}; a seed fixes the partition, the initial model and the "
        "batches for every method alike, so the seeds pair up). The FDR rank counts only the "
        "separations that remain when the p-values of all the setting's pairs are adjusted "
        f"together for a {ALPHA:.0%} false discovery rate (Benjamini-Hochberg). {COSTS}"
    )


def render(root: Path) -> tuple[str, list[list[str]]]:
    """The leaderboard page (markdown) and its CSV rows."""
    suite = (
        yaml.safe_load((root / "suite.yaml").read_text()) if (root / "suite.yaml").exists() else {}
    )
    settings = sorted(p for p in root.iterdir() if p.is_dir() and (p / "final").is_dir())
    name = suite.get("name", root.name)
    lines = [f"# pflower leaderboard: suite {name}", "", _intro(suite), ""]
    if suite.get("budget"):
        lines += [f"Budget: {suite['budget']}", ""]
    csv_rows: list[list[str]] = []
    codes: dict[str, set[str]] = {}  # setting -> code fingerprints of its final runs
    kernels: collections.Counter[str] = collections.Counter()
    planned = int(suite.get("studies") or 1)
    header: list[str] = []
    for setting_dir in settings:
        entries = load_setting(setting_dir)
        # a method whose studies are not all in yet is not ranked: its rank, and the others',
        # would move as they come in (a suite completes over several invocations)
        progress = in_progress(entries, planned, suite.get("final_seeds") or [])
        entries = [e for e in entries if e.method not in progress]
        overrides = (suite.get("settings") or {}).get(setting_dir.name, [])
        lines += [f"## {setting_dir.name}", ""]
        if overrides:
            lines += [f"Setting: `{' '.join(overrides)}`", ""]
        knobs = shared_knobs(entries)
        if knobs:
            lines += [f"Shared knobs searched for every method: {', '.join(knobs)}.", ""]
        results = {e.method: e.scores for e in entries if e.scores}
        ranked = studies.rank_intervals(results) if results else []
        single: list[Entry] = []
        if ranked or planned > 1:  # several studies: ranked by the mean, with intervals
            by_method = {e.method: e for e in entries}
            for r in ranked:
                by_method[r.method].rank = r.rank
            single = [e for e in entries if not e.scores]
            entries = [by_method[r.method] for r in ranked]
            rows = studies_board.table(ranked, {e.method: method_row(e) for e in entries})
        else:
            rows = table(entries)
        if entries:
            reach = {r.method: r.interval[0] for r in ranked}  # the best rank each can hold
            figure = figures.leaderboard(
                [(e.label, e.final, reach.get(e.method, e.rank)) for e in entries],
                root / f"leaderboard_{setting_dir.name}.png",
                setting_in_words(setting_dir),
                failed={e.label: e.failed_runs for e in entries if ranked and e.failed_runs},
                by_mean=bool(ranked),
            )
            lines += [f"![{setting_dir.name}: final accuracy by method]({figure.name})", ""]
        if len(rows) > 1:
            lines += [*markdown_table(rows[0], rows[1:]), ""]
        labels = {e.method: e.label for e in entries}
        lines += (
            studies_board.notes(results, ranked, labels) if ranked else inversion_notes(entries)
        )
        if single:  # runs of another protocol in the same folder: shown apart, not ranked
            lines += [
                "Tuned in a single study (another protocol), not ranked with the methods above: "
                + ", ".join(f"{e.label} {mean_std(e.final)}" for e in single)
                + ".",
                "",
            ]
        lines += collapse_notes(entries)
        lines += failure_notes(entries)
        lines += rejection_notes(entries)
        lines += range_end_notes(entries)
        lines += exception_notes(
            setting_dir, (suite.get("per_method") or {}).get(setting_dir.name, {})
        )
        compared = (suite.get("setting_methods") or {}).get(setting_dir.name)
        lines += pending_note(
            setting_dir, compared or suite.get("methods") or [], entries, progress
        )
        if header != rows[0]:  # a header wherever the columns change
            header = rows[0]
            csv_rows += [["setting", *header]]
        csv_rows += [[setting_dir.name, *row] for row in rows[1:]]
        for entry in entries:
            codes.setdefault(setting_dir.name, set()).update(entry.codes)
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
        f"- code fingerprint(s) of the final runs: {codes_line(codes)}",
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
