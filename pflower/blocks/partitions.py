"""The ``partition`` group: one structured config per partition scheme."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from omegaconf import MISSING

from pflower.blocks.base import Block
from pflower.config import (
    require,
)

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
        assignment: ``balanced`` or ``random`` (see
            [`Assignment`][pflower.blocks.partitions.Assignment]).
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
class NaturalPartition(PartitionBlock):
    """One client per client id the data names (LEAF users, a table's client column, an image
    folder per client, a Hugging Face ``client_column``), as Flower Datasets'
    ``NaturalIdPartitioner``; ``num_clients`` must equal the number of ids."""

    config_name: ClassVar[str] = "natural"


@dataclass
class FromFilePartition(PartitionBlock):
    """Client shares read from a JSON file of per-client pool indices (``pflower partition``
    writes one).

    Attributes:
        path: the file (required).
    """

    config_name: ClassVar[str] = "from_file"
    path: str = MISSING
