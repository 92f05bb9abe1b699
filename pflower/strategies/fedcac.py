r"""FedCAC: Wu, Liu, Niu, Zhu, Tang, Li and Cao, "Bold but Cautious: Unlocking the Potential of
Personalized Federated Learning through Cautiously Aggressive Collaboration", ICCV 2023 (a
baseline of the DiversiFed paper by the same authors, Wu et al., Sec. V-B).

Every round (the paper's method section and Alg. 1):

- client i starts from $θ_i^{start} = M_i$ ⊙ $θ_i^{cust}$ + (1 − $M_i$) ⊙ $θ^{glob}$, its critical
  parameters (mask $M_i$ of its previous round) from its customized model and the rest from the
  global model (round 1, or a client without a mask: $θ^{glob}$), and trains locally;
- it measures each trainable parameter's sensitivity s = |Δθ ⊙ $θ$| with Δθ =
  $θ_{trained} − θ_{start}$ (the first-order estimate of the loss change if the parameter were
  reset) and marks the top ``tau_c`` fraction of every layer (each trainable array) as critical:
  $M_i$;
- server: the overlap of critical sets, $O_{ij} = 1 − \sum $|$M_i − M_j$| / (2 $\sum  M_i$); the
  round's threshold $h_t$ = mean + (t/$β$)(max − mean) over the off-diagonal $O_{ij}$ (t = server
  round, so the collaboration gets more cautious each round); client i's collaborators $C_i$ = {i} ∪
  {j : $O_{ij} ≥ h_t$}; its customized model $θ_i^{cust}$ = mean of the stored models of $C_i$;
  $θ^{glob}$ = FedAvg of the round's uploads (sample-weighted, ``aggregation``). Once t > $β$ the
  threshold exceeds the largest overlap and every client's customized model is its own.

What crosses the wire: fit sends ``[θ^glob arrays, θ_i^cust arrays]`` (two ``state_dict``
lists, concatenated; $θ^{cust} = θ^{glob}$ before the client's first upload); config
``server-round``. The client uploads ``[θ_trained arrays, M_i arrays]`` (one 0/1 float32 array per
trainable parameter). Server state: the base class's ClientModelStore (each client's latest
model and mask) and the global model; stage G evaluates $θ^{glob}$. Client state:
``fedcac_mask`` $(M_i)$ and ``fedcac_personal`` ($θ_{trained}$, evaluated at stage L1: the
personalized model is the locally trained one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.aggregation import weighted_mean
from pflower.core.declared import state
from pflower.core.strategy import ClientUpdate
from pflower.core.training import trainable_mask
from pflower.searchspace import tunable
from pflower.strategies.model_mixing import parameter_mask

MASK = "fedcac_mask"
PERSONAL = "fedcac_personal"


def critical_mask(start: np.ndarray, trained: np.ndarray, tau_c: float) -> np.ndarray:
    """1 for the top ``tau_c`` fraction of |(θ_trained − θ_start) ⊙ θ_trained| (ties: lower
    index first), else 0; float32, the shape of the layer."""
    sensitivity = np.abs((trained.astype(np.float64) - start) * trained).ravel()
    count = int(tau_c * sensitivity.size)
    mask = np.zeros(sensitivity.size, dtype=np.float32)
    if count > 0:
        mask[np.argsort(-sensitivity, kind="stable")[:count]] = 1.0
    return mask.reshape(trained.shape)


def overlaps(masks: list[np.ndarray]) -> np.ndarray:
    """O_ij = 1 − Σ|M_i − M_j| / (2 Σ M_i) for flattened masks."""
    count = len(masks)
    out = np.ones((count, count))
    for i in range(count):
        total = max(float(masks[i].sum()), 1.0)
        for j in range(count):
            if i != j:
                out[i, j] = 1.0 - float(np.abs(masks[i] - masks[j]).sum()) / (2.0 * total)
    return out


def collaborators(overlap: np.ndarray, server_round: int, beta: float) -> list[list[int]]:
    """C_i = {i} ∪ {j : O_ij ≥ mean + (t/β)(max − mean)} over the off-diagonal overlaps."""
    count = len(overlap)
    if count < 2:
        return [[i] for i in range(count)]
    off = overlap[~np.eye(count, dtype=bool)]
    threshold = off.mean() + (server_round / beta) * (off.max() - off.mean())
    return [[j for j in range(count) if j == i or overlap[i, j] >= threshold] for i in range(count)]


class FedCACStrategy(PersonalizedStrategy["FedCACOptions"]):
    """Global FedAvg model plus one customized model per client from its collaborators."""

    keeps_client_models: ClassVar[bool] = True

    last_collaborators: dict[int, list[int]] = state({})
    """Each client's collaborators in the latest round (partition ids)."""

    def _split(self, upload: NDArrays) -> tuple[NDArrays, np.ndarray]:
        size = len(self.global_weights)
        return upload[:size], np.concatenate([m.ravel() for m in upload[size:]])

    def check_update(self, weights: NDArrays, current: NDArrays) -> str | None:
        mask = parameter_mask(self, current)
        if len(weights) != len(current) + sum(mask):
            return f"sent {len(weights)} arrays, expected the model and its masks"
        return super().check_update(weights[: len(current)], current)

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays]:
        known = self.client_models.partition_ids
        customized: dict[int, NDArrays] = {}
        if known:
            split = {pid: self._split(self.client_models.model(pid)) for pid in known}
            groups = collaborators(
                overlaps([split[pid][1] for pid in known]), server_round, self.options.beta
            )
            for row, pid in enumerate(known):
                members = [known[k] for k in groups[row]]
                self.last_collaborators[pid] = members
                customized[pid] = weighted_mean(
                    [split[m][0] for m in members], np.ones(len(members))
                )
        return {
            pid: [*global_weights, *customized.get(pid, global_weights)] for pid in partition_ids
        }

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        size = len(current)
        models = [update.model_part(size) for update in updates]
        return self.average(models)


class FedCACClient(PersonalClient["FedCACOptions"]):
    """Starts from its critical parameters of the customized model; uploads model and mask."""

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        size = len(global_weights) // 2
        glob, custom = global_weights[:size], global_weights[size:]
        stored = self.state.get_arrays(MASK)
        if stored is None:
            self._start = list(glob)
            return self._start
        masks = iter(stored)
        start = []
        for g, c, trainable in zip(glob, custom, trainable_mask(self.model), strict=True):
            if trainable:
                m = next(masks)
                start.append((m * c + (1 - m) * g).astype(g.dtype))
            else:
                start.append(g)
        self._start = start
        return start

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self._masks = [
            critical_mask(s, t, self.options.tau_c)
            for s, t, m in zip(self._start, trained, trainable_mask(self.model), strict=True)
            if m
        ]
        self.state.put_arrays(MASK, self._masks)
        self.state.put_arrays(PERSONAL, trained)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return [*trained, *self._masks]

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        stored = self.state.get_arrays(PERSONAL)
        return stored if stored is not None else global_weights


_SEARCH_SOURCE = "FedCAC (Wu et al., ICCV 2023), Sec. 5: sensitivity of τ and β"
"""Where the search ranges of τ and β come from."""


@register_algorithm("fedcac", strategy=FedCACStrategy, client=FedCACClient)
@dataclass
class FedCACOptions(AlgorithmOptions):
    """Attributes:
    tau_c: fraction of each layer's parameters marked critical.
    beta: β, how fast the collaboration threshold rises from the mean to the max overlap.
    """

    display_name: ClassVar[str] = "FedCAC"
    display_rank: ClassVar[int] = 45

    tau_c: float = tunable(0.5, low=0.1, high=0.9, source=_SEARCH_SOURCE)
    beta: float = tunable(100.0, low=1.0, high=300.0, log=True, source=_SEARCH_SOURCE)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 <= self.tau_c <= 1, f"strategy.tau_c must be in [0, 1], got {self.tau_c}")
        require(self.beta > 0, f"strategy.beta must be > 0, got {self.beta}")
