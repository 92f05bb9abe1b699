"""FedPer: Arivazhagan, Aggarwal, Singh and Choudhary, "Federated Learning with Personalization
Layers", arXiv:1912.00818, 2019 (Sec. 3, Algorithm 1).

The model is split into base layers W_B, shared through FedAvg, and personalization layers W_P
(the head), which never leave the client. Each round client j starts from the received base and
its own W_P (Alg. 1: "W_B ← received", W_P kept), trains both jointly with SGD for the round's
local epochs, and uploads W_B only; the server averages the bases weighted by n_j. Stage L1
evaluates received base + own head.

The split is the zoo's declaration (:mod:`pflower.models.split`: the head ``fc``), so FedPer runs
on every model. The class :class:`SplitClient` here is the shared client half of the split-model
family (FedPer, FedRep, FedBN): an algorithm names its personal arrays (:meth:`personal_mask`)
and the rest of the protocol follows.

What crosses the wire: server → client the full global model (``server-round`` in the config;
the personal arrays in it are Θ^0's, used only as a client's initial head); client → server the
shared arrays, with an empty array in place of each personal one (the base's ``partial_uploads``
mechanism: the server averages each array over the clients that sent it). Client state:
``split_personal``, the client's personal arrays after its last training.

Deviation: the global model has no meaningful head, so there is no stage G.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.core.algorithm import register_algorithm
from pflower.core.client import PersonalClient
from pflower.core.options import AlgorithmOptions
from pflower.core.strategy import PersonalizedStrategy
from pflower.models import split

PERSONAL = "split_personal"


class SplitStrategy(PersonalizedStrategy[Any]):
    """FedAvg over the arrays clients share; personal arrays never reach the server."""

    has_global_model: ClassVar[bool] = False
    partial_uploads: ClassVar[bool] = True


class SplitClient(PersonalClient[Any]):
    """Keeps the arrays of :meth:`personal_mask` locally and shares the others."""

    def personal_mask(self) -> list[bool]:
        """Per ``state_dict`` entry: True for an array that stays on the client."""
        return split.head_mask(self.model)

    def with_personal(self, global_weights: NDArrays) -> NDArrays:
        """The received model with this client's personal arrays (none yet: the received ones)."""
        stored = self.state.get_arrays(PERSONAL)
        if stored is None:
            return global_weights
        mask = self.personal_mask()
        personal = iter(stored)
        return [
            next(personal) if keep else glob
            for keep, glob in zip(mask, global_weights, strict=True)
        ]

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.with_personal(global_weights)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.with_personal(global_weights)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        personal = [
            array for keep, array in zip(self.personal_mask(), trained, strict=True) if keep
        ]
        if personal:
            self.state.put_arrays(PERSONAL, personal)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return [
            np.empty((0,), dtype=array.dtype) if keep else array
            for keep, array in zip(self.personal_mask(), trained, strict=True)
        ]


class FedPerStrategy(SplitStrategy):
    """FedAvg over the base layers (Alg. 1, server)."""


class FedPerClient(SplitClient):
    """Trains base and personal head jointly; uploads the base."""


@register_algorithm("fedper", strategy=FedPerStrategy, client=FedPerClient)
@dataclass
class FedPerOptions(AlgorithmOptions):
    """FedPer has only the common options; the head is the model's declared head."""

    display_name: ClassVar[str] = "FedPer"
    display_rank: ClassVar[int] = 200
