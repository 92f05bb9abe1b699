"""Attacks of the FLAME paper's robustness study (Zhu et al., Sec. VI-B3), after Ditto (Li et al.,
ICML 2021, Sec. 4):

- ``label_flip`` (label poisoning): the client trains honestly on labels drawn uniformly from the C
  classes (once per sample, seeded);
- ``same_value``: it uploads c·1, one scalar c ~ N(0, σ²) per round;
- ``sign_flip``: it uploads −|c|·w, the received model sign-flipped and rescaled, c ~ N(0, σ²);
- ``gaussian``: it uploads a vector drawn from N(0, σ² I).

A model-poisoning client skips local training and leaves its state untouched; the attack vector
replaces the whole upload, redrawn every round. σ is ``attack.noise_std`` (the paper's variance
0.1 gives the default σ = √0.1). The malicious set is chosen once per seed, uniformly without
replacement, with |M| = max(1, ⌊fraction·m⌋) (the authors' code), by
[`malicious_ids`][pflower.robust.attacks.malicious_ids], which
the server (to leave malicious clients unscored) and the clients (to act) both call.
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays

from pflower.config import AttackConfig, AttackKind

MODEL_POISONING = (AttackKind.same_value, AttackKind.sign_flip, AttackKind.gaussian)
_STREAM = 0xA77AC
"""Separates the attack's random streams from every other use of the seed."""


def malicious_ids(seed: int, num_clients: int, fraction: float) -> frozenset[int]:
    """The malicious partition ids: max(1, ⌊fraction·m⌋) of m, drawn without replacement from
    ``seed``; none when ``fraction`` is 0."""
    if fraction <= 0.0:
        return frozenset()
    count = min(num_clients, max(1, int(fraction * num_clients)))
    rng = np.random.default_rng([seed, _STREAM])
    return frozenset(int(i) for i in rng.choice(num_clients, size=count, replace=False))


def malicious_set(attack: AttackConfig, seed: int, num_clients: int) -> frozenset[int]:
    """The malicious clients of a run (none without an attack)."""
    if attack.name == AttackKind.none:
        return frozenset()
    return malicious_ids(seed, num_clients, attack.fraction)


def poisoned_upload(
    attack: AttackConfig, received: NDArrays, seed: int, server_round: int, partition_id: int
) -> NDArrays:
    """What a model-poisoning client uploads in ``server_round`` instead of its update."""
    rng = np.random.default_rng([seed, _STREAM, server_round, partition_id])
    sigma = attack.noise_std
    if attack.name == AttackKind.same_value:
        c = rng.normal(0.0, sigma)
        return [np.full_like(array, c) for array in received]
    if attack.name == AttackKind.sign_flip:
        c = abs(rng.normal(0.0, sigma))
        return [(-c * array.astype(np.float64)).astype(array.dtype) for array in received]
    if attack.name == AttackKind.gaussian:
        return [rng.normal(0.0, sigma, size=array.shape).astype(array.dtype) for array in received]
    raise ValueError(f"attack '{attack.name}' does not replace the upload")


def poisoned_labels(
    labels: np.ndarray, num_classes: int, seed: int, partition_id: int
) -> np.ndarray:
    """Label poisoning: a label drawn uniformly from the classes for every sample (fixed)."""
    rng = np.random.default_rng([seed, _STREAM, partition_id])
    return rng.integers(0, num_classes, size=len(labels)).astype(np.asarray(labels).dtype)
