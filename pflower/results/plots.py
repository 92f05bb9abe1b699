"""Plots of one run: accuracy per round by stage, and the final per-client accuracy distribution."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot_run(
    rows: Sequence[dict[str, Any]], final_round: int, client_stages: Sequence[str], out_dir: Path
) -> list[Path]:
    """Write ``accuracy.png`` and ``clients.png`` (stage G and ``client_stages``) into
    ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _accuracy_per_round(rows, client_stages, out_dir / "accuracy.png"),
        _final_clients(rows, final_round, client_stages, out_dir / "clients.png"),
    ]


def _accuracy_per_round(
    rows: Sequence[dict[str, Any]], client_stages: Sequence[str], path: Path
) -> Path:
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["stage"] in client_stages:
            curves[f"{row['stage']} Acc(L)"][row["round"]].append(row["acc_local"])
            curves[f"{row['stage']} Acc(G)"][row["round"]].append(row["acc_global"])
        elif row["stage"] == "G":
            curves["G Acc(G)"][row["round"]].append(row["acc"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, by_round in sorted(curves.items()):
        rounds = sorted(by_round)
        means = np.array([np.mean(by_round[r]) for r in rounds])
        stds = np.array([np.std(by_round[r]) for r in rounds])
        style = "--" if "Acc(G)" in label else "-"
        (line,) = ax.plot(rounds, means, style, marker="o", markersize=3, label=label)
        ax.fill_between(rounds, means - stds, means + stds, color=line.get_color(), alpha=0.12)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (mean over clients, ±1 std)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _final_clients(
    rows: Sequence[dict[str, Any]], final_round: int, client_stages: Sequence[str], path: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    data, labels = [], []
    for stage in client_stages:
        for metric, name in (("acc_local", "Acc(L)"), ("acc_global", "Acc(G)")):
            values = [r[metric] for r in rows if r["round"] == final_round and r["stage"] == stage]
            if values:
                data.append(values)
                labels.append(f"{stage} {name}")
    if data:
        ax.boxplot(data, tick_labels=labels, showmeans=True)
        for position, values in enumerate(data, start=1):
            jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
            ax.scatter(position + np.asarray(jitter), values, s=10, alpha=0.6)
    ax.set_ylabel(f"per-client accuracy, round {final_round}")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
