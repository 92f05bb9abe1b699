"""Every kind of figure pflower draws, on small synthetic data, checked for how it reads:

- a round axis has whole-number ticks (never 1.25, 1.75);
- the panels of a figure share their x range (a stage or method that starts later does not get a
  shorter axis);
- the legend lies outside every panel, so it covers no data;
- the run plot's subtitle names only the stages its legend shows;
- the leaderboard figure's title says the setting in words, not by its folder name.

The figures are taken as they are saved (each module's ``_save``), after a draw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from matplotlib.figure import Figure

from pflower.reporting import figures
from pflower.reporting.leaderboard import setting_in_words
from pflower.reporting.report import write_report
from pflower.results import plots
from tests.test_report import FEDAVG, write_run


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Figure]]:
    """File name -> the figure saved to it, drawn, by any of the plotting modules."""
    found: dict[str, Figure] = {}

    def keep(original: Callable[[Figure, Path], Path]) -> Callable[[Figure, Path], Path]:
        def save(fig: Figure, path: Path) -> Path:
            fig.canvas.draw()
            found[path.name] = fig
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=40)
            return path

        return save

    monkeypatch.setattr(plots, "_save", keep(plots._save))
    monkeypatch.setattr(figures, "_save", keep(figures._save))
    yield found
    for fig in found.values():
        plt.close(fig)


def _panels(fig: Figure) -> list[Any]:
    return [ax for ax in fig.axes if ax.get_visible() and ax.has_data()]


def check_layout(fig: Figure) -> None:
    """Whole-number round ticks, one x range for every panel, every legend off every panel."""
    panels = _panels(fig)
    assert panels
    for ax in panels:
        if ax.get_xlabel() == "round":
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    limits = {tuple(np.round(ax.get_xlim(), 9)) for ax in panels}
    assert len(limits) == 1, limits
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in panels:
            assert not box.overlaps(ax.get_window_extent(renderer)), legend.get_texts()[0]


def _rows(stages: tuple[str, ...], rounds: range) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"round": 0, "stage": "G", "acc": 0.1}]
    for r in rounds:
        rows.append({"round": r, "stage": "G", "acc": 0.5 + 0.1 * r})
        for stage in stages:
            for client, shift in enumerate((0.0, 0.1, 0.2)):
                accuracy = min(1.0, 0.4 + 0.1 * r + shift)
                row = {"acc_local": accuracy, "acc_global": accuracy / 2}
                rows.append({"round": r, "stage": stage, "client": client, **row})
    return rows


def test_the_run_figures_read_cleanly(saved: dict[str, Figure], tmp_path: Path) -> None:
    # the clients' stages start at round 1, the global model at 0; no U stage in this run
    rows = _rows(("L1", "L2"), range(1, 4))
    plots.plot_run(rows, 3, ("L1", "L2", "U"), tmp_path, "fedavg on digits")
    accuracy = saved["accuracy.png"]
    check_layout(accuracy)
    assert accuracy.get_axes()[0].get_xlim() == accuracy.get_axes()[1].get_xlim()
    legend = [t.get_text() for t in accuracy.legends[0].get_texts()]
    subtitle = accuracy.get_suptitle()
    assert "(L1, L2)" in subtitle and "U" not in subtitle.split("\n")[1]
    assert not any(label.startswith("U") for label in legend)
    check_layout(saved["clients.png"])


def test_the_report_figures_read_cleanly(saved: dict[str, Figure], tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for seed in (0, 1):  # two rounds each: the default locator would tick at 0.25 steps
        write_run(root / f"a{seed}", seed, FEDAVG, [(0.8, 0.5, 0.2), (0.6, 0.7, 0.6)], g=0.6)
        run = write_run(root / f"b{seed}", seed, FEDAVG, [(0.5, 0.5, 0.2)], g=0.5)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["attack"] = {"name": "label_flip", "fraction": 0.2}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        run = write_run(root / f"c{seed}", seed, FEDAVG, [(0.3, 0.5, 0.2)], g=0.5)
        config["attack"] = {"name": "gaussian", "fraction": 0.4}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    write_report([root], tmp_path / "out")
    assert "robustness.png" in saved, sorted(saved)
    assert any(name.startswith("accuracy_rounds") for name in saved), sorted(saved)
    for fig in saved.values():
        check_layout(fig)
    robustness = _panels(saved["robustness.png"])
    assert len(robustness) == 2  # one panel per attack, one x range


def test_the_leaderboard_figure_reads_cleanly_and_names_its_setting_in_words(
    saved: dict[str, Figure], tmp_path: Path
) -> None:
    setting = tmp_path / "cpu" / "mnist_path"
    config = {
        "dataset": {"name": "mnist"},
        "partition": {"name": "pathological", "classes_per_client": 2},
        "num_clients": 20,
    }
    run = setting / "final" / "fedavg" / "seed_1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    title = setting_in_words(setting)
    assert title == "MNIST, each client holds 2 classes, 20 clients"
    assert setting_in_words(tmp_path / "cpu" / "empty") == "empty"  # nothing recorded
    rows = [("FedAvg", [0.91, 0.93, 0.92], 1), ("Local", [0.81, 0.85, 0.8], 2)]
    figures.leaderboard(rows, tmp_path / "leaderboard_mnist_path.png", title)
    fig = saved["leaderboard_mnist_path.png"]
    check_layout(fig)
    assert fig.get_suptitle().startswith("MNIST, each client holds 2 classes, 20 clients: ")


def test_the_leaderboard_figure_of_several_studies_marks_a_failed_run_at_the_edge(
    saved: dict[str, Figure], tmp_path: Path
) -> None:
    """A failed run is in the mean at 0 but drawn as a cross at the axis' left edge, which
    starts below the completed runs and the means, not at 0."""
    rows = [("FedAvg", [0.91, 0.93, 0.92], 1), ("APPLE", [0.95, 0.96], 2)]
    figures.leaderboard(rows, tmp_path / "leaderboard.png", failed={"APPLE": 1}, by_mean=True)
    fig = saved["leaderboard.png"]
    check_layout(fig)
    (ax,) = fig.axes
    apple = (0 + 95 + 96) / 3  # its mean, with the failed run at 0
    assert ax.get_xlim() == pytest.approx((apple - 2, 98.0))
    crosses = [c for c in ax.collections if "failed run" in str(c.get_label())]
    assert [list(c.get_offsets()[:, 0]) for c in crosses] == [pytest.approx([apple - 2])]
    means = [bar.lines[0].get_xdata()[0] for bar in ax.containers]  # the errorbars
    assert means == pytest.approx([92.0, apple])  # best mean on top
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert "95% rank interval reaches 1" in labels and "one final run" in labels
    colours = [bar.lines[0].get_color() for bar in ax.containers]
    assert colours == ["tab:blue", "tab:gray"]  # FedAvg's interval reaches 1, APPLE's not
