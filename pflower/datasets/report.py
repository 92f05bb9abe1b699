"""What a partition looks like: per-client class histograms as a table, a heatmap, CSV and JSON.

pflower reports every partition it builds, so that a data environment can be checked by eye.
[`report_partition`][pflower.datasets.report.report_partition] does all of it for the ``pflower
partition`` command; the pieces are
usable alone (e.g. [`class_histogram`][pflower.datasets.report.class_histogram] in tests and
notebooks). The heatmap follows FLIU's
Figs. 2-4: clients by classes, sample counts as colour (and as numbers when the grid is small
enough to read them).
"""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from pflower.datasets.federation import Federation

Share = Literal["train", "test", "val"]

HEATMAP_FILE = "partition_heatmap.png"
HISTOGRAM_FILE = "partition_histogram.csv"
SUMMARY_FILE = "partition.json"

_MAX_CLASS_COLUMNS = 20
"""Above this many classes the table lists only how many classes each client holds."""
_MAX_ANNOTATED_CELLS = 400
"""Heatmaps with more cells than this are not annotated with counts (unreadable)."""


def num_classes(federation: Federation) -> int:
    """Classes shown: the dataset's count, widened if a label lies beyond it."""
    labels = federation.pool.labels
    return max(federation.dataset.num_classes, int(labels.max()) + 1 if len(labels) else 0)


def class_histogram(federation: Federation, share: Share = "train") -> np.ndarray:
    """``clients x classes`` sample counts of every client's ``share`` (train, test or val)."""
    labels = federation.pool.labels.numpy()
    width = num_classes(federation)
    return np.stack(
        [
            np.bincount(labels[getattr(client, share)], minlength=width)
            for client in federation.clients
        ]
    ).astype(np.int64)


def render_partition_table(federation: Federation) -> Table:
    """One row per client: share sizes, classes held, noise std if any, train class counts."""
    train = class_histogram(federation, "train")
    show_classes = train.shape[1] <= _MAX_CLASS_COLUMNS
    table = Table(
        title=f"{federation.dataset.name}: {federation.num_clients} clients, "
        f"global test {len(federation.global_test)}",
        caption="class columns: training samples per class" if show_classes else None,
    )
    for header in ("client", "train", "test", "val", "classes"):
        table.add_column(header, justify="right")
    noise = federation.input_noise
    if noise is not None:
        table.add_column("noise std", justify="right")
    if show_classes:
        for label in range(train.shape[1]):
            table.add_column(str(label), justify="right")
    for pid, client in enumerate(federation.clients):
        cells = [str(pid), str(len(client.train)), str(len(client.test)), str(len(client.val))]
        cells.append(str(int((train[pid] > 0).sum())))
        if noise is not None:
            cells.append(f"{noise.std[pid]:.4g}")
        if show_classes:
            cells += [str(count) if count else "." for count in train[pid]]
        table.add_row(*cells)
    return table


def save_heatmap(
    federation: Federation, path: str | Path, share: Share = "train", title: str | None = None
) -> Path:
    """Write a PNG heatmap of ``clients x classes`` counts of ``share`` to ``path``.

    ``title`` names what was partitioned (default: the dataset's name).
    """
    subject = title or federation.dataset.name
    return plot_counts(
        class_histogram(federation, share),
        path,
        title=f"{subject}: {share} samples per client and class",
        colour_label=f"{share} samples",
    )


def plot_counts(
    counts: np.ndarray,
    path: str | Path,
    title: str,
    colour_label: str = "samples",
    column_label: str = "class",
) -> Path:
    """Write ``counts`` (``clients x columns``) as a PNG heatmap, with the counts written in the
    cells when the grid is small enough to read them; rows are clients."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clients, columns = counts.shape
    figure = Figure(figsize=(min(3.0 + 0.5 * columns, 14.0), min(1.8 + 0.3 * clients, 30.0)))
    axes = figure.add_subplot()
    image = axes.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest", vmin=0)
    figure.colorbar(image, ax=axes, label=colour_label)
    axes.set_xlabel(column_label)
    axes.set_ylabel("client")
    axes.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=9)
    axes.set_xticks(range(columns) if columns <= 50 else [])
    axes.set_yticks(range(clients) if clients <= 50 else [])
    if clients * columns <= _MAX_ANNOTATED_CELLS:
        threshold = counts.max() / 2 if counts.size else 0
        for (row, col), count in np.ndenumerate(counts):
            if count:
                colour = "white" if count > threshold else "black"
                axes.text(col, row, str(count), ha="center", va="center", fontsize=7, color=colour)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def report_partition(
    federation: Federation,
    out_dir: str | Path,
    console: Console | None = None,
    title: str | None = None,
) -> Path:
    """Print the table; write the heatmap, the histogram CSV and a JSON summary to ``out_dir``.

    Returns ``out_dir``, which then holds `HEATMAP_FILE`, `HISTOGRAM_FILE` (rows
    ``client, share, total, class_0 ...`` for the train, test and, if any, val shares) and
    `SUMMARY_FILE` (sizes, histograms, global test size, noise std). ``title`` heads the
    heatmap (default: the dataset's name).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (console or Console()).print(render_partition_table(federation))
    save_heatmap(federation, out_dir / HEATMAP_FILE, title=title)
    shares: list[Share] = ["train", "test"]
    if any(len(client.val) for client in federation.clients):
        shares.append("val")
    histograms = {share: class_histogram(federation, share) for share in shares}
    with (out_dir / HISTOGRAM_FILE).open("w", newline="") as stream:
        writer = csv.writer(stream)
        width = num_classes(federation)
        writer.writerow(["client", "share", "total", *(f"class_{c}" for c in range(width))])
        for share, counts in histograms.items():
            for pid, row in enumerate(counts):
                writer.writerow([pid, share, int(row.sum()), *row.tolist()])
    summary = {
        "dataset": federation.dataset.name,
        "num_clients": federation.num_clients,
        "num_classes": num_classes(federation),
        "global_test_size": len(federation.global_test),
        "sizes": {share: counts.sum(axis=1).tolist() for share, counts in histograms.items()},
        "histograms": {share: counts.tolist() for share, counts in histograms.items()},
        "noise_std": None if federation.input_noise is None else list(federation.input_noise.std),
    }
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return out_dir
