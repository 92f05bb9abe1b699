"""Opt-in speed options of the shared loops: ``train.amp``, ``train.channels_last``,
``train.data_on_device``; and the import of torch's first optimizer step.

The defaults leave every result unchanged; each option, when asked for, is seen inside the model's
forward pass (the autocast dtype, the input's memory format) or in where the batches live.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from pflower.compose import compose_config
from pflower.config import Amp
from pflower.core import training
from pflower.core.training import TrainSettings, evaluate, on_device, train
from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError
from tests.helpers import comparable, tiny
from tests.inprocess import run_inprocess

BASE = tiny(clients=3)
SETTINGS = TrainSettings(epochs=1, steps=None, batch_size=8, optimizer="sgd", lr=0.1, momentum=0.9)


class Probe(nn.Module):
    """A tiny CNN that records, at every forward pass, the dtype its convolution computes in
    and whether its input is in channels-last memory format."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4 * 6 * 6, 3)
        self.seen: list[tuple[torch.dtype, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.conv(x)
        self.seen.append((hidden.dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return self.head(torch.relu(hidden).flatten(1))


def _data(n: int = 32) -> ImageSplit:
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(n, 3, 8, 8, generator=generator)
    return ImageSplit(images, torch.randint(0, 3, (n,), generator=generator))


def _train(settings: TrainSettings) -> tuple[Probe, float]:
    torch.manual_seed(0)
    model = Probe()
    loss = train(model, _data(), lambda x: x * 2.0, settings, torch.Generator().manual_seed(1))
    return model, loss


def test_options_default_off_and_are_validated() -> None:
    cfg = compose_config(BASE)
    assert (cfg.train.amp, cfg.train.channels_last, cfg.train.data_on_device) == (
        Amp.off,
        False,
        False,
    )
    chosen = compose_config([*BASE, "train.amp=bf16", "train.channels_last=true"])
    assert (chosen.train.amp, chosen.train.channels_last) == (Amp.bf16, True)
    with pytest.raises(ConfigError):
        compose_config([*BASE, "train.amp=fp8"])


def test_defaults_compute_in_float32_and_contiguous_format() -> None:
    model, _ = _train(SETTINGS)
    assert set(model.seen) == {(torch.float32, False)}


@pytest.mark.parametrize(("amp", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_amp_runs_the_forward_pass_under_autocast(amp: str, dtype: torch.dtype) -> None:
    model, loss = _train(dataclasses.replace(SETTINGS, amp=amp))
    assert {seen[0] for seen in model.seen} == {dtype}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert loss == loss  # finite, not NaN
    model.seen.clear()
    evaluate(model, _data(), lambda x: x, 16, dataclasses.replace(SETTINGS, amp=amp))
    assert {seen[0] for seen in model.seen} == {dtype}


def test_channels_last_converts_the_model_and_every_batch() -> None:
    model, _ = _train(dataclasses.replace(SETTINGS, channels_last=True))
    assert {seen[1] for seen in model.seen} == {True}
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_options_that_change_nothing_on_the_cpu_keep_results_bit_identical() -> None:
    reference, loss = _train(SETTINGS)
    same, same_loss = _train(dataclasses.replace(SETTINGS, data_on_device=True))
    assert same_loss == loss
    for a, b in zip(reference.state_dict().values(), same.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_data_on_device_copies_once_where_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _data()
    assert on_device(data, torch.device("cpu")) is data
    meta = on_device(data, torch.device("meta"))  # a device other than the CPU: one copy
    assert meta.images.device.type == "meta" and meta.labels.device.type == "meta"
    # on a GPU without room for it (half its free memory), the data stay on the host
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (data.images.nbytes, 2**30))
    assert on_device(data, torch.device("cuda")) is data


def test_a_run_with_default_options_equals_one_without_the_keys(tmp_path: Path) -> None:
    default, _ = run_inprocess(BASE, tmp_path / "default")
    explicit, _ = run_inprocess(
        [*BASE, "train.amp=off", "train.channels_last=false", "train.data_on_device=true"],
        tmp_path / "explicit",
    )
    assert comparable(default) == comparable(explicit)
    assert [r.get("train_loss") for r in default] == [r.get("train_loss") for r in explicit]


@pytest.mark.slow
def test_import_first_step_modules_leaves_nothing_for_the_first_step() -> None:
    probe = (
        "import sys, torch\n"
        "from pflower.core.training import import_first_step_modules\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "import_first_step_modules()\n"
        "before = set(sys.modules)\n"
        "model = torch.nn.Linear(3, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
        "optimizer.zero_grad(set_to_none=True)\n"
        "model(torch.ones(4, 3)).sum().backward()\n"
        "optimizer.step()\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    assert output.stdout.strip() == "[]"
    assert training.import_first_step_modules.__doc__
