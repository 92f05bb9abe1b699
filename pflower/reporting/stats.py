"""Report statistics: one number per run and metric (final round), then mean ± std over seeds.

Per run, stage L1 and L2 statistics over clients come from :func:`pflower.metrics.summarize_stage`
on the final round's rows: Acc(L) and Acc(G) are the unweighted client means (fliu.md §3.3),
Acc = Acc(L) + Acc(G), rho_eps counts clients with Acc(L) > eps, the loss variance is the
fairness measure of DESIGN.md §4 and "bottom-10%" is the mean Acc(L) of the worst tenth of the
clients. G is the global model's accuracy on the global test set. Across seeds the report gives
the mean, the population standard deviation (ddof = 0, fliu.md A11) and the number of seeds.
Headline numbers are final-round values, never the best over rounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pflower.metrics import summarize_stage
from pflower.reporting.groups import Experiment
from pflower.reporting.runs import Run


@dataclass(frozen=True)
class Metric:
    """A report column: ``key`` in the per-run results, shown as ``column`` in table ``table``."""

    key: str
    table: str
    column: str
    kind: str  # "percent", "count" or "value": how a cell is printed


@dataclass(frozen=True)
class Cell:
    """Mean and population std over seeds of one metric, and how many seeds had it."""

    mean: float
    std: float
    n: int


def metrics(eps: float) -> list[Metric]:
    """The report's columns in table order: FLIU Table I's accuracies, then fairness."""
    columns = []
    for stage in ("L1", "L2"):
        for name in ("Acc(L)", "Acc(G)", "Acc"):
            columns.append(Metric(f"{stage} {name}", stage, name, "percent"))
    columns.append(Metric("G Acc(G)", "G", "Acc(G)", "percent"))
    for stage in ("L1", "L2"):
        table = f"Fairness {stage}"
        columns += [
            Metric(f"{stage} rho", table, f"ρ_{eps:g}", "count"),
            Metric(f"{stage} loss var", table, "loss var", "value"),
            Metric(f"{stage} bottom-10%", table, "bottom-10% Acc(L)", "percent"),
        ]
    return columns


def _final_rows(run: Run, stage: str) -> list[dict[str, Any]]:
    return [r for r in run.rows if r["stage"] == stage and r["round"] == run.final_round]


def run_results(run: Run, eps: float) -> dict[str, float]:
    """The final-round value of every metric this run has (missing stages stay missing)."""
    results: dict[str, float] = {}
    for stage in ("L1", "L2"):
        rows = _final_rows(run, stage)
        if not rows:
            continue
        summary = summarize_stage(rows, [eps])
        acc_local = summary["acc_local"]["mean"]
        results[f"{stage} Acc(L)"] = acc_local
        results[f"{stage} rho"] = summary[f"rho_{eps:g}"]
        results[f"{stage} loss var"] = summary["fairness_loss_var"]
        results[f"{stage} bottom-10%"] = summary["acc_local"]["bottom10_mean"]
        if "acc_global" in summary:
            acc_global = summary["acc_global"]["mean"]
            results[f"{stage} Acc(G)"] = acc_global
            results[f"{stage} Acc"] = acc_local + acc_global
    global_rows = _final_rows(run, "G")
    if global_rows:
        results["G Acc(G)"] = float(global_rows[0]["acc"])
    return results


def over_seeds(values: Sequence[float]) -> Cell:
    """Mean, population std (ddof = 0) and count of per-seed values."""
    array = np.asarray(values, dtype=np.float64)
    return Cell(float(array.mean()), float(array.std()), len(array))


def completed(experiment: Experiment) -> list[Run]:
    return [run for run in experiment.runs if run.status == "ok"]


def experiment_cells(experiment: Experiment, eps: float) -> dict[str, Cell]:
    """Seed statistics of every metric over the experiment's completed runs."""
    per_metric: dict[str, list[float]] = defaultdict(list)
    for run in completed(experiment):
        for key, value in run_results(run, eps).items():
            per_metric[key].append(value)
    return {key: over_seeds(values) for key, values in per_metric.items()}


def round_curve(
    experiment: Experiment, stage: str, metric: str
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Per evaluated round: mean over seeds of the client-mean ``metric`` at ``stage`` (for G the
    global model's ``acc``), and its std over seeds."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for run in completed(experiment):
        by_round: dict[int, list[float]] = defaultdict(list)
        for row in run.rows:
            if row["stage"] == stage and metric in row and row["round"] > 0:
                by_round[row["round"]].append(float(row[metric]))
        for round_, values in by_round.items():
            per_round[round_].append(float(np.mean(values)))
    rounds = sorted(per_round)
    means = np.array([np.mean(per_round[r]) for r in rounds])
    stds = np.array([np.std(per_round[r]) for r in rounds])
    return rounds, means, stds


def final_client_values(experiment: Experiment, stage: str, metric: str) -> list[float]:
    """Every client's final-round ``metric`` at ``stage``, pooled over seeds."""
    return [
        float(row[metric])
        for run in completed(experiment)
        for row in _final_rows(run, stage)
        if metric in row
    ]
