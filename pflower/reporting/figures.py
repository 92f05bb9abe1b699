"""The report's figures, one pair per section, one panel per partition. Every figure has a title
(the section and stage; [`pflower.reporting.report`][pflower.reporting.report] passes the report's
title), every
method its own colour and marker, axes labelled with their units, and its legend outside the
panels:

- accuracy per round by method: the client-mean Acc(L) (top) and Acc(G) (bottom) at one stage,
  mean over seeds with a ±1 std band over seeds;
- per-client final accuracy by method: box plots of every client's final-round Acc(L) at that
  stage, pooled over seeds, with the individual clients as dots;
- fairness: final-round client-mean Acc(L) against the variance over clients of the local test
  loss, one point per method and model type (PM / GM / HM where the method holds both models),
  mean over seeds with ±1 std bars over seeds;
- robustness (one figure for the whole report, when some attack runs at two or more fractions,
  the attack-free run counting as fraction 0): the benign clients' final-round Acc(L) against the
  share of malicious clients, one panel per attack and partition, one line per method (with its
  robust aggregator) and model type;
- a tuned leaderboard's setting ([`leaderboard`][pflower.reporting.figures.leaderboard], drawn by
  ``pflower report --leaderboard``):
  every method's final accuracy, its seeds and the methods that share rank 1 (or whose rank
  interval reaches 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.ticker import MaxNLocator

from pflower.reporting.robustness import Panels
from pflower.reporting.stats import final_client_values, model_points, round_curve
from pflower.reporting.studies import FAILED
from pflower.reporting.tables import Section
from pflower.results.plots import client_boxes, client_markers

_CURVES = (
    ("acc_local", "Acc(L), own test split"),
    ("acc_global", "Acc(G), global test set"),
)
_METHOD_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p")
_LINESTYLES = ("-", "--", "-.", ":")


def _colors(methods: Sequence[str]) -> dict[str, str]:
    palette = [*plt.get_cmap("tab10")(range(10)), *plt.get_cmap("Dark2")(range(8))]
    return {m: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, m in enumerate(methods)}


def _method_styles(methods: Sequence[str]) -> dict[str, dict[str, str]]:
    """A marker and a line style per method, so that methods differ beyond their colour."""
    return {
        m: {
            "marker": _METHOD_MARKERS[i % len(_METHOD_MARKERS)],
            "linestyle": _LINESTYLES[(i // 2) % len(_LINESTYLES)],
        }
        for i, m in enumerate(methods)
    }


def _legend_outside(fig: plt.Figure, axes: Sequence[plt.Axes]) -> None:
    """One legend for the figure, right of the panels (the first label of each name wins)."""
    handles: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=8,
            frameon=False,
        )


def _title(fig: plt.Figure, text: str, title: str) -> None:
    fig.suptitle(f"{title}: {text}" if title else text, fontsize=11)


def accuracy_per_round(section: Section, stage: str, path: Path, title: str = "") -> Path:
    """Client-mean accuracy per evaluated round, by method, with std bands over seeds."""
    partitions = section.partitions
    colors = _colors(section.methods)
    styles = _method_styles(section.methods)
    fig, axes = plt.subplots(
        len(_CURVES),
        len(partitions),
        figsize=(4.2 * len(partitions), 6.5),
        squeeze=False,
        sharex=True,  # one round axis for every panel
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
                    rounds,
                    means,
                    markersize=4,
                    markevery=max(1, len(rounds) // 15),
                    color=color,
                    label=experiment.method,
                    **styles[experiment.method],
                )
                ax.fill_between(rounds, means - stds, means + stds, color=color, alpha=0.15)
            ax.set_title(f"{partition}: {stage} {name}", fontsize=10)
            ax.set_ylim(0, 1.03)
            ax.grid(alpha=0.3)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for row in range(len(_CURVES)):
        axes[row][0].set_ylabel("client-mean accuracy\n(fraction; band ±1 std over seeds)")
    _legend_outside(fig, list(axes.flat))
    _title(fig, f"accuracy per round at stage {stage}, mean over seeds", title)
    return _save(fig, path)


def client_distribution(section: Section, stage: str, path: Path, title: str = "") -> Path:
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
            client_boxes(ax, data, labels, [colors[label] for label in labels], dot_size=8)
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.set_title(f"{partition}: final {stage} Acc(L) per client", fontsize=10)
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("Acc(L), own test split (fraction)")
    fig.legend(
        handles=client_markers(),
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        fontsize=8,
        frameon=False,
    )
    _title(fig, f"final per-client Acc(L) at stage {stage}, clients of all seeds", title)
    return _save(fig, path)


_MARKERS = {"": "o", "PM": "o", "GM": "s", "HM": "^"}


def fairness(section: Section, stage: str, path: Path, title: str = "") -> Path:
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
        ax.set_xlabel("variance over clients of the local test loss (nats²)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("client-mean Acc(L) (fraction; ±1 std over seeds)")
    _legend_outside(fig, list(axes.flat))
    _title(fig, f"fairness at stage {stage} (marker: o PM or single model, s GM, ^ HM)", title)
    return _save(fig, path)


def robustness(panels: Panels, stage: str, path: Path, title: str = "") -> Path | None:
    """Benign clients' final-round Acc(L) at ``stage`` against ``attack.fraction`` (malicious
    clients are never scored), one panel per attack and partition, mean over seeds with ±1 std
    bars; None when there is no panel
    ([`robustness_panels`][pflower.reporting.robustness.robustness_panels])."""
    if not panels:
        return None
    lines = [line for panel in panels.values() for line in panel]
    colors = _colors(list(dict.fromkeys(line.method for line in lines)))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False, sharex=True, sharey=True
    )
    for ax, ((attack, partition), panel) in zip(axes[0], panels.items(), strict=True):
        for line, points in panel.items():
            fractions = sorted(points)
            ax.errorbar(
                fractions,
                [points[f].final.mean for f in fractions],
                yerr=[points[f].final.std for f in fractions],
                marker=_MARKERS[line.model],
                linestyle="-" if line.robust == "none" else "--",
                color=colors[line.method],
                capsize=2,
                label=line.label,
            )
        ax.set_title(f"{partition}: attack {attack}, final {stage}", fontsize=10)
        ax.set_xlabel("share of malicious clients (fraction)")
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("benign clients' mean Acc(L)\n(fraction; ±1 std over seeds)")
    _legend_outside(fig, list(axes.flat))
    _title(fig, f"robustness at stage {stage} (dashed: robust aggregation)", title)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def leaderboard(
    rows: Sequence[tuple[str, Sequence[float], int]],
    path: Path,
    title: str = "",
    failed: Mapping[str, int] | None = None,
    by_mean: bool = False,
) -> Path:
    """A tuned setting at a glance: per method (``label, completed final runs' accuracies,
    rank``), best mean on top, its runs as dots and its mean ± std (ddof=1) as a bar; methods
    of rank 1 in colour (``by_mean``: ``rank`` is the best of its 95% rank interval, so those
    the studies and seeds leave a chance of being first; else those no method beats beyond the
    seeds' noise). ``failed`` counts, by label, failed runs that the mean counts at
    [`FAILED`][pflower.reporting.studies.FAILED] (a suite of several studies scores them so):
    drawn as crosses at the axis' left edge, which then starts below every completed run and
    every mean, not at 0."""
    failed = failed or {}
    scored = {
        label: 100 * np.array([*values, *[FAILED] * failed.get(label, 0)], dtype=float)
        for label, values, _ in rows
    }
    ordered = sorted(rows, key=lambda row: -float(scored[row[0]].mean()))
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.28 * len(ordered)))
    completed = [100 * float(v) for _, values, _ in rows for v in values]
    left = min([*completed, *(float(p.mean()) for p in scored.values())], default=0.0) - 2.0
    first_label = (
        "95% rank interval reaches 1"
        if by_mean
        else "rank 1: no method better beyond the seeds' noise"
    )
    for y, (label, values, rank) in enumerate(ordered):
        percent = scored[label]
        first = rank == 1
        color = "tab:blue" if first else "tab:gray"
        std = float(percent.std(ddof=1)) if len(percent) > 1 else 0.0
        ax.errorbar(
            percent.mean(),
            y,
            xerr=std,
            fmt="o" if first else "s",
            color=color,
            capsize=3,
            markersize=6,
            label=first_label if first else "ranked below",
        )
        ax.scatter(
            100 * np.asarray(values, dtype=float),
            [y] * len(values),
            s=10,
            color="black",
            alpha=0.5,
            zorder=3,
            label="one final run" if by_mean else "one final seed",
        )
        if failed.get(label):
            ax.scatter(
                [left] * failed[label],
                [y] * failed[label],
                marker="x",
                s=30,
                color="tab:red",
                zorder=3,
                clip_on=False,
                label="a failed run (scored 0; in the mean ± std)",
            )
    if failed:  # a failed run's bar would reach past 100%
        ax.set_xlim(left, max(completed, default=100.0) + 2.0)
    ax.set_yticks(range(len(ordered)), [row[0] for row in ordered], fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    over = "runs" if by_mean else "seeds"
    ax.set_xlabel(f"final-round L1 Acc(L), % (clients' own test shares; mean ± std over {over})")
    _legend_outside(fig, [ax])
    _title(fig, "every method tuned on validation with the same budget", title)
    return _save(fig, path)
