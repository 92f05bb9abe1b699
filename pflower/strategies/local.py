"""Local training only (the papers' CLT / "Separate" baseline).

Every client trains its own model on its own data, starting from the common Θ^0, and never adopts
anything from the server. The server still averages the uploaded models, only to report stage G
(FLIU spec §3.2, A14: the uniform average of the local models).
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.common import NDArrays, Scalar

from pflower.client.base import PersonalClient
from pflower.strategies.base import PersonalizedStrategy
from pflower.strategies.registry import ALGORITHMS, AlgorithmOptions

LOCAL_MODEL = "local_model"


class LocalStrategy(PersonalizedStrategy["LocalOptions"]):
    """Averages the local models for reporting only; clients never use the average."""


class LocalClient(PersonalClient["LocalOptions"]):
    """Keeps its model in ``context.state``; the server's model is used only in round 1 (Θ^0)."""

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.state.get_arrays(LOCAL_MODEL) or global_weights

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(LOCAL_MODEL, trained)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.state.get_arrays(LOCAL_MODEL) or global_weights


@ALGORITHMS.register("local")
@dataclass(frozen=True)
class LocalOptions(AlgorithmOptions):
    strategy_class = LocalStrategy
    client_class = LocalClient
