"""Clients held out of training (``eval.unseen_fraction``, pFL-Bench's participation gap): never
trained, evaluated through the algorithm's stage-L1 path in every evaluation round, scored apart as
stage U, for every registered algorithm."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.client import Client
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, parameters_to_ndarrays

import pflower.strategies  # noqa: F401  (importing registers every algorithm)
from pflower.client.app import client_fn
from pflower.compose import compose_config, config_from_run_config, settings_of
from pflower.config import ExperimentConfig
from pflower.core.algorithm import ALGORITHMS
from pflower.core.experiment import Experiment
from pflower.core.strategy import unseen_clients
from pflower.core.training import evaluate, set_weights
from pflower.registry import ConfigError
from pflower.results.rows import U
from tests.helpers import (
    tiny,
)
from tests.inprocess import run_inprocess

BASE = tiny("eval.l2_clients=trained", epochs=None)  # every client that trains measures L2
NEEDS = {"fedmpr": ["strategy.dropout=0", "strategy.noise_sigma=0"]}  # FedMPR's extras need ResNet


def _composed(overrides: list[str]) -> ExperimentConfig:
    return settings_of(compose_config(overrides))


def test_the_held_out_set_is_seeded_benign_and_sized_by_the_fraction() -> None:
    settings = _composed(["num_clients=10", "eval.unseen_fraction=0.3"])
    held_out = unseen_clients(settings, frozenset())
    assert len(held_out) == 3 and held_out == unseen_clients(settings, frozenset())
    other_seed = _composed(["num_clients=10", "eval.unseen_fraction=0.3", "seed=1"])
    assert unseen_clients(other_seed, frozenset()) != held_out  # the seed draws the set
    malicious = frozenset(range(6))
    assert unseen_clients(settings, malicious) <= frozenset(range(6, 10))
    assert unseen_clients(_composed(["num_clients=10"]), frozenset()) == frozenset()
    tiny = _composed(["num_clients=10", "eval.unseen_fraction=0.01"])
    assert len(unseen_clients(tiny, frozenset())) == 1  # any positive share holds out one
    with pytest.raises(ValueError, match="at least one benign client must train"):
        unseen_clients(settings, frozenset(range(8)))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.unseen_fraction=1.0", "eval.unseen_fraction must be in [0, 1), got 1.0"),
        ("eval.unseen_fraction=-0.1", "eval.unseen_fraction must be in [0, 1), got -0.1"),
    ],
)
def test_impossible_fractions_are_rejected(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        compose_config([override])
    assert message in str(error.value)


def test_holding_out_all_but_none_is_rejected() -> None:
    with pytest.raises(ConfigError, match="holds out 1 of num_clients=1 clients"):
        compose_config(["num_clients=1", "min_clients=1", "eval.unseen_fraction=0.5"])


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_scores_clients_that_never_trained(name: str, tmp_path: Path) -> None:
    """No fit ever reaches a held-out client; every evaluation round scores it as stage U (not
    L1) with the algorithm's stage-L1 path."""
    overrides = [*BASE, f"strategy={name}", "eval.unseen_fraction=0.25", *NEEDS.get(name, [])]
    fitted: set[int] = set()

    def make_client(context) -> Client:
        client = client_fn(context)
        original_fit = client.fit

        def fit(ins: FitIns) -> FitRes:
            fitted.add(int(context.node_config["partition-id"]))
            return original_fit(ins)

        client.fit = fit
        return client

    rows, contexts = run_inprocess(overrides, tmp_path, make_client)
    settings = settings_of(config_from_run_config(contexts[0].run_config))
    (held_out,) = unseen_clients(settings, frozenset())
    assert held_out not in fitted
    assert held_out not in {r["client"] for r in rows if r["stage"] in ("L1", "L2")}
    for round_ in (1, 2):
        (row,) = [r for r in rows if r["stage"] == U and r["round"] == round_]
        assert row["client"] == held_out and 0.0 <= row["acc_local"] <= 1.0
        assert np.isfinite(row["loss_local"])


class EvaluateLog:
    """Records the arrays each client receives with its evaluate instruction."""

    def __init__(self) -> None:
        self.received: dict[tuple[int, int], list[np.ndarray]] = {}

    def make_client(self, context) -> Client:
        client = client_fn(context)
        pid = int(context.node_config["partition-id"])
        original_evaluate = client.evaluate

        def evaluate_(ins: EvaluateIns) -> EvaluateRes:
            self.received[int(ins.config["server-round"]), pid] = parameters_to_ndarrays(
                ins.parameters
            )
            return original_evaluate(ins)

        client.evaluate = evaluate_
        return client


def test_a_held_out_client_is_scored_on_the_model_it_would_deploy(tmp_path: Path) -> None:
    """FedAvg's stage-L1 model is the received global model; FedAvg-FT fine-tunes it on the
    held-out client's own training data first, so the two U rows differ."""
    log = EvaluateLog()
    overrides = [*BASE, "eval.unseen_fraction=0.25"]
    rows, contexts = run_inprocess([*overrides, "strategy=fedavg"], tmp_path / "a", log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    (held_out,) = unseen_clients(experiment.settings, frozenset())
    model = experiment.new_model()
    set_weights(model, log.received[2, held_out])
    data = experiment.client_data(held_out)
    expected = evaluate(model, data.test, data.prepare, experiment.settings.eval.batch_size)
    (row,) = [r for r in rows if r["stage"] == U and r["round"] == 2]
    assert row["acc_local"] == pytest.approx(expected.accuracy)
    assert row["loss_local"] == pytest.approx(expected.loss, rel=1e-5)
    tuned, _ = run_inprocess([*overrides, "strategy=fedavg_ft"], tmp_path / "b")
    (tuned_row,) = [r for r in tuned if r["stage"] == U and r["round"] == 2]
    assert tuned_row["client"] == held_out and tuned_row["loss_local"] != row["loss_local"]
