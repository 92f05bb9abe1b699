"""The body/head split of every zoo model, for split-model personalized FL.

Split-model methods (FedPer, FedRep, FedRoD, FedBABU, FedPHP, ALA on "higher layers") need to
know which parameters form the classification *head* and which the feature-extracting *body*
(the "base" of FedPer/FedRep, the "feature extractor" of FedRoD/FedBABU), and where the body's
output, the feature vector, can be read. Every model class of the zoo declares this once:

- the class attribute ``head_module`` names the head submodule (``"fc"`` for every zoo model);
- the method ``represent(x)`` returns the body's output, so ``model(x) == head(represent(x))``.

Algorithms use only the functions here, never a model's attribute names, so they work on every
zoo model and on any new model that makes the same two declarations. Keys are ``state_dict`` keys
(parameters and buffers), in the order in which weights cross the wire.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from pflower.registry import ConfigError

_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def head_name(model: nn.Module) -> str:
    """The name of ``model``'s head submodule (its ``head_module`` declaration)."""
    name = getattr(type(model), "head_module", None)
    if not isinstance(name, str) or not isinstance(getattr(model, name, None), nn.Module):
        raise ConfigError(
            f"model {type(model).__name__} declares no body/head split: give its class a "
            f"'head_module' attribute naming the classification layer and a 'represent(x)' method "
            f"returning that layer's input (see pflower.models.split)"
        )
    return name


def head(model: nn.Module) -> nn.Module:
    """``model``'s head submodule (the classifier applied to
    [`represent`][pflower.models.split.represent])."""
    module: nn.Module = getattr(model, head_name(model))
    return module


def head_shape(model: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of the head: the representation width and the classes.

    Read from the head's last 2-D weight, so a head may be any stack ending in a linear layer.
    """
    weights = [p for p in head(model).parameters() if p.dim() == 2]
    if not weights:
        raise ConfigError(f"the head of {type(model).__name__} has no linear layer")
    out_features, in_features = weights[-1].shape
    return int(in_features), int(out_features)


def is_head_key(model: nn.Module, key: str) -> bool:
    """Whether ``state_dict`` key ``key`` belongs to the head."""
    prefix = head_name(model)
    return key == prefix or key.startswith(prefix + ".")


def head_keys(model: nn.Module) -> list[str]:
    """The head's ``state_dict`` keys, in ``state_dict`` order."""
    return [key for key in model.state_dict() if is_head_key(model, key)]


def body_keys(model: nn.Module) -> list[str]:
    """Every ``state_dict`` key not in the head (parameters and buffers), in order."""
    return [key for key in model.state_dict() if not is_head_key(model, key)]


def head_mask(model: nn.Module) -> list[bool]:
    """Per ``state_dict`` entry (wire order): True for the head's arrays."""
    return [is_head_key(model, key) for key in model.state_dict()]


def batchnorm_mask(model: nn.Module) -> list[bool]:
    """Per ``state_dict`` entry: True for BatchNorm parameters and statistics (FedBN's part)."""
    prefixes = [
        name + "." for name, module in model.named_modules() if isinstance(module, _BATCHNORM)
    ]
    return [any(key.startswith(prefix) for prefix in prefixes) for key in model.state_dict()]


def represent(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The body's output for batch ``x``: the feature vector the head classifies."""
    head_name(model)
    return model.represent(x)  # type: ignore[operator]  # declared by the model class, checked above


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The head's trainable parameters."""
    return list(head(model).parameters())


def body_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters outside the head."""
    prefix = head_name(model) + "."
    return [param for name, param in model.named_parameters() if not name.startswith(prefix)]


def merge(
    mask: Sequence[bool], where_true: Sequence[object], where_false: Sequence[object]
) -> list:
    """Entry-wise choice of two weight lists: ``where_true[i]`` if ``mask[i]``, else the other."""
    if not len(mask) == len(where_true) == len(where_false):
        raise ValueError(
            f"cannot merge weight lists of lengths {len(where_true)} and {len(where_false)} "
            f"with a mask of length {len(mask)}"
        )
    return [a if m else b for m, a, b in zip(mask, where_true, where_false, strict=True)]


@contextmanager
def trainable_only(model: nn.Module, parameters: Sequence[nn.Parameter]) -> Iterator[None]:
    """Within the block only ``parameters`` of ``model`` get gradients (the others are frozen, so
    an optimizer over ``model.parameters()`` leaves them untouched); restored afterwards."""
    chosen = {id(param) for param in parameters}
    saved = [(param, param.requires_grad) for param in model.parameters()]
    try:
        for param, _ in saved:
            param.requires_grad_(id(param) in chosen)
        yield
    finally:
        for param, flag in saved:
            param.requires_grad_(flag)
