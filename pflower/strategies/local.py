"""Local training only (the papers' CLT / "Separate" baseline).

Every client trains its own model on its own data, starting from the common $Θ^0$, and never adopts
anything from the server. The server still averages the uploaded models, only to report stage G
(the uniform average of the local models; the FLIU paper's CLT, Sec. IV, reports no global
model, so this stage G is pflower's addition for comparison).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm

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


@register_algorithm("local", strategy=LocalStrategy, client=LocalClient)
@dataclass
class LocalOptions(AlgorithmOptions):
    """Local training has only the common options; ``aggregation`` applies to stage G alone."""

    display_name: ClassVar[str] = "Local"
    display_rank: ClassVar[int] = 1000
