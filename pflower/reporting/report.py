"""``pflower report <sweep or run dirs>...``: compare methods over partitions and seeds.

``pflower report --leaderboard <suite folder>`` renders a ``pflower tune`` suite's tuned
leaderboard instead ([`pflower.reporting.leaderboard`][pflower.reporting.leaderboard]).

Reads every run directory at or below the given paths, groups runs that differ only in ``seed``
([`pflower.reporting.groups`][pflower.reporting.groups]), and writes into ``--out``:

- ``report.md``: tables with one row per method and columns partition x metric (FLIU Table I's
  stages L1, L2 and G with Acc(L), Acc(G) and Acc = Acc(L) + Acc(G); ρ_ε, loss variance and
  bottom-10% accuracy), cells ``mean ± std (number of seeds)`` at the final round; which config
  keys vary; failed and incomplete runs; completed runs that went on without some clients'
  replies
  ([`pflower.results.failures.rejected_replies`][pflower.results.failures.rejected_replies]);
  across sections, the robustness
  study (benign accuracy per attack against the share of malicious clients,
  [`pflower.reporting.robustness`][pflower.reporting.robustness]);
- ``report.csv`` (the same matrix) and ``report_values.csv`` (raw numbers);
- ``plots/``: accuracy per round by method with std bands over seeds, per-client final accuracy
  distributions, fairness (accuracy against loss variance) and the robustness figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from pflower.commands import HelpFormatter
from pflower.reporting.figures import (
    accuracy_per_round,
    client_distribution,
    fairness,
    robustness,
)
from pflower.reporting.groups import group_runs
from pflower.reporting.robustness import robustness_panels, robustness_table
from pflower.reporting.tables import Section, markdown, sections, write_csv, write_values_csv
from pflower.results.runs import load_runs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pflower report",
        description="Compare methods over partitions and seeds: markdown + CSV tables and plots.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("paths", nargs="+", type=Path, help="sweep or run directories")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: the one given path, else ./report)",
    )
    parser.add_argument(
        "--eps", type=float, default=0.9, help="rho_eps threshold on client Acc(L) (default 0.9)"
    )
    parser.add_argument(
        "--stage",
        choices=("L1", "L2"),
        default="L1",
        help="client stage shown in the plots (default L1, the deployable model)",
    )
    parser.add_argument("--title", default="pflower report", help="the report's heading")
    parser.add_argument(
        "--leaderboard",
        action="store_true",
        help="the path is a `pflower tune` suite folder: render its tuned leaderboard "
        "(pflower.reporting.leaderboard) into leaderboard.md/.csv there",
    )
    parser.add_argument(
        "--compare",
        metavar="A,B",
        action="append",
        default=[],
        help="the path is a `pflower tune` suite folder: print method A minus method B on each "
        "setting, with its 95%% interval and p-value counting the paired seeds and each method's "
        "studies (repeatable)",
    )
    return parser


def _figure_title(section: Section, title: str) -> str:
    """The figures' title: the report's, the dataset(s) and the section (its varying keys)."""
    datasets = sorted(
        {
            str(e.runs[0].config.get("dataset", {}).get("name", "?"))
            for e in section.experiments
            if e.runs
        }
    )
    parts = [title, ", ".join(datasets), section.label]
    return " / ".join(p for p in parts if p)


def _figures(section: Section, index: int, stage: str, out_dir: Path, title: str) -> list[Path]:
    """The section's three figures, named after its position so that file names stay short."""
    suffix = f"_{index}" if index else ""
    heading = _figure_title(section, title)
    plots = out_dir / "plots"
    written = [
        accuracy_per_round(section, stage, plots / f"accuracy_rounds{suffix}.png", heading),
        client_distribution(section, stage, plots / f"client_accuracy{suffix}.png", heading),
        fairness(section, stage, plots / f"fairness{suffix}.png", heading),
    ]
    return [path.relative_to(out_dir) for path in written]


def _robustness_study(
    report_sections: Sequence[Section], stage: str, out_dir: Path, title: str = ""
) -> list[str]:
    """The robustness study's figure and table (markdown lines), none without attacked runs at
    two or more shares of malicious clients."""
    panels = robustness_panels(report_sections, stage)
    figure = robustness(panels, stage, out_dir / "plots" / "robustness.png", title)
    if figure is None:
        return []
    return [
        f"![robustness]({figure.relative_to(out_dir).as_posix()})",
        "",
        f"### Robustness at stage {stage}: benign clients' Acc(L) (%), final / last 10% of rounds",
        "",
        *robustness_table(panels),
    ]


def write_report(
    paths: Sequence[Path],
    out_dir: Path,
    eps: float = 0.9,
    stage: str = "L1",
    title: str = "pflower report",
) -> Path:
    """Write the report for the runs under ``paths`` into ``out_dir``; returns ``report.md``."""
    runs = load_runs(paths)
    if not runs:
        raise FileNotFoundError(
            f"no run directories (with config.yaml) under {', '.join(map(str, paths))}"
        )
    experiments = group_runs(runs)
    report_sections = sections(experiments, eps)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        section.label: _figures(
            section, index if len(report_sections) > 1 else 0, stage, out_dir, title
        )
        for index, section in enumerate(report_sections, start=1)
        if section.has_results and section.has_rows
    }
    across = _robustness_study(report_sections, stage, out_dir, title)
    text = markdown(title, experiments, report_sections, paths, figures, eps, across)
    report_path = out_dir / "report.md"
    report_path.write_text(text, encoding="utf-8")
    write_csv(out_dir / "report.csv", report_sections, eps)
    write_values_csv(out_dir / "report_values.csv", report_sections)
    return report_path


def _compare(paths: Sequence[Path], pairs: Sequence[str]) -> int:
    """``--compare A,B``: each pair on each suite folder's settings; exit code 2 for a pair
    that does not name two methods with final runs there."""
    from pflower.reporting.leaderboard import compare

    for path in paths:
        for pair in pairs:
            names = [name.strip() for name in pair.split(",")]
            if len(names) != 2 or not all(names):
                print(f"pflower report: --compare takes two methods, A,B; got {pair!r}")
                return 2
            try:
                lines = compare(path, names[0], names[1])
            except ValueError as error:
                print(f"pflower report: {error}")
                return 2
            print("\n".join(lines) or f"{path}: no setting has final runs of both {pair}")
    return 0


def main(argv: Sequence[str]) -> int:
    """Command line entry (``pflower report ...``); returns the exit code."""
    args = _parser().parse_args(list(argv))
    if args.compare:
        return _compare(args.paths, args.compare)
    if args.leaderboard:
        from pflower.reporting.leaderboard import suite_folder_problem, write_leaderboard

        for path in args.paths:
            if problem := suite_folder_problem(path):
                print(f"pflower report: {problem}")
                return 2
            written = write_leaderboard(path)
            print(written.read_text())
            print(f"leaderboard written to {written} (+ leaderboard.csv)")
        return 0
    out_dir = args.out or (args.paths[0] if len(args.paths) == 1 else Path("report"))
    try:
        report_path = write_report(args.paths, out_dir, args.eps, args.stage, args.title)
    except FileNotFoundError as error:
        print(f"pflower report: {error}")
        return 1
    plots = ", plots/" if (report_path.parent / "plots").is_dir() else ""
    print(f"report written to {report_path} (+ report.csv, report_values.csv{plots})")
    return 0
