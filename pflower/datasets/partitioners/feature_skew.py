"""Feature- and quality-skew schemes: clients differ in *how* their inputs look.

===================== ===========================================================================
name                  scheme (source)
===================== ===========================================================================
``quality_skew``      FLAME "Gau(sigma)": contiguous blocks; client ``i`` adds Gaussian noise of
                      std ``sigma * i / K`` to its normalized inputs (FLAME, Sec. VI-A)
``feature_skew``      FLAME "#writers": consecutive writers per client (FLAME, Sec. VI-A)
``attribute_groups``  FedMPR CelebA high shift: attribute ``i`` to client ``i mod K``
                      (FedMPR, Sec. V-B; the mapping is pflower's choice)
``natural``           one client per group id (writer, user, silo), as Flower Datasets'
                      ``NaturalIdPartitioner``: the natural partition of LEAF, image-folder,
                      table and Hugging Face data that name each sample's client
===================== ===========================================================================

``feature_skew``, ``attribute_groups`` and ``natural`` read the per-sample ``group`` column
(writer ids, attribute indices, client ids). A negative group id means "no group": such samples
are not assigned.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pflower.datasets.partitioners.allocation import stratified_choice
from pflower.datasets.partitioners.base import PARTITIONERS, IndexPartitioner, require


def _require_groups(groups: np.ndarray | None, scheme: str, meaning: str) -> np.ndarray:
    if groups is None:
        raise ValueError(
            f"{scheme} splits by {meaning} and needs per-sample group ids, but this dataset has "
            "none; use a dataset that provides them or another partition scheme"
        )
    return groups


@PARTITIONERS.register("quality_skew")
class QualitySkewPartitioner(IndexPartitioner):
    """FLAME noise-based quality skew "Gau(sigma)" (FLAME paper, Sec. VI-A, "Partitions").

    The pool is cut into ``K`` equal contiguous blocks in pool order (client ``i`` gets rows
    ``[i*N/K, (i+1)*N/K)``, as FLAME's code does); ``shuffle_before_split`` shuffles first
    (pflower's option: a properly IID split for class-sorted data such as Medical-MNIST). The
    split itself carries no noise:
    [`noise_std`][pflower.datasets.partitioners.feature_skew.QualitySkewPartitioner.noise_std] tells
    the federation that client ``i`` adds
    Gaussian noise of std ``sigma * i / K`` (std, as in FLAME's code, though the paper says
    variance; client 0 is clean) to every normalized train and test input. ``fixed_noise: false``
    redraws the noise at every access (FLAME's code); ``true`` draws it once per sample.
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        sigma: float = 0.1,
        fixed_noise: bool = False,
        shuffle_before_split: bool = False,
    ) -> None:
        super().__init__(num_partitions, seed)
        require(sigma >= 0, f"sigma must be >= 0 (a noise std), got {sigma}")
        self._sigma = float(sigma)
        self._fixed_noise = bool(fixed_noise)
        self._shuffle = shuffle_before_split

    @property
    def noise_std(self) -> tuple[float, ...]:
        """Noise std of each client: ``sigma * i / K``."""
        return tuple(self._sigma * i / self.num_partitions for i in range(self.num_partitions))

    @property
    def fixed_noise(self) -> bool:
        """Whether each sample's noise is drawn once (True) or at every access (False)."""
        return self._fixed_noise

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        positions = rng.permutation(len(labels)) if self._shuffle else np.arange(len(labels))
        return np.array_split(positions, self.num_partitions)


@PARTITIONERS.register("feature_skew")
class WriterPartitioner(IndexPartitioner):
    """FLAME feature skew "#writers" (FLAME paper, Sec. VI-A; "#writers = 338" in Table III).

    Writers (``group`` ids, in ascending id order) are dealt out ``W // K`` consecutive writers
    per client with all of their samples; the last ``W mod K`` writers are dropped (as FLAME's
    code does).
    """

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        groups = _require_groups(groups, "feature_skew", "writer")
        writers = np.unique(groups[groups >= 0])
        per_client = len(writers) // self.num_partitions
        if per_client == 0:
            raise ValueError(
                f"{self.num_partitions} clients but only {len(writers)} writers; "
                f"allowed: at most {len(writers)} clients"
            )
        return [
            np.flatnonzero(np.isin(groups, writers[i * per_client : (i + 1) * per_client]))
            for i in range(self.num_partitions)
        ]


@PARTITIONERS.register("attribute_groups")
class AttributeGroupsPartitioner(IndexPartitioner):
    """FedMPR CelebA-Gender high shift (Sec. V-B): attribute ``i`` -> client ``i mod K``.

    ``group`` is the index of the sample's single active attribute in the canonical attribute
    order; client ``k`` gets every sample whose attribute index is ``k`` modulo ``K`` (for 5
    attributes and ``K = 2``: client 0 gets attributes 0, 2, 4; client 1 gets 1, 3). The paper
    uses mutually exclusive attributes for high shift (Sec. V-B, Fig. 6) but does not say how they
    map to clients; round-robin is pflower's choice. The loader already balances genders within
    every attribute; ``equal_sizes`` (pflower's default; the paper gives no client sizes) then
    downsamples every client to the smallest client's size, keeping its label proportions.
    """

    def __init__(self, num_partitions: int, seed: int, equal_sizes: bool = True) -> None:
        super().__init__(num_partitions, seed)
        self._equal_sizes = equal_sizes

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        groups = _require_groups(groups, "attribute_groups", "attribute")
        k = self.num_partitions
        shares = [np.flatnonzero((groups >= 0) & (groups % k == client)) for client in range(k)]
        empty = [client for client, share in enumerate(shares) if not len(share)]
        if empty:
            found = np.unique(groups[groups >= 0]).tolist()
            raise ValueError(
                f"clients {empty} get no attribute: attribute groups {found} cannot feed {k} "
                f"clients round-robin; use at most {len(found)} clients"
            )
        if not self._equal_sizes:
            return shares
        size = min(len(share) for share in shares)
        return [share[stratified_choice(labels[share], size, rng)] for share in shares]


@PARTITIONERS.register("natural")
class NaturalPartitioner(IndexPartitioner):
    """One client per distinct group id, in ascending id order: each writer, user or silo keeps
    exactly its own samples (Flower Datasets' ``NaturalIdPartitioner`` on the ``group`` column;
    here the client count is checked against the number of ids instead of following it)."""

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        groups = _require_groups(groups, "natural", "client (writer, user or silo) id")
        ids = np.unique(groups[groups >= 0])
        if len(ids) != self.num_partitions:
            raise ValueError(
                f"the data names {len(ids)} clients but num_clients={self.num_partitions}: "
                f"set num_clients={len(ids)}"
            )
        return [np.flatnonzero(groups == group) for group in ids]
