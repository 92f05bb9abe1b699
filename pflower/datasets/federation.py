"""A dataset split among clients, as every other part sees it, and the builder that makes it.

[`build_federation`][pflower.datasets.federation.build_federation] is the single entry point the
server, the clients, the partition report
and the tests use. It is a pure function of its arguments (same arguments, same federation), so a
caller may cache it per process; the simulation calls ``client_fn`` once per message, and
rebuilding there would dominate the round time.

How a federation is built (``split`` keys in brackets, see
[`SplitConfig`][pflower.datasets.federation.SplitConfig]):

1. The *pool* is the official train split followed by the official test split; every index below
   points into it (test sample ``i`` is at ``len(train) + i``). The samples shared among clients
   are the official train split (``pool: train``) or all of the pool (``pool: all``: FLAME,
   FedALA), optionally a stratified fraction of them (``subsample_fraction``, for CPU runs; the
   official test split is subsampled the same way where it is used).
2. The partition scheme (``conf/partition``,
   [`pflower.datasets.partitioners`][pflower.datasets.partitioners]) shares those
   samples among ``num_clients`` clients.
3. Each client's test share (``client_test``) is ``holdout`` (cut from its own share,
   ``test_fraction``, ``stratify``), ``mirror`` (drawn from the official test split with the class
   proportions of its train share, disjoint across clients: FLIU, FedMPR), ``partitioner`` (drawn
   by the scheme itself: DiversiFed) or ``file`` (each client's own test samples as a
   ``partition=from_file`` file lists them: PFLlib's and LEAF's per-client test files).
4. ``val_fraction`` carves a validation share out of each client's train share.
5. The global test set (``global_test``) is the union of the client test shares (pflower's
   default, as in FLIU, Sec. IV-B: "an aggregate data set, constructed from the individual client
   test sets") or the official test split (FedMPR).
6. ``evaluate_on: val`` (for choosing hyperparameters) puts each client's validation share in
   place of its test share, and their union in place of the global test set: every evaluation
   stage then scores validation data, and no test sample is read.

The index lists are computed by [`pflower.datasets.builder`][pflower.datasets.builder] and cached
once per machine
([`pflower.datasets.cache.cached_arrays`][pflower.datasets.cache.cached_arrays], keyed by the
labels, the arguments and pflower's
code fingerprint): the server computes them, and every client process reads them without
importing the partition schemes (Flower Datasets and its dependencies cost about 3 s and 200 MB
per process).

Schemes that give one sample to several clients (``disjoint: false``, see
[`SampleSharingScheme`][pflower.datasets.partitioners.SampleSharingScheme]) change steps 2-4: the
held-out
samples (``holdout`` tests, validation) are set aside in *reserves* before the scheme runs, and each
client's held-out shares are drawn from them with its train class mix (see
[`pflower.datasets.builder`][pflower.datasets.builder]). Cutting them from the overlapping shares
instead would make one
client's test samples other clients' training samples. Every federation's shares are checked
before they are stored and again when they are read
([`check_no_leak`][pflower.datasets.federation.check_no_leak]): no client test
sample and no global test sample is in any client's train or validation share, and no validation
sample is in any client's train share. The ``evaluate_on: val`` view is made after that check
(its test shares are the validation shares).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.cache import cached_arrays
from pflower.datasets.split import ClientSplit, Shares, SplitConfig, check_no_leak
from pflower.provenance import CODE_FINGERPRINT
from pflower.registry import ConfigError

__all__ = [
    "ClientSplit",
    "Federation",
    "InputNoise",
    "SplitConfig",
    "build_federation",
    "check_no_leak",
]


@dataclass(frozen=True)
class InputNoise:
    """Per-client Gaussian noise on normalized inputs: FLAME's quality skew (FLAME, Sec. VI-A).

    Client ``i`` adds noise of std ``std[i]`` (``sigma * i / K``; 0.0 = clean) to every normalized
    image it trains or evaluates on, test included. With ``fixed=False`` (FLAME's code) the noise is
    redrawn at every access; with ``fixed=True`` each sample's noise is drawn once, from a generator
    seeded by ``(seed, pool index)``, and so is the same in every epoch and on every machine.
    """

    std: tuple[float, ...]
    fixed: bool
    seed: int

    def apply(
        self,
        partition_id: int,
        images: torch.Tensor,
        indices: np.ndarray | torch.Tensor | tuple[()],
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``images`` (a normalized batch of client ``partition_id``) plus that client's noise.

        Args:
            partition_id: the client.
            images: normalized batch ``(B, C, H, W)``.
            indices: pool indices of the batch's samples (used when ``fixed``).
            generator: source of fresh noise when not ``fixed`` (default: torch's global one).
        """
        std = self.std[partition_id]
        if std == 0.0:
            return images
        if self.fixed:
            if len(indices) != len(images):
                raise ValueError(f"{len(indices)} indices for a batch of {len(images)} images")
            noise = torch.stack([self._sample_noise(int(i), images.shape[1:]) for i in indices])
        else:
            device = generator.device if generator is not None else images.device
            noise = torch.randn(images.shape, generator=generator, device=device)
        return images + std * noise.to(device=images.device, dtype=images.dtype)

    def _sample_noise(self, index: int, shape: torch.Size) -> torch.Tensor:
        state = np.random.SeedSequence([self.seed, index]).generate_state(1, np.uint64)[0]
        return torch.randn(shape, generator=torch.Generator().manual_seed(int(state)))


@dataclass(frozen=True)
class Federation:
    """A dataset, its pool (official train followed by official test) and each client's share.

    ``input_noise`` is set when the partition scheme perturbs inputs per client (quality skew);
    the client data path applies it to normalized batches, train and test.
    """

    dataset: ImageDataset
    pool: ImageSplit
    clients: tuple[ClientSplit, ...]
    global_test: np.ndarray
    input_noise: InputNoise | None = None

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def client_train(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].train)

    def client_test(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].test)

    def client_val(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].val)

    def global_test_split(self) -> ImageSplit:
        return self.pool.subset(self.global_test)


def build_federation(
    dataset: ImageDataset,
    num_clients: int,
    seed: int,
    partition: Mapping[str, Any],
    split: Mapping[str, Any],
) -> Federation:
    """Share ``dataset`` among ``num_clients`` clients; pure and deterministic in its arguments.

    The index lists come from the cache when this machine has computed them before (see the
    module docstring), else from
    [`pflower.datasets.builder.share_out`][pflower.datasets.builder.share_out].

    Args:
        dataset: the dataset with its official train/test split.
        num_clients: the number of clients.
        seed: drives the partition, the subsampling and the per-client splits.
        partition: the ``partition`` block, ``{name: <scheme>, <option>: ...}``.
        split: the ``conf/split/*.yaml`` block
            ([`SplitConfig`][pflower.datasets.federation.SplitConfig]).

    Raises:
        ConfigError: an invalid block, an impossible request, or a client left without
            training or test samples (the message says which and what to change).
    """
    config = SplitConfig.from_mapping(split)
    pool = _concat(dataset.train, dataset.test)
    labels = pool.labels.numpy()
    groups = None if pool.groups is None else pool.groups.numpy()

    def share() -> dict[str, np.ndarray]:
        from pflower.datasets.builder import share_out  # the schemes: only on a cache miss

        n_train = len(dataset.train)
        return share_out(labels, groups, n_train, num_clients, seed, partition, config).to_arrays()

    identity = _identity(dataset, labels, groups, num_clients, seed, partition, config)
    shares = cached_arrays("federations", identity, share, Shares.from_arrays)
    clients, global_test = shares.clients, shares.global_test
    noise = None
    if shares.noise_std is not None:
        noise = InputNoise(shares.noise_std, shares.fixed_noise, seed)
    if config.evaluate_on == "val":
        clients, global_test = _validation_view(clients, partition.get("name"))
    return Federation(dataset, pool, clients, global_test, noise)


def _identity(
    dataset: ImageDataset,
    labels: np.ndarray,
    groups: np.ndarray | None,
    num_clients: int,
    seed: int,
    partition: Mapping[str, Any],
    config: SplitConfig,
) -> dict[str, Any]:
    """Everything a federation's index lists depend on (the cache key).

    The schemes see labels and group tags only, never images; ``partition=from_file`` also
    reads its file, which counts by its resolved path and content. The code fingerprint covers
    pflower's own code, and the library versions the schemes and generators pflower draws on.
    ``evaluate_on`` only changes how the lists are viewed, so tuning and final runs share one
    entry.
    """
    identity = {
        "dataset": dataset.name,
        "n_train": len(dataset.train),
        "labels": _digest(labels),
        "groups": None if groups is None else _digest(groups),
        "num_clients": num_clients,
        "seed": seed,
        "partition": dict(partition),
        "split": {
            field.name: getattr(config, field.name)
            for field in fields(config)
            if field.name != "evaluate_on"
        },
        "code": CODE_FINGERPRINT,
        "libraries": {name: version(name) for name in ("numpy", "flwr-datasets", "datasets")},
    }
    if partition.get("name") == "from_file" and partition.get("path"):
        path = Path(str(partition["path"])).expanduser().resolve()
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        identity["partition_file"] = [str(path), content]
    return identity


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.int64).tobytes()).hexdigest()


def _validation_view(
    clients: tuple[ClientSplit, ...], scheme: Any
) -> tuple[tuple[ClientSplit, ...], np.ndarray]:
    """``split.evaluate_on=val``: each client's validation share in place of its test share, and
    their union in place of the global test set."""
    empty = [pid for pid, client in enumerate(clients) if not len(client.val)]
    if empty:
        raise ConfigError(
            f"partition '{scheme}' leaves clients {empty} without validation samples, and "
            "split.evaluate_on=val scores them: use a larger split.val_fraction or fewer clients"
        )
    view = tuple(ClientSplit(client.train, client.val, client.val) for client in clients)
    return view, np.unique(np.concatenate([client.val for client in clients]))


def _concat(train: ImageSplit, test: ImageSplit) -> ImageSplit:
    """Train followed by test; a split without groups gets group -1 ("none") if the other has.

    Splits read from the dataset cache are consecutive views of one memory-mapped array: their
    pool is a view of it too (no copy), so every process shares the same pages.
    """
    groups = None
    if train.groups is not None or test.groups is not None:
        groups = _join(_groups_or_none(train), _groups_or_none(test))
    return ImageSplit(_join(train.images, test.images), _join(train.labels, test.labels), groups)


def _join(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``torch.cat([first, second])``, as a view when ``second`` follows ``first`` in memory."""
    adjacent = (
        first.is_contiguous()
        and second.is_contiguous()
        and first.dtype == second.dtype
        and first.shape[1:] == second.shape[1:]
        and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        and first.storage_offset() + first.numel() == second.storage_offset()
    )
    if not adjacent:
        return torch.cat([first, second])
    shape = (first.shape[0] + second.shape[0], *first.shape[1:])
    return first.as_strided(
        shape, torch.empty(shape, device="meta").stride(), first.storage_offset()
    )


def _groups_or_none(split: ImageSplit) -> torch.Tensor:
    if split.groups is not None:
        return split.groups.to(torch.int64)
    return torch.full((len(split),), -1, dtype=torch.int64)
