"""The report's figures, one pair per section, one panel per partition:

- accuracy per round by method: the client-mean Acc(L) (top) and Acc(G) (bottom) at one stage,
  mean over seeds with a ±1 std band over seeds;
- per-client final accuracy by method: box plots of every client's final-round Acc(L) at that
  stage, pooled over seeds, with the individual clients as dots;
- fairness: final-round client-mean Acc(L) against the variance over clients of the local test
  loss, one point per method and model type (PM / GM / HM where the method holds both models),
  mean over seeds with ±1 std bars over seeds;
- robustness (one figure for the whole report, when some attack runs at two or more fractions):
  the benign clients' final-round Acc(L) against the share of malicious clients, one panel per
  attack and partition, one line per method (with its robust aggregator) and model type.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from pflower.reporting.stats import MODEL_TYPES, Cell, final_client_values, round_curve
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


_MARKERS = {"": "o", "PM": "o", "GM": "s", "HM": "^"}


def model_points(cells: dict[str, Cell], stage: str) -> list[tuple[str, Cell, Cell]]:
    """(model type, Acc(L), loss var) per model the method reports at ``stage``: PM, GM and HM
    where it holds both models (its plain stage metrics are then the PM's), else its one model."""
    points = [
        (model, cells[f"{stage} {model} Acc(L)"], cells[f"{stage} {model} loss var"])
        for model in MODEL_TYPES
        if f"{stage} {model} loss var" in cells
    ]
    if points or f"{stage} loss var" not in cells:
        return points
    return [("", cells[f"{stage} Acc(L)"], cells[f"{stage} loss var"])]


def fairness(section: Section, stage: str, path: Path) -> Path:
    """Final-round Acc(L) against loss variance over clients, per method and model type."""
    partitions = section.partitions
    colors = _colors(section.methods)
    fig, axes = plt.subplots(1, len(partitions), figsize=(4.6 * len(partitions), 4), squeeze=False)
    for ax, partition in zip(axes[0], partitions, strict=True):
        for method in section.methods:
            for model, accuracy, variance in model_points(
                section.cells.get((method, partition), {}), stage
            ):
                ax.errorbar(
                    variance.mean,
                    accuracy.mean,
                    xerr=variance.std,
                    yerr=accuracy.std,
                    marker=_MARKERS[model],
                    color=colors[method],
                    linestyle="none",
                    capsize=2,
                    label=f"{method} {model}".strip(),
                )
        ax.set_title(f"{partition}: final {stage}, Acc(L) vs loss variance", fontsize=10)
        ax.set_xlabel("variance over clients of the local test loss")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel("client-mean Acc(L) (±1 std over seeds)")
    return _save(fig, path)


@dataclass(frozen=True)
class _Line:
    """One line of the robustness figure: a method, its aggregator and a model type."""

    method: str
    robust: str
    model: str

    @property
    def label(self) -> str:
        name = self.method if self.robust == "none" else f"{self.method} + {self.robust}"
        return f"{name} {self.model}".strip()


def robustness(sections: Sequence[Section], stage: str, path: Path) -> Path | None:
    """Benign clients' final-round Acc(L) at ``stage`` against ``attack.fraction`` (malicious
    clients are never scored), mean over seeds with ±1 std bars; None unless some attack was run
    at two or more fractions."""
    panels: dict[tuple[str, str], dict[_Line, dict[float, Cell]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for section in sections:
        for experiment in section.experiments:
            attack = str(experiment.config.get("attack.name", "none"))
            if attack == "none":
                continue
            robust = str(experiment.config.get("robust.name", "none"))
            fraction = float(experiment.config["attack.fraction"])
            cells = section.cells.get((experiment.method, experiment.partition), {})
            for model, accuracy, _ in model_points(cells, stage):
                line = _Line(experiment.method, robust, model)
                panels[attack, experiment.partition][line][fraction] = accuracy
    if not any(len(points) > 1 for lines in panels.values() for points in lines.values()):
        return None
    methods = [line.method for lines in panels.values() for line in lines]
    colors = _colors(list(dict.fromkeys(methods)))
    keys = sorted(panels)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for line, points in panels[key].items():
            fractions = sorted(points)
            ax.errorbar(
                fractions,
                [points[f].mean for f in fractions],
                yerr=[points[f].std for f in fractions],
                marker=_MARKERS[line.model],
                linestyle="-" if line.robust == "none" else "--",
                color=colors[line.method],
                capsize=2,
                label=line.label,
            )
        ax.set_title(f"{key[1]}: attack {key[0]}, final {stage}", fontsize=10)
        ax.set_xlabel("share of malicious clients")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("benign clients' mean Acc(L) (±1 std over seeds)")
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
