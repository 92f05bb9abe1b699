"""FedPer: Arivazhagan, Aggarwal, Singh and Choudhary, "Federated Learning with Personalization
Layers", arXiv:1912.00818, 2019 (Sec. 3, Algorithm 1).

The model is split into base layers $W_B$, shared through FedAvg, and personalization layers $W_P$
(the head), which never leave the client. Each round client j starts from the received base and
its own $W_P$ (Alg. 1: "$W_B$ ← received", $W_P$ kept), trains both jointly with SGD for the round's
local epochs, and uploads $W_B$ only; the server averages the bases weighted by $n_j$. Stage L1
evaluates received base + own head.

The split is the zoo's declaration ([`pflower.models.split`][pflower.models.split]: the head
``fc``), so FedPer runs
on every model. FedPer is the split-model family's protocol
([`pflower.strategies.split`][pflower.strategies.split])
with the head as the personal arrays.

What crosses the wire: server → client the full global model (``server-round`` in the config;
the head in it is $Θ^0$'s, used only as a client's initial head); client → server the base, with
an empty array in place of each head array. Client state: ``split_personal``, the client's head
after its last training.

Deviation: the global model has no meaningful head, so there is no stage G.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pflower.api import AlgorithmOptions, register_algorithm
from pflower.strategies.split import SplitClient, SplitStrategy


class FedPerStrategy(SplitStrategy):
    """FedAvg over the base layers (Alg. 1, server)."""


class FedPerClient(SplitClient):
    """Trains base and personal head jointly; uploads the base."""


@register_algorithm("fedper", strategy=FedPerStrategy, client=FedPerClient)
@dataclass
class FedPerOptions(AlgorithmOptions):
    """FedPer has only the common options; the head is the model's declared head."""

    display_name: ClassVar[str] = "FedPer"
    display_rank: ClassVar[int] = 200
