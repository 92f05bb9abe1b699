"""Per-client results of one stage and round -> the aggregate statistics pflower reports.

For each client stage (L1, L2, U) and each per-client metric the summary holds the
sample-weighted and the unweighted mean over clients, the standard deviation (ddof=0), the minimum,
the mean of the worst 10% of clients, and rho_eps (how many clients exceed each accuracy
threshold). Fairness is the variance of the per-client local test loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

CLIENT_METRICS = ("acc_local", "acc_global", "loss_local", "loss_global")
HYBRID_METRICS = ("acc_pm", "acc_gm", "acc_hm", "loss_pm", "loss_gm", "loss_hm")
"""Personalized / global / hybrid model metrics, present where clients hold both models (FLAME
paper, Sec. IV-D); summarized only when every row of the stage has them."""


def bottom_fraction_mean(values: Sequence[float] | np.ndarray, fraction: float = 0.1) -> float:
    """Mean of the lowest ``ceil(fraction * n)`` values (at least one)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    count = max(1, math.ceil(fraction * len(ordered)))
    return float(ordered[:count].mean())


def summarize_values(values: Sequence[float], weights: Sequence[float]) -> dict[str, float]:
    """Weighted and unweighted mean, std (ddof=0), min, max and bottom-10% mean of ``values``."""
    array = np.asarray(values, dtype=np.float64)
    weight = np.asarray(weights, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "weighted_mean": float(np.average(array, weights=weight)) if weight.sum() > 0 else math.nan,
        "std": float(array.std()),
        "min": float(array.min()),
        "max": float(array.max()),
        "bottom10_mean": bottom_fraction_mean(array),
    }


def rho(accuracies: Sequence[float], thresholds: Sequence[float]) -> dict[str, int]:
    """rho_eps: the number of clients whose accuracy exceeds each threshold eps (strict ``>``)."""
    array = np.asarray(accuracies, dtype=np.float64)
    return {f"rho_{eps:g}": int((array > eps).sum()) for eps in thresholds}


def summarize_stage(rows: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> dict[str, Any]:
    """Aggregate statistics of one stage's per-client rows (weights: local test-set sizes)."""
    if not rows:
        return {"num_clients": 0}
    weights = [float(row.get("num_test", 1)) for row in rows]
    summary: dict[str, Any] = {"num_clients": len(rows)}
    for metric in CLIENT_METRICS:
        values = [float(row[metric]) for row in rows if metric in row]
        if len(values) == len(rows):
            summary[metric] = summarize_values(values, weights)
    summary.update(rho([row["acc_local"] for row in rows], thresholds))
    losses = np.asarray([row["loss_local"] for row in rows], dtype=np.float64)
    summary["fairness_loss_var"] = float(losses.var())
    if all("hm_choice_pm" in row for row in rows):
        for metric in HYBRID_METRICS:
            summary[metric] = summarize_values([float(row[metric]) for row in rows], weights)
        summary["hm_choice_pm_frac"] = float(np.mean([row["hm_choice_pm"] for row in rows]))
        for model in ("pm", "gm", "hm"):
            model_losses = np.asarray([row[f"loss_{model}"] for row in rows], dtype=np.float64)
            summary[f"fairness_loss_var_{model}"] = float(model_losses.var())
    return summary
