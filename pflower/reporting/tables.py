"""The report as text: markdown tables and CSV files.

Tables have one row per method and one column per partition x metric, one table per stage
(L1, L2, G) and one per fairness stage, so that each stays narrow enough to read. The CSV
``report.csv`` is the same matrix in one table (cells as printed); ``report_values.csv`` holds the
raw numbers, one row per experiment and metric, for further analysis.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pflower.reporting.groups import Experiment, show, varying_keys
from pflower.reporting.stats import Cell, Metric, experiment_cells, metrics
from pflower.results.failures import REJECTION_NOTE
from pflower.results.runs import RunResult
from pflower.results.summary import Status

LEGEND = (
    "Cells: mean ± std over seeds (population std, ddof = 0), with the number of seeds in "
    "parentheses, of each run's final-round value and, in the 'last10%' columns, of each run's "
    "mean over the evaluated rounds among its last 10% of rounds (never the best round). "
    "Fairness columns are final-round values. Acc(L): mean over clients of "
    "the accuracy on the client's own test split; Acc(G): the same clients' models on the global "
    "test set; Acc(L)+Acc(G): the sum of the two, FLIU's Acc (0-200, not an accuracy); "
    "G: the global model on the global test set; "
    "accuracies in %. ρ_ε: clients with Acc(L) > ε; loss var: variance over clients of the local "
    "test loss (fairness); bottom-10% Acc(L): mean Acc(L) of the worst 10% of clients. PM / GM / "
    "HM: a client's personalized model, its global model, and the one of the two with the higher "
    "selection accuracy (FLAME, Sec. IV-D). "
    "'-': the method does not report it."
)
_TABLE_TITLES = {
    "L1": "Stage L1 (personalized model, before local training): accuracy (%)",
    "L2": "Stage L2 (after local training): accuracy (%)",
    "U": "Stage U (clients held out of training, their stage-L1 model): accuracy (%)",
    "G": "Stage G (global model): accuracy (%)",
    "Cost": "Cost: seconds per round (median over rounds) and arrays per client and round",
    "Fairness L1": "Fairness at stage L1",
    "Fairness L2": "Fairness at stage L2",
    "Fairness U": "Fairness at stage U (clients held out of training)",
    "Models L1": "Stage L1 by model (clients that hold both): personalized (PM), global (GM) and "
    "hybrid (HM) model, Acc(L) (%) and loss var",
    "Models L2": "Stage L2 by model: PM, GM and HM, Acc(L) (%) and loss var",
    "Models U": "Stage U by model: PM, GM and HM, Acc(L) (%) and loss var",
}


@dataclass(frozen=True)
class Section:
    """Experiments that share every setting outside the strategy and partition blocks."""

    label: str
    experiments: list[Experiment]
    cells: dict[tuple[str, str], dict[str, Cell]]  # (method, partition) -> metric key -> cell

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(e.method for e in self.experiments))

    @property
    def has_results(self) -> bool:
        """Whether any of the section's runs completed."""
        return any(self.cells.values())

    @property
    def has_rows(self) -> bool:
        """Whether any of the section's completed runs kept its rows (``metrics.jsonl``), which
        the figures draw: per round, per client."""
        return any(run.rows for e in self.experiments for run in e.runs)

    @property
    def partitions(self) -> list[str]:
        ordered = sorted(self.experiments, key=lambda e: e.partition_order)
        return list(dict.fromkeys(e.partition for e in ordered))


def sections(experiments: Sequence[Experiment], eps: float) -> list[Section]:
    """Experiments split by section label (report order is kept), with their seed statistics."""
    by_label: dict[str, list[Experiment]] = {}
    for experiment in experiments:
        by_label.setdefault(experiment.section, []).append(experiment)
    return [
        Section(
            label,
            members,
            {(e.method, e.partition): experiment_cells(e, eps) for e in members},
        )
        for label, members in by_label.items()
    ]


def format_cell(cell: Cell | None, kind: str) -> str:
    """``mean ± std (n)``; accuracies in %, ``-`` where there is no value."""
    if cell is None:
        return "-"
    if kind == "percent":
        return f"{100 * cell.mean:.2f} ± {100 * cell.std:.2f} ({cell.n})"
    if kind == "count":
        return f"{cell.mean:.1f} ± {cell.std:.1f} ({cell.n})"
    return f"{cell.mean:.3g} ± {cell.std:.2g} ({cell.n})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table. A cell's ``|`` is escaped and its line breaks become
    ``<br>``, so that a cell such as a failed run's error, one line per client, stays in its
    row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_one_line(cell) for cell in row) + " |" for row in rows]
    return lines


def _one_line(cell: str) -> str:
    return "<br>".join(cell.replace("|", "\\|").splitlines())


def _section_tables(section: Section, eps: float) -> list[str]:
    lines: list[str] = []
    columns = metrics(eps)
    for table in dict.fromkeys(m.table for m in columns):
        chosen = [m for m in columns if m.table == table]
        header = ["method"] + [f"{p} {m.column}" for p in section.partitions for m in chosen]
        rows = [
            [method] + [_cell(section, method, p, m) for p in section.partitions for m in chosen]
            for method in section.methods
        ]
        if all(cell == "-" for row in rows for cell in row[1:]):
            continue
        lines += ["", f"### {_TABLE_TITLES[table]}", "", *markdown_table(header, rows)]
    return lines


def _cell(section: Section, method: str, partition: str, metric: Metric) -> str:
    cells = section.cells.get((method, partition), {})
    return format_cell(cells.get(metric.key), metric.kind)


def _configuration(experiments: Sequence[Experiment]) -> list[str]:
    configs = [e.config for e in experiments]
    varying = varying_keys(configs)
    seeds = [show(seed) for seed in sorted({run.seed for e in experiments for run in e.runs})]
    lines = ["## Configuration", ""]
    if varying:
        rows = [[f"`{key}`", ", ".join(values)] for key, values in varying.items()]
        lines += [
            "Keys that vary between experiments (runs that differ in any key but `seed` are never "
            "averaged together):",
            "",
            *markdown_table(["key", "values"], rows),
        ]
    else:
        lines.append("All runs share one configuration apart from the seed.")
    lines += ["", f"{'Seed' if len(seeds) == 1 else 'Seeds'}: {', '.join(seeds)}.", ""]
    shared = [[f"`{k}`", show(v)] for k, v in sorted(configs[0].items()) if k not in varying]
    lines += [
        "<details><summary>Settings shared by all experiments</summary>",
        "",
        *markdown_table(["key", "value"], shared),
        "",
        "</details>",
    ]
    return lines


def _problems(experiments: Sequence[Experiment]) -> list[str]:
    rows = [
        [f"`{run.path}`", e.method, e.partition, show(run.seed), run.status, run.error or ""]
        for e in experiments
        for run in e.runs
        if run.status != "completed"
    ]
    if not rows:
        return []
    header = ["run", "method", "partition", "seed", "status", "error"]
    title = "## Failed, interrupted and incomplete runs (not in the tables)"
    return ["", title, "", *markdown_table(header, rows)]


def _rejections(experiments: Sequence[Experiment]) -> list[str]:
    rows = [
        [f"`{run.path}`", e.method, e.partition, show(run.seed), run.rejected.describe()]
        for e in experiments
        for run in e.runs
        if run.rejected
    ]
    if not rows:
        return []
    header = ["run", "method", "partition", "seed", "client replies it went on without"]
    title = "## Completed runs without some clients' replies (in the tables)"
    return ["", title, "", REJECTION_NOTE, "", *markdown_table(header, rows)]


def _status_counts(runs: Sequence[RunResult]) -> str:
    """``3 completed, 1 failed, 0 incomplete``, with the interrupted runs where there are any."""
    counts = Counter(run.status for run in runs)
    shown = [s for s in get_args(Status) if s != "interrupted" or counts[s]]
    return ", ".join(f"{counts[status]} {status}" for status in shown)


def markdown(
    title: str,
    experiments: Sequence[Experiment],
    report_sections: Sequence[Section],
    sources: Sequence[Path],
    figures: dict[str, list[Path]],
    eps: float,
    across: Sequence[str] = (),
) -> str:
    """The whole markdown report; ``figures`` maps section labels to image paths relative to the
    report file, ``across`` holds the markdown lines of what spans sections (the robustness
    study)."""
    runs: list[RunResult] = [run for e in experiments for run in e.runs]
    lines = [
        f"# {title}",
        "",
        f"{len(runs)} runs ({_status_counts(runs)}) in {len(experiments)} experiments, read from "
        + ", ".join(f"`{source}`" for source in sources)
        + ".",
        "",
        code_line(runs),
        "",
        *validation_warning(runs),
        *rows_warning(runs),
        LEGEND,
        "",
        *_configuration(experiments),
    ]
    if across:
        lines += ["", "## Across sections", "", *across]
    for section in report_sections:
        lines += ["", f"## {section.label or 'Results'}"]
        if not section.has_results:
            lines += ["", "No completed runs."]
            continue
        lines += _section_tables(section, eps)
        shown = figures.get(section.label, [])
        lines += [""] + [f"![{path.stem}]({path.as_posix()})" for path in shown]
    lines += _problems(experiments)
    lines += _rejections(experiments)
    return "\n".join(lines) + "\n"


def code_line(runs: Sequence[RunResult]) -> str:
    """Which pflower code made the runs (``summary.json``'s ``code``): one version, or each
    version with its number of runs, so that a comparison across code changes is visible."""
    versions: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.code is not None:
            versions.setdefault(str(run.code["fingerprint"]), []).append(run.code)
    unrecorded = sum(run.code is None for run in runs)

    def describe(fingerprint: str, codes: list[dict[str, Any]]) -> str:
        commits = sorted({str(c["commit"])[:12] for c in codes if c.get("commit")})
        dirty = any(c.get("dirty") for c in codes)
        where = f", commit {', '.join(commits)}" if commits else ""
        return f"`{fingerprint}`{where}{' with uncommitted changes' if dirty else ''}"

    if not versions:
        return "Code: not recorded (the runs are incomplete or predate pflower recording it)."
    if len(versions) == 1 and not unrecorded:
        ((fingerprint, codes),) = versions.items()
        return f"Code: every run was made with pflower {describe(fingerprint, codes)}."
    parts = [f"{describe(f, codes)} ({len(codes)} runs)" for f, codes in versions.items()]
    if unrecorded:
        parts.append(f"not recorded ({unrecorded} runs: incomplete, or made before pflower did)")
    return (
        f"Code: the runs were made with {len(versions)} version(s) of pflower: "
        + "; ".join(parts)
        + "."
    )


def rows_warning(runs: Sequence[RunResult]) -> list[str]:
    """A note, with an empty line after it, when completed runs were kept without their rows
    (``metrics.jsonl``), as the final runs under ``results/tuning/`` are: their values are
    their ``summary.json``'s, and no figure shows them; nothing otherwise."""
    done = [run for run in runs if run.status == "completed"]
    bare = sum(not run.rows for run in done)
    if not bare:
        return []
    return [
        f"{bare} of the {len(done)} completed runs keep no `metrics.jsonl`: their final and "
        "last-10% values are the aggregates their `summary.json` recorded (the same numbers), "
        "and no figure shows them (the figures draw rounds and clients).",
        "",
    ]


def validation_warning(runs: Sequence[RunResult]) -> list[str]:
    """A warning, with an empty line after it, when runs scored validation shares instead of
    test shares (``split.evaluate_on=val``: tuning runs); nothing otherwise."""
    tuning = sum(run.config.get("split", {}).get("evaluate_on") == "val" for run in runs)
    if not tuning:
        return []
    return [
        f"**{tuning} of {len(runs)} runs scored the clients' validation shares, not their test "
        "shares** (`split.evaluate_on=val`: runs for choosing hyperparameters). Their "
        "accuracies are validation accuracies; they are not test results.",
        "",
    ]


def write_csv(path: Path, report_sections: Sequence[Section], eps: float) -> Path:
    """``report.csv``: one row per section and method, columns partition x metric."""
    columns = metrics(eps)
    partitions = list(dict.fromkeys(p for s in report_sections for p in s.partitions))
    header = ["section", "method"] + [f"{p} {m.key}" for p in partitions for m in columns]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for section in report_sections:
            for method in section.methods:
                writer.writerow(
                    [section.label, method]
                    + [_cell(section, method, p, m) for p in partitions for m in columns]
                )
    return path


def write_values_csv(path: Path, report_sections: Sequence[Section]) -> Path:
    """``report_values.csv``: raw seed statistics (accuracies as fractions), one row per
    experiment and metric."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["section", "method", "partition", "metric", "mean", "std", "n"])
        for section in report_sections:
            for (method, partition), cells in section.cells.items():
                for key, cell in cells.items():
                    writer.writerow(
                        [section.label, method, partition, key, cell.mean, cell.std, cell.n]
                    )
    return path
