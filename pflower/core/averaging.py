"""How the server combines client models into one.

[`ModelAveraging`][pflower.core.averaging.ModelAveraging] is the FedAvg mean (McMahan et al.,
AISTATS 2017) that most algorithms' ``aggregate`` calls, weighted by the clients' sample counts
or uniform (``options.aggregation``), or, with ``robust=<name>``, the robust aggregate of
[`pflower.robust.aggregators`][pflower.robust.aggregators] in its place. Where an algorithm's
clients may leave personal arrays out of an upload (``partial_uploads``), each array is
combined over the clients that sent it and the current global array is kept where none did.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.common import NDArrays

from pflower.config import RobustConfig, RobustKind
from pflower.core.aggregation import weighted_mean, weighted_mean_partial
from pflower.core.options import Aggregation
from pflower.core.policy import ClientUpdate
from pflower.robust.aggregators import clip_update_norms, robust_average, robust_average_partial


def aggregation_weights(aggregation: Aggregation, sizes: Sequence[float]) -> np.ndarray:
    """The weights of a mean of client models: each client's training-set size, or 1 for every
    client where ``aggregation`` is ``uniform``."""
    if aggregation == Aggregation.uniform:
        return np.ones(len(sizes))
    return np.array(sizes, dtype=np.float64)


class ModelAveraging:
    """The mean of client models a strategy computes (see the module docstring).

    Parameters
    ----------
    aggregation:
        Sample-weighted or uniform (the algorithm's ``options.aggregation``).
    robust:
        The run's ``robust`` group (``none``: the plain mean).
    attackers:
        The number of malicious clients of ``attack`` (Multi-Krum's f unless
        ``robust.num_malicious`` is set).
    partial_uploads:
        Whether uploads may leave arrays out (the strategy's ``partial_uploads``).
    """

    def __init__(
        self, aggregation: Aggregation, robust: RobustConfig, attackers: int, partial_uploads: bool
    ) -> None:
        self.aggregation = aggregation
        self.robust = robust
        self.attackers = attackers
        self.partial_uploads = partial_uploads

    def client_weights(self, updates: Sequence[ClientUpdate]) -> np.ndarray:
        """Each update's weight in the mean: its sample count, or 1 (``uniform``)."""
        return aggregation_weights(self.aggregation, [u.num_examples for u in updates])

    def mean(self, arrays: Sequence[NDArrays], weights: np.ndarray, current: NDArrays) -> NDArrays:
        """The weighted mean of client models (over the clients that sent each array, keeping
        ``current``'s where none did, if uploads may be partial)."""
        if self.partial_uploads:
            return weighted_mean_partial(arrays, weights, current)
        return weighted_mean(arrays, weights)

    def robust_mean(
        self, arrays: Sequence[NDArrays], weights: np.ndarray, current: NDArrays
    ) -> NDArrays:
        """The ``robust`` aggregate (Multi-Krum, trimmed mean, median) of client models.
        ``norm_clip`` clips each model's update from the current global model ``current``
        ([`clip_update_norms`][pflower.robust.aggregators.clip_update_norms]) and takes the mean
        with ``weights``. Where uploads may be partial, each array is aggregated over the clients
        that sent it and the current global array kept where none did, as `mean` does."""
        robust = self.robust
        if robust.name == RobustKind.norm_clip:
            return self.mean(
                clip_update_norms(arrays, current, robust.clip_factor), weights, current
            )
        if self.partial_uploads:
            return robust_average_partial(robust, arrays, list(weights), self.attackers, current)
        return robust_average(robust, arrays, list(weights), self.attackers)
