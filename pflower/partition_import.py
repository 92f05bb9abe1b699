"""``pflower partition import pflib|leaf <folder> [overrides]``: turn a PFLlib or LEAF dataset
folder into a ``partition=from_file`` file that keeps each client's own train/test split."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from pflower.commands import HelpFormatter
from pflower.console import console, escape
from pflower.registry import ConfigError

IMPORT_HELP = """\
Write a partition=from_file file from a PFLlib or LEAF dataset folder, keeping each client's own
train and test samples (run it with split=file, which uses those tests instead of redrawing them).

  pflib <folder> dataset=<name>: PFLlib's train/<i>.npz and test/<i>.npz of the dataset named
        (e.g. dataset=mnist); every image is matched to its sample of that dataset.
  leaf  <folder> [dataset.*=...]: LEAF's train/*.json and test/*.json (dataset=leaf, FEMNIST
        by default); each user becomes a client with its own train and test samples.

It prints the run's overrides (partition=from_file partition.path=<out> split=file
num_clients=<K> and the dataset)."""


def partition_import(argv: Sequence[str]) -> int:
    """``pflower partition import <format> <path> [overrides]``: write a from_file partition."""
    parser = argparse.ArgumentParser(
        prog="pflower partition import", description=IMPORT_HELP, formatter_class=HelpFormatter
    )
    parser.add_argument("format", choices=("pflib", "leaf"), help="the folder's format")
    parser.add_argument("path", type=Path, help="the dataset folder")
    parser.add_argument("overrides", nargs="*", help="the dataset (pflib: e.g. dataset=mnist)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("partition_indices.json"),
        help="the file to write (default: partition_indices.json in this folder)",
    )
    args = parser.parse_args(list(argv))
    from pflower.datasets.base import DatasetNotFoundError
    from pflower.datasets.partitioners.from_file import import_folder
    from pflower.datasets.sources import CorruptDatasetError

    folder: Path = args.path.resolve()
    overrides = list(args.overrides)
    if args.format == "leaf":
        overrides = ["dataset=leaf", f"dataset.path={folder}", *overrides]
    try:
        from pflower.compose import compose_config
        from pflower.datasets.loaders import load_dataset
        from pflower.registry import name_and_options

        cfg = compose_config(overrides, check_scheme=False)
        dataset = load_dataset(*name_and_options(cfg.dataset))
        imported = import_folder(args.format, folder, dataset, args.out)
    except (ConfigError, DatasetNotFoundError, CorruptDatasetError) as error:
        console.print(f"[red]cannot import:[/] {escape(str(error))}")
        return 2
    out = args.out.resolve()
    trained = sum(len(share) for share in imported.trains)
    tested = sum(len(share) for share in imported.tests)
    console.print(
        f"{len(imported.trains)} clients, {trained} train and {tested} test samples -> {out}\n"
        f"run with: pflower {' '.join(overrides)} partition=from_file partition.path={out} "
        f"split=file num_clients={len(imported.trains)}"
    )
    return 0
