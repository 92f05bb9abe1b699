"""What makes a round cheaper computes the same numbers (issue 59: trials as fast as their
objective allows).

- the shared loop (``index_select`` batches, multi-tensor optimizer steps) trains exactly as a
  plain PyTorch loop does: ``images[index]``, one tensor at a time; and a tiny run gives the
  same rows with either;
- a client finds its experiment by the identity of its read-only configuration, without
  rendering the configuration again;
- a fork worker runs without torch's NVML-based CUDA check, which the driver keeps.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from pflower.compose import compose_config
from pflower.core import client as client_module
from pflower.core.experiment import Experiment
from pflower.core.training import (
    Prepare,
    Regularizer,
    TrainSettings,
    batch_indices,
    train,
)
from pflower.datasets.base import ImageSplit
from pflower.runtime.forkbackend import NVML_CUDA_CHECK, _serve
from tests.helpers import comparable, tiny
from tests.inprocess import run_inprocess

ADAM = TrainSettings(epochs=2, steps=None, batch_size=7, optimizer="adam", lr=0.01)
SGD = TrainSettings(
    epochs=2, steps=None, batch_size=7, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3
)


def plain_train(
    model: nn.Module,
    data: ImageSplit,
    prepare: Prepare,
    settings: TrainSettings,
    generator: torch.Generator,
    regularizer: Regularizer | None = None,
    after_step: Any = None,
) -> float:
    """The shared loop as a plain PyTorch loop: ``images[index]`` batches, torch's optimizer
    with one tensor at a time (its CPU default), the loss summed in Python floats."""
    model.train()
    optimizer: torch.optim.Optimizer
    if settings.optimizer == "adam":
        optimizer = torch.optim.Adam(
            model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, foreach=False
        )
    else:
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=settings.lr,
            momentum=settings.momentum,
            weight_decay=settings.weight_decay,
            foreach=False,
        )
    total, batches = 0.0, 0
    for index in batch_indices(len(data), settings.batch_size, generator, settings.epochs):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(prepare(data.images[index])), data.labels[index])
        total += float(loss.detach())
        if regularizer is not None:
            loss = loss + regularizer(model)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(model)
        batches += 1
    return total / max(batches, 1)


def _mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 5))


def _normalize(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255.0 - 0.3) / 0.4


@pytest.mark.parametrize("settings", [ADAM, SGD], ids=["adam", "sgd-momentum-decay"])
def test_the_shared_loop_trains_as_a_plain_loop_bit_for_bit(settings: TrainSettings) -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (31, 3, 4, 4), dtype=torch.uint8, generator=generator)
    data = ImageSplit(images, torch.randint(0, 5, (31,), generator=generator))  # 31 = 4 x 7 + 3
    fast, plain = _mlp(), _mlp()
    fast_loss = train(fast, data, _normalize, settings, torch.Generator().manual_seed(1))
    plain_loss = plain_train(plain, data, _normalize, settings, torch.Generator().manual_seed(1))
    assert fast_loss == plain_loss
    for a, b in zip(fast.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    unmoved = _mlp()
    train(unmoved, data, _normalize, dataclasses.replace(settings, epochs=0), torch.Generator())
    assert not torch.equal(unmoved.state_dict()["1.weight"], fast.state_dict()["1.weight"])


def test_a_tiny_run_gives_the_rows_of_a_plain_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = tiny("train.optimizer=adam", "train.lr=0.01", clients=2, rounds=1, epochs=2)
    fast, _ = run_inprocess(overrides, tmp_path / "fast")
    monkeypatch.setattr(client_module, "train", plain_train)
    plain, _ = run_inprocess(overrides, tmp_path / "plain")
    assert comparable(fast) == comparable(plain)
    assert [r.get("train_loss") for r in fast] == [r.get("train_loss") for r in plain]


def test_a_read_only_configuration_finds_its_experiment_without_rendering_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = compose_config(tiny("seed=91"))
    writable = Experiment.of(cfg)
    assert Experiment.of(compose_config(tiny("seed=91"))) is writable, "keyed by the YAML"
    OmegaConf.set_readonly(cfg, True)
    experiment = Experiment.of(cfg)  # the same YAML: the same experiment, now also by identity
    assert experiment is writable

    def render(*_: object, **__: object) -> str:
        raise AssertionError("the configuration was rendered again")

    monkeypatch.setattr(OmegaConf, "to_yaml", render)
    assert Experiment.of(cfg) is experiment
    with pytest.raises(AssertionError, match="rendered again"):
        Experiment.of(compose_config(tiny("seed=91")))  # a writable copy is still keyed by YAML


def _nvml_check(message: object, context: object) -> str | None:
    """A ClientApp stand-in that answers with its process's NVML-check setting."""
    return os.environ.get(NVML_CUDA_CHECK)


def test_a_fork_worker_runs_without_the_drivers_nvml_cuda_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver checks CUDA through NVML so that its workers can use CUDA; a worker forks
    nothing, and torch would ask NVML at every optimizer step."""
    monkeypatch.setenv(NVML_CUDA_CHECK, "1")
    context = multiprocessing.get_context("fork")
    driver_end, worker_end = context.Pipe()
    worker = context.Process(target=_serve, args=(_nvml_check, worker_end, os.getpid()))
    worker.start()
    worker_end.close()
    try:
        driver_end.send(("message", "context"))
        assert driver_end.recv() == (None, "context")
    finally:
        driver_end.send(None)
        worker.join(timeout=30)
    assert os.environ[NVML_CUDA_CHECK] == "1", "the driver keeps it"
