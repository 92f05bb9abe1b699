"""The ``model`` group: one structured config per model of the zoo."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from pflower.blocks.base import Block
from pflower.config import (
    require,
)

# ----------------------------------------------------------------------------------------------
# models


@dataclass
class ModelBlock(Block):
    """A model of the zoo (the input shape and class count come from the dataset)."""

    @classmethod
    def group(cls) -> str:
        return "model"


def _positive(key: str, value: int) -> None:
    require(value >= 1, f"model.{key} must be a positive integer, got {value}")


@dataclass
class MnistCnn(ModelBlock):
    """McMahan et al. (2017) CNN with 'same' padding: FLIU's MNIST model."""

    config_name: ClassVar[str] = "mnist_cnn"


@dataclass
class FliuCifarCnn(ModelBlock):
    """FLIU's CIFAR-10 CNN: ``mnist_cnn`` plus a third conv (Sec. IV-C).

    Attributes:
        conv3_channels: channels of the third conv.
        conv3_kernel: its kernel size (odd: 'same' padding).
    """

    config_name: ClassVar[str] = "fliu_cifar_cnn"
    conv3_channels: int = 64
    conv3_kernel: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("conv3_channels", self.conv3_channels)
        _positive("conv3_kernel", self.conv3_kernel)
        require(
            self.conv3_kernel % 2 == 1,
            f"model.conv3_kernel must be odd for 'same' padding, got {self.conv3_kernel}",
        )


@dataclass
class FedavgCnn(ModelBlock):
    """FedALA's 4-layer CNN (PFLlib's FedAvgCNN), no padding: needs inputs of at least 16 px."""

    config_name: ClassVar[str] = "fedavg_cnn"


@dataclass
class LenetCnn(ModelBlock):
    """DiversiFed's LeNet-5-style CNN (Sec. V-B).

    Attributes:
        conv1_padding: padding of the first conv (null: pad inputs smaller than 32 px up to 32,
            e.g. 2 for 28x28).
    """

    config_name: ClassVar[str] = "lenet_cnn"
    conv1_padding: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.conv1_padding is None or self.conv1_padding >= 0,
            f"model.conv1_padding must be >= 0 or null (auto), got {self.conv1_padding}",
        )


@dataclass
class FlameCnn(ModelBlock):
    """FLAME's CIFAR-10 CNN (Sec. VI-A, Table II)."""

    config_name: ClassVar[str] = "flame_cnn"


@dataclass
class FlameCnn1(ModelBlock):
    """FLAME's "CNN1" for Medical-MNIST (Sec. VI-A, Table II).

    Attributes:
        dropout: dropout rate on the flattened features, before fc1, in [0, 1).
    """

    config_name: ClassVar[str] = "flame_cnn1"
    dropout: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")


@dataclass
class FlameCnn2(ModelBlock):
    """FLAME's "CNN2" for FEMNIST (Sec. VI-A, Table II)."""

    config_name: ClassVar[str] = "flame_cnn2"


@dataclass
class Mlp(ModelBlock):
    """MLP on the flattened input (FLAME: [128, 64]; DiversiFed: [64]).

    Attributes:
        hidden: widths of the hidden layers.
    """

    config_name: ClassVar[str] = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 64])

    def __post_init__(self) -> None:
        super().__post_init__()
        for width in self.hidden:
            _positive("hidden width", width)


@dataclass
class SmallCnn(ModelBlock):
    """A small CNN for tests and CPU smoke runs (any input of at least 2x2 pixels).

    Attributes:
        width: channels of the first conv; the second has 2·width.
    """

    config_name: ClassVar[str] = "small_cnn"
    width: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("width", self.width)


class ResNetInit(StrEnum):
    """Weight initialization of the ResNets."""

    default = "default"
    """PyTorch's layer defaults."""
    kaiming = "kaiming"
    """Kaiming-normal fan-out convolutions (torchvision's scheme)."""


class ResNetStem(StrEnum):
    """The first layer of ResNet-18."""

    cifar = "cifar"
    """3x3 conv, no max-pool (28-32 px images)."""
    imagenet = "imagenet"
    """7x7 stride-2 conv and a max-pool."""


@dataclass
class Resnet8(ModelBlock):
    """DiversiFed's ResNet-8 (Sec. V-B), laid out as Fling's ``resnet8``.

    Attributes:
        width: stage widths [w, 2w, 4w].
        init: ``kaiming`` or ``default`` (see [`ResNetInit`][pflower.blocks.models.ResNetInit]).
    """

    config_name: ClassVar[str] = "resnet8"
    width: int = 64
    init: ResNetInit = ResNetInit.kaiming

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("width", self.width)


@dataclass
class Resnet18(ModelBlock):
    """ResNet-18 (four stages of two BasicBlocks). FedMPR's dropout and noise are the
    algorithm's options (``strategy.dropout``, ``strategy.noise_sigma``, ...), not the model's.

    Attributes:
        stem: ``cifar`` or ``imagenet`` (see [`ResNetStem`][pflower.blocks.models.ResNetStem]).
        width: stage widths [w, 2w, 4w, 8w]; 16 gives about 0.70M parameters for CPU runs.
        init: ``default`` or ``kaiming`` (see [`ResNetInit`][pflower.blocks.models.ResNetInit]).
    """

    config_name: ClassVar[str] = "resnet18"
    stem: ResNetStem = ResNetStem.cifar
    width: int = 64
    init: ResNetInit = ResNetInit.default

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("width", self.width)


@dataclass
class ShakespeareLstm(ModelBlock):
    """LEAF's next-character stacked LSTM for Shakespeare (a text dataset: ``dataset=leaf
    dataset.kind=shakespeare``).

    Attributes:
        embedding_dim: width of the character embedding (LEAF: 8).
        hidden_size: width of each LSTM layer (LEAF: 256).
        num_layers: stacked LSTM layers (LEAF: 2).
    """

    config_name: ClassVar[str] = "shakespeare_lstm"
    embedding_dim: int = 8
    hidden_size: int = 256
    num_layers: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("embedding_dim", "hidden_size", "num_layers"):
            _positive(key, getattr(self, key))


@dataclass
class Sent140Lstm(ModelBlock):
    """LEAF's stacked LSTM for Sent140 sentiment, over a learned word embedding (``dataset=leaf
    dataset.kind=sent140``).

    Attributes:
        embedding_dim: width of the learned word embedding (LEAF's code: 100; its paper: 300-d
            GloVe, not available here).
        hidden_size: width of each LSTM layer (LEAF: 100).
        num_layers: stacked LSTM layers (LEAF: 2).
        dense: widths of the linear layers before the classifier (LEAF: [128]).
    """

    config_name: ClassVar[str] = "sent140_lstm"
    embedding_dim: int = 100
    hidden_size: int = 100
    num_layers: int = 2
    dense: list[int] = field(default_factory=lambda: [128])

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("embedding_dim", "hidden_size", "num_layers"):
            _positive(key, getattr(self, key))
        for width in self.dense:
            _positive("dense width", width)
