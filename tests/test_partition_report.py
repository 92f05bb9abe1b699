"""The partition report: histograms, the table, the PNG heatmap, the CSV/JSON files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch
from matplotlib.image import imread
from rich.console import Console

from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.federation import Federation, build_federation
from pflower.datasets.report import (
    HEATMAP_FILE,
    HISTOGRAM_FILE,
    SUMMARY_FILE,
    class_histogram,
    render_partition_table,
    report_partition,
    save_heatmap,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def federation(
    num_classes: int = 4, clients: int = 3, partition: dict | None = None, split: dict | None = None
) -> Federation:
    rng = np.random.default_rng(0)

    def part(n: int) -> ImageSplit:
        images = torch.from_numpy(rng.integers(0, 256, (n, 1, 2, 2), dtype=np.uint8))
        return ImageSplit(images, torch.from_numpy(rng.integers(0, num_classes, n)))

    dataset = ImageDataset(
        "toy", part(40 * num_classes), part(10 * num_classes), num_classes, (0.5,), (0.5,)
    )
    return build_federation(
        dataset,
        clients,
        0,
        partition or {"name": "pathological", "classes_per_client": 2},
        split or {"val_fraction": 0.2},
    )


def render(table: object) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_histograms_sum_to_the_share_sizes() -> None:
    fed = federation()
    labels = fed.pool.labels.numpy()
    for share in ("train", "test", "val"):
        counts = class_histogram(fed, share)
        assert counts.shape == (3, 4)
        for pid, client in enumerate(fed.clients):
            indices = getattr(client, share)
            assert counts[pid].sum() == len(indices)
            np.testing.assert_array_equal(counts[pid], np.bincount(labels[indices], minlength=4))
    assert ((class_histogram(fed) > 0).sum(axis=1) == 2).all()  # two classes per client


def test_table_lists_sizes_and_class_counts() -> None:
    fed = federation()
    text = render(render_partition_table(fed))
    counts = class_histogram(fed)
    assert "toy: 3 clients" in text
    for pid, client in enumerate(fed.clients):
        row = next(line for line in text.splitlines() if line.strip("│ ").startswith(f"{pid} "))
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        assert cells[:5] == [
            str(pid),
            str(len(client.train)),
            str(len(client.test)),
            str(len(client.val)),
            "2",
        ]
        assert cells[5:] == [str(c) if c else "." for c in counts[pid]]


def test_table_shows_noise_and_drops_class_columns_for_many_classes() -> None:
    noisy = federation(
        partition={"name": "quality_skew", "sigma": 0.3},
        split={"pool": "all", "test_fraction": 0.2},
    )
    text = render(render_partition_table(noisy))
    assert "noise std" in text and "0.1" in text and "0.2" in text
    wide = render(render_partition_table(federation(num_classes=30, partition={"name": "iid"})))
    assert "classes" in wide and "class columns" not in wide


def test_heatmap_is_a_valid_png(tmp_path: Path) -> None:
    path = save_heatmap(federation(), tmp_path / "sub" / "heatmap.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50
    many = federation(num_classes=30, clients=25, partition={"name": "iid"})
    assert save_heatmap(many, tmp_path / "many.png", share="test").stat().st_size > 0


def test_report_writes_table_png_csv_and_json(tmp_path: Path) -> None:
    fed = federation()
    console = Console(record=True, width=200)
    out = report_partition(fed, tmp_path / "report", console)
    assert out == tmp_path / "report"
    assert "toy: 3 clients" in console.export_text()
    assert (out / HEATMAP_FILE).read_bytes()[:8] == PNG_SIGNATURE
    with (out / HISTOGRAM_FILE).open() as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 3 * 3  # train, test and val rows per client
    for row in rows:
        client = fed.clients[int(row["client"])]
        assert int(row["total"]) == len(getattr(client, row["share"]))
        assert sum(int(row[f"class_{c}"]) for c in range(4)) == int(row["total"])
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["num_clients"] == 3 and summary["num_classes"] == 4
    assert summary["sizes"]["train"] == [len(c.train) for c in fed.clients]
    assert summary["histograms"]["test"] == class_histogram(fed, "test").tolist()
    assert summary["global_test_size"] == len(fed.global_test)
    assert summary["noise_std"] is None
