"""What an algorithm's Strategy declares about itself, and the per-client hooks it overrides.

[`StrategyHooks`][pflower.core.hooks.StrategyHooks] is the part of
[`PersonalizedStrategy`][pflower.core.strategy.PersonalizedStrategy] an algorithm module writes
to, in the manner of FL-bench's declarative methods: class attributes that say what the algorithm
keeps and sends (a global model, every client's upload, partial uploads, text metrics, whether a
robust aggregator can replace its mean), and hooks with defaults that give FedAvg's behaviour
(what each client trains on and is sent, what it must upload). The protocol that calls them,
the aggregation hook ([`aggregate`][pflower.core.strategy.PersonalizedStrategy.aggregate]) and
the collaborators live in [`pflower.core.strategy`][pflower.core.strategy].
"""

from __future__ import annotations

from typing import ClassVar

from flwr.common import NDArrays, Parameters, Scalar
from flwr.server.client_proxy import ClientProxy

from pflower.config import ExperimentConfig, RobustKind
from pflower.core.sampling import sample_size
from pflower.robust.aggregators import Idle, idle
from pflower.robust.attacks import malicious_set


class StrategyHooks:
    """Declarations and per-client hooks of an algorithm's server half (see the module
    docstring); every default is FedAvg's."""

    has_global_model: ClassVar[bool] = True
    """Whether the algorithm keeps a global model (evaluated at stage G)."""

    keeps_client_models: ClassVar[bool] = False
    """Whether the server keeps every client's latest upload
    ([`client_models`][pflower.core.strategy.PersonalizedStrategy.client_models])."""

    global_model_label: ClassVar[str | None] = None
    """Recorded with stage G as ``model`` when what ``aggregate`` returns is not a global model
    the algorithm trains (e.g. ``mean_of_client_models`` for methods without one)."""

    partial_uploads: ClassVar[bool] = False
    """Whether clients may leave personal arrays out of a fit upload by sending an empty array
    (size 0) in their place (split models: FedPer/FedRep keep the head, FedBN the BatchNorm
    layers). [`average`][pflower.core.strategy.PersonalizedStrategy.average] then averages each
    array over the clients that sent it and keeps the
    current global array where none did."""

    robust_aggregation: ClassVar[bool] = True
    """Whether ``robust=<name>`` changes what the server computes: `aggregate` combines
    client models through `average` or `robust_mean`. An algorithm that combines
    them otherwise (per-client mixtures, prototypes, masked means) or adopts one client's model
    sets False, and composing then refuses ``robust=`` (`idle_robust`)."""

    text_metrics: ClassVar[frozenset[str]] = frozenset()
    """Metrics the algorithm's clients report as text (every other metric is a number)."""

    def fit_clients(self, server_round: int, sampled: list[ClientProxy]) -> list[ClientProxy]:
        """The clients that train this round, from the seeded sample (default: all of it)."""
        return sampled

    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """The config sent with client ``partition_id``'s fit instruction."""
        return {"server-round": server_round}

    def evaluate_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """The config sent with client ``partition_id``'s evaluate instruction (stage L1)."""
        return {"server-round": server_round}

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """The model sent to client ``partition_id`` (default: the global model)."""
        return global_parameters

    def evaluate_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """The arrays sent with client ``partition_id``'s evaluate instruction (default: those of
        [`client_parameters`][pflower.core.hooks.StrategyHooks.client_parameters]);
        algorithms that send more than a model to train override it."""
        return self.client_parameters(server_round, partition_id, global_parameters)

    def scored_parameters(self, global_parameters: Parameters) -> Parameters:
        """The model that stages G and L1 score for a round whose global model is
        ``global_parameters`` (default: that model). FedDyn sends clients a corrected model but,
        as its official code, scores the plain average of the client models."""
        return global_parameters

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """Arrays with the count and shapes a fit upload must have (default: the global model's);
        algorithms that upload more than a model (e.g. control variates) extend it."""
        return current

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays] | None:
        """Each sampled client's own model for this round's fit, computed once per round
        (typically from
        [`client_models`][pflower.core.strategy.PersonalizedStrategy.client_models]); None (the
        default) sends
        [`client_parameters`][pflower.core.hooks.StrategyHooks.client_parameters] to
        each."""
        return None

    @classmethod
    def robust_inputs(cls, settings: ExperimentConfig) -> tuple[int, str]:
        """How many client vectors `robust_mean` gets each round, as the configuration
        fixes it (fewer when clients fail), and a phrase saying so for messages: by default the
        round's training sample."""
        trainable = settings.num_clients - settings.num_unseen
        count = sample_size(trainable, settings.fraction, settings.min_clients)
        if count == trainable:
            return count, f"the {count} clients of every round"
        return count, (
            f"the {count} clients sampled per round (fraction={settings.fraction:g} of "
            f"{trainable}, min_clients={settings.min_clients})"
        )

    @classmethod
    def idle_robust(cls, settings: ExperimentConfig) -> Idle | None:
        """Why ``robust`` cannot act on `robust_inputs` vectors a round (None if it can, or
        without ``robust``): composing refuses it, or the server logs it when it starts."""
        if settings.robust.name == RobustKind.none:
            return None
        if not cls.robust_aggregation:
            return Idle(
                f"robust={settings.robust.name} changes nothing with "
                f"strategy={settings.strategy.config_name}: it does not combine client models "
                "by a mean that a robust aggregator could replace; use robust=none",
                refused=True,
            )
        count, per_round = cls.robust_inputs(settings)
        attackers = len(malicious_set(settings.attack, settings.seed, settings.num_clients))
        return idle(settings.robust, count, attackers, per_round)
