r"""FLIU: Federated Learning with Individualized Updates.

Hussaini, Theiß and Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical
Analysis of Personalized Federated Learning in Heterogeneous Data Environments", Sec. III.

FedAvg plus one client-side step. After the server averages the clients' trained models into $Θ^t$
(uniformly, 1/K, as in Alg. 1), client k replaces its model with

$$
\tilde θ_k^t = γ_k θ_k^t + (1 − γ_k) Θ^t \qquad \text{(Eq. 3)}
$$

where $θ_k^t$ is its own trained model of round t. $θ̃_k^t$ is evaluated at stage L1 (Fig. 1) and is
the start model of round t+1. $γ_k$ is fixed (FLIUxx: $γ$ = xx/100, Sec. IV) or, in adaptive mode, a
step function of the client's size $n_k$ relative to n/K (Eq. 4; ">" checked top-down, so
$n_k$ = n/K gives 0.25).

Identities: $γ = 0$ is FedAvg with uniform aggregation, $γ = 1$ is local training (CLT).

What crosses the wire: clients upload $θ_k^t$ and $n_k$, never the mixed model (Alg. 1 averages the
trained models). The server learns n and K from the clients' reported sizes and sends them in
every fit and evaluate config (keys ``n_total`` and ``num_clients``), so clients can compute $γ_k$.
The client keeps $θ_k^t$ in its state (``fliu_local``); the mix is recomputed wherever it is needed
(evaluate at round t, fit at round t+1), so evaluate never writes state and nothing relies on
evaluate having run.

Deviation: none in the algorithm. Alg. 1 leaves the round-1 start model implicit; every client
starts from the common $Θ^0$.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.options import Aggregation

LOCAL_MODEL = "fliu_local"
META = "fliu_meta"

ADAPTIVE_STEPS = ((10.0, 0.90), (5.0, 0.75), (1.0, 0.50), (0.5, 0.25))
"""(size ratio n_k / m, γ) of Eq. 4, checked top-down with strict ">"; below all: γ = 0.10."""


class GammaMode(StrEnum):
    """How γ_k is chosen."""

    adaptive = "adaptive"
    """Eq. 4, from the client's relative data size."""
    fixed = "fixed"
    """``gamma`` for every client (FLIU10 ... FLIU90)."""


def adaptive_gamma(num_examples: int, total_examples: int, num_clients: int) -> float:
    """γ_k of Eq. 4 from the client's training-set size n_k, n = Σ n_k and K."""
    mean_size = total_examples / num_clients
    for ratio, gamma in ADAPTIVE_STEPS:
        if num_examples > ratio * mean_size:
            return gamma
    return 0.10


def mix(gamma: float, local: NDArrays, global_: NDArrays) -> NDArrays:
    """Eq. 3, elementwise on every array: γ·local + (1 − γ)·global."""
    return [
        (gamma * own + (1.0 - gamma) * glob).astype(glob.dtype)
        for own, glob in zip(local, global_, strict=True)
    ]


class FLIUStrategy(PersonalizedStrategy["FLIUOptions"]):
    """FedAvg server that also tells clients n = Σ n_k and K for the adaptive γ."""

    def _population(self) -> dict[str, Scalar]:
        sizes = self.client_sizes
        if not sizes:
            return {}
        return {"n_total": sum(sizes.values()), "num_clients": len(sizes)}

    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        return {**super().fit_config(server_round, partition_id), **self._population()}

    def evaluate_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        return {**super().evaluate_config(server_round, partition_id), **self._population()}


class FLIUClient(PersonalClient["FLIUOptions"]):
    """Keeps θ_k^t (its last trained model) and mixes it with each new global model."""

    def gamma(self, config: dict[str, Scalar]) -> float:
        if self.options.gamma_mode == GammaMode.fixed:
            return self.options.gamma
        return adaptive_gamma(
            len(self.data.train), int(config["n_total"]), int(config["num_clients"])
        )

    def individualized(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """θ̃_k = γ_k θ_k + (1 − γ_k) Θ; before the client has trained, just Θ (round-1 Θ^0)."""
        local = self.state.get_arrays(LOCAL_MODEL)
        if local is None:
            return global_weights
        return mix(self.gamma(config), local, global_weights)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.individualized(global_weights, config)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(LOCAL_MODEL, trained)
        self.state.put_scalars(META, {"last_round": server_round(config)})

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.individualized(global_weights, config)

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        if self.options.gamma_mode == GammaMode.fixed or "n_total" in config:
            return {"gamma": self.gamma(config)}
        return {}


@register_algorithm("fliu", strategy=FLIUStrategy, client=FLIUClient)
@dataclass
class FLIUOptions(AlgorithmOptions):
    """Attributes:
    gamma_mode: ``adaptive`` (Eq. 4 from n_k) or ``fixed`` (``gamma`` for every client).
    gamma: the fixed personalization factor γ in [0, 1] (FLIU10 = 0.1, ...).
    aggregation: uniform 1/K as in Alg. 1 (default), or weighted by n_k (an ablation).
    """

    display_name: ClassVar[str] = "FLIU"
    display_rank: ClassVar[int] = 100
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("gamma_mode", "fixed"), ("gamma", 0.0))),
        Collapse("local", (("gamma_mode", "fixed"), ("gamma", 1.0))),
    )  # γ = 0 is FedAvg, γ = 1 local training

    gamma_mode: GammaMode = GammaMode.adaptive
    gamma: float = 0.5
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.gamma <= 1.0, f"strategy.gamma must be in [0, 1], got {self.gamma}")

    def label(self) -> str:
        """``FLIU`` (adaptive γ) or ``FLIUxx`` for the fixed γ = xx/100."""
        if self.gamma_mode == GammaMode.adaptive:
            return self.display_name
        return f"{self.display_name}{round(100 * self.gamma, 4):g}"

    def label_keys(self) -> tuple[str, ...]:
        """The label names the mode, and γ when it is fixed (adaptive FLIU ignores ``gamma``)."""
        if self.gamma_mode == GammaMode.adaptive:
            return ("gamma_mode",)
        return ("gamma_mode", "gamma")

    def variant_rank(self) -> float:
        """FLIU (adaptive) first, then FLIUxx by ascending γ."""
        return -1.0 if self.gamma_mode == GammaMode.adaptive else self.gamma
