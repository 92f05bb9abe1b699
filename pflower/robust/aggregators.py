"""Robust aggregation of client models, by Flower's implementations
(``flwr.server.strategy.aggregate``) and one update transformation:

- ``multi_krum`` (Blanchard et al., NeurIPS 2017): each of the n vectors is scored by the sum of
  its squared L2 distances to its n − f − 2 nearest other vectors; the n − f lowest-scoring
  vectors are averaged (weighted as the strategy weighs clients). f is the number of malicious
  clients, assumed known (``robust.num_malicious``, default: the attack's);
- ``trimmed_mean``: per coordinate, the mean after cutting ⌊β·n⌋ values at each end
  (``robust.trim_fraction`` = β);
- ``median``: per coordinate, the median;
- ``norm_clip``: norm-difference clipping (Sun et al., "Can You Really Backdoor Federated
  Learning?", 2019): each update Δ_i = x_i − x, a client's vector minus the current global model x,
  is scaled down to an L2 norm of at most M = c · median_j ‖Δ_j‖ (``robust.clip_factor`` = c; the
  median bound is the adaptive clipping of Nguyen et al., "FLAME: Taming Backdoors in Federated
  Learning", USENIX Security 2022, not the FLAME of Zhu et al. implemented in
  [`pflower.strategies.flame`][pflower.strategies.flame]), then the strategy takes its own mean of x
  + Δ_i (`clip_update_norms`). Since the median is taken over the round's clients, the bound holds
  while fewer than half of them are hostile; a finite but huge update (a model scaled by 1e30, which
  passes the server's NaN/Inf check) then moves the global model no further than a typical honest
  update.

`idle` says when a configured aggregator cannot act on the number of vectors it gets, which
the compose-time check refuses and the server logs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def assumed_malicious(config: RobustConfig, attackers: int) -> int:
    """Multi-Krum's f: ``robust.num_malicious``, else ``attackers`` (the attack's malicious
    clients)."""
    return attackers if config.num_malicious is None else config.num_malicious


def robust_average(
    config: RobustConfig,
    arrays: Sequence[NDArrays],
    weights: Sequence[float],
    num_malicious: int,
) -> NDArrays:
    """The robust aggregate of ``arrays`` under ``config`` (cast back to the arrays' dtypes):
    Multi-Krum, trimmed mean or median; ``norm_clip`` transforms the updates instead
    (`clip_update_norms`) and leaves the mean to the strategy."""
    if config.name == RobustKind.multi_krum:
        combined = multi_krum(arrays, weights, assumed_malicious(config, num_malicious))
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


def robust_average_partial(
    config: RobustConfig,
    arrays: Sequence[NDArrays],
    weights: Sequence[float],
    num_malicious: int,
    current: NDArrays,
) -> NDArrays:
    """`robust_average` where clients may leave arrays out (an empty array in its place,
    ``partial_uploads``): the arrays are grouped by the clients that sent them, each group is
    aggregated over its senders as one vector, and ``current``'s array is kept where no client
    sent one (a head or BatchNorm layer every client keeps to itself)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, layer in enumerate(zip(*arrays, strict=True)):
        sent = tuple(i for i, a in enumerate(layer) if a.size > 0 or current[index].size == 0)
        groups.setdefault(sent, []).append(index)
    combined = [np.array(array, copy=True) for array in current]
    for senders, indices in groups.items():
        if not senders:
            continue
        part = robust_average(
            config,
            [[arrays[i][index] for index in indices] for i in senders],
            [weights[i] for i in senders],
            num_malicious,
        )
        for index, array in zip(indices, part, strict=True):
            combined[index] = array
    return combined


def clip_update_norms(
    arrays: Sequence[NDArrays], reference: NDArrays, factor: float
) -> list[NDArrays]:
    """Each vector of ``arrays`` whose update (its difference from ``reference``) has an L2 norm
    above ``factor`` × the median of the updates' norms, moved back along that update to that
    bound; the others unchanged, array for array.

    The norm runs over the floating arrays, in float64 (a 1e30 entry squares to 1e60 without
    overflow); integer arrays (BatchNorm's batch counters) and empty arrays (a personal array
    the client keeps, ``partial_uploads``) are kept as they are. Clipped arrays are cast back to
    their dtype.
    """
    deltas = [
        [
            np.asarray(array, np.float64) - base
            if array.size > 0 and np.issubdtype(array.dtype, np.floating)
            else None
            for array, base in zip(vector, reference, strict=True)
        ]
        for vector in arrays
    ]
    norms = [
        math.sqrt(sum(float(np.sum(np.square(d))) for d in delta if d is not None))
        for delta in deltas
    ]
    bound = factor * float(np.median(norms))
    clipped = []
    for vector, delta, norm in zip(arrays, deltas, norms, strict=True):
        if norm <= bound:
            clipped.append(list(vector))
            continue
        scale = bound / norm
        clipped.append(
            [
                array if d is None else (base + scale * d).astype(array.dtype)
                for array, base, d in zip(vector, reference, delta, strict=True)
            ]
        )
    return clipped


_AT_LEAST_3 = "aggregate at least 3 clients per round (num_clients, fraction, min_clients)"


@dataclass(frozen=True)
class Idle:
    """Why a robust aggregator would give the plain mean of the vectors it gets."""

    reason: str
    """What the aggregator does with these numbers, and how to make it act (one line)."""
    refused: bool
    """Whether composing refuses the configuration (else the server logs ``reason``)."""


def idle(config: RobustConfig, clients: int, attackers: int, per_round: str) -> Idle | None:
    """Whether ``config``, given ``clients`` vectors a round, leaves them all as they are, so
    that the strategy's plain mean results and one huge update decides the global model.

    ``attackers``: the malicious clients of ``attack`` (Multi-Krum's f unless
    ``robust.num_malicious`` is set); ``per_round``: how the strategy arrives at ``clients``,
    quoted in the message.

    - ``trimmed_mean`` with ⌊β·n⌋ = 0 (β = ``trim_fraction``) cuts nothing: refused, since the
      user asked for a defense that, for this federation, is the mean under another name;
    - ``median`` and ``norm_clip`` with n ≤ 2: the median of two values is their mean, so one of
      two clients sets the result (or the bound): refused;
    - ``multi_krum`` with f = 0 keeps all n − 0 vectors. Refused when f = 0 is written
      (``robust.num_malicious=0``). Logged, not refused, when f = 0 comes from ``attack=none`` or
      ``attack.fraction=0``: Multi-Krum assumes f known, and with no attacker configured the mean
      is what it prescribes; the attack-free point of a robustness study is this very run. The
      message names ``robust.num_malicious``, which makes it act against clients the attack
      configuration does not declare.
    """
    n = clients
    name = config.name
    if name == RobustKind.trimmed_mean:
        cut = int(config.trim_fraction * n)  # as Flower's _trim_mean cuts
        if cut > 0:
            return None
        fix = (
            f"set robust.trim_fraction >= {math.ceil(100 / n) / 100:g} to cut one, or use "
            f"robust=median or robust=norm_clip"
            if n >= 3
            else _AT_LEAST_3
        )
        return Idle(
            f"robust=trimmed_mean cuts int(trim_fraction x clients) = "
            f"int({config.trim_fraction:g} x {n}) = 0 values at each end of every coordinate "
            f"over {per_round}: it is the plain mean; {fix}",
            refused=True,
        )
    if name in (RobustKind.median, RobustKind.norm_clip) and n <= 2:
        return Idle(
            f"robust={name} over {per_round} is their plain mean (the median of {n} values "
            f"is their mean): {_AT_LEAST_3}",
            refused=True,
        )
    if name == RobustKind.multi_krum:
        f = assumed_malicious(config, attackers)
        if f > 0:
            return None
        source = (
            "robust.num_malicious=0"
            if config.num_malicious is not None
            else "robust.num_malicious=null and no malicious client in attack"
        )
        return Idle(
            f"robust=multi_krum with f = 0 ({source}) keeps all n - f = {n} of {per_round}: it "
            f"is the plain mean and stops no hostile client; set robust.num_malicious to the "
            f"number of hostile clients to tolerate (>= 1), or use robust=median or "
            f"robust=norm_clip",
            refused=config.num_malicious is not None,
        )
    return None
