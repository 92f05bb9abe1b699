"""The structured configs of the named config groups: ``dataset``, ``partition``, ``model``.

Each registered dataset loader, partition scheme and model has one dataclass here, stored in
Hydra's ConfigStore as ``<group>/<name>`` (:func:`store_blocks`): its fields are the config keys
of ``dataset=<name>`` (``partition=<name>``, ``model=<name>``), with their types, defaults and
help text (the class's ``Attributes:`` docstring), and its ``__post_init__`` rejects values out of
range with :class:`~pflower.registry.ConfigError`. ``conf/<group>/*.yaml`` holds only named
presets that change some of these defaults (none today): Hydra composes ``dataset=mnist`` from
the stored node alone.

The keys are the keyword arguments of the factory registered under the same name
(:data:`pflower.datasets.loaders.DATASETS`, :data:`pflower.datasets.partitioners.base.PARTITIONERS`,
:data:`pflower.models.MODELS`) minus those the caller supplies (``num_partitions``/``seed`` of a
partition scheme, ``input_shape``/``num_classes`` of a model); ``tests/test_config_schema.py``
checks that names and defaults agree with the factories' signatures. This module imports no
torch, Flower or dataset code, so a configuration can be checked before any of them is loaded.

The ``split`` group's schema is :class:`pflower.datasets.split.SplitConfig` and the ``backend``
group's :class:`pflower.config.BackendConfig`; both are stored here too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from typing import Any, ClassVar

from omegaconf import MISSING

from pflower.config import (
    AttackConfig,
    AttackKind,
    BackendConfig,
    ExperimentConfig,
    RobustConfig,
    RobustKind,
    TrackingConfig,
    TrackingKind,
    plain,
    require,
)


@dataclass
class Block:
    """A named block: ``name`` picks the factory (set by ``<group>=<name>``)."""

    config_name: ClassVar[str] = ""
    name: str = ""

    def __post_init__(self) -> None:
        require(
            self.name == self.config_name,
            f"{self.group()}.name is {self.name!r} but the keys are those of "
            f"{self.config_name!r}: choose with {self.group()}=<name>, not {self.group()}.name",
        )

    @classmethod
    def group(cls) -> str:
        return "block"


# ----------------------------------------------------------------------------------------------
# datasets


@dataclass
class DatasetBlock(Block):
    """Options every dataset has.

    Attributes:
        mean: per-channel normalization mean (a number or a list, one per channel); null: the
            dataset's own statistics.
        std: per-channel normalization std, as ``mean``; null: the dataset's own.
    """

    mean: Any = None
    std: Any = None

    @classmethod
    def group(cls) -> str:
        return "dataset"

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        """The (C, H, W) of every image and the number of classes, known from the options."""
        raise NotImplementedError


@dataclass
class DigitsDataset(DatasetBlock):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download).

    Attributes:
        image_size: side of the square images (8: the original; larger sizes are upsampled).
    """

    config_name: ClassVar[str] = "digits"
    image_size: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, f"dataset.image_size must be >= 1, got {self.image_size}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return (1, self.image_size, self.image_size), 10


@dataclass
class SyntheticDataset(DatasetBlock):
    """Seeded class prototypes plus Gaussian noise, for tests (no files).

    Attributes:
        image_shape: [C, H, W] of the images.
        num_classes: number of classes (>= 2).
        num_train: training images.
        num_test: test images.
        noise: std of the noise added to the class prototypes (>= 0).
        seed: seed of the prototypes and the noise.
    """

    config_name: ClassVar[str] = "synthetic"
    image_shape: list[int] = field(default_factory=lambda: [1, 16, 16])
    num_classes: int = 10
    num_train: int = 2000
    num_test: int = 500
    noise: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            len(self.image_shape) == 3 and min(self.image_shape) >= 1,
            f"dataset.image_shape must be [C, H, W], got {list(self.image_shape)}",
        )
        require(self.num_classes >= 2, f"dataset.num_classes must be >= 2, got {self.num_classes}")
        require(
            self.num_train >= 1 and self.num_test >= 1,
            "dataset.num_train and dataset.num_test must be >= 1",
        )
        require(self.noise >= 0, f"dataset.noise must be >= 0, got {self.noise}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        channels, height, width = (int(size) for size in self.image_shape)
        return (channels, height, width), self.num_classes


@dataclass
class FileDataset(DatasetBlock):
    """A dataset read from its original files under a data root.

    Attributes:
        root: the data root (null: ``$PFLOWER_DATA``, else a user cache directory).
        download: let torchvision download missing files (checksums are verified).
        verify: check the files' checksums before decoding them.
    """

    root: str | None = None
    download: bool = False
    verify: bool = True
    shape: ClassVar[tuple[int, int, int]] = (1, 28, 28)
    classes: ClassVar[int] = 10

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return self.shape, self.classes


@dataclass
class MnistDataset(FileDataset):
    """MNIST (LeCun et al.): 28x28 grey digits, original IDX files."""

    config_name: ClassVar[str] = "mnist"


@dataclass
class FmnistDataset(FileDataset):
    """Fashion-MNIST (Xiao et al.): 28x28 grey clothing images, original IDX files."""

    config_name: ClassVar[str] = "fmnist"


@dataclass
class Cifar10Dataset(FileDataset):
    """CIFAR-10: 32x32 colour images of 10 classes (cifar-10-batches-py)."""

    config_name: ClassVar[str] = "cifar10"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)


@dataclass
class Cifar100Dataset(FileDataset):
    """CIFAR-100 (fine labels): 32x32 colour images of 100 classes."""

    config_name: ClassVar[str] = "cifar100"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)
    classes: ClassVar[int] = 100


@dataclass
class SvhnDataset(FileDataset):
    """SVHN: 32x32 colour house-number digits (train_32x32.mat, test_32x32.mat)."""

    config_name: ClassVar[str] = "svhn"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)


class CelebaShift(StrEnum):
    """How CelebA-Gender's attributes differ between clients (FedMPR, Sec. V-B)."""

    low = "low"
    high = "high"


@dataclass
class CelebaGenderDataset(FileDataset):
    """CelebA gender classification with attribute groups (FedMPR, Sec. V-B).

    Attributes:
        num_attributes: how many mutually exclusive attributes make the groups (3..7).
        shift: ``low`` or ``high`` covariate shift between the attribute groups.
        image_size: side of the square images (64 reduced scale, 128 full scale).
        test_size: images in the test split (null: the loader's choice; >= 2).
        seed: seed of the balanced subsampling.
    """

    config_name: ClassVar[str] = "celeba_gender"
    num_attributes: int = 5
    shift: CelebaShift = CelebaShift.low
    image_size: int = 64
    test_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            3 <= self.num_attributes <= 7,
            f"dataset.num_attributes must be 3..7, got {self.num_attributes}",
        )
        require(self.image_size >= 1, f"dataset.image_size must be >= 1, got {self.image_size}")
        require(
            self.test_size is None or self.test_size >= 2,
            f"dataset.test_size must be null or >= 2, got {self.test_size}",
        )

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return (3, self.image_size, self.image_size), 2


# ----------------------------------------------------------------------------------------------
# partitions


@dataclass
class PartitionBlock(Block):
    """A partition scheme (the number of clients and the seed come from the run)."""

    input_noise: ClassVar[bool] = False
    """Whether the scheme adds per-client noise to the inputs (a client's data then exists only
    with that client's noise: no union of all clients' data)."""

    @classmethod
    def group(cls) -> str:
        return "partition"


def _count(key: str, value: int | None, minimum: int = 1) -> None:
    require(
        value is None or value >= minimum,
        f"partition.{key} must be an integer >= {minimum}, got {value}",
    )


def _concentration(key: str, value: float) -> None:
    require(value > 0, f"partition.{key} must be > 0 (a Dirichlet concentration), got {value}")


class Assignment(StrEnum):
    """How the pathological scheme assigns classes to clients."""

    balanced = "balanced"
    """Each class held by K·k/L clients."""
    random = "random"
    """Independent draws per client."""


@dataclass
class PathologicalPartition(PartitionBlock):
    """Each client holds ``classes_per_client`` classes (McMahan et al.'s pathological non-IID).

    Attributes:
        classes_per_client: classes per client.
        assignment: ``balanced`` or ``random`` (see :class:`Assignment`).
    """

    config_name: ClassVar[str] = "pathological"
    classes_per_client: int = 2
    assignment: Assignment = Assignment.balanced

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("classes_per_client", self.classes_per_client)


@dataclass
class ShardsPartition(PartitionBlock):
    """Label-sorted shards dealt to clients (McMahan et al., 2017).

    Attributes:
        shards_per_client: shards per client.
        shard_size: samples per shard (null: N / (K · shards_per_client)).
    """

    config_name: ClassVar[str] = "shards"
    shards_per_client: int = 2
    shard_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("shards_per_client", self.shards_per_client)
        _count("shard_size", self.shard_size)


@dataclass
class DirichletPartition(PartitionBlock):
    """Per-class Dirichlet(alpha) shares over clients (Flower Datasets' DirichletPartitioner).

    Attributes:
        alpha: concentration (small: skewed).
        min_size: redraw until every client holds this many samples.
        self_balancing: Flower Datasets' self-balancing option.
    """

    config_name: ClassVar[str] = "dirichlet"
    alpha: float = 0.5
    min_size: int = 10
    self_balancing: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("alpha", self.alpha)
        _count("min_size", self.min_size, 0)


@dataclass
class LsPartition(PartitionBlock):
    """FLIU label skew (Sec. IV-A3): Dirichlet label mixes with equal client sizes.

    Attributes:
        alpha: concentration of the label mixes.
    """

    config_name: ClassVar[str] = "ls"
    alpha: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("alpha", self.alpha)


@dataclass
class SamplesPerClassPartition(PartitionBlock):
    """Options of the schemes that can cap the samples per class and client.

    Attributes:
        samples_per_class: cap per client and class (null: all).
    """

    samples_per_class: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("samples_per_class", self.samples_per_class)


@dataclass
class ClassGroupsPartition(SamplesPerClassPartition):
    """FedMPR high shift (Sec. V-A): the sorted classes cut into K contiguous groups."""

    config_name: ClassVar[str] = "class_groups"


@dataclass
class StratifiedIidPartition(SamplesPerClassPartition):
    """Each class split evenly over all clients (FedMPR's low shift, Sec. V-A)."""

    config_name: ClassVar[str] = "stratified_iid"


@dataclass
class QLabelSkewPartition(PartitionBlock):
    """FLAME "#label = q" (Sec. VI-A).

    Attributes:
        q: classes per client.
    """

    config_name: ClassVar[str] = "q_label_skew"
    q: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("q", self.q)


@dataclass
class DirLabelSkewPartition(PartitionBlock):
    """FLAME's Dirichlet label skew "Dir(beta)" (Sec. VI-A).

    Attributes:
        beta: concentration.
        disjoint: true: no sample in two clients' data; false: FLAME's code (clients may share
            samples).
        min_size: redraw until every client holds this many samples.
    """

    config_name: ClassVar[str] = "dir_label_skew"
    beta: float = 0.5
    disjoint: bool = True
    min_size: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("beta", self.beta)
        _count("min_size", self.min_size, 0)


@dataclass
class PflibPathologicalPartition(PartitionBlock):
    """PFLlib's pathological split (``balance=False``), as used by FedALA.

    Attributes:
        classes_per_client: classes per client.
        least_samples: PFLlib's lower bound on a client's samples.
    """

    config_name: ClassVar[str] = "pflib_pathological"
    classes_per_client: int = 2
    least_samples: int = 40

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("classes_per_client", self.classes_per_client)
        _count("least_samples", self.least_samples, 0)


@dataclass
class PflibPracticalPartition(PartitionBlock):
    """PFLlib's practical Dir(beta) split, as used by FedALA.

    Attributes:
        beta: concentration.
        least_samples: PFLlib's lower bound on a client's samples.
    """

    config_name: ClassVar[str] = "pflib_practical"
    beta: float = 0.1
    least_samples: int = 40

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("beta", self.beta)
        _count("least_samples", self.least_samples, 0)


@dataclass
class RedrawPartition(PartitionBlock):
    """FLIU's schemes with Dirichlet client sizes, redrawn while a client is too small.

    Attributes:
        alpha: concentration.
        min_size: redraw until every client holds this many samples.
        max_draws: give up after this many draws.
    """

    alpha: float = 1.0
    min_size: int = 10
    max_draws: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("alpha", self.alpha)
        _count("min_size", self.min_size, 0)
        _count("max_draws", self.max_draws)


@dataclass
class QsPartition(RedrawPartition):
    """FLIU quantity skew (Sec. IV-A4): client sizes ~ Dir(alpha), global class proportions."""

    config_name: ClassVar[str] = "qs"


@dataclass
class LsqsPartition(RedrawPartition):
    """FLIU label + quantity skew (Sec. IV-A5)."""

    config_name: ClassVar[str] = "lsqs"


@dataclass
class DirQuantitySkewPartition(PartitionBlock):
    """FLAME quantity skew "Dir(beta)" (Sec. VI-A).

    Attributes:
        beta: concentration of the client sizes.
        min_size: redraw until every client holds this many samples.
        disjoint: true: no sample in two clients' data; false: FLAME's code.
    """

    config_name: ClassVar[str] = "dir_quantity_skew"
    beta: float = 0.5
    min_size: int = 100
    disjoint: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("beta", self.beta)
        _count("min_size", self.min_size)


@dataclass
class HybridSkewPartition(PartitionBlock):
    """FLAME hybrid skew "#label = q, Dir(beta)" (Sec. VI-A): half the clients each.

    Attributes:
        q: classes per client of the label half.
        beta: concentration of the quantity half.
        min_size: redraw until every client of the quantity half holds this many samples.
        disjoint: true: no sample in two clients' data; false: FLAME's code.
    """

    config_name: ClassVar[str] = "hybrid_skew"
    q: int = 2
    beta: float = 0.5
    min_size: int = 100
    disjoint: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("q", self.q)
        _concentration("beta", self.beta)
        _count("min_size", self.min_size)


@dataclass
class FixedSizePartition(PartitionBlock):
    """DiversiFed's schemes: every client draws fixed-size train and test shares (Fling).

    Attributes:
        train_size: training samples per client.
        test_size: test samples per client.
        disjoint: false: clients may share samples (Fling); true: no sample in two clients.
    """

    train_size: int = 300
    test_size: int = 100
    disjoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("train_size", self.train_size)
        _count("test_size", self.test_size)


@dataclass
class DiversifedPathologicalPartition(FixedSizePartition):
    """DiversiFed pathological (Sec. V-A).

    Attributes:
        classes_per_client: distinct classes per client, equal counts each.
    """

    config_name: ClassVar[str] = "diversifed_pathological"
    classes_per_client: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("classes_per_client", self.classes_per_client)


@dataclass
class DiversifedDirichletPartition(FixedSizePartition):
    """DiversiFed Dirichlet (Sec. V-A).

    Attributes:
        alpha: concentration of each client's class weights.
    """

    config_name: ClassVar[str] = "diversifed_dirichlet"
    alpha: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        _concentration("alpha", self.alpha)


@dataclass
class DiversifedPracticalPartition(FixedSizePartition):
    """DiversiFed practical (Sec. V-A and V-E): dominant class groups.

    Attributes:
        num_groups: client groups, each with its own dominant classes (>= 2).
        dominant_fraction: share of a client's samples from its group's dominant classes.
    """

    config_name: ClassVar[str] = "diversifed_practical"
    num_groups: int = 3
    dominant_fraction: float = 0.8
    train_size: int = 500

    def __post_init__(self) -> None:
        super().__post_init__()
        _count("num_groups", self.num_groups, 2)
        require(
            0.0 <= self.dominant_fraction <= 1.0,
            f"partition.dominant_fraction must be in [0, 1], got {self.dominant_fraction}",
        )


@dataclass
class IidPartition(PartitionBlock):
    """Uniformly shuffled, equal-size shares."""

    config_name: ClassVar[str] = "iid"


@dataclass
class QualitySkewPartition(PartitionBlock):
    """FLAME noise-based quality skew "Gau(sigma)" (Sec. VI-A): client i adds noise of std
    sigma·i/K to its inputs.

    Attributes:
        sigma: the noise std of the last client's inputs, scaled by i/K.
        fixed_noise: false: noise redrawn at every access (FLAME's code); true: once per sample.
        shuffle_before_split: shuffle the pool before cutting it into contiguous blocks.
    """

    config_name: ClassVar[str] = "quality_skew"
    input_noise: ClassVar[bool] = True
    sigma: float = 0.1
    fixed_noise: bool = False
    shuffle_before_split: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.sigma >= 0, f"partition.sigma must be >= 0 (a noise std), got {self.sigma}")


@dataclass
class FeatureSkewPartition(PartitionBlock):
    """FLAME feature skew "#writers" (Sec. VI-A): writers dealt out to clients (needs a dataset
    with writer ids)."""

    config_name: ClassVar[str] = "feature_skew"


@dataclass
class AttributeGroupsPartition(PartitionBlock):
    """FedMPR CelebA-Gender high shift (Sec. V-B): attribute i -> client i mod K.

    Attributes:
        equal_sizes: downsample every client to the smallest client's size.
    """

    config_name: ClassVar[str] = "attribute_groups"
    equal_sizes: bool = True


@dataclass
class FromFilePartition(PartitionBlock):
    """Client shares read from a JSON file of per-client pool indices (``pflower partition``
    writes one).

    Attributes:
        path: the file (required).
    """

    config_name: ClassVar[str] = "from_file"
    path: str = MISSING


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
        init: ``kaiming`` or ``default`` (see :class:`ResNetInit`).
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
        stem: ``cifar`` or ``imagenet`` (see :class:`ResNetStem`).
        width: stage widths [w, 2w, 4w, 8w]; 16 gives about 0.70M parameters for CPU runs.
        init: ``default`` or ``kaiming`` (see :class:`ResNetInit`).
    """

    config_name: ClassVar[str] = "resnet18"
    stem: ResNetStem = ResNetStem.cifar
    width: int = 64
    init: ResNetInit = ResNetInit.default

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("width", self.width)


# ----------------------------------------------------------------------------------------------
# the ConfigStore


def _subclasses(base: type[Block]) -> list[type[Block]]:
    found: list[type[Block]] = []
    for child in base.__subclasses__():
        if child.config_name:
            found.append(child)
        found.extend(_subclasses(child))
    return found


def blocks(group: str) -> dict[str, type[Block]]:
    """The registered block classes of ``group`` (``dataset``, ``partition``, ``model``) by name."""
    base = {"dataset": DatasetBlock, "partition": PartitionBlock, "model": ModelBlock}[group]
    return {child.config_name: child for child in _subclasses(base)}


SCHEMA_NAME = "pflower_schema"
"""The ConfigStore name of the run-level schema that ``conf/config.yaml`` extends."""

BLOCK_GROUPS = ("dataset", "partition", "model")
"""The groups whose blocks are chosen by name and built by a registered factory."""

BACKENDS = ("fork", "ray")
"""The stored backends (``backend=ray_cluster`` is a preset of ``ray`` in ``conf/backend``)."""


def block_class(group: str, name: str) -> type[Block]:
    """The block class of ``<group>=<name>``.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones).
    """
    classes = blocks(group)
    require(name in classes, f"Unknown {group} '{name}'. Valid names: {', '.join(sorted(classes))}")
    return classes[name]


def block_of(group: str, options: Any) -> Block:
    """The typed block of a plain ``{name: ..., key: value}`` mapping (checks run here)."""
    values = dict(options)
    return block_class(group, str(values["name"]))(**values)


def typed_settings(cfg: Any) -> ExperimentConfig:
    """The :class:`~pflower.config.ExperimentConfig` of a composed configuration: every
    dataclass built (its ``__post_init__`` checks run), the named blocks and ``split`` then turned
    into plain mappings (``{name: ..., key: value}``), as the rest of pflower reads them."""
    from omegaconf import OmegaConf

    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, ExperimentConfig)
    for group in (*BLOCK_GROUPS, "split"):
        block = getattr(settings, group)
        if is_dataclass(block) and not isinstance(block, type):
            setattr(settings, group, plain(asdict(block)))
    return settings


def store_blocks() -> None:
    """Store the run-level schema (``pflower_schema``, which ``conf/config.yaml`` extends), every
    block, the split schema, the backends, the trackers, the attacks and the robust aggregators
    in the ConfigStore (the algorithms store their own options when they are registered)."""
    from hydra.core.config_store import ConfigStore

    from pflower.datasets.split import SplitConfig

    store = ConfigStore.instance()
    if f"{SCHEMA_NAME}.yaml" in store.repo:
        return  # stored once per process (the check before imports may have done it)
    for attack in AttackKind:
        store.store(group="attack", name=attack.value, node=AttackConfig(attack))
    for robust in RobustKind:
        store.store(group="robust", name=robust.value, node=RobustConfig(robust))
    for group in BLOCK_GROUPS:
        for name, cls in blocks(group).items():
            store.store(group=group, name=name, node=cls(name=name))
    store.store(group="split", name="default", node=SplitConfig)
    for backend in BACKENDS:
        store.store(group="backend", name=backend, node=BackendConfig(name=backend))
    for tracker in TrackingKind:
        store.store(group="tracking", name=tracker.value, node=TrackingConfig(name=tracker))
    store.store(name=SCHEMA_NAME, node=ExperimentConfig)  # last: marks the rest as stored
