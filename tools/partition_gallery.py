"""Draw the docs' partition gallery: a heatmap per registered scheme in docs/images/partitions.

    python tools/partition_gallery.py [--data ../shared/data] [--out docs/images/partitions]

Each scheme runs with its default options (the ``partition`` block's defaults, as
``partition=<scheme>`` composes them), 10 clients (3 for ``attribute_groups``) and seed 0 on
MNIST's official training labels (and test labels, for the schemes that draw clients' test
shares): the same call as a run's partition step
(:func:`~pflower.datasets.partitioners.base.partition_labels`). The heatmap shows each client's
training samples per class, as ``pflower partition`` does.

Two schemes split by per-sample group ids that MNIST does not have: ``feature_skew`` (writers)
and ``attribute_groups`` (CelebA attributes). For them the gallery makes the ids up (stated in
the figure's title): 20 writers of 3,000 consecutive samples, and 7 attributes drawn at random;
their heatmaps show clients by group, which is what those schemes decide. ``from_file`` reads
index lists written by ``pflower partition`` and is not drawn. The site's build
(``docs/hooks/pflower_docs.py``) fails when a registered scheme has no heatmap here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pflower.blocks import blocks
from pflower.compose import compose_config
from pflower.datasets.loaders import load_dataset
from pflower.datasets.partitioners.base import partition_labels
from pflower.datasets.report import plot_counts

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 10
SEED = 0
NOT_DRAWN = frozenset({"from_file"})
"""Schemes without a heatmap: ``from_file`` only replays index lists."""
FEWER_CLIENTS = {"attribute_groups": 3}
"""Schemes drawn with fewer clients: 7 attributes feed at most 7 clients round-robin."""
GROUPED = {"feature_skew": "writer", "attribute_groups": "attribute"}
"""Schemes that split by group ids, and what a group is."""


def synthetic_groups(scheme: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Made-up group ids for the grouped schemes (see the module docstring)."""
    if scheme == "feature_skew":
        return np.arange(size) // (size // 20)
    return rng.integers(0, 7, size=size)


def draw(scheme: str, labels: np.ndarray, test_labels: np.ndarray, out: Path) -> Path:
    """Partition MNIST's labels with ``scheme`` (default options) and write its heatmap."""
    block = dict(compose_config([f"partition={scheme}"]).partition)
    clients = FEWER_CLIENTS.get(scheme, CLIENTS)
    options = ", ".join(f"{k}={v}" for k, v in block.items() if k != "name") or "no options"
    title = f"partition={scheme} ({options}), {clients} clients, seed {SEED}"
    if scheme in GROUPED:
        kind = GROUPED[scheme]
        groups = synthetic_groups(scheme, len(labels), np.random.default_rng(SEED))
        partition = partition_labels(block, clients, SEED, labels, groups)
        width = int(groups.max()) + 1
        counts = np.stack([np.bincount(groups[s], minlength=width) for s in partition.train])
        return plot_counts(
            counts,
            out / f"{scheme}.png",
            title=f"{title}; synthetic {kind} ids: samples per client and {kind}",
            column_label=f"{kind} id (synthetic)",
        )
    partition = partition_labels(block, clients, SEED, labels, test_labels=test_labels)
    counts = np.stack([np.bincount(labels[share], minlength=10) for share in partition.train])
    if partition.noise_std is not None:
        stds = ", ".join(f"{std:.2g}" for std in partition.noise_std)
        title += f"; input noise std per client: {stds}"
    return plot_counts(
        counts,
        out / f"{scheme}.png",
        title=f"MNIST, {title}: training samples per client and class",
        colour_label="training samples",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "partitions"))
    args = parser.parse_args()
    mnist = load_dataset("mnist", {"root": args.data})
    labels = mnist.train.labels.numpy()
    test_labels = mnist.test.labels.numpy()
    for scheme in sorted(set(blocks("partition")) - NOT_DRAWN):
        print(draw(scheme, labels, test_labels, Path(args.out)))


if __name__ == "__main__":
    main()
