"""Draft the table and the verdict lines of a results page's tuned section from a suite's
leaderboard, so that the numbers a page quotes are the leaderboard's when written
(``tests/test_tuned_numbers.py`` keeps them so after)::

    python tools/tuned_section.py results/tuning/cpu fmnist_dir01 fliu local fedavg \
        --pair fliu:local --pair fliu:fedavg

prints, for the named methods of one setting of ``results/tuning/<suite>/leaderboard.csv`` (a
suite of several studies), a markdown table in the leaderboard's rank order (rank among all the
setting's ranked methods, final and last-10% L1 Acc(L), rank interval, spread between studies,
rank by study, each study's chosen values by key, collapse flag), then one line per ``--pair
a:b`` with ``pflower report <suite> --compare a,b``'s difference for that setting. The prose
around them (setting, budget, verdict) is the author's.
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import pflower.strategies  # noqa: F401  (registers the algorithms, whose labels the board uses)
from pflower.core.algorithm import ALGORITHMS
from pflower.reporting.leaderboard import compare

STUDY = re.compile(r"(\d+): (.*?)(?=; \d+: |$)")
VALUE = re.compile(r"([\w.]+)=(.*?)(?=, [\w.]+=|$)")
VERDICT = re.compile(r"^(?P<setting>[^:]+): (?P<difference>.*) \((?P<verdict>[^;]+); [^)]*\)$")


def chosen_by_key(cell: str) -> str:
    """``0: lr=0.1, mu=0.5; 1: lr=0.2, mu=0.4`` -> ``lr 0.1, 0.2; mu 0.5, 0.4`` (one value per
    study, in study order; a key a study did not choose shows as -)."""
    studies = [dict(VALUE.findall(m[2])) for m in STUDY.finditer(cell)]
    keys = list(dict.fromkeys(k for s in studies for k in s))
    if not keys:  # "-", or a study that searched nothing
        return cell or "-"
    return "; ".join(f"{k} {', '.join(s.get(k, '-') for s in studies)}" for k in keys)


def table(rows: list[dict[str, str]], methods: list[str]) -> list[str]:
    """The markdown table of ``methods`` (config names) from a setting's leaderboard rows."""
    if rows and "95% rank interval" not in rows[0]:
        raise SystemExit("a one-study suite's leaderboard: this tool drafts several studies'")
    unknown = [m for m in methods if m not in ALGORITHMS]
    if unknown:
        raise SystemExit(f"not a registered method: {', '.join(unknown)}")
    labels = {ALGORITHMS[m].options.display_name for m in methods}
    ranked = [r for r in rows if r["method"].removesuffix(" (!)") in labels]
    missing = labels - {r["method"].removesuffix(" (!)") for r in ranked}
    if missing:
        raise SystemExit(f"not ranked on this setting: {', '.join(sorted(missing))}")
    lines = [
        f"| rank (of {len(rows)}) | method | final L1 Acc(L) % | last-10% % | 95% rank interval "
        "| between studies (pts) | rank by study | chosen per study (on validation) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ranked:
        chosen = chosen_by_key(r["chosen per study"])
        if r["collapse"]:
            chosen += f" ({r['collapse']})"
        study_ranks = r["rank by study"].replace(" (moves)", "")
        lines.append(
            f"| {r['rank']} | {r['method']} | {r['final Acc(L) %']} | {r['last-10% Acc(L) %']} "
            f"| {r['95% rank interval']} | {r['between studies (pts)']} | {study_ranks} "
            f"| {chosen} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", type=Path, help="a suite folder, e.g. results/tuning/cpu")
    parser.add_argument("setting")
    parser.add_argument("methods", nargs="+", help="config names (the table keeps rank order)")
    parser.add_argument("--pair", action="append", default=[], help="a:b, compared a - b")
    args = parser.parse_args()
    with (args.suite / "leaderboard.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["setting"] == args.setting]
    print("\n".join(table(rows, args.methods)), end="\n\n")
    for pair in args.pair:
        first, second = pair.split(":")
        try:
            lines = compare(args.suite, first, second)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        said = [line for line in lines if line.startswith(f"{args.setting}: ")]
        if not said:
            print(f"- {pair}: not both on {args.setting}")
        for line in said:
            found = VERDICT.match(line)
            print(f"- {found['difference']}: {found['verdict']}." if found else f"- {line}")


if __name__ == "__main__":
    main()
