"""Averages of client models: the arithmetic every averaging strategy shares.

Computed in float64 and cast back to each array's dtype, so that identities between algorithms
(FLIU with γ = 0 and FedAvg, for instance) hold exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.common import NDArrays


def weighted_mean(arrays: Sequence[NDArrays], weights: np.ndarray) -> NDArrays:
    """Elementwise ``sum_i w_i x_i / sum_i w_i`` over lists of arrays, in float64, cast back."""
    total = float(np.sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must have a positive sum")
    averaged = []
    for layer in zip(*arrays, strict=True):
        acc = np.zeros(layer[0].shape, dtype=np.float64)
        for weight, array in zip(weights, layer, strict=True):
            acc += (weight / total) * array
        averaged.append(acc.astype(layer[0].dtype))
    return averaged


def weighted_mean_partial(
    arrays: Sequence[NDArrays], weights: np.ndarray, current: NDArrays
) -> NDArrays:
    """[`weighted_mean`][pflower.core.aggregation.weighted_mean] per array over the clients that
    sent it (a non-empty array; the
    weights renormalized over them), ``current``'s array where no client did. Equal to
    [`weighted_mean`][pflower.core.aggregation.weighted_mean] when every client sent every array."""
    averaged = []
    for index, layer in enumerate(zip(*arrays, strict=True)):
        sent = [i for i, array in enumerate(layer) if array.size > 0 or current[index].size == 0]
        if not sent:
            averaged.append(np.array(current[index], copy=True))
            continue
        averaged.extend(weighted_mean([[layer[i]] for i in sent], weights[sent]))
    return averaged
