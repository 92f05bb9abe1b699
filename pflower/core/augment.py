"""Training-time image augmentation (``train.augment``): random rotation and random flips.

FedMPR (Göksu & Pugeault, Sec. V-C) trains with "random rotation, random flipping, and
normalization"; ``train.augment`` offers the first two to every algorithm alike. Each training
batch of stored images is augmented per sample before its preparation (normalization, a client's
input noise), so a rotation's empty corners are filled with 0 (black, the background of MNIST and
Fashion-MNIST) rather than with the normalized mean; with fixed input noise
(``partition.fixed_noise``) the stored images are already normalized, and the corners get the
dataset's mean. Evaluation never augments.

The random draws (one angle and one flip decision per sample) come from a ``torch.Generator``
seeded from the state of the loop's batch-order generator when the loop starts
([`augmenter`][pflower.core.augment.augmenter]), never from torch's global generator: two runs with
the same seed augment
the same samples the same way, and the batch order is the same with augmentation on or off. The
images are transformed with ``torchvision.transforms.v2.functional`` (``rotate``, nearest
interpolation as ``RandomRotation``'s default; ``horizontal_flip``, ``vertical_flip``),
imported on first use only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

Augment = Callable[[torch.Tensor], torch.Tensor]
"""Augments a batch of stored images (N, C, H, W); the identity when augmentation is off."""

_STREAM = 0x6175676D  # "augm": keeps the augmentation stream apart from any other seeded stream


@dataclass(frozen=True)
class Augmentation:
    """Per-sample random rotation and flips (the values of ``train.augment``).

    Attributes:
        rotation: each image is rotated by an angle drawn uniformly from
            [-rotation, rotation] degrees (0: no rotation).
        hflip: probability that an image is mirrored left-right.
        vflip: probability that an image is mirrored top-bottom.
    """

    rotation: float = 0.0
    hflip: float = 0.0
    vflip: float = 0.0

    @property
    def active(self) -> bool:
        """Whether this augmentation changes anything."""
        return self.rotation > 0 or self.hflip > 0 or self.vflip > 0

    def apply(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``images`` (N, C, H, W, any dtype, any device) augmented per sample with draws from
        ``generator`` (a CPU generator); shape, dtype and device are kept.

        The draws per batch are, in this order, N uniforms for the flips left-right, N for the
        flips top-bottom and N for the angles, all three whichever are in use; so each batch's
        draws depend only on the generator's seed and the batch's position in the loop.
        """
        # imported here: torchvision.transforms imports torch._dynamo (about 2 s), which a process
        # that never augments should not pay (see training.import_first_step_modules)
        from torchvision.transforms.v2 import functional as F

        count = images.shape[0]
        hflip = torch.rand(count, generator=generator) < self.hflip
        vflip = torch.rand(count, generator=generator) < self.vflip
        uniform = torch.rand(count, generator=generator, dtype=torch.float64)
        angles = (uniform * 2 - 1) * self.rotation
        shape = (count,) + (1,) * (images.dim() - 1)
        if self.hflip > 0:
            chosen = hflip.to(images.device).view(shape)
            images = torch.where(chosen, F.horizontal_flip(images), images)
        if self.vflip > 0:
            chosen = vflip.to(images.device).view(shape)
            images = torch.where(chosen, F.vertical_flip(images), images)
        if self.rotation > 0:
            images = torch.stack(
                [F.rotate(image, float(angle)) for image, angle in zip(images, angles, strict=True)]
            )
        return images


def augmentation_generator(batch_order: torch.Generator) -> torch.Generator:
    """A generator for the augmentation of one training loop, seeded from the current state of
    the loop's batch-order generator ``batch_order`` (which this does not advance): the same
    client, round and seed give the same draws, and two loops of one round that share a
    batch-order generator get different ones."""
    digest = hashlib.blake2b(batch_order.get_state().numpy().tobytes(), digest_size=8).digest()
    seed = np.random.SeedSequence([int.from_bytes(digest, "little"), _STREAM]).generate_state(1)
    return torch.Generator().manual_seed(int(seed[0]))


def augmenter(augmentation: Augmentation | None, batch_order: torch.Generator) -> Augment:
    """The augmentation of one training loop whose data order ``batch_order`` draws: the
    identity when ``augmentation`` is None or inactive (the batches are then exactly those of a
    run without the option), else [`Augmentation.apply`][pflower.core.augment.Augmentation.apply]
    with draws from
    [`augmentation_generator`][pflower.core.augment.augmentation_generator]. Call it before the loop
    draws its first batch."""
    if augmentation is None or not augmentation.active:
        return _identity
    generator = augmentation_generator(batch_order)

    def augment(images: torch.Tensor) -> torch.Tensor:
        return augmentation.apply(images, generator)

    return augment


def _identity(images: torch.Tensor) -> torch.Tensor:
    return images
