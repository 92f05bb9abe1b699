"""What the server and every client derive from one composed configuration.

Both sides build the same federation (dataset, partition, per-client splits) deterministically from
the config, so nothing but model weights and small configs crosses the wire. Building it is
expensive (reading files, Sinkhorn iterations), and Flower creates a client object per message, so
experiments are cached per process, keyed by the resolved configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from flwr.common import NDArrays
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pflower.blocks import typed_settings
from pflower.config import AttackKind, ClientGlobalTest
from pflower.core.augment import Augmentation
from pflower.core.training import Prepare, TrainSettings, get_weights, resolve_device
from pflower.datasets.base import ImageSplit
from pflower.datasets.federation import Federation, build_federation
from pflower.datasets.loaders import load_dataset
from pflower.models import build_model
from pflower.registry import name_and_options
from pflower.robust.attacks import malicious_set, poisoned_labels


@dataclass(frozen=True)
class ClientData:
    """Everything one client trains and evaluates on."""

    partition_id: int
    train: ImageSplit
    test: ImageSplit
    val: ImageSplit
    global_test: ImageSplit
    prepare: Prepare


_CACHED_EXPERIMENTS = 4
_EXPERIMENTS: dict[str, Experiment] = {}
"""Experiments built in this process, oldest first (a per-process cache, never client state)."""
_BY_IDENTITY: dict[int, tuple[DictConfig, Experiment]] = {}
"""The same experiments by ``id`` of the read-only config they were asked for with."""


class Experiment:
    """The federation and the model factory of one composed config, and its typed settings."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.settings = typed_settings(cfg)

    @classmethod
    def of(cls, cfg: DictConfig) -> Experiment:
        """The (per-process cached) experiment for ``cfg``, keyed by its resolved YAML.

        A read-only ``cfg`` is found by identity first: the ClientApp gets the same read-only
        object for every Flower message
        ([`config_from_run_config`][pflower.compose.config_from_run_config]), and rendering its
        YAML again took about a sixth of a small client's time per message."""
        readonly = OmegaConf.is_readonly(cfg) is True
        if readonly and (known := _BY_IDENTITY.get(id(cfg))) is not None and known[0] is cfg:
            return known[1]
        key = OmegaConf.to_yaml(cfg, resolve=True)
        if key not in _EXPERIMENTS:
            if len(_EXPERIMENTS) >= _CACHED_EXPERIMENTS:
                del _EXPERIMENTS[next(iter(_EXPERIMENTS))]
            _EXPERIMENTS[key] = cls(cfg)
        experiment = _EXPERIMENTS[key]
        if readonly:
            if len(_BY_IDENTITY) >= _CACHED_EXPERIMENTS:
                del _BY_IDENTITY[next(iter(_BY_IDENTITY))]
            _BY_IDENTITY[id(cfg)] = (cfg, experiment)  # holding cfg keeps its id unique
        return experiment

    @cached_property
    def federation(self) -> Federation:
        settings = self.settings
        dataset = load_dataset(*name_and_options(settings.dataset))
        return build_federation(
            dataset,
            num_clients=settings.num_clients,
            seed=settings.seed,
            partition=settings.partition,
            split=settings.split,
        )

    def client_global_test(self, partition_id: int) -> ImageSplit:
        """The samples on which client ``partition_id`` measures Acc(G)
        (``eval.client_global_test``): its own slice, or the subsample all clients share."""
        if self.settings.eval.client_global_test == ClientGlobalTest.subsample:
            return self.global_test
        federation = self.federation
        return federation.pool.subset(federation.global_test[self._slices[partition_id]])

    @cached_property
    def _slices(self) -> list[np.ndarray]:
        federation = self.federation
        labels = federation.pool.labels.numpy()[federation.global_test]
        limit = self.settings.eval.global_test_max_samples or None
        return _stratified_slices(labels, federation.num_clients, limit, self.settings.seed)

    @cached_property
    def global_test(self) -> ImageSplit:
        """The stratified subsample of the global test set that every client shares under
        ``eval.client_global_test=subsample``: ``eval.global_test_max_samples`` samples (the same
        for every client and round), or the whole set (null or 0, or a set no larger). Stage G
        uses [`server_test`][pflower.core.experiment.Experiment.server_test]."""
        return self._global_test_sample(self.settings.eval.global_test_max_samples)

    @cached_property
    def server_test(self) -> ImageSplit:
        """What stage G evaluates on the server: the whole global test set, or a stratified
        subsample of ``eval.server_test_max_samples`` samples (the same in every round)."""
        return self._global_test_sample(self.settings.eval.server_test_max_samples)

    def _global_test_sample(self, limit: int | None) -> ImageSplit:
        """``limit`` samples of the global test set with its class proportions, drawn with the
        run's seed, or the whole set (``limit`` null or 0, or no smaller than the set).

        The subsample is taken from the pool directly, so a worker that only needs it never
        copies the whole set (the same samples as subsampling
        [`full_global_test`][pflower.core.experiment.Experiment.full_global_test])."""
        federation = self.federation
        if not limit or limit >= len(federation.global_test):
            return self.full_global_test
        labels = federation.pool.labels.numpy()[federation.global_test]
        chosen = _stratified_subsample(labels, limit, self.settings.seed)
        return federation.pool.subset(federation.global_test[chosen])

    @cached_property
    def full_global_test(self) -> ImageSplit:
        """The whole global test set (stage G on the server by default)."""
        return self.federation.global_test_split()

    @cached_property
    def device(self) -> torch.device:
        """Where this process runs models (``train.device``; see
        [`resolve_device`][pflower.core.experiment.resolve_device])."""
        return resolve_device(self.settings.train.device)

    def new_model(self) -> nn.Module:
        """A freshly initialized model; the seed makes Θ^0 identical wherever it is built."""
        torch.manual_seed(self.settings.seed)
        dataset = self.federation.dataset
        return build_model(
            *name_and_options(self.settings.model),
            dataset.input_shape,
            dataset.num_classes,
            dataset.vocab_size,
        )

    def shared_model(self) -> nn.Module:
        """One model instance per process that clients reuse across messages.

        Every client loads its weights into it before use (``set_weights``), so reusing it only
        saves rebuilding the module for every Flower message.
        """
        return self._shared_model

    @cached_property
    def _shared_model(self) -> nn.Module:
        return self.new_model()

    def initial_weights(self) -> NDArrays:
        """Θ^0, the model every client starts from."""
        return get_weights(self.new_model())

    def prepare(self) -> Prepare:
        """Batch preparation of clean data (the server, the global test set): normalization."""
        return self.federation.dataset.normalize

    def client_data(self, partition_id: int) -> ClientData:
        """The train/test/validation shares of client ``partition_id`` and the global test set.

        Under quality skew (``federation.input_noise``) the client's own data carries its Gaussian
        noise on normalized inputs: redrawn for every batch by default, or, with fixed noise,
        drawn once per sample here. The global test set stays clean.
        """
        federation = self.federation
        if not 0 <= partition_id < federation.num_clients:
            raise ValueError(
                f"partition-id {partition_id} is outside 0..{federation.num_clients - 1}"
            )
        shares = federation.clients[partition_id]
        splits = {
            name: federation.pool.subset(getattr(shares, name)) for name in ("train", "test", "val")
        }
        settings = self.settings
        if settings.attack.name == AttackKind.label_flip and partition_id in malicious_set(
            settings.attack, settings.seed, federation.num_clients
        ):  # label poisoning: a malicious client trains on random labels
            train = splits["train"]
            labels = poisoned_labels(
                train.labels.numpy(), federation.dataset.num_classes, settings.seed, partition_id
            )
            splits["train"] = ImageSplit(train.images, torch.from_numpy(labels), train.groups)
        normalize = federation.dataset.normalize
        prepare: Prepare = normalize
        noise = federation.input_noise
        if noise is not None and noise.std[partition_id] > 0.0:
            if noise.fixed:
                splits = {
                    name: ImageSplit(
                        noise.apply(partition_id, normalize(split.images), getattr(shares, name)),
                        split.labels,
                        split.groups,
                    )
                    for name, split in splits.items()
                }
                prepare = _already_prepared
            else:

                def prepare(images: torch.Tensor) -> torch.Tensor:
                    return noise.apply(partition_id, normalize(images), indices=())

        return ClientData(
            partition_id=partition_id,
            global_test=self.client_global_test(partition_id),
            prepare=prepare,
            **splits,
        )

    def train_settings(self, server_round: int) -> TrainSettings:
        """Local training settings of round ``server_round`` (learning rate decayed per round)."""
        train = self.settings.train
        return TrainSettings(
            epochs=train.local_epochs,
            steps=train.local_steps,
            batch_size=train.batch_size,
            optimizer=train.optimizer,
            lr=train.lr_at(server_round),
            momentum=train.momentum,
            weight_decay=train.weight_decay,
            amp=str(train.amp),
            channels_last=train.channels_last,
            data_on_device=train.data_on_device,
            augment=Augmentation(**dataclasses.asdict(train.augment)),
        )


def _already_prepared(images: torch.Tensor) -> torch.Tensor:
    return images


def _stratified_slices(
    labels: np.ndarray, count: int, limit: int | None, seed: int
) -> list[np.ndarray]:
    """``count`` disjoint slices of the positions of ``labels`` (seeded): each class, shuffled,
    is dealt round-robin over the slices, continuing where the previous class stopped, so slice
    sizes and every class's count in a slice differ by at most one. A slice longer than
    ``limit`` keeps the samples that come first within their class, which keeps the class
    proportions. With more slices than samples, slice i holds one sample, the
    (i mod len)-th of a seeded permutation."""
    rng = np.random.default_rng(seed)
    if count > len(labels):
        order = rng.permutation(len(labels))
        return [order[[i % len(labels)]] for i in range(count)]
    owner = np.empty(len(labels), dtype=np.int64)
    rank = np.empty(len(labels))
    dealt = 0
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        position = np.arange(len(members))
        owner[members] = (dealt + position) % count
        rank[members] = (position + 0.5) / len(members)
        dealt += len(members)
    by_owner = np.lexsort((rank, owner))
    bounds = np.cumsum(np.bincount(owner, minlength=count))[:-1]
    return [np.sort(mine[:limit]) for mine in np.split(by_owner, bounds)]


def _stratified_subsample(labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """``limit`` indices with the class proportions of ``labels`` (largest remainder), seeded."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    quotas = counts * limit / len(labels)
    take = np.floor(quotas).astype(int)
    remainder = limit - int(take.sum())
    take[np.argsort(-(quotas - take), kind="stable")[:remainder]] += 1
    chosen = [
        rng.choice(np.flatnonzero(labels == cls), size=n, replace=False)
        for cls, n in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(chosen))
