r"""Shared machinery of the server-personalized methods that mix stored client models
(DiversiFed, FedAMP) and of those that keep one model per client on both sides (FedFomo,
FedProto, APPLE, FedCAC).

- [`ModelMixingStrategy`][pflower.strategies.model_mixing.ModelMixingStrategy]: sends every sampled
  client i its own $u_i = \sum _j Ξ_{ij} w_j$, an
  affine combination of the stored client models; a subclass gives $Ξ$ (DiversiFed's step on its
  model distance loss, FedAMP's attentive message passing);
- [`OwnModelClient`][pflower.strategies.model_mixing.OwnModelClient]: a client whose deployable
  model is its own, kept in ``context.state``;
- the server's arithmetic on flattened models ([`flatten`][pflower.strategies.model_mixing.flatten],
  [`unflatten`][pflower.strategies.model_mixing.unflatten],
  [`pairwise_distances`][pflower.strategies.model_mixing.pairwise_distances],
  [`mix`][pflower.strategies.model_mixing.mix]) over the trainable parameters
  ([`parameter_mask`][pflower.strategies.model_mixing.parameter_mask]);
- [`mean_of_stored`][pflower.strategies.model_mixing.mean_of_stored]: stage G's reference model for
  methods without a global model
  (labelled [`MEAN_OF_CLIENT_MODELS`][pflower.strategies.model_mixing.MEAN_OF_CLIENT_MODELS]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, TypeVar

import numpy as np
import torch
from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy
from pflower.core.aggregation import weighted_mean
from pflower.core.averaging import aggregation_weights
from pflower.core.declared import state
from pflower.core.options import OptionsT
from pflower.core.strategy import ClientUpdate

MEAN_OF_CLIENT_MODELS = "mean_of_client_models"
"""Stage G's ``model`` label when it scores
[`mean_of_stored`][pflower.strategies.model_mixing.mean_of_stored] (no global model)."""


class Neighbors(StrEnum):
    """The stored models a client's u_i mixes under partial participation (the set S of
    DiversiFed's Eq. 4)."""

    participants = "participants"
    """This round's participants (m = |S_t|)."""
    all_stale = "all_stale"
    """Every client's latest upload (Θ^0 for clients never sampled)."""


# ---------------------------------------------------------------------- flattened models
def flatten(weights: NDArrays, mask: Sequence[bool]) -> np.ndarray:
    """The arrays selected by ``mask`` (the trainable parameters), concatenated, float64."""
    parts = [
        np.asarray(a, dtype=np.float64).ravel() for a, m in zip(weights, mask, strict=True) if m
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, template: NDArrays, mask: Sequence[bool]) -> NDArrays:
    """``template`` with its ``mask``-selected arrays replaced by consecutive slices of
    ``vector`` (cast to each array's dtype); the other arrays are copied from ``template``."""
    out, offset = [], 0
    for array, selected in zip(template, mask, strict=True):
        if selected:
            out.append(
                vector[offset : offset + array.size].reshape(array.shape).astype(array.dtype)
            )
            offset += array.size
        else:
            out.append(np.array(array, copy=True))
    if offset != vector.size:
        raise ValueError(f"vector has {vector.size} entries, the template's parameters {offset}")
    return out


def pairwise_distances(vectors: np.ndarray, squared: bool = False) -> np.ndarray:
    """‖v_i − v_j‖₂ (or its square) for the rows of ``vectors``, from differences in float64
    (the Gram-matrix shortcut loses precision when models are close)."""
    count = len(vectors)
    out = np.zeros((count, count))
    for i in range(count):
        for j in range(i + 1, count):
            diff = vectors[i].astype(np.float64) - vectors[j].astype(np.float64)
            value = float(diff @ diff)
            out[i, j] = out[j, i] = value if squared else np.sqrt(value)
    return out


def mix(xi: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """U = Ξ W, accumulated in float64 row by row (W stays in its own dtype)."""
    out = np.zeros((xi.shape[0], vectors.shape[1]))
    for j in range(vectors.shape[0]):
        out += np.outer(xi[:, j], vectors[j].astype(np.float64))
    return out


def parameter_mask(strategy: PersonalizedStrategy, weights: NDArrays) -> list[bool]:
    """The strategy's trainable mask, or (if it was given none) every floating array."""
    if strategy.trainable_mask is not None:
        return list(strategy.trainable_mask)
    return [np.issubdtype(np.asarray(a).dtype, np.floating) for a in weights]


def mean_of_stored(strategy: PersonalizedStrategy) -> NDArrays:
    """Stage G's reference model for methods without a global model: the mean of the stored
    client models, weighted by training-set sizes or uniform (``strategy.aggregation``)."""
    store = strategy.client_models
    pids = store.partition_ids
    models = [store.get(pid, []) for pid in pids]  # every listed partition has a model
    sizes = [strategy.client_sizes.get(pid, 1) for pid in pids]
    return weighted_mean(models, aggregation_weights(strategy.options.aggregation, sizes))


# ----------------------------------------------- shared by the server-personalized methods
@dataclass
class MixingOptions(AlgorithmOptions):
    """The option every model-mixing method has (see
    [`ModelMixingStrategy`][pflower.strategies.model_mixing.ModelMixingStrategy])."""

    neighbors: Neighbors = Neighbors.participants


MixingOptionsT = TypeVar("MixingOptionsT", bound=MixingOptions)


class ModelMixingStrategy(PersonalizedStrategy[MixingOptionsT]):
    """Sends every sampled client i its own u_i = Σ_j Ξ_ij w_j, an affine combination of the
    stored client models w_j (Θ^0 for a client never sampled) over the trainable parameters
    (buffers copied from the client's stored model). Subclasses give Ξ
    ([`mixing`][pflower.strategies.model_mixing.ModelMixingStrategy.mixing]):
    DiversiFed's step on L_M (Eq. 6), FedAMP's attentive message passing. No global model:
    stage G evaluates the mean of the stored models. The neighbor set follows
    ``options.neighbors`` (this round's participants, or every client's latest upload)."""

    keeps_client_models: ClassVar[bool] = True
    global_model_label: ClassVar[str | None] = MEAN_OF_CLIENT_MODELS
    robust_aggregation: ClassVar[bool] = False

    initial_weights: NDArrays = state(factory=lambda strategy: strategy.global_weights)
    """Θ^0, the stored model of a client never sampled."""
    last_mixing: tuple[list[int], np.ndarray] | None = state()
    """The neighbor set and Ξ of the latest round (for logs and tests)."""

    def neighbor_ids(self, partition_ids: list[int]) -> list[int]:
        if self.options.neighbors == Neighbors.participants:
            return sorted(partition_ids)
        return sorted(set(self.client_sizes) | set(partition_ids))

    def mixing(self, server_round: int, neighbors: list[int], vectors: np.ndarray) -> np.ndarray:
        """Ξ (rows sum to 1) for the flattened float32 models ``vectors`` of ``neighbors``."""
        raise NotImplementedError

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays]:
        neighbors = self.neighbor_ids(partition_ids)
        models = {pid: self.client_models.get(pid, self.initial_weights) for pid in neighbors}
        mask = parameter_mask(self, self.initial_weights)
        vectors = np.stack([flatten(models[pid], mask).astype(np.float32) for pid in neighbors])
        xi = self.mixing(server_round, neighbors, vectors)
        self.last_mixing = (neighbors, xi)
        targets = mix(xi, vectors)
        row = {pid: index for index, pid in enumerate(neighbors)}
        return {pid: unflatten(targets[row[pid]], models[pid], mask) for pid in partition_ids}

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        return mean_of_stored(self)


def initial_weights_untouched(client: PersonalClient) -> NDArrays:
    """Θ^0, rebuilt from the seed, leaving the global torch RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        return client.experiment.initial_weights()


class OwnModelClient(PersonalClient[OptionsT]):
    """A client whose deployable model is its own, kept in ``context.state`` under
    `model_key` (all ``state_dict`` arrays) and Θ^0 before its first round: it trains
    from it, stores the trained model, and evaluates it at stage L1."""

    model_key: ClassVar[str]

    def own_model(self) -> NDArrays:
        """The stored model, or Θ^0 before the client's first round."""
        stored = self.state.get_arrays(self.model_key)
        return stored if stored is not None else initial_weights_untouched(self)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.own_model()

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(self.model_key, trained)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.own_model()
