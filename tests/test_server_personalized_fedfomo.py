"""FedFomo (Zhang et al., ICLR 2021): first-order weights by hand, the server's choice of models,
M = 0 is local training, and a state test recomputing round 3 from the stored model, the
received models and the validation share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import data_order, evaluate, get_weights, set_weights, train
from pflower.strategies.fedfomo import (
    PERSONAL,
    choose_models,
    decode_weights,
    fomo_weights,
    hold_out,
)
from tests.helpers import ADAM_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_arrays_close,
    comparable,
)
from tests.inprocess import run_inprocess

FOMO = [*BASE, "split.val_fraction=0.2", "strategy=fedfomo"]


def test_weights_match_a_hand_computation() -> None:
    # old loss 1.0; model a: loss 0.5 at distance 2, b: loss 1.5 (worse: 0), c: loss 0.0 at 4
    raw = np.array([0.5 / (2 + 1e-5), 0.0, 1.0 / (4 + 1e-5)])
    got = fomo_weights(1.0, [0.5, 1.5, 0.0], [2.0, 1.0, 4.0])
    np.testing.assert_allclose(got, raw / raw.sum())
    np.testing.assert_array_equal(fomo_weights(1.0, [2.0, 3.0], [1.0, 1.0]), [0.0, 0.0])


def test_choice_is_top_affinity_or_random_with_epsilon() -> None:
    affinity = np.array([0.0, 0.7, 0.1, 0.9, 0.0])
    rng = np.random.default_rng(0)
    assert choose_models(affinity, [1, 2, 3, 4], 2, 0.0, rng) == [3, 1]
    assert choose_models(affinity, [1, 2], 5, 0.0, rng) == [1, 2]
    assert choose_models(affinity, [], 3, 0.0, rng) == []
    draws = {tuple(choose_models(affinity, [1, 2, 3, 4], 2, 1.0, rng)) for _ in range(50)}
    assert len(draws) > 1 and all(len(set(d)) == 2 for d in draws)


def test_fedfomo_with_no_models_equals_local_training(tmp_path: Path) -> None:
    fomo, _ = run_inprocess([*FOMO, "strategy.num_models=0"], tmp_path / "f")
    local, _ = run_inprocess([*BASE, "split.val_fraction=0.2", "strategy=local"], tmp_path / "l")
    assert comparable(fomo) == comparable(local)


def test_fedfomo_state_round_three(tmp_path: Path) -> None:
    """Round 3: the client receives the latest uploads of the clients named in ``fomo-ids``,
    weighs them against its *stored* model on its validation share, moves, trains, stores and
    uploads; the server's affinity is the sum of the reported weights."""
    log = StateLog(PERSONAL)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*FOMO, "rounds=3", "strategy.num_models=2", "partition=iid"]  # shared classes
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    mask = strategy.trainable_mask
    model = experiment.new_model()
    settings = experiment.train_settings(3)
    affinity = np.zeros((4, 4))
    for (_, pid), metrics in log.metrics.items():
        for neighbor, weight in decode_weights(str(metrics["fomo-weights"])).items():
            affinity[pid, neighbor] += weight
    np.testing.assert_allclose(strategy.affinity, affinity)
    assert log.config[1, 0]["fomo-ids"] == "" and log.received[1, 0] == []
    moved_any = False
    for pid in range(4):
        ids = [int(n) for n in str(log.config[3, pid]["fomo-ids"]).split(",")]
        assert len(ids) == 2 and pid not in ids
        received = [a for n in ids for a in log.uploaded[2, n]]
        assert_arrays_close(log.received[3, pid], received, rtol=0, atol=0)
        old = log.before[3, pid]
        assert_arrays_close(old, log.uploaded[2, pid], rtol=0, atol=0)
        data = experiment.client_data(pid)
        losses = []
        for weights in [old, *(log.uploaded[2, n] for n in ids)]:
            set_weights(model, weights)
            losses.append(evaluate(model, data.val, data.prepare, 512).loss)
        distances = [
            np.sqrt(
                sum(
                    np.sum((a.astype(np.float64) - b) ** 2)
                    for a, b, m in zip(log.uploaded[2, n], old, mask, strict=True)
                    if m
                )
            )
            for n in ids
        ]
        weights = fomo_weights(losses[0], losses[1:], distances)
        reported = decode_weights(str(log.metrics[3, pid]["fomo-weights"]))
        np.testing.assert_allclose([reported[n] for n in ids], weights, rtol=1e-6)
        moved_any |= bool(weights.sum() > 0)
        start = [
            (
                a + sum(w * (log.uploaded[2, n][k] - a) for w, n in zip(weights, ids, strict=True))
            ).astype(a.dtype)
            if m
            else a
            for k, (a, m) in enumerate(zip(old, mask, strict=True))
        ]
        set_weights(model, start)
        order = data_order(0, 3, pid)
        train(model, data.train, data.prepare, settings, order)
        assert_arrays_close(get_weights(model), log.after[3, pid], rtol=1e-4, atol=2e-5)
        assert_arrays_close(log.after[3, pid], log.uploaded[3, pid], rtol=0, atol=0)
        (l1,) = [r for r in rows if r["stage"] == "L1" and r["round"] == 3 and r["client"] == pid]
        set_weights(model, log.after[3, pid])
        assert l1["acc_local"] == pytest.approx(
            evaluate(model, data.test, data.prepare, 512).accuracy
        )
    assert moved_any, "no client took anything from the received models: the test is vacuous"


def test_fedfomo_learns_with_its_own_holdout(tmp_path: Path) -> None:
    """With no validation share in the experiment, each client holds out 20% of its train share."""
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=fedfomo"], tmp_path
    )
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 4 and np.mean(l1) > 0.6
    weights = [r["fomo-weights"] for r in rows if r["stage"] == "L2" and r["round"] == 2]
    assert len(weights) == 4 and all(weights)  # round 2 weighed the received models


def test_holdout_moves_a_seeded_fifth_of_the_train_share() -> None:
    from pflower.compose import compose_config

    experiment = Experiment.of(compose_config(["dataset=digits", "num_clients=4"]))
    data = experiment.client_data(1)
    held = hold_out(data, 0.2, 0)
    assert len(held.val) == round(0.2 * len(data.train))
    assert len(held.train) + len(held.val) == len(data.train)
    assert_arrays_close(
        [hold_out(data, 0.2, 0).val.images.numpy()], [held.val.images.numpy()], rtol=0, atol=0
    )
