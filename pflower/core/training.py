"""The local training and evaluation loops every algorithm shares.

Batches are drawn by indexing in-memory tensors (no per-sample ``Dataset.__getitem__``, no
DataLoader workers), so a client's round costs about what a bare PyTorch loop over the same batches
costs. Algorithms change the loop only through a loss term (``regularizer``) or a hook after each
optimizer step (``after_step``).

Models run on the device of their parameters (``train.device``, :func:`resolve_device`): the loops
prepare each batch on the CPU, where the data live, and move it to the model's device. Weights
cross the wire as numpy arrays on the CPU (:func:`get_weights`, :func:`set_weights`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from flwr.common import NDArrays
from torch import nn

from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError

Prepare = Callable[[torch.Tensor], torch.Tensor]
"""Turns a batch of stored images into model input (normalization, per-client feature shift)."""

Regularizer = Callable[[nn.Module], torch.Tensor]
"""An extra loss term of the model's parameters (e.g. FedProx's proximal term)."""


@dataclass(frozen=True)
class TrainSettings:
    """How one client trains in one round (from ``cfg.train`` and the round number)."""

    epochs: int
    steps: int | None
    batch_size: int
    optimizer: str
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def make_optimizer(self, parameters: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """A fresh optimizer (its state is reset every round, as in the papers)."""
        if self.optimizer == "adam":
            return torch.optim.Adam(parameters, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(
            parameters, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )


@dataclass(frozen=True)
class EvalResult:
    """Mean loss and accuracy of a model on a split."""

    loss: float
    accuracy: float
    num_examples: int


def resolve_device(choice: str) -> torch.device:
    """The device ``train.device`` names in this process: ``cpu``; ``cuda`` (an error if this
    process sees no CUDA device); ``auto``: CUDA when this process sees one, else the CPU.

    Raises:
        ConfigError: ``cuda`` was asked for and ``torch.cuda.is_available()`` is False.
    """
    if choice == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        raise ConfigError(
            "train.device=cuda, but no CUDA device is available to this process "
            "(torch.cuda.is_available() is False: no GPU, no CUDA build of torch, or "
            "CUDA_VISIBLE_DEVICES hides it). Use train.device=auto (CUDA where present) or "
            "train.device=cpu."
        )
    if choice not in ("auto", "cuda"):
        raise ConfigError(f"train.device must be auto, cpu or cuda, got {choice!r}")
    return torch.device("cuda" if available else "cpu")


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def get_weights(model: nn.Module) -> NDArrays:
    """All parameters and buffers of ``model`` as numpy arrays, in ``state_dict`` order."""
    return [tensor.detach().cpu().numpy().copy() for tensor in model.state_dict().values()]


def payload_bytes(arrays: NDArrays) -> int:
    """Bytes of the arrays of one message (their ``nbytes``; serialization headers and configs
    are not counted): the per-client communication metric every algorithm reports."""
    return int(sum(np.asarray(array).nbytes for array in arrays))


def trainable_mask(model: nn.Module) -> list[bool]:
    """Per ``state_dict`` entry of ``model``: whether it is a trainable ``nn.Parameter``."""
    parameters = {name for name, param in model.named_parameters() if param.requires_grad}
    return [name in parameters for name in model.state_dict()]


def set_weights(model: nn.Module, weights: NDArrays) -> None:
    """Load ``weights`` (in ``state_dict`` order) into ``model``, checking count and shapes."""
    state = model.state_dict()
    if len(weights) != len(state):
        raise ValueError(f"expected {len(state)} arrays for this model, got {len(weights)}")
    new_state = {}
    for (name, current), array in zip(state.items(), weights, strict=True):
        if tuple(array.shape) != tuple(current.shape):
            raise ValueError(
                f"array for '{name}' has shape {tuple(array.shape)}, "
                f"the model expects {tuple(current.shape)}"
            )
        new_state[name] = torch.from_numpy(np.asarray(array)).to(current.dtype)
    model.load_state_dict(new_state, strict=True)


def batch_indices(
    num_samples: int,
    batch_size: int,
    generator: torch.Generator,
    epochs: int,
    steps: int | None = None,
) -> Iterator[torch.Tensor]:
    """Shuffled mini-batch indices: ``epochs`` passes, or exactly ``steps`` batches if given.

    The last batch of a pass may be smaller (drop_last=False: tiny clients still train).
    """
    if num_samples == 0:
        return
    produced = 0
    passes = 0
    while (steps is not None and produced < steps) or (steps is None and passes < epochs):
        order = torch.randperm(num_samples, generator=generator)
        for start in range(0, num_samples, batch_size):
            if steps is not None and produced >= steps:
                return
            yield order[start : start + batch_size]
            produced += 1
        passes += 1


def train(
    model: nn.Module,
    data: ImageSplit,
    prepare: Prepare,
    settings: TrainSettings,
    generator: torch.Generator,
    regularizer: Regularizer | None = None,
    after_step: Callable[[nn.Module], None] | None = None,
) -> float:
    """Train ``model`` in place with cross-entropy; returns the mean training loss.

    Batches go to the model's device; the loss is summed there in float64 (the same sum as Python
    floats on the CPU) and read once, so a GPU is not synchronized every step.
    """
    model.train()
    device = model_device(model)
    optimizer = settings.make_optimizer(model.parameters())
    criterion = nn.CrossEntropyLoss()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    batches = 0
    for index in batch_indices(
        len(data), settings.batch_size, generator, settings.epochs, settings.steps
    ):
        optimizer.zero_grad(set_to_none=True)
        images = prepare(data.images[index]).to(device, non_blocking=True)
        labels = data.labels[index].to(device, non_blocking=True)
        loss = criterion(model(images), labels)
        total_loss += loss.detach().to(torch.float64)
        if regularizer is not None:
            loss = loss + regularizer(model)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(model)
        batches += 1
    return float(total_loss) / max(batches, 1)


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageSplit, prepare: Prepare, batch_size: int) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``data`` (eval mode, no gradients), on the
    model's device."""
    if len(data) == 0:
        return EvalResult(loss=float("nan"), accuracy=float("nan"), num_examples=0)
    model.eval()
    device = model_device(model)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(data), batch_size):
        images = prepare(data.images[start : start + batch_size]).to(device, non_blocking=True)
        logits = model(images)
        labels = data.labels[start : start + batch_size].to(device, non_blocking=True)
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(dim=1) == labels).sum())
    return EvalResult(
        loss=loss_sum / len(data), accuracy=correct / len(data), num_examples=len(data)
    )
