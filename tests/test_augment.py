"""Training-time augmentation (``train.augment``): random rotation and flips of training batches.

Off by default (results unchanged); when on, every training batch of every loop is augmented,
deterministically in the run's seed, and no evaluation batch is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from torch import nn
from torchvision.transforms.v2 import functional as F

from pflower.compose import compose_config
from pflower.core.augment import Augmentation, augmentation_generator, augmenter
from pflower.core.experiment import Experiment
from pflower.core.training import TrainSettings, train
from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError
from tests.helpers import comparable, tiny
from tests.inprocess import run_inprocess

BASE = tiny(clients=3)
AUGMENTED = [*BASE, "train.augment.rotation=30", "train.augment.hflip=0.5"]
SETTINGS = TrainSettings(epochs=2, steps=None, batch_size=8, optimizer="sgd", lr=0.1)


def _images(n: int = 16) -> torch.Tensor:
    """Stored images (uint8, N x 1 x 8 x 8) with no symmetry."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 1, 8, 8), generator=generator, dtype=torch.uint8)


def test_the_option_is_off_by_default_and_reaches_the_train_settings() -> None:
    default = Experiment(compose_config(BASE)).train_settings(1).augment
    assert default is not None and not default.active
    chosen = Experiment(compose_config(AUGMENTED)).train_settings(1).augment
    assert chosen == Augmentation(rotation=30.0, hflip=0.5, vflip=0.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.augment.rotation=-5", "train.augment.rotation must be in [0, 180]"),
        ("train.augment.rotation=200", "train.augment.rotation must be in [0, 180]"),
        ("train.augment.hflip=1.5", "train.augment.hflip must be a probability"),
        ("train.augment.vflip=-0.1", "train.augment.vflip must be a probability"),
    ],
)
def test_bad_values_are_refused_while_composing(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        compose_config([*BASE, override])


def test_flips_with_probability_one_mirror_every_image() -> None:
    images = _images()
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(Augmentation(hflip=1.0).apply(images, generator), images.flip(-1))
    assert torch.equal(Augmentation(vflip=1.0).apply(images, generator), images.flip(-2))
    both = Augmentation(hflip=1.0, vflip=1.0).apply(images, generator)
    assert torch.equal(both, images.flip(-1).flip(-2))


def test_flips_are_per_sample() -> None:
    images = _images(64)
    out = Augmentation(hflip=0.5).apply(images, torch.Generator().manual_seed(0))
    mirrored = [torch.equal(o, i.flip(-1)) for o, i in zip(out, images, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, images, strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert 0 < sum(mirrored) < len(images)


def test_rotation_changes_a_batch_and_keeps_shape_dtype_and_device() -> None:
    images = _images()
    for stored in (images, images.float() / 255):
        out = Augmentation(rotation=45.0).apply(stored, torch.Generator().manual_seed(0))
        assert (out.shape, out.dtype, out.device) == (stored.shape, stored.dtype, stored.device)
        assert not torch.equal(out, stored)
        changed = [not torch.equal(o, s) for o, s in zip(out, stored, strict=True)]
        assert sum(changed) > len(stored) // 2  # angles drawn per sample


def test_rotation_rotates_each_image_by_its_drawn_angle() -> None:
    """The documented draws: N flip uniforms left-right, N top-bottom, then N angle uniforms."""
    images = _images()
    out = Augmentation(rotation=90.0).apply(images, torch.Generator().manual_seed(5))
    replay = torch.Generator().manual_seed(5)
    torch.rand(2 * len(images), generator=replay)
    angles = (torch.rand(len(images), generator=replay, dtype=torch.float64) * 2 - 1) * 90.0
    for image, angle, rotated in zip(images, angles, out, strict=True):
        assert torch.equal(rotated, F.rotate(image, float(angle)))
    quarter = F.rotate(images[:1], 90.0)  # torchvision's rotate: counter-clockwise
    assert torch.equal(quarter, images[:1].rot90(1, dims=(-2, -1)))


def test_inactive_augmentation_is_the_identity_and_never_advances_the_batch_order() -> None:
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    images = _images()
    assert augmenter(None, generator)(images) is images
    assert augmenter(Augmentation(), generator)(images) is images
    augmenter(Augmentation(rotation=10.0), generator)(images)
    assert torch.equal(generator.get_state(), state)


def test_the_draws_follow_the_batch_order_generator() -> None:
    def draws(seed: int) -> torch.Tensor:
        return torch.rand(4, generator=augmentation_generator(torch.Generator().manual_seed(seed)))

    assert torch.equal(draws(1), draws(1))
    assert not torch.equal(draws(1), draws(2))
    advanced = torch.Generator().manual_seed(1)
    torch.rand(1, generator=advanced)  # a second loop of the round on the same generator
    other = torch.rand(4, generator=augmentation_generator(advanced))
    assert not torch.equal(draws(1), other)


def _trained(settings: TrainSettings) -> tuple[list[torch.Tensor], float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    data = ImageSplit(_images(32), torch.arange(32) % 3)
    loss = train(model, data, lambda x: x.float() / 255, settings, torch.Generator().manual_seed(1))
    return [p.detach().clone() for p in model.parameters()], loss


def test_the_shared_loop_augments_deterministically() -> None:
    plain, plain_loss = _trained(SETTINGS)
    off, off_loss = _trained(dataclasses.replace(SETTINGS, augment=Augmentation()))
    assert off_loss == plain_loss and all(map(torch.equal, off, plain))
    on = dataclasses.replace(SETTINGS, augment=Augmentation(rotation=30.0, vflip=0.5))
    first, first_loss = _trained(on)
    second, second_loss = _trained(on)
    assert first_loss == second_loss and all(map(torch.equal, first, second))
    assert first_loss != plain_loss


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of every batch :meth:`Augmentation.apply` augments."""
    sizes: list[int] = []
    original = Augmentation.apply

    def apply(self: Augmentation, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        sizes.append(len(images))
        return original(self, images, generator)

    monkeypatch.setattr(Augmentation, "apply", apply)
    return sizes


def _train_samples(cfg: DictConfig) -> int:
    federation = Experiment(cfg).federation
    return sum(len(federation.client_train(i)) for i in range(federation.num_clients))


@pytest.mark.parametrize("strategy", ["fedavg", "fedrod", "perfedavg"])
def test_runs_augment_exactly_the_training_batches_and_repeat(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sample of every local epoch is augmented once (all clients train in each of the 2
    rounds, 1 epoch each), no evaluation batch is; two runs with one seed give the same rows."""
    overrides = [*AUGMENTED, f"strategy={strategy}"]
    sizes = _spy(monkeypatch)
    first, _ = run_inprocess(overrides, tmp_path / "first")
    assert sum(sizes) == 2 * _train_samples(compose_config(overrides))
    second, _ = run_inprocess(overrides, tmp_path / "second")
    assert comparable(first) == comparable(second)
    if strategy == "fedavg":
        plain, _ = run_inprocess([*BASE, f"strategy={strategy}"], tmp_path / "plain")
        assert comparable(plain) != comparable(first)
