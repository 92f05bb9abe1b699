"""Plots of one run: accuracy per round by stage, and the final per-client accuracy distribution.

Both figures carry the run's title (method, dataset, partition, clients, seed:
[`run_title`][pflower.results.plots.run_title]),
label their axes with units, keep the legend outside the data, and draw every series so that it
stays visible where it overlaps another (at 1.0, L1 and L2 often do): each stage has its own
colour, marker and line style, and the personalized stages' markers are hollow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

STAGE_STYLE: dict[str, dict[str, Any]] = {
    "G": {"color": "black", "marker": "D", "linestyle": "-", "fill": True},
    "L1": {"color": "tab:blue", "marker": "o", "linestyle": "-", "fill": True},
    "L2": {"color": "tab:orange", "marker": "^", "linestyle": "--", "fill": False},
    "U": {"color": "tab:green", "marker": "s", "linestyle": ":", "fill": False},
}
"""How each stage is drawn in every run figure (other stages get grey)."""

_STAGE_NAMES = {
    "G": "G: global model",
    "L1": "L1: personalized, before training",
    "L2": "L2: after local training",
    "U": "U: held-out clients",
}


def client_markers() -> list[Artist]:
    """Legend entries of a per-client accuracy plot: one dot a client, the median, the mean."""
    return [
        Line2D([], [], color="grey", marker="o", linestyle="none", alpha=0.6, label="one client"),
        Line2D([], [], color="black", label="median"),
        Line2D(
            [],
            [],
            marker="D",
            markerfacecolor="white",
            markeredgecolor="black",
            linestyle="none",
            label="mean",
        ),
    ]


def client_boxes(
    ax: Axes,
    data: Sequence[Sequence[float]],
    labels: Sequence[str],
    colors: Sequence[Any],
    dot_size: float,
) -> None:
    """One box a group of clients' values on ``ax``: quartiles, median and mean, with every
    client drawn as a jittered dot in its group's colour (what
    [`client_markers`][pflower.results.plots.client_markers] names)."""
    ax.boxplot(
        data,
        tick_labels=labels,
        showmeans=True,
        showfliers=False,  # every client is drawn as a dot
        medianprops={"color": "black"},
        meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black"},
    )
    for position, (values, color) in enumerate(zip(data, colors, strict=True), start=1):
        jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
        ax.scatter(position + np.asarray(jitter), values, s=dot_size, alpha=0.6, color=color)


def run_title(cfg: Mapping[str, Any]) -> str:
    """``fliu on digits / pathological, 10 clients, seed 0`` from a run's configuration."""

    def name(group: str) -> str:
        block = cfg.get(group) or {}
        return str(block.get("name", "?")) if hasattr(block, "get") else str(block)

    return (
        f"{name('strategy')} on {name('dataset')} / {name('partition')}, "
        f"{cfg.get('num_clients', '?')} clients, seed {cfg.get('seed', '?')}"
    )


def plot_run(
    rows: Sequence[dict[str, Any]],
    final_round: int,
    client_stages: Sequence[str],
    out_dir: Path,
    title: str = "",
) -> list[Path]:
    """Write ``accuracy.png`` and ``clients.png`` (stage G and ``client_stages``) into
    ``out_dir``, titled ``title`` (e.g. [`run_title`][pflower.results.plots.run_title]); returns
    their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _accuracy_per_round(rows, client_stages, out_dir / "accuracy.png", title),
        _final_clients(rows, final_round, client_stages, out_dir / "clients.png", title),
    ]


def _style(stage: str) -> dict[str, Any]:
    return STAGE_STYLE.get(stage, {"color": "grey", "marker": "x", "linestyle": "-.", "fill": True})


def _accuracy_per_round(
    rows: Sequence[dict[str, Any]], client_stages: Sequence[str], path: Path, title: str
) -> Path:
    # panel -> stage -> round -> values: Acc(L) (own test split) and Acc(G) (global test set)
    curves: dict[str, dict[str, dict[int, list[float]]]] = {
        "Acc(L)": defaultdict(lambda: defaultdict(list)),
        "Acc(G)": defaultdict(lambda: defaultdict(list)),
    }
    for row in rows:
        if row["stage"] in client_stages:
            curves["Acc(L)"][row["stage"]][row["round"]].append(row["acc_local"])
            if "acc_global" in row:  # not measured with eval.client_global_test=off
                curves["Acc(G)"][row["stage"]][row["round"]].append(row["acc_global"])
        elif row["stage"] == "G":
            curves["Acc(G)"]["G"][row["round"]].append(row["acc"])
    # one x range for both panels (stage G may have rounds the clients' stages lack)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True, sharey=True)
    panels = (
        ("Acc(L)", "Acc(L): each client's own test split"),
        ("Acc(G)", "Acc(G): the global test set"),
    )
    shown: dict[str, Line2D] = {}
    for ax, (metric, panel_title) in zip(axes, panels, strict=True):
        stages = [s for s in ("G", *client_stages) if s in curves[metric]]
        for stage in stages:
            by_round = curves[metric][stage]
            rounds = sorted(by_round)
            means = np.array([np.mean(by_round[r]) for r in rounds])
            style = _style(stage)
            (line,) = ax.plot(
                rounds,
                means,
                linestyle=style["linestyle"],
                marker=style["marker"],
                markersize=5 if style["fill"] else 7,
                markerfacecolor=style["color"] if style["fill"] else "none",
                color=style["color"],
                linewidth=1.4,
                label=_STAGE_NAMES.get(stage, stage),
            )
            if stage != "G":  # one model: no spread over clients
                stds = np.array([np.std(by_round[r]) for r in rounds])
                ax.fill_between(rounds, means - stds, means + stds, color=style["color"], alpha=0.1)
            shown.setdefault(stage, line)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (fraction correct)")
    handles: list[Artist] = list(shown.values())
    handles.append(
        plt.Rectangle((0, 0), 1, 1, color="grey", alpha=0.2, label="±1 std over clients")
    )
    fig.legend(
        handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False
    )
    drawn = [stage for stage in client_stages if stage in shown]  # the legend's, no other
    subtitle = [f"lines: mean over clients ({', '.join(drawn)})"] if drawn else []
    if "G" in shown:
        subtitle.append("G: the one global model")
    fig.suptitle(
        f"Accuracy per round{': ' + title if title else ''}\n" + "; ".join(subtitle), fontsize=10
    )
    return _save(fig, path)


def _final_clients(
    rows: Sequence[dict[str, Any]],
    final_round: int,
    client_stages: Sequence[str],
    path: Path,
    title: str,
) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    data, labels, colors = [], [], []
    for stage in client_stages:
        for metric, name in (("acc_local", "Acc(L)"), ("acc_global", "Acc(G)")):
            values = [
                r[metric]
                for r in rows
                if r["round"] == final_round and r["stage"] == stage and metric in r
            ]
            if values:
                data.append(values)
                labels.append(f"{stage} {name}")
                colors.append(_style(stage)["color"])
    if data:
        client_boxes(ax, data, labels, colors, dot_size=12)
    ax.set_xlabel("stage and test set (Acc(L): own test split, Acc(G): global test set)")
    ax.set_ylabel(f"accuracy at round {final_round} (fraction correct)")
    ax.set_ylim(0, 1.03)
    ax.grid(alpha=0.3, axis="y")
    legend: list[Artist] = [
        *client_markers(),
        plt.Rectangle((0, 0), 1, 1, fill=False, label="box: quartiles\nwhiskers: 1.5 IQR"),
    ]
    ax.legend(
        handles=legend, loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False
    )
    ax.set_title(f"Final per-client accuracy{': ' + title if title else ''}", fontsize=10)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    """Write ``fig`` as ``path``; a write that fails (a full disk) leaves no part of it."""
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as error:
        path.unlink(missing_ok=True)
        error.filename = error.filename or str(path)
        raise
    finally:
        plt.close(fig)
    return path
