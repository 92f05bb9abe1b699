"""Shared machinery of the split-model family: FedPer, FedRep, FedBN (and FedRep-ALA).

Each method divides the model's ``state_dict`` arrays into *shared* ones, averaged by the server,
and *personal* ones, which never leave the client: the head for FedPer and FedRep
([`pflower.models.split.head_mask`][pflower.models.split.head_mask]), the BatchNorm layers for FedBN
([`pflower.models.split.batchnorm_mask`][pflower.models.split.batchnorm_mask]). An algorithm names
its personal arrays
([`SplitClient.personal_mask`][pflower.strategies.split.SplitClient.personal_mask]) and the rest of
the protocol follows:

- the client starts its round, and is evaluated at stage L1, from the received shared arrays
  and its own personal ones (the received ones before it has trained);
- after training it keeps its personal arrays in ``context.state`` under ``split_personal``;
- it uploads the shared arrays, with an empty array (size 0) in place of each personal one;
  the server ([`SplitStrategy`][pflower.strategies.split.SplitStrategy], the base's
  ``partial_uploads``) averages each array over
  the clients that sent it and keeps the current global array where none did.

What crosses the wire: server → client the full global model (``server-round`` in the config;
the personal arrays in it are $Θ^0$'s, used only as a client's initial personal arrays); client →
server the shared arrays. The global model has no meaningful personal arrays, so there is no
stage G.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import PersonalClient, PersonalizedStrategy
from pflower.models import split

PERSONAL = "split_personal"
"""Client state: the client's personal arrays after its last training (``state_dict`` order)."""


def shared_arrays(arrays: NDArrays, personal: Sequence[bool]) -> NDArrays:
    """``arrays`` with an empty array (size 0, same dtype) in place of each ``personal`` one: the
    upload of a client that keeps those arrays (the base's ``partial_uploads``)."""
    return [
        np.empty((0,), dtype=array.dtype) if keep else array
        for keep, array in zip(personal, arrays, strict=True)
    ]


class SplitStrategy(PersonalizedStrategy[Any]):
    """FedAvg over the arrays clients share; personal arrays never reach the server."""

    has_global_model: ClassVar[bool] = False
    partial_uploads: ClassVar[bool] = True


class SplitClient(PersonalClient[Any]):
    """Keeps the arrays of [`personal_mask`][pflower.strategies.split.SplitClient.personal_mask]
    locally and shares the others."""

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
        return shared_arrays(trained, self.personal_mask())
