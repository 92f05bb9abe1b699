"""Robust aggregation of client models, by Flower's implementations
(``flwr.server.strategy.aggregate``):

- ``multi_krum`` (Blanchard et al., NeurIPS 2017): each of the n vectors is scored by the sum of
  its squared L2 distances to its n − f − 2 nearest other vectors; the n − f lowest-scoring
  vectors are averaged (weighted as the strategy weighs clients). f is the number of malicious
  clients, assumed known (``robust.num_malicious``, default: the attack's);
- ``trimmed_mean``: per coordinate, the mean after cutting ⌊β·n⌋ values at each end
  (``robust.trim_fraction`` = β);
- ``median``: per coordinate, the median.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.common import NDArrays
from flwr.server.strategy.aggregate import (
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)

from pflower.config import RobustConfig, RobustKind


def multi_krum(
    arrays: Sequence[NDArrays], weights: Sequence[float], num_malicious: int
) -> NDArrays:
    """Mean of the n − f vectors with the lowest Krum scores (at least one)."""
    results = [(list(a), w) for a, w in zip(arrays, weights, strict=True)]
    to_keep = max(1, len(results) - num_malicious)
    # Flower annotates the weights as int sample counts; it only multiplies by them, and ours may
    # be fractional (re-weighted clients), so they are passed as they are.
    return aggregate_krum(results, num_malicious=num_malicious, to_keep=to_keep)  # type: ignore[arg-type]  # see above


def robust_average(
    config: RobustConfig,
    arrays: Sequence[NDArrays],
    weights: Sequence[float],
    num_malicious: int,
) -> NDArrays:
    """The robust aggregate of ``arrays`` under ``config`` (cast back to the arrays' dtypes)."""
    if config.name == RobustKind.multi_krum:
        f = num_malicious if config.num_malicious is None else config.num_malicious
        combined = multi_krum(arrays, weights, f)
    elif config.name == RobustKind.trimmed_mean:
        combined = aggregate_trimmed_avg([(list(a), 1) for a in arrays], config.trim_fraction)
    elif config.name == RobustKind.median:
        combined = aggregate_median([(list(a), 1) for a in arrays])
    else:
        raise ValueError(f"robust '{config.name}' is not a robust aggregator")
    return [
        np.asarray(c).astype(reference.dtype)
        for c, reference in zip(combined, arrays[0], strict=True)
    ]
