"""The report's figures, one pair per section, one panel per partition:

- accuracy per round by method: the client-mean Acc(L) (top) and Acc(G) (bottom) at one stage,
  mean over seeds with a ±1 std band over seeds;
- per-client final accuracy by method: box plots of every client's final-round Acc(L) at that
  stage, pooled over seeds, with the individual clients as dots.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from pflower.reporting.stats import final_client_values, round_curve
from pflower.reporting.tables import Section

_CURVES = (("acc_local", "Acc(L)"), ("acc_global", "Acc(G)"))


def _colors(methods: Sequence[str]) -> dict[str, str]:
    palette = plt.get_cmap("tab10").colors + plt.get_cmap("Dark2").colors
    return {m: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, m in enumerate(methods)}


def accuracy_per_round(section: Section, stage: str, path: Path) -> Path:
    """Client-mean accuracy per evaluated round, by method, with std bands over seeds."""
    partitions = section.partitions
    colors = _colors(section.methods)
    fig, axes = plt.subplots(
        len(_CURVES), len(partitions), figsize=(4.2 * len(partitions), 6.5), squeeze=False
    )
    for column, partition in enumerate(partitions):
        for row, (metric, name) in enumerate(_CURVES):
            ax = axes[row][column]
            for experiment in section.experiments:
                if experiment.partition != partition:
                    continue
                rounds, means, stds = round_curve(experiment, stage, metric)
                if not rounds:
                    continue
                color = colors[experiment.method]
                ax.plot(
                    rounds, means, marker="o", markersize=3, color=color, label=experiment.method
                )
                ax.fill_between(rounds, means - stds, means + stds, color=color, alpha=0.15)
            ax.set_title(f"{partition}: {stage} {name}", fontsize=10)
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if axes[0][column].lines:
            axes[0][column].legend(fontsize=7)
    axes[0][0].set_ylabel("client mean (±1 std over seeds)")
    return _save(fig, path)


def client_distribution(section: Section, stage: str, path: Path) -> Path:
    """Final-round per-client Acc(L) at ``stage`` by method, pooled over seeds."""
    partitions = section.partitions
    colors = _colors(section.methods)
    fig, axes = plt.subplots(1, len(partitions), figsize=(4.2 * len(partitions), 4), squeeze=False)
    for ax, partition in zip(axes[0], partitions, strict=True):
        data, labels = [], []
        for experiment in section.experiments:
            values = final_client_values(experiment, stage, "acc_local")
            if experiment.partition == partition and values:
                data.append(values)
                labels.append(experiment.method)
        if data:
            ax.boxplot(data, tick_labels=labels, showmeans=True)
            for position, (values, label) in enumerate(zip(data, labels, strict=True), start=1):
                jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
                ax.scatter(
                    position + np.asarray(jitter), values, s=8, alpha=0.6, color=colors[label]
                )
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.set_title(f"{partition}: final {stage} Acc(L) per client", fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
