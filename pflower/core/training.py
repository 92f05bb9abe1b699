"""The local training and evaluation loops every algorithm shares.

Batches are drawn by indexing in-memory tensors (no per-sample ``Dataset.__getitem__``, no
DataLoader workers; ``index_select``, which copies a batch of 100 MNIST images in a tenth of the
time ``images[index]`` takes), so a client's round costs about what a bare PyTorch loop over the
same batches costs. Algorithms that train with this loop change it only through a loss term
(``regularizer``) or a hook after each optimizer step (``after_step``); the others (pFedMe,
Per-FedAvg, FedRep's head and body epochs, ...) override ``local_train`` with a loop of their own.

Models run on the device of their parameters (``train.device``,
[`resolve_device`][pflower.core.training.resolve_device]): the loops
prepare each batch on the CPU, where the data live, and move it to the model's device. Weights
cross the wire as numpy arrays on the CPU ([`get_weights`][pflower.core.training.get_weights],
[`set_weights`][pflower.core.training.set_weights]).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from flwr.common import NDArrays
from torch import nn

from pflower.core.augment import Augmentation, augmenter
from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError

Prepare = Callable[[torch.Tensor], torch.Tensor]
"""Turns a batch of stored images into model input (normalization, per-client feature shift)."""

Regularizer = Callable[[nn.Module], torch.Tensor]
"""An extra loss term of the model's parameters (e.g. FedProx's proximal term)."""

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""``train.amp`` -> the dtype ``torch.autocast`` runs the model's forward pass in."""

DEVICE_MEMORY_SHARE = 0.5
"""``train.data_on_device`` copies a client's split to the device only if it takes at most this
share of the device's free memory (the rest is for the model, activations and other clients)."""

log = logging.getLogger(__name__)


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
    amp: str = "off"
    channels_last: bool = False
    data_on_device: bool = False
    augment: Augmentation | None = None
    """``train.augment``: random rotation and flips of training batches (None: off)."""

    def make_optimizer(self, parameters: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """A fresh optimizer (its state is reset every round, as in the papers).

        It updates all parameters with torch's multi-tensor (``foreach``) kernels, as torch
        does by default on a GPU: on the CPU, where torch defaults to one tensor at a time, they
        compute the same numbers (the same operations on each tensor:
        ``tests/test_round_speed.py``) in fewer Python calls, a fifth less time per optimizer step
        of a small model."""
        if self.optimizer == "adam":
            return torch.optim.Adam(
                parameters, lr=self.lr, weight_decay=self.weight_decay, foreach=True
            )
        return torch.optim.SGD(
            parameters,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            foreach=True,
        )


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[object]:
    """The mixed-precision context of ``train.amp`` on ``device``: nothing for ``off``, else
    ``torch.autocast`` to bfloat16 (``bf16``) or float16 (``fp16``)."""
    if amp == "off":
        return contextlib.nullcontext()
    if amp not in AMP_DTYPES:
        raise ConfigError(f"train.amp must be off, bf16 or fp16, got {amp!r}")
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


def to_memory_format(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch in channels-last memory format if ``train.channels_last`` (4-d batches only)."""
    if channels_last and images.dim() == 4:
        return images.contiguous(memory_format=torch.channels_last)
    return images


def on_device(data: ImageSplit, device: torch.device) -> ImageSplit:
    """``data`` copied to ``device`` once (``train.data_on_device``), so that batches are indexed
    there with no host-to-device copy each; ``data`` itself on the CPU, or where the copy would
    take more than [`DEVICE_MEMORY_SHARE`][pflower.core.training.DEVICE_MEMORY_SHARE] of the
    device's free memory (then logged)."""
    if device.type == "cpu" or data.images.device == device:
        return data
    needed = data.images.nbytes + data.labels.nbytes
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        if needed > DEVICE_MEMORY_SHARE * free:
            log.warning(
                "train.data_on_device: %d MB of data do not fit in half the %d MB free on %s; "
                "batches are copied one by one",
                needed >> 20,
                free >> 20,
                device,
            )
            return data
    return ImageSplit(data.images.to(device), data.labels.to(device), None)


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


def import_first_step_modules() -> None:
    """Import what torch's first optimizer imports, so that no training step waits for it.

    torch imports ``torch._dynamo`` (about 900 modules with sympy and parts of
    ``torch.distributed``: 2.5-3 s on a 2-core machine) the first time an optimizer is built
    and stepped: ``Optimizer.add_param_group`` and ``zero_grad`` are wrapped in
    ``torch._disable_dynamo`` and ``step`` in ``_use_grad_for_differentiable``, which import it
    on their first call whatever the ``foreach``/``fused`` flags. A process that forks
    training processes calls this once before forking (the fork backend's driver, the
    deployment's fork server), so every child starts with it imported; a process that trains
    itself pays the same either way (``benchmarks/results/coldstart.md``).
    """
    parameter = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([parameter], lr=0.0)
    optimizer.zero_grad(set_to_none=True)


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


def data_order(seed: int, server_round: int, partition_id: int, *extra: int) -> torch.Generator:
    """The generator of a client's local-training data order in one round: seeded by (experiment
    seed, round, partition id), so every run with the same seed visits the same batches; ``extra``
    entries give a further, independent stream (e.g. a second pass over other batches)."""
    state = np.random.SeedSequence([seed, server_round, partition_id, *extra]).generate_state(1)
    return torch.Generator().manual_seed(int(state[0]))


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
    floats on the CPU) and read once, so a GPU is not synchronized every step. The opt-in speed
    options of ``settings`` (``amp``, ``channels_last``, ``data_on_device``) apply to the forward
    pass and the batches; the regularizer and the optimizer step stay in float32. With
    ``settings.augment`` each batch is augmented before ``prepare``
    ([`pflower.core.augment`][pflower.core.augment]).
    """
    model.train()
    device = model_device(model)
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    if settings.data_on_device:
        data = on_device(data, device)
    optimizer = settings.make_optimizer(model.parameters())
    scaler = (
        torch.amp.GradScaler("cuda") if settings.amp == "fp16" and device.type == "cuda" else None
    )
    criterion = nn.CrossEntropyLoss()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    batches = 0
    augment = augmenter(settings.augment, generator)
    for index in batch_indices(
        len(data), settings.batch_size, generator, settings.epochs, settings.steps
    ):
        optimizer.zero_grad(set_to_none=True)
        index = index.to(data.images.device)
        images = prepare(augment(data.images.index_select(0, index))).to(device, non_blocking=True)
        images = to_memory_format(images, settings.channels_last)
        labels = data.labels.index_select(0, index).to(device, non_blocking=True)
        with autocast(device, settings.amp):
            loss = criterion(model(images), labels)
        total_loss += loss.detach().to(torch.float64)
        if regularizer is not None:
            loss = loss + regularizer(model)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if after_step is not None:
            after_step(model)
        batches += 1
    return float(total_loss) / max(batches, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ImageSplit,
    prepare: Prepare,
    batch_size: int,
    settings: TrainSettings | None = None,
) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``data`` (eval mode, no gradients), on the
    model's device; with ``settings``, under its speed options (as
    [`train`][pflower.core.training.train])."""
    if len(data) == 0:
        return EvalResult(loss=float("nan"), accuracy=float("nan"), num_examples=0)
    model.eval()
    device = model_device(model)
    amp, channels_last = "off", False
    if settings is not None:
        amp, channels_last = settings.amp, settings.channels_last
        if settings.data_on_device:
            data = on_device(data, device)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(data), batch_size):
        images = prepare(data.images[start : start + batch_size]).to(device, non_blocking=True)
        images = to_memory_format(images, channels_last)
        with autocast(device, amp):
            logits = model(images).float()
        labels = data.labels[start : start + batch_size].to(device, non_blocking=True)
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(dim=1) == labels).sum())
    return EvalResult(
        loss=loss_sum / len(data), accuracy=correct / len(data), num_examples=len(data)
    )
