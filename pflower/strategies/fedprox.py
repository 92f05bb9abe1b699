r"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020.

Each client k approximately minimizes $h_k(w; w^t) = F_k(w) + \frac{μ}{2}\|w − w^t\|^2$ (Sec. 3,
Alg. 2) with the round's local SGD, where $w^t$ is the global model it received; the server averages
as FedAvg does. The proximal term covers the trainable parameters; BatchNorm statistics are not
parameters and are left to the data.

Deviation: Alg. 2 lets clients run a variable number of local steps ($γ$-inexact solutions); here
every client runs the configured epochs or steps, as in the paper's experiments with no
stragglers. $μ = 0$ is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from flwr.common import NDArrays, Scalar

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.training import Regularizer
from pflower.searchspace import tunable
from pflower.strategies.proximal import proximal_to


class FedProxStrategy(PersonalizedStrategy["FedProxOptions"]):
    """Server side identical to FedAvg."""


ProxOptionsT = TypeVar("ProxOptionsT", bound="FedProxOptions")


class FedProxClient(PersonalClient[ProxOptionsT]):
    """Adds the proximal term ``mu/2 ||w - w_global||^2`` to the local loss."""

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        return proximal_to(self.model, global_weights, self.options.mu)


def tunable_mu(default: float) -> float:
    """The tunable ``mu`` field: FedProx's proximal weight μ with ``default``, searched on a log
    scale over 1e-4..1 (FedProx, Sec. 5.2: μ in {0.001, 0.01, 0.1, 1})."""
    return tunable(
        default,
        low=1e-4,
        high=1.0,
        log=True,
        source="FedProx (Li et al., MLSys 2020), Sec. 5.2: μ in {0.001, 0.01, 0.1, 1}",
    )


@register_algorithm("fedprox", strategy=FedProxStrategy, client=FedProxClient)
@dataclass
class FedProxOptions(AlgorithmOptions):
    """Attributes:
    mu: weight μ of the proximal term (0 gives FedAvg).
    """

    display_name: ClassVar[str] = "FedProx"
    display_rank: ClassVar[int] = 1
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("mu", 0.0),)),
    )  # μ = 0 is FedAvg

    mu: float = tunable_mu(0.01)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.mu >= 0, f"strategy.mu must be >= 0, got {self.mu}")
