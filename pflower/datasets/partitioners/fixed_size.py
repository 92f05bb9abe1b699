"""DiversiFed's fixed-size clients (DiversiFed, Sec. V-A), whose test shares are part of the scheme.

Every client gets exactly ``train_size`` training samples from the pool (300 for FMNIST, 500 for
CIFAR and PathMNIST) and ``test_size`` (100) test samples from the official test split with the
same label distribution. A client's label distribution is a
[`Recipe`][pflower.datasets.partitioners.fixed_size.Recipe]: a few sources (sets
of classes) and their weights; its samples are drawn without replacement within the client. The
paper does not say whether clients may share samples; pflower follows Fling (the authors' group's
framework, used for FedCAC in Sec. V-B), where clients are sampled independently, so different
clients may share samples; ``disjoint: true`` draws every sample at most once instead.
Training samples come from the pool and test samples from the official test split, so shared
samples never put a test sample into training.

============================ ================================================================
name                         recipe (source)
============================ ================================================================
``diversifed_pathological``  ``classes_per_client`` distinct random classes, equal counts
``diversifed_dirichlet``     class weights ``q_i ~ Dir(alpha * 1_C)`` per client
``diversifed_practical``     client groups with dominant classes: ``dominant_fraction`` of the
                             samples from the group's classes, the rest from the others
============================ ================================================================
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflower.datasets.partitioners.base import (
    PARTITIONERS,
    DisjointOption,
    TestAwarePartitioner,
    check_concentration,
    check_count,
    require,
)
from pflower.datasets.partitioners.label_skew import check_classes_per_client


@dataclass(frozen=True)
class Recipe:
    """One client's label distribution: ``weights[j]`` of its samples come from ``sources[j]``."""

    sources: tuple[np.ndarray, ...]
    weights: np.ndarray

    def counts(self, size: int) -> np.ndarray:
        """Samples per source for a client of ``size`` samples (Fling's rule; the paper has none).

        Every source but the last gets ``round(size * weight)``, clipped so that the running
        total stays within ``size``; the last source gets the rest.
        """
        counts = np.zeros(len(self.weights), dtype=np.int64)
        for source, weight in enumerate(self.weights[:-1]):
            counts[source] = min(round(size * float(weight)), size - counts.sum())
        counts[-1] = size - counts.sum()
        return counts


class FixedSizePartitioner(DisjointOption, TestAwarePartitioner):
    """Base of the DiversiFed schemes: recipes first (all clients), then train and test draws."""

    def __init__(
        self, num_partitions: int, seed: int, train_size: int, test_size: int, disjoint: bool
    ) -> None:
        super().__init__(num_partitions, seed)
        check_count("train_size", train_size)
        check_count("test_size", test_size)
        self._train_size, self._test_size, self._disjoint = train_size, test_size, disjoint

    def _partition_with_test(
        self, labels: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator
    ) -> tuple[Sequence[np.ndarray], Sequence[np.ndarray]]:
        recipes = self._recipes(np.unique(labels), rng)
        train = self._draw(labels, [r.counts(self._train_size) for r in recipes], recipes, rng)
        test = self._draw(test_labels, [r.counts(self._test_size) for r in recipes], recipes, rng)
        return train, test

    def _draw(
        self,
        labels: np.ndarray,
        counts: list[np.ndarray],
        recipes: list[Recipe],
        rng: np.random.Generator,
    ) -> list[np.ndarray]:
        available = np.ones(len(labels), dtype=bool)
        by_class = {int(label): np.flatnonzero(labels == label) for label in np.unique(labels)}
        empty = np.zeros(0, dtype=np.int64)
        shares = []
        for client, (recipe, client_counts) in enumerate(zip(recipes, counts, strict=True)):
            parts = []
            for source, count in zip(recipe.sources, client_counts, strict=True):
                candidates = np.concatenate([by_class.get(int(c), empty) for c in source])
                candidates = candidates[available[candidates]]
                if count > len(candidates):
                    raise ValueError(
                        f"client {client} needs {count} samples of classes {source.tolist()} but "
                        f"only {len(candidates)} are available"
                        + (" (disjoint: true uses every sample once)" if self._disjoint else "")
                        + "; lower train_size/test_size or use fewer clients"
                    )
                parts.append(rng.choice(candidates, count, replace=False))
            share = np.concatenate(parts)
            if self._disjoint:
                available[share] = False
            shares.append(share)
        return shares

    @abstractmethod
    def _recipes(self, classes: np.ndarray, rng: np.random.Generator) -> list[Recipe]:
        """One recipe per client, drawn before any sample so train and test share it."""


@PARTITIONERS.register("diversifed_pathological")
class DiversifedPathologicalPartitioner(FixedSizePartitioner):
    """DiversiFed pathological (Sec. V-A, "Pathological non-IID"): each client draws
    ``classes_per_client`` distinct classes uniformly, independently of the others, with equal
    counts per class (150 + 150 train and 50 + 50 test for FMNIST)."""

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        classes_per_client: int = 2,
        train_size: int = 300,
        test_size: int = 100,
        disjoint: bool = False,
    ) -> None:
        super().__init__(num_partitions, seed, train_size, test_size, disjoint)
        check_count("classes_per_client", classes_per_client)
        self._classes_per_client = classes_per_client

    def _recipes(self, classes: np.ndarray, rng: np.random.Generator) -> list[Recipe]:
        check_classes_per_client(self._classes_per_client, len(classes))
        k = self._classes_per_client
        return [
            Recipe(
                tuple(np.array([c]) for c in rng.choice(classes, k, replace=False)),
                np.full(k, 1.0 / k),
            )
            for _ in range(self.num_partitions)
        ]


@PARTITIONERS.register("diversifed_dirichlet")
class DiversifedDirichletPartitioner(FixedSizePartitioner):
    """DiversiFed Dirichlet (Sec. V-A, "Dirichlet non-IID"): per client, class weights
    ``q_i ~ Dir(alpha)``; train and test use the same ``q_i`` (alpha in {0.1, 0.5, 1.0}: pflower's
    reading of the three settings of Sec. V-D and Table II)."""

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        alpha: float = 0.5,
        train_size: int = 300,
        test_size: int = 100,
        disjoint: bool = False,
    ) -> None:
        super().__init__(num_partitions, seed, train_size, test_size, disjoint)
        check_concentration("alpha", alpha)
        self._alpha = alpha

    def _recipes(self, classes: np.ndarray, rng: np.random.Generator) -> list[Recipe]:
        sources = tuple(np.array([c]) for c in classes)
        return [
            Recipe(sources, rng.dirichlet(np.full(len(classes), self._alpha)))
            for _ in range(self.num_partitions)
        ]


@PARTITIONERS.register("diversifed_practical")
class DiversifedPracticalPartitioner(FixedSizePartitioner):
    """DiversiFed practical (Sec. V-A, "Practical non-IID", and Sec. V-E; PathMNIST in the paper).

    The sorted classes are cut into ``num_groups`` contiguous dominant sets ({0-2}, {3-5}, {6-8}
    for 9 classes) and the clients into ``num_groups`` near-equal consecutive groups (7/7/6 for 20
    clients). A client draws ``dominant_fraction`` of its samples at random from its group's
    pooled dominant classes and the rest from the pooled other classes (400 + 100 train,
    80 + 20 test). The 80/20 rule and the three groups are the paper's; the dominant sets, group
    sizes and client count are pflower's defaults.
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        num_groups: int = 3,
        dominant_fraction: float = 0.8,
        train_size: int = 500,
        test_size: int = 100,
        disjoint: bool = False,
    ) -> None:
        super().__init__(num_partitions, seed, train_size, test_size, disjoint)
        check_count("num_groups", num_groups, minimum=2)
        require(
            0.0 <= dominant_fraction <= 1.0,
            f"dominant_fraction must be in [0, 1], got {dominant_fraction}",
        )
        self._num_groups, self._dominant_fraction = num_groups, dominant_fraction

    def _recipes(self, classes: np.ndarray, rng: np.random.Generator) -> list[Recipe]:
        if self._num_groups > len(classes):
            raise ValueError(
                f"num_groups={self._num_groups} exceeds the {len(classes)} classes; "
                f"allowed: 2..{len(classes)}"
            )
        weights = np.array([self._dominant_fraction, 1.0 - self._dominant_fraction])
        recipes: list[Recipe] = []
        client_groups = np.array_split(np.arange(self.num_partitions), self._num_groups)
        class_groups = np.array_split(classes, self._num_groups)
        for members, dominant in zip(client_groups, class_groups, strict=True):
            others = np.setdiff1d(classes, dominant)
            recipes += [Recipe((dominant, others), weights)] * len(members)
        return recipes
