"""What the server and every client derive from one composed configuration.

Both sides build the same federation (dataset, partition, per-client splits) deterministically from
the config, so nothing but model weights and small configs crosses the wire. Building it is
expensive (reading files, Sinkhorn iterations), and Flower creates a client object per message, so
experiments are cached per process, keyed by the resolved configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch
from flwr.common import NDArrays
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pflower.client.training import Prepare, TrainSettings, get_weights
from pflower.config import options_of
from pflower.datasets.base import ImageSplit
from pflower.datasets.federation import Federation, build_federation
from pflower.datasets.loaders import load_dataset
from pflower.models import build_model
from pflower.strategies.registry import AlgorithmOptions, build_algorithm


@dataclass(frozen=True)
class ClientData:
    """Everything one client trains and evaluates on."""

    partition_id: int
    train: ImageSplit
    test: ImageSplit
    val: ImageSplit
    global_test: ImageSplit
    prepare: Prepare


class Experiment:
    """The federation, model factory and algorithm options of one composed config."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    @classmethod
    def of(cls, cfg: DictConfig) -> Experiment:
        """The (per-process cached) experiment for ``cfg``."""
        return _cached_experiment(OmegaConf.to_yaml(cfg, resolve=True))

    @cached_property
    def federation(self) -> Federation:
        dataset = load_dataset(self.cfg.dataset.name, options_of(self.cfg.dataset))
        return build_federation(
            dataset,
            num_clients=self.cfg.num_clients,
            seed=self.cfg.seed,
            partition=OmegaConf.to_container(self.cfg.partition, resolve=True),
            split=OmegaConf.to_container(self.cfg.split, resolve=True),
        )

    @cached_property
    def algorithm(self) -> AlgorithmOptions:
        return build_algorithm(self.cfg.strategy)

    @cached_property
    def global_test(self) -> ImageSplit:
        """The global test set, stratified-subsampled if ``eval.global_test_max_samples`` is set."""
        split = self.federation.global_test_split()
        limit = self.cfg.eval.global_test_max_samples
        if limit is None or limit >= len(split):
            return split
        return split.subset(_stratified_subsample(split.labels.numpy(), limit, self.cfg.seed))

    def new_model(self) -> nn.Module:
        """A freshly initialized model; the seed makes Θ^0 identical wherever it is built."""
        torch.manual_seed(self.cfg.seed)
        dataset = self.federation.dataset
        return build_model(
            self.cfg.model.name,
            options_of(self.cfg.model),
            dataset.input_shape,
            dataset.num_classes,
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
            global_test=self.global_test,
            prepare=prepare,
            **splits,
        )

    def train_settings(self, server_round: int) -> TrainSettings:
        """Local training settings of round ``server_round`` (learning rate decayed per round)."""
        train = self.cfg.train
        return TrainSettings(
            epochs=train.local_epochs,
            steps=train.local_steps,
            batch_size=train.batch_size,
            optimizer=train.optimizer,
            lr=train.lr * train.lr_decay ** (server_round - 1),
            momentum=train.momentum,
            weight_decay=train.weight_decay,
        )

    def is_eval_round(self, server_round: int) -> bool:
        """Stages L1/L2/G are evaluated every ``eval.every`` rounds and always in the last."""
        return server_round % self.cfg.eval.every == 0 or server_round == self.cfg.rounds


def _already_prepared(images: torch.Tensor) -> torch.Tensor:
    return images


@lru_cache(maxsize=4)
def _cached_experiment(resolved_yaml: str) -> Experiment:
    cfg = OmegaConf.create(resolved_yaml)
    assert isinstance(cfg, DictConfig)
    return Experiment(cfg)


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
