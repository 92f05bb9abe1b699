r"""FedALA: Zhang, Hua, Wang, Song, Xue, Ma and Guan, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023 (Algorithm 1), and ALA on FedProx (Table 4).

FedALA is FedAvg with one client-side change: the local model is initialized by the ALA module
([`pflower.strategies.ala`][pflower.strategies.ala], Eq. 4 and 5) instead of being overwritten by
the global model
$Θ^{t-1}$. Client i then trains $Θ̂_i^t$ for the round's local epochs (Alg. 1 line 19) and uploads
$Θ_i^t$; the server averages $Θ^t = \sum _i (k_i / \sum _j k_j) Θ_i^t$ over the round's clients with
$k_i$ = |$D_i$| (line 21), as FedAvg does. Stage L1 evaluates the ALA-initialized local model $Θ̂_i$
built from the latest global model (the paper evaluates "the best local models"; the authors'
code evaluates $Θ̂_i$ before local training); stage L2 the trained $Θ_i^t$.

``fedrep_ala`` is FedRep + ALA (Table 4): only the body is downloaded, so ALA mixes the received
body into the client's old body; the "higher layers" are the top ``layer_idx`` parameter tensors
of the body, and the client's head is untouched by ALA (FedRep's head and body epochs follow
unchanged, the body is uploaded). With ``layer_idx = 0`` it is FedRep exactly on models without
buffers (with buffers, ALA keeps the body's local buffers where FedRep takes the received ones).

``fedprox_ala`` is FedProx + ALA (Table 4, "Applicability of ALA"): the ALA-initialized model is
the start of FedProx's local training; the proximal anchor stays the received global model, and
the server is FedAvg's. With ``mu = 0`` it is FedALA exactly.

``ditto_ala`` is Ditto + ALA (Table 4, where ALA gives Ditto its largest gain): ALA initializes
the client's copy of the global model, which Ditto's global step then trains and uploads, and that
ALA-initialized model is also the anchor of the personal step's proximal term (what replacing the
global model's ``set_parameters`` with ALA does in the authors' Ditto client). Stage L1 evaluates
the personal model $v_k$, as Ditto does (ALA never touches $v_k$), so ALA runs when the client next
trains (the start of iteration t + 1, where Alg. 1 puts it) rather than at evaluation. With
``layer_idx = 0`` it is Ditto exactly.

What crosses the wire: exactly FedAvg's (the full model each way, ``server-round`` in the
config); the client reports ``ala_epochs``, ``ala_seconds``, and after its initial stage
``ala_start_epochs`` and ``ala_capped`` with its fit metrics. Client state: ``ala_local``,
``ala_weights`` and ``ala_meta`` (see [`pflower.strategies.ala`][pflower.strategies.ala]).

Deviations: (1) a client that has not trained yet has no local model: ALA stays deactivated for
it (local := global) and its initial stage waits until it has trained once; the authors' code
detects the first round by comparing the first tensor of the two models, which for $ρ < 1$ treats a
never-selected client's initial model as a local model. (2) Flower evaluates after aggregation,
so the initial stage runs at the stage-L1 evaluation of round 1 (Alg. 1 places it at the start of
iteration 2, on the same models). (3) ``max_start_epochs`` caps the initial stage (the paper's
convergence loop has no cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, Collapse, PersonalizedStrategy, register_algorithm
from pflower.core.client import server_round
from pflower.models import split
from pflower.strategies.ala import ALAClientMixin, ALAFields
from pflower.strategies.ditto import DittoClient, DittoOptions
from pflower.strategies.fedavg import FedAvgClient
from pflower.strategies.fedprox import FedProxClient, FedProxOptions
from pflower.strategies.fedrep import FedRepClient, FedRepOptions, FedRepStrategy


class FedALAStrategy(PersonalizedStrategy["FedALAOptions"]):
    """Server side identical to FedAvg (Alg. 1 line 21)."""


class FedALAClient(ALAClientMixin, FedAvgClient):
    """FedAvg's client with ALA initialization (Alg. 1 lines 9-17)."""


@register_algorithm("fedala", strategy=FedALAStrategy, client=FedALAClient)
@dataclass
class FedALAOptions(AlgorithmOptions, ALAFields):
    """FedALA's options are the ALA options ([`ALAFields`][pflower.strategies.ala.ALAFields]):
    eta (η), rand_percent (s), layer_idx (p in parameter tensors; 2 = the paper's p = 1),
    threshold, num_pre_loss, max_start_epochs, ala_batch_size, adapt_after_start."""

    display_name: ClassVar[str] = "FedALA"
    display_rank: ClassVar[int] = 400

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ala()


class FedProxALAStrategy(PersonalizedStrategy["FedProxALAOptions"]):
    """Server side identical to FedAvg."""


class FedProxALAClient(ALAClientMixin, FedProxClient["FedProxALAOptions"]):
    """FedProx's client with ALA initialization; the proximal anchor is the received model."""


@register_algorithm("fedprox_ala", strategy=FedProxALAStrategy, client=FedProxALAClient)
@dataclass
class FedProxALAOptions(FedProxOptions, ALAFields):
    """FedProx's ``mu`` plus the ALA options of FedALA."""

    display_name: ClassVar[str] = "FedProx+ALA"
    display_rank: ClassVar[int] = 401
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedala", (("mu", 0.0),)),
    )  # μ = 0 is FedALA

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ala()


class FedRepALAStrategy(FedRepStrategy):
    """FedRep's server: the average of the uploaded bodies."""


class FedRepALAClient(ALAClientMixin, FedRepClient):
    """FedRep's client whose body is initialized by ALA (the head is FedRep's own)."""

    def ala_candidates(self) -> list[str]:
        prefix = split.head_name(self.model) + "."
        return [name for name, _ in self.model.named_parameters() if not name.startswith(prefix)]


@register_algorithm("fedrep_ala", strategy=FedRepALAStrategy, client=FedRepALAClient)
@dataclass
class FedRepALAOptions(FedRepOptions, ALAFields):
    """FedRep's ``head_epochs`` plus the ALA options of FedALA (``layer_idx`` counts body
    tensors)."""

    display_name: ClassVar[str] = "FedRep+ALA"
    display_rank: ClassVar[int] = 402

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ala()


class DittoALAStrategy(PersonalizedStrategy["DittoALAOptions"]):
    """Server side identical to FedAvg (Ditto's)."""


class DittoALAClient(ALAClientMixin, DittoClient):
    """Ditto's client whose copy of the global model is initialized by ALA; the personal step is
    pulled toward that ALA-initialized model."""

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """Ditto's deployable model v_k: ALA initializes the global-model copy, not v_k."""
        return super(ALAClientMixin, self).personalize(global_weights, config)

    def personal_anchor(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """ALA(w^t, local) of this round (computed by
        [`start_model`][pflower.strategies.fedala.DittoALAClient.start_model], read back)."""
        return self.ala_initialized(global_weights, server_round(config) - 1, config)


@register_algorithm("ditto_ala", strategy=DittoALAStrategy, client=DittoALAClient)
@dataclass
class DittoALAOptions(DittoOptions, ALAFields):
    """Ditto's ``lambda_``, ``personal_epochs`` ... plus the ALA options of FedALA."""

    display_name: ClassVar[str] = "Ditto+ALA"
    display_rank: ClassVar[int] = 403

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ala()
