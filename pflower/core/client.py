"""PersonalClient: the NumPyClient every algorithm's client derives from.

The base class runs the evaluation protocol every algorithm shares (stages L1 and L2 of the FLIU
paper, Hussaini et al., Sec. III, each on the client's own test split and on its share of the
global test set, ``eval.client_global_test``);
an algorithm overrides only the hooks that hold its mathematics:

- [`start_model`][pflower.core.client.PersonalClient.start_model]: the weights local training starts
  from (default: the global model);
- [`regularizer`][pflower.core.client.PersonalClient.regularizer]: an extra loss term during local
  training (default: none);
- [`after_step`][pflower.core.client.PersonalClient.after_step]: a function run after every
  optimizer step (default: none);
- [`remember`][pflower.core.client.PersonalClient.remember]: what to keep in ``context.state`` after
  training (default: nothing);
- [`upload`][pflower.core.client.PersonalClient.upload]: what to send back (default: the trained
  weights);
- [`personalize`][pflower.core.client.PersonalClient.personalize]: the deployable model at stage L1
  (default: the global model);
- [`evaluation_metrics`][pflower.core.client.PersonalClient.evaluation_metrics]: what stage L1
  reports about the deployable model (default:
  [`stage_metrics`][pflower.core.client.PersonalClient.stage_metrics]; the methods that keep a
  personalized and a global model add the FLAME
  paper's PM/GM/HM metrics,
  [`pflower.strategies.moreau.PersonalAndGlobalClient`][pflower.strategies.moreau.PersonalAndGlobalClient]).

``fit`` trains and evaluates stage L2 (the trained model; in an evaluation round, when the fit
config's ``measure-l2`` is not false); ``evaluate`` evaluates stage L1 (the
personalized model built from the server's latest message). Both report accuracy and loss on the
client's own test split and, unless ``eval.client_global_test=off``, on its share of the global
test set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic

from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.config import ClientGlobalTest
from pflower.core.experiment import ClientData, Experiment
from pflower.core.options import OptionsT
from pflower.core.state import ClientState
from pflower.core.training import (
    Prepare,
    Regularizer,
    TrainSettings,
    data_order,
    evaluate,
    get_weights,
    payload_bytes,
    set_weights,
    train,
)
from pflower.datasets.base import ImageSplit
from pflower.provenance import check_same_code
from pflower.robust.attacks import MODEL_POISONING, malicious_set, poisoned_upload

MEASURE_L2 = "measure-l2"
"""Fit-config key: whether the client measures stage L2 after training in an evaluation round
(absent: it does). The server sets it from ``eval.l2_clients``."""


class PersonalClient(NumPyClient, Generic[OptionsT]):
    """The shared client protocol; subclasses override the hooks listed in the module docstring."""

    def __init__(
        self,
        options: OptionsT,
        experiment: Experiment,
        data: ClientData,
        model: nn.Module,
        state: ClientState,
    ) -> None:
        self.options = options
        self.experiment = experiment
        self.data = data
        self.model = model.to(experiment.device)  # in place: the shared model stays there
        self.state = state

    @property
    def partition_id(self) -> int:
        return self.data.partition_id

    # ----------------------------------------------------------------- hooks for algorithms
    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """Weights local training starts from in this round."""
        return global_weights

    def regularizer(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Regularizer | None:
        """An extra loss term for local training, or None."""
        return None

    def after_step(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Callable[[nn.Module], None] | None:
        """A function called after every optimizer step of local training, or None (default).

        Called once per round after [`regularizer`][pflower.core.client.PersonalClient.regularizer]
        (e.g. FLAME's closed-form ADMM updates
        after each pass over the data).
        """
        return None

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        """Store what the next round needs in ``self.state``."""

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        """The arrays sent to the server after training."""
        return trained

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """The client's deployable model (stage L1) given the server's latest model."""
        return global_weights

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """Algorithm-specific scalars reported with the fit result."""
        return {}

    def evaluation_metrics(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> dict[str, Scalar]:
        """Stage L1's metrics; ``self.model`` holds the deployable model
        ([`personalize`][pflower.core.client.PersonalClient.personalize])."""
        return self.stage_metrics()

    # ------------------------------------------------------------------- shared machinery
    def train_settings(self, config: dict[str, Scalar]) -> TrainSettings:
        return self.experiment.train_settings(server_round(config))

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """Train ``self.model`` on
        [`training_data`][pflower.core.client.PersonalClient.training_data]; data order seeded per
        round/client."""
        generator = data_order(
            self.experiment.settings.seed, server_round(config), self.partition_id
        )
        data, prepare = self.training_data()
        return train(self.model, data, prepare, settings, generator, regularizer, after_step)

    def training_data(self) -> tuple[ImageSplit, Prepare]:
        """What local training runs on: the client's train split and its batch preparation."""
        return self.data.train, self.data.prepare

    def stage_metrics(self) -> dict[str, Scalar]:
        """Accuracy and loss of ``self.model`` on the local test set and on its share of the
        global one."""
        return self.scores(self.model)

    def scores(self, model: nn.Module) -> dict[str, Scalar]:
        """Accuracy and loss of ``model`` on the local test set and, unless
        ``eval.client_global_test=off``, on the client's share of the global test set (a
        stratified slice, or a subsample shared by all clients)."""
        batch_size = self.experiment.settings.eval.batch_size
        local = evaluate(model, self.data.test, self.data.prepare, batch_size)
        metrics: dict[str, Scalar] = {"acc_local": local.accuracy, "loss_local": local.loss}
        if self.experiment.settings.eval.client_global_test != ClientGlobalTest.off:
            global_ = evaluate(model, self.data.global_test, self.experiment.prepare(), batch_size)
            metrics.update(acc_global=global_.accuracy, loss_global=global_.loss)
        metrics["num_test"] = local.num_examples
        return metrics

    # ------------------------------------------------------------------ Flower interface
    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """Tell the server which partition this node holds (it keys per-client memory by it)."""
        return {"partition_id": self.partition_id, "num_train": len(self.data.train)}

    @property
    def is_malicious(self) -> bool:
        """Whether this client is one of the run's Byzantine clients (``attack``)."""
        settings = self.experiment.settings
        return self.partition_id in malicious_set(
            settings.attack, settings.seed, settings.num_clients
        )

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        check_same_code(config)
        attack = self.experiment.settings.attack
        if attack.name in MODEL_POISONING and self.is_malicious:
            # A model-poisoning client skips training, keeps its state, uploads the attack.
            upload = poisoned_upload(
                attack,
                parameters,
                self.experiment.settings.seed,
                server_round(config),
                self.partition_id,
            )
            return upload, len(self.data.train), {"partition_id": self.partition_id}
        set_weights(self.model, self.start_model(parameters, config))
        train_loss = self.local_train(
            self.train_settings(config),
            config,
            self.regularizer(parameters, config),
            self.after_step(parameters, config),
        )
        trained = get_weights(self.model)
        self.remember(trained, parameters, config)
        metrics: dict[str, Scalar] = {
            "partition_id": self.partition_id,
            "train_loss": train_loss,
            **self.fit_metrics(config),
        }
        if self.experiment.settings.is_eval_round(server_round(config)) and bool(
            config.get(MEASURE_L2, True)
        ):
            metrics.update(self.stage_metrics())
        uploaded = self.upload(trained, parameters, config)
        metrics["bytes_up"] = payload_bytes(uploaded)
        return uploaded, len(self.data.train), metrics

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        check_same_code(config)
        set_weights(self.model, self.personalize(parameters, config))
        metrics: dict[str, Scalar] = {
            "partition_id": self.partition_id,
            **self.evaluation_metrics(parameters, config),
        }
        return float(metrics["loss_local"]), int(metrics["num_test"]), metrics


def server_round(config: dict[str, Any]) -> int:
    """The round number the server put in a message's config."""
    return int(config["server-round"])
