"""ResNets with BasicBlocks: ResNet-18 (FedMPR, FedALA) and ResNet-8 (DiversiFed).

Module and parameter names are torchvision's (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0``, ..., ``fc``), so a ResNet-18 with the ImageNet stem and width 64 has the
same ``state_dict`` keys and shapes as ``torchvision.models.resnet18``. The code is written from
the architecture description (He et al., 2016), not copied.

Each BasicBlock carries a [`Regularization`][pflower.models.regularization.Regularization] (off by
default)
that FedMPR switches on with [`apply_regularization`][pflower.models.resnet.apply_regularization];
it adds no parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from pflower.models.regularization import NO_REGULARIZATION, Regularization
from pflower.models.shapes import check_input
from pflower.registry import ConfigError

STEMS = ("cifar", "imagenet")
INITS = ("default", "kaiming")


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm plus a shortcut (1x1 conv + BN when the shape changes).

    With regularization (train mode only; FedMPR, Sec. IV-B, in an order that is pflower's
    reading): ``conv1 (noisy weights) → BN1 → ReLU → Dropout → conv2 (noisy weights) → BN2
    → + shortcut → ReLU``. The shortcut is never regularized.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        self.regularization = NO_REGULARIZATION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output; the regularization acts only in ``train()``."""
        reg = self.regularization if self.training else NO_REGULARIZATION
        out = reg.drop(F.relu(reg.after_norm(self.bn1(reg.conv(self.conv1, x)))))
        out = reg.after_norm(self.bn2(reg.conv(self.conv2, out)))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet(nn.Module):
    """Stem → BasicBlock stages (widths w, 2w, 4w, ...; strides 1, 2, 2, ...) → avg-pool → ``fc``.

    Args:
        input_shape: ``(C, H, W)``; any spatial size works thanks to the adaptive average pool.
        num_classes: width of ``fc``.
        blocks_per_stage: e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        width: channels of the stem and the first stage.
        stem: ``"cifar"`` = 3x3 conv, stride 1, no max-pool (for 28-32 px images);
            ``"imagenet"`` = 7x7 conv, stride 2, then 3x3 max-pool with stride 2.
        init: ``"default"`` = PyTorch's layer defaults; ``"kaiming"`` = torchvision's scheme
            (Kaiming-normal, fan_out, for convs; BatchNorm γ = 1, β = 0).
    """

    head_module: ClassVar[str] = "fc"
    """The classification head (body/head split, [`pflower.models.split`][pflower.models.split])."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        blocks_per_stage: Sequence[int],
        width: int = 64,
        stem: str = "cifar",
        init: str = "default",
    ) -> None:
        super().__init__()
        check_input(input_shape, num_classes)
        _check_choice("stem", stem, STEMS)
        _check_choice("init", init, INITS)
        if width < 1:
            raise ConfigError(f"width must be a positive channel count, got {width}")
        if stem == "cifar":
            self.conv1 = nn.Conv2d(input_shape[0], width, 3, 1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(input_shape[0], width, 7, 2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        channels = width
        for index, num_blocks in enumerate(blocks_per_stage):
            out_channels, blocks = width * 2**index, []
            for position in range(num_blocks):
                stride = 2 if index > 0 and position == 0 else 1
                blocks.append(BasicBlock(channels, out_channels, stride))
                channels = out_channels
            self.add_module(f"layer{index + 1}", nn.Sequential(*blocks))
        self.num_stages = len(blocks_per_stage)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        if init == "kaiming":
            self._kaiming_init()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` for a batch ``(B, C, H, W)``."""
        return self.fc(self.represent(x))

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output, the pooled feature vector the head ``fc`` classifies."""
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        for stage in self.stages():
            x = stage(x)
        return torch.flatten(self.avgpool(x), 1)

    def stages(self) -> list[nn.Sequential]:
        """The residual stages ``layer1, layer2, ...`` in order."""
        return [getattr(self, f"layer{index}") for index in range(1, self.num_stages + 1)]

    def _kaiming_init(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


def apply_regularization(
    model: nn.Module, regularization: Regularization, stages: Iterable[int] = (1, 2, 3, 4)
) -> None:
    """Give every BasicBlock of the listed (1-based) ``stages`` this regularization, others none.

    pflower's FedMPR default is every block of stages 1-4 (the paper: "within the basic blocks",
    Sec. IV-B); ``stages=[1, 2]`` is the reading of its "particularly in the early stages of
    feature extraction". Parameters and ``state_dict`` are unchanged.

    Raises:
        ConfigError: ``model`` is not a [`ResNet`][pflower.models.resnet.ResNet], or a stage does
            not exist in it.
    """
    if not isinstance(model, ResNet):
        raise ConfigError(
            f"Dropout/weight-noise regularization needs a ResNet (resnet18, resnet8), "
            f"got {type(model).__name__}"
        )
    chosen = set(stages)
    unknown = sorted(chosen - set(range(1, model.num_stages + 1)))
    if unknown:
        raise ConfigError(
            f"Regularization stages {unknown} do not exist: this ResNet has stages "
            f"1..{model.num_stages}"
        )
    for index, stage in enumerate(model.stages(), start=1):
        for block in stage:
            assert isinstance(block, BasicBlock)
            block.regularization = regularization if index in chosen else NO_REGULARIZATION


def _check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"Unknown {key} '{value}'. Valid values: {', '.join(choices)}")
