"""``train.device``: where models train and evaluate (auto, cpu, cuda).

On a machine without CUDA: ``cpu`` gives exactly the default run, ``auto`` resolves to the CPU, and
``cuda`` stops with a configuration error before any round (exit code 2 from the command line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pflower.compose import compose_config
from pflower.config import Device
from pflower.core.experiment import Experiment
from pflower.core.training import model_device, resolve_device
from pflower.registry import ConfigError
from tests.helpers import (
    comparable,
    tiny,
)
from tests.inprocess import run_inprocess

BASE = tiny(clients=3)
NO_CUDA = not torch.cuda.is_available()
needs_no_cuda = pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")


def test_device_is_a_choice_with_auto_as_default() -> None:
    assert compose_config(BASE).train.device == Device.auto
    with pytest.raises(ConfigError):
        compose_config([*BASE, "train.device=tpu"])


def test_resolution_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"train\.device=cuda"):
        resolve_device("cuda")


@needs_no_cuda
def test_auto_resolves_to_the_cpu_here() -> None:
    experiment = Experiment(compose_config(BASE))
    assert experiment.device == torch.device("cpu")
    assert model_device(experiment.new_model()) == torch.device("cpu")


@needs_no_cuda
def test_cpu_is_identical_to_the_default(tmp_path: Path) -> None:
    default, _ = run_inprocess(BASE, tmp_path / "default")
    cpu, _ = run_inprocess([*BASE, "train.device=cpu"], tmp_path / "cpu")
    assert comparable(default) == comparable(cpu)
    train_losses = [
        [r.get("train_loss") for r in rows if r["stage"] == "L2"] for rows in (default, cpu)
    ]
    assert train_losses[0] == train_losses[1]


@needs_no_cuda
def test_cuda_without_cuda_fails_in_process_before_any_round(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.device=cuda.*no CUDA device"):
        run_inprocess([*BASE, "train.device=cuda"], tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
@needs_no_cuda
def test_cuda_without_cuda_exits_2_from_the_command_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            *BASE,
            "train.device=cuda",
            f"output_dir={run_dir}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = " ".join((result.stdout + result.stderr).split())
    assert "configuration error" in output and "train.device=cuda" in output
    assert "no CUDA device" in output
    assert not (run_dir / "metrics.jsonl").exists()  # no round ran
