"""Report statistics: per run and metric, the final-round value and the mean over the last 10% of
rounds; then mean ± std over seeds.

Per run and round, stage L1 and L2 statistics over clients come from
[`pflower.results.statistics.summarize_stage`][pflower.results.statistics.summarize_stage]: Acc(L)
and Acc(G) are the unweighted client
means (as in FLIU's Table I), Acc = Acc(L) + Acc(G), rho_eps counts clients with Acc(L) > eps, the
loss variance over clients is the fairness measure, and "bottom-10%" is the mean Acc(L) of the
worst tenth of the clients. G is the global model's accuracy on the global test set. The last-10%
value averages a metric over the evaluated rounds among the last 10% of rounds
([`pflower.results.summary.last_rounds`][pflower.results.summary.last_rounds]). Across seeds the
report gives the mean, the
population standard deviation (ddof = 0) and the number of seeds. Headline numbers are never the
best over rounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflower.reporting.groups import Experiment
from pflower.results.rows import CLIENT_STAGES, G, Row
from pflower.results.runs import RunResult
from pflower.results.summary import round_summary

LAST10 = " last10"
"""Suffix of a metric key averaged over the last 10% of rounds."""

ACC_SUM_COLUMN = "Acc(L)+Acc(G) (sum, 0-200)"
"""The table heading of FLIU's Acc = Acc(L) + Acc(G) (key ``<stage> Acc``): a sum of two
percentages, so that values above 100 cannot be misread as an accuracy."""

MODEL_TYPES = ("PM", "GM", "HM")
"""The personalized, global and hybrid model of clients that hold both (FLAME paper, Sec. IV-D)."""


@dataclass(frozen=True)
class Metric:
    """A report column: ``key`` in the per-run results, shown as ``column`` in table ``table``."""

    key: str
    table: str
    column: str
    kind: str  # "percent", "count" or "value": how a cell is printed

    def last10(self) -> Metric:
        """The same metric averaged over the last 10% of rounds."""
        return Metric(self.key + LAST10, self.table, f"{self.column} last10%", self.kind)


@dataclass(frozen=True)
class Cell:
    """Mean and population std over seeds of one metric, and how many seeds had it."""

    mean: float
    std: float
    n: int


def metrics(eps: float) -> list[Metric]:
    """The report's columns in table order: FLIU Table I's accuracies, each final and averaged
    over the last 10% of rounds side by side, then fairness at the final round."""
    columns = []
    for stage in CLIENT_STAGES:
        for name in ("Acc(L)", "Acc(G)", "Acc"):
            column = ACC_SUM_COLUMN if name == "Acc" else name
            final = Metric(f"{stage} {name}", stage, column, "percent")
            columns += [final, final.last10()]
    final = Metric("G Acc(G)", "G", "Acc(G)", "percent")
    columns += [final, final.last10()]
    for stage in CLIENT_STAGES:
        for model in MODEL_TYPES:
            final = Metric(
                f"{stage} {model} Acc(L)", f"Models {stage}", f"{model} Acc(L)", "percent"
            )
            columns += [final, final.last10()]
        columns += [
            Metric(f"{stage} {model} loss var", f"Models {stage}", f"{model} loss var", "value")
            for model in MODEL_TYPES
        ]
    columns += [
        Metric("seconds per round", "Cost", "s/round", "value"),
        Metric("MB down", "Cost", "MB down per client-round", "value"),
        Metric("MB up", "Cost", "MB up per client-round", "value"),
    ]
    for stage in CLIENT_STAGES:
        table = f"Fairness {stage}"
        columns += [
            Metric(f"{stage} rho", table, f"ρ_{eps:g}", "count"),
            Metric(f"{stage} loss var", table, "loss var", "value"),
            Metric(f"{stage} bottom-10%", table, "bottom-10% Acc(L)", "percent"),
        ]
    return columns


def summary_results(summary: Row, eps: float) -> dict[str, float]:
    """The value of every metric in a round summary (``{stage: summarize_stage(...), "G": its
    row}``, [`round_summary`][pflower.results.summary.round_summary], or ``summary.json``'s
    ``final`` and ``last10``); missing stages stay missing, as does ``rho`` where ``eps`` is not
    one of the summary's thresholds."""
    results: dict[str, float] = {}
    for stage in CLIENT_STAGES:
        stage_summary = summary.get(stage) or {}
        if "acc_local" not in stage_summary:
            continue
        acc_local = stage_summary["acc_local"]["mean"]
        results[f"{stage} Acc(L)"] = acc_local
        if f"rho_{eps:g}" in stage_summary:
            results[f"{stage} rho"] = stage_summary[f"rho_{eps:g}"]
        results[f"{stage} loss var"] = stage_summary["fairness_loss_var"]
        results[f"{stage} bottom-10%"] = stage_summary["acc_local"]["bottom10_mean"]
        if "acc_global" in stage_summary:
            acc_global = stage_summary["acc_global"]["mean"]
            results[f"{stage} Acc(G)"] = acc_global
            results[f"{stage} Acc"] = acc_local + acc_global
        for model in MODEL_TYPES:
            if f"acc_{model.lower()}" in stage_summary:
                results[f"{stage} {model} Acc(L)"] = stage_summary[f"acc_{model.lower()}"]["mean"]
                results[f"{stage} {model} loss var"] = stage_summary[
                    f"fairness_loss_var_{model.lower()}"
                ]
    if "acc" in (summary.get(G) or {}):
        results["G Acc(G)"] = float(summary[G]["acc"])
    return results


def round_results(run: RunResult, server_round: int, eps: float) -> dict[str, float]:
    """The value of every metric the run has in ``server_round`` (missing stages stay missing)."""
    return summary_results(round_summary(run.rows, server_round, [eps]), eps)


def run_costs(run: RunResult) -> dict[str, float]:
    """The run's seconds per round and megabytes of arrays one client downloads and uploads per
    round ([`pflower.results.summary.run_cost`][pflower.results.summary.run_cost]), under the
    report's column names."""
    names = {
        "seconds_per_round": "seconds per round",
        "mb_down_per_client_round": "MB down",
        "mb_up_per_client_round": "MB up",
    }
    return {names[key]: value for key, value in run.cost.items() if key in names}


def run_results(run: RunResult, eps: float) -> dict[str, float]:
    """Every metric at the final round, and (key suffix ``last10``) averaged over the evaluated
    rounds in the last 10% of rounds; then the run's costs
    ([`run_costs`][pflower.reporting.stats.run_costs]). A run kept without its rows gives the
    aggregates its ``summary.json`` recorded from them
    ([`RunResult.recorded`][pflower.results.runs.RunResult.recorded]): the same values."""
    if not run.rows:
        final = summary_results(run.recorded.get("final", {}), eps)
        last10 = summary_results(run.recorded.get("last10", {}), eps)
        in_window = {key + LAST10: last10[key] for key in final if key in last10}
        return {**final, **in_window, **run_costs(run)}
    assert run.final_round is not None
    final = round_results(run, run.final_round, eps)
    window = [round_results(run, r, eps) for r in run.window()]
    last10 = {
        key + LAST10: float(np.mean([values[key] for values in window if key in values]))
        for key in final
    }
    return {**final, **last10, **run_costs(run)}


def over_seeds(values: Sequence[float]) -> Cell:
    """Mean, population std (ddof = 0) and count of per-seed values."""
    array = np.asarray(values, dtype=np.float64)
    return Cell(float(array.mean()), float(array.std()), len(array))


def completed(experiment: Experiment) -> list[RunResult]:
    """The experiment's runs that completed."""
    return [run for run in experiment.runs if run.status == "completed"]


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
        for row in run.stage_rows(stage, run.final_round or 0)
        if metric in row
    ]


def model_key(stage: str, model: str, name: str) -> str:
    """The cell key of metric ``name`` ("Acc(L)", "loss var") of model type ``model`` at
    ``stage``; ``model`` is "" for the one model of a method that holds a single model."""
    return " ".join(part for part in (stage, model, name) if part)


def model_points(cells: dict[str, Cell], stage: str) -> list[tuple[str, Cell, Cell]]:
    """(model type, Acc(L), loss var) per model the method reports at ``stage``: PM, GM and HM
    where it holds both models (its plain stage metrics are then the PM's), else its one model."""
    models = [model for model in MODEL_TYPES if model_key(stage, model, "loss var") in cells]
    if not models and model_key(stage, "", "loss var") in cells:
        models = [""]
    return [
        (
            model,
            cells[model_key(stage, model, "Acc(L)")],
            cells[model_key(stage, model, "loss var")],
        )
        for model in models
    ]
