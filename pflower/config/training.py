"""The ``train`` section: local training's optimizer, schedule, device and opt-in speed options."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pflower.config.base import require
from pflower.searchspace import tunable


class Optimizer(StrEnum):
    """Local optimizers (a fresh one every round, as in the papers)."""

    sgd = "sgd"
    adam = "adam"


class Amp(StrEnum):
    """Mixed precision of the shared training and evaluation loops (``train.amp``)."""

    off = "off"
    """float32 throughout (the default: results bit-identical to runs without the option)."""
    bf16 = "bf16"
    """``torch.autocast`` to bfloat16 (no loss scaling needed)."""
    fp16 = "fp16"
    """``torch.autocast`` to float16, with a ``GradScaler`` on CUDA."""


class Device(StrEnum):
    """Where models train and evaluate (``train.device``)."""

    auto = "auto"
    """CUDA in every process that sees a CUDA device, else the CPU."""
    cpu = "cpu"
    cuda = "cuda"
    """CUDA, required: a process that runs a model (the server's stage G, every client) and sees no
    CUDA device stops with a configuration error; a simulation checks before it starts."""


@dataclass
class AugmentConfig:
    """Training-time image augmentation (``train.augment.*``; off by default), per sample and
    only on training batches (never at evaluation), the same for every algorithm; see
    [`pflower.core.augment`][pflower.core.augment] and docs/guide/augmentation.md.

    Attributes:
        rotation: rotate each training image by an angle drawn uniformly from
            [-rotation, rotation] degrees (0: off; at most 180).
        hflip: probability of mirroring a training image left-right (0: off).
        vflip: probability of mirroring a training image top-bottom (0: off).
    """

    rotation: float = 0.0
    hflip: float = 0.0
    vflip: float = 0.0

    def __post_init__(self) -> None:
        require(
            0 <= self.rotation <= 180,
            f"train.augment.rotation must be in [0, 180] degrees, got {self.rotation!r}",
        )
        for name in ("hflip", "vflip"):
            value = getattr(self, name)
            require(
                0 <= value <= 1,
                f"train.augment.{name} must be a probability in [0, 1], got {value!r}",
            )


@dataclass
class TrainConfig:
    """Client-side local training, the same for every algorithm (``train.*``).

    Attributes:
        local_epochs: passes over the client's training split per round.
        local_steps: if set, exactly this many mini-batches per round instead of epochs.
        batch_size: mini-batch size.
        optimizer: ``sgd`` or ``adam``.
        lr: learning rate of round 1.
        lr_decay: per-round decay, ``lr_t = lr * lr_decay^(t-1)``.
        momentum: SGD momentum.
        weight_decay: L2 weight decay of the optimizer.
        threads: torch threads per client worker.
        device: ``auto`` (CUDA where present), ``cpu`` or ``cuda`` (see
            [`Device`][pflower.config.training.Device]).
        amp: mixed precision of the shared loops, ``off``, ``bf16`` or ``fp16``
            ([`Amp`][pflower.config.training.Amp]).
        channels_last: models and image batches in channels-last memory format (faster
            convolutions on GPUs with tensor cores).
        data_on_device: a client's data copied to the model's device once per message instead
            of every batch, when it fits in the device's free memory (a no-op on the CPU).
        augment: random rotation and flips of training images
            ([`AugmentConfig`][pflower.config.training.AugmentConfig]; off).
        ``amp``, ``channels_last`` and ``data_on_device`` are opt-in speed options of local
        training in ``pflower.core.training`` (algorithms with loops of their own ignore them;
        evaluation stays float32); with their defaults results are unchanged
        (docs/guide/speed.md).
    """

    local_epochs: int = tunable(
        2,
        choices=(1, 2, 5),
        source="FedAvg (McMahan et al., 2017), Sec. 3: E in {1, 5, 20}",
    )
    local_steps: int | None = None
    batch_size: int = 16
    optimizer: Optimizer = Optimizer.sgd
    lr: float = tunable(
        0.05,
        low=1e-3,
        high=0.3,
        log=True,
        source="FedAvg (McMahan et al., 2017), Sec. 3: lr on a log grid",
    )
    lr_decay: float = 1.0
    momentum: float = tunable(
        0.9, choices=(0.0, 0.5, 0.9), source="plain SGD, and the 0.5 / 0.9 of the papers' runs"
    )
    weight_decay: float = 0.0
    threads: int = 1
    device: Device = Device.auto
    amp: Amp = Amp.off
    channels_last: bool = False
    data_on_device: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        require(self.lr > 0, f"train.lr must be > 0, got {self.lr!r}")
        require(0 < self.lr_decay <= 1, f"train.lr_decay must be in (0, 1], got {self.lr_decay}")
        require(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        require(self.local_epochs >= 0, f"train.local_epochs must be >= 0, got {self.local_epochs}")
        require(
            self.local_steps is None or self.local_steps >= 1,
            f"train.local_steps must be null or >= 1, got {self.local_steps!r}",
        )
        require(self.momentum >= 0, f"train.momentum must be >= 0, got {self.momentum!r}")
        require(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        require(self.threads >= 1, f"train.threads must be >= 1, got {self.threads!r}")

    def lr_at(self, server_round: int) -> float:
        """The learning rate of round ``server_round`` (1-based)."""
        return self.lr * self.lr_decay ** (server_round - 1)
