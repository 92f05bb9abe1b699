"""Plain feed-forward classifiers: a stack of conv blocks (possibly empty), then an MLP head.

Every CNN and MLP of the five papers has this shape (conv → ReLU → [max-pool 2] repeated, flatten,
[dropout], Linear → ReLU repeated, final Linear), so one class described by a list of
[`ConvSpec`][pflower.models.feedforward.ConvSpec] and a list of hidden widths builds them all; the
zoo (``zoo.py``) holds the
per-paper recipes. The flatten width is computed from the dataset's input shape.

Parameter names follow the papers' reference code: ``features.conv1``, ``features.conv2``, ...,
``hidden.fc1``, ``hidden.fc2``, ..., and the classification layer ``fc`` (what FedRep-style
base/head splits look up), registered in forward order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from pflower.models.shapes import SpatialSize, check_input


@dataclass(frozen=True)
class ConvSpec:
    """One conv block: ``Conv2d(→channels, kernel, stride 1, padding)`` → ReLU → ``MaxPool2d(2)``.

    ``pool = False`` leaves out the pooling.
    """

    channels: int
    kernel: int
    padding: int = 0
    pool: bool = True


class FeedForwardNet(nn.Module):
    """Conv blocks → flatten → optional dropout → hidden ``Linear + ReLU`` layers → ``fc``.

    Args:
        name: the model's config name, used in error messages.
        input_shape: ``(C, H, W)`` of one input sample.
        num_classes: width of ``fc``.
        convs: the conv blocks in order; empty for an MLP on the flattened input.
        hidden: widths of the hidden linear layers.
        dropout: rate of the dropout applied to the flattened features (0 = none).

    Raises:
        ConfigError: the input is too small for the conv/pool stack.
    """

    head_module: ClassVar[str] = "fc"
    """The classification head (body/head split, [`pflower.models.split`][pflower.models.split])."""

    def __init__(
        self,
        name: str,
        input_shape: tuple[int, int, int],
        num_classes: int,
        convs: Sequence[ConvSpec] = (),
        hidden: Sequence[int] = (),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_input(input_shape, num_classes)
        size = SpatialSize(name, input_shape)
        channels = input_shape[0]
        features: OrderedDict[str, nn.Module] = OrderedDict()
        for index, spec in enumerate(convs, start=1):
            features[f"conv{index}"] = nn.Conv2d(
                channels, spec.channels, spec.kernel, padding=spec.padding
            )
            features[f"relu{index}"] = nn.ReLU()
            size.conv(spec.kernel, padding=spec.padding)
            if spec.pool:
                features[f"pool{index}"] = nn.MaxPool2d(2)
                size.pool(2)
            channels = spec.channels
        self.features = nn.Sequential(features)

        width = size.flat(channels)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        if dropout > 0.0:
            layers["dropout"] = nn.Dropout(dropout)
        for index, out_features in enumerate(hidden, start=1):
            layers[f"fc{index}"] = nn.Linear(width, out_features)
            layers[f"relu{index}"] = nn.ReLU()
            width = out_features
        self.hidden = nn.Sequential(layers)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` for a batch ``(B, C, H, W)``."""
        return self.fc(self.represent(x))

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output, the feature vector the head ``fc`` classifies: ``(B, width)``."""
        return self.hidden(torch.flatten(self.features(x), 1))
