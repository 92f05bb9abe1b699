"""Compare one setting of two folders of the same ``pflower tune`` suite: the setting tuned again
(issue 59's question, would a second search change the ranks?), or tuned under other code::

    python tools/compare_suites.py results/tuning/cpu results/rerun/cpu-fmnist2 \
        --setting fmnist_dir01

prints a markdown table, one row per method whose final runs are complete in both folders (the
same studies and seeds, each run completed or failed by itself; suites of several studies, whose
runs lie in ``study_<k>`` folders): the configurations each study
tried in A and in B, the studies whose searches chose the same values in both, each folder's
mean final L1 Acc(L) over every study's final runs (a failed run scored 0, as the leaderboard
scores it) and the method's rank by that mean among the methods compared, and whether the final
runs of the studies that chose the same values are the same to the last digit in both (the same
configuration, seed and kernels under code that makes the same numbers: they must be). Under
the table: Spearman's rank correlation of the methods' means in A and in B.

A page quotes such a table between ``<!-- compare_suites: <A> <B> <setting> -->`` (folders
relative to the repository's root) and ``<!-- /compare_suites -->``;
``python tools/compare_suites.py --update docs/guide/tuning.md`` writes each quoted table afresh
from the results, and ``tests/test_compare_suites.py`` fails where a page's table is not the one
its folders give.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

import pflower.strategies  # noqa: F401  (registers the algorithms, whose labels the board uses)
from pflower.reporting.leaderboard_runs import Entry, read_setting
from pflower.tuning.layout import Layout


@dataclass(frozen=True)
class Row:
    """One method in both folders."""

    label: str
    configurations: tuple[list[int], list[int]]
    same_choice: list[int]
    """The studies whose searches chose the same values in both folders."""
    means: tuple[float, float]
    identical: int
    """Final runs of the ``same_choice`` studies equal to the last digit in both folders."""
    differing: list[str]
    """``study <k> seed <n>`` of those that are not."""


def _runs(entry: Entry) -> set[tuple[int, int]]:
    return {(s, seed) for s, runs in entry.scores.items() for seed in runs}


def _mean(entry: Entry) -> float:
    return float(np.mean([v for runs in entry.scores.values() for v in runs.values()]))


def _tried(entry: Entry, study: int) -> int:
    """The configurations study ``study`` tried (its chosen file's record)."""
    return int(entry.study_chosen[study]["search"]["configurations"])


def _summary(folder: Path, setting: str, method: str, study: int, seed: int) -> dict[str, Any]:
    path = Layout(folder).final_dir(setting, method, seed, study) / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text())
    return summary


def _numbers(summary: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a final run scored: its status, final and last-10% values."""
    return summary.get("status"), summary.get("final"), summary.get("last10")


def compare(first: Path, second: Path, setting: str) -> list[Row]:
    """The methods of ``setting`` whose final runs are complete in both suite folders, compared."""
    a = {e.method: e for e in read_setting(first / setting)}
    b = {e.method: e for e in read_setting(second / setting)}
    rows = []
    for method in sorted(a.keys() & b.keys()):
        ea, eb = a[method], b[method]
        runs = _runs(ea)
        if not runs or runs != _runs(eb):
            continue
        studies = sorted({s for s, _ in runs})
        same = [s for s in studies if ea.study_chosen[s]["params"] == eb.study_chosen[s]["params"]]
        differing = [
            f"study {s} seed {seed}"
            for s, seed in sorted(runs)
            if s in same
            and _numbers(_summary(first, setting, method, s, seed))
            != _numbers(_summary(second, setting, method, s, seed))
        ]
        identical = sum(s in same for s, _ in runs) - len(differing)
        tried = ([_tried(ea, s) for s in studies], [_tried(eb, s) for s in studies])
        rows.append(
            Row(
                ea.label,
                tried,
                same,
                (_mean(ea), _mean(eb)),
                identical,
                differing,
            )
        )
    return rows


def ranks(means: Sequence[float]) -> list[int]:
    """1 for the highest mean; tied means share the better rank."""
    return [int(r) for r in stats.rankdata([-m for m in means], method="min")]


def table(rows: Sequence[Row], names: tuple[str, str]) -> str:
    """The markdown table and Spearman's rank correlation of the two folders' means."""
    a, b = names
    rank_a, rank_b = (ranks([r.means[i] for r in rows]) for i in (0, 1))
    lines = [
        f"| method | configurations {a} | configurations {b} | same choice (studies) | "
        f"final L1 Acc(L) % {a} | {b} | rank {a} | rank {b} | same finals to the last digit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row, ra, rb in zip(rows, rank_a, rank_b, strict=True):
        checked = row.identical + len(row.differing)
        finals = f"{row.identical} of {checked}" if checked else "-"
        if row.differing:
            finals += f" (differ: {', '.join(row.differing)})"
        lines.append(
            f"| {row.label} | {', '.join(map(str, row.configurations[0]))} | "
            f"{', '.join(map(str, row.configurations[1]))} | "
            f"{', '.join(map(str, row.same_choice)) or 'none'} | {100 * row.means[0]:.2f} | "
            f"{100 * row.means[1]:.2f} | {ra} | {rb} | {finals} |"
        )
    if len(rows) > 2:
        rho = stats.spearmanr([r.means[0] for r in rows], [r.means[1] for r in rows]).statistic
        lines.append(f"\nSpearman's rank correlation of the {len(rows)} methods' means: {rho:.3f}.")
    return "\n".join(lines)


ROOT = Path(__file__).resolve().parent.parent
QUOTE = re.compile(
    r"(<!-- compare_suites: (\S+) (\S+) (\S+) -->\n)(.*?)(<!-- /compare_suites -->)", re.DOTALL
)
"""A quoted table: its opening marker (folders A and B, the setting), the table, the end."""


def quoted(first: str, second: str, setting: str) -> str:
    """The table a page quotes for folders ``first`` and ``second`` (relative to the
    repository's root), its columns named by the folders' names."""
    rows = compare(ROOT / first, ROOT / second, setting)
    return table(rows, (Path(first).name, Path(second).name))


def update(page: Path) -> int:
    """Write each table that ``page`` quotes afresh; the number of tables."""
    text, count = QUOTE.subn(
        lambda m: m[1] + quoted(m[2], m[3], m[4]) + "\n" + m[6], page.read_text()
    )
    page.write_text(text)
    return count


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, nargs="?", help="a suite folder (A)")
    parser.add_argument("second", type=Path, nargs="?", help="a suite folder of the same suite (B)")
    parser.add_argument("--setting")
    parser.add_argument(
        "--update",
        type=Path,
        nargs="+",
        metavar="PAGE",
        help="write the tables these markdown pages quote afresh, instead of printing one",
    )
    args = parser.parse_args(argv)
    if args.update:
        for page in args.update:
            print(f"{page}: {update(page)} table(s) written")
        return
    if args.first is None or args.second is None or args.setting is None:
        parser.error("give two suite folders and --setting, or --update PAGE")
    rows = compare(args.first, args.second, args.setting)
    print(
        table(rows, ("A", "B"))
        if rows
        else "no method has every study's final runs complete in both folders"
    )


if __name__ == "__main__":
    main()
