"""A missing or corrupt dataset, or a partition the data cannot satisfy, ends ``pflower ...`` like
a configuration error: the message, exit code 2, no traceback, and nothing started (no run
directory, no simulation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
TINY_RUN = ["dataset=mnist", "num_clients=3", "rounds=1"]


def pflower(arguments: list[str], data_root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m pflower <arguments>`` with ``PFLOWER_DATA=data_root``, in ``cwd``."""
    environment = {**os.environ, "PFLOWER_DATA": str(data_root)}
    return subprocess.run(
        [sys.executable, "-m", "pflower", *arguments],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def flat(text: str) -> str:
    """The output with line wrapping undone (the console wraps long messages)."""
    return " ".join(text.split())


def corrupt_mnist(root: Path) -> Path:
    """MNIST's four files where they belong, but not gzip IDX files (wrong MD5, wrong format)."""
    folder = root / "mnist"
    folder.mkdir(parents=True)
    for name in MNIST_FILES:
        (folder / name).write_bytes(b"not the MNIST file")
    return folder


def test_missing_dataset_ends_with_the_message_and_exit_code_2(tmp_path: Path) -> None:
    data_root = tmp_path / "data"
    data_root.mkdir()
    run_dir = tmp_path / "run"
    done = pflower([*TINY_RUN, f"output_dir={run_dir}"], data_root, tmp_path)
    output = flat(done.stdout + done.stderr)
    assert done.returncode == 2, output
    assert f"dataset error: Dataset 'mnist' was not found under {data_root}" in output
    assert str(data_root / "mnist" / "train-images-idx3-ubyte.gz") in output  # what is expected
    assert "PFLOWER_DATA" in output  # and how to point elsewhere
    assert "Traceback" not in done.stderr
    assert not run_dir.exists()


def test_corrupt_dataset_ends_with_the_message_and_exit_code_2(tmp_path: Path) -> None:
    folder = corrupt_mnist(tmp_path / "data")
    run_dir = tmp_path / "run"
    done = pflower([*TINY_RUN, f"output_dir={run_dir}"], tmp_path / "data", tmp_path)
    output = flat(done.stdout + done.stderr)
    assert done.returncode == 2, output
    assert "dataset error: Dataset file" in output
    assert "is unusable: MD5 is" in output
    assert str(folder) in output
    assert "Traceback" not in done.stderr
    assert not run_dir.exists()


@pytest.mark.slow
def test_partition_command_reports_a_corrupt_dataset_with_exit_code_2(tmp_path: Path) -> None:
    corrupt_mnist(tmp_path / "data")
    done = pflower(
        ["partition", *TINY_RUN, "dataset.verify=false", f"output_dir={tmp_path / 'out'}"],
        tmp_path / "data",
        tmp_path,
    )
    output = flat(done.stdout + done.stderr)
    assert done.returncode == 2, output
    assert "dataset error: Dataset file" in output
    assert "not a readable gzip file" in output  # without the MD5 check, the format check
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_partition_the_data_cannot_satisfy_ends_before_the_simulation(tmp_path: Path) -> None:
    """The command line builds the federation before Ray starts: a scheme option that only the
    data refutes (10 classes, 99 per client) fails there, not in the ServerApp."""
    run_dir = tmp_path / "run"
    arguments = ["dataset=digits", "num_clients=4", "partition.classes_per_client=99"]
    done = pflower([*arguments, f"output_dir={run_dir}"], tmp_path, tmp_path)
    output = flat(done.stdout + done.stderr)
    assert done.returncode == 2, output
    assert "configuration error: partition 'pathological' with 4 clients is impossible" in output
    assert "Traceback" not in done.stderr
    assert "Starting Flower ServerApp" not in output and not run_dir.exists()


@pytest.mark.slow
def test_a_cached_federation_spares_the_command_line_the_partition_schemes(
    tmp_path: Path,
) -> None:
    """The first run on a machine builds its federation (importing the schemes, which bring
    Flower Datasets); a run that finds it cached reads it and never imports them."""
    script = (
        "import sys; from pflower.cli import _preflight; from pflower.compose import "
        "compose_config, validate; cfg = compose_config(['dataset=digits'], check_scheme=False); "
        "_preflight(cfg, validate(cfg, check_scheme=False)); print('flwr_datasets' in sys.modules)"
    )
    environment = {**os.environ, "PFLOWER_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=environment, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert [run.stdout.strip() for run in runs] == ["True", "False"], runs[-1].stderr


@pytest.mark.parametrize("error", ["missing", "corrupt"])
def test_the_error_types_are_what_the_command_line_catches(error: str, tmp_path: Path) -> None:
    """The loaders raise exactly the two types that ``pflower`` turns into exit code 2."""
    from pflower.cli import CorruptDatasetError, DatasetNotFoundError
    from pflower.datasets.loaders import load_dataset

    if error == "corrupt":
        corrupt_mnist(tmp_path)
    expected = DatasetNotFoundError if error == "missing" else CorruptDatasetError
    with pytest.raises(expected):
        load_dataset("mnist", {"root": str(tmp_path)})
