"""FedProto (Tan et al., AAAI 2022): only prototypes cross the wire; prototypes are class means
of the representation; the server's count-weighted average; nearest-prototype prediction; a
state test recomputing round 2's training from the stored model and the received prototypes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import batch_indices, data_order, evaluate, get_weights, set_weights
from pflower.models.split import represent
from pflower.strategies.fedproto import (
    MODEL,
    NearestPrototype,
    ProtoWeighting,
    aggregate_prototypes,
    prototype_scores,
)
from tests.helpers import ADAM_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_arrays_close,
)
from tests.inprocess import run_inprocess


def test_server_averages_prototypes_by_counts_or_uniformly() -> None:
    a = [np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 2.0]], np.float32), np.array([3.0, 0.0, 1.0])]
    b = [np.array([[3.0, 4.0], [5.0, 5.0], [0.0, 0.0]], np.float32), np.array([1.0, 2.0, 0.0])]
    protos, counts = aggregate_prototypes([a, b], ProtoWeighting.counts)
    np.testing.assert_allclose(protos, [[1.5, 1.0], [5.0, 5.0], [2.0, 2.0]])
    np.testing.assert_array_equal(counts, [4.0, 2.0, 1.0])
    protos, _ = aggregate_prototypes([a, b], ProtoWeighting.uniform)
    np.testing.assert_allclose(protos, [[2.0, 2.0], [5.0, 5.0], [2.0, 2.0]])
    empty = [np.zeros((3, 2), np.float32), np.zeros(3)]
    protos, counts = aggregate_prototypes([empty, empty])
    np.testing.assert_array_equal(protos, np.zeros((3, 2)))


def test_nearest_prototype_prediction() -> None:
    prototypes = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 1.0]])
    present = torch.tensor([True, True, False])
    features = torch.tensor([[9.0, 0.0], [0.1, 0.9], [4.0, 0.0]])
    scores = prototype_scores(features, prototypes, present)
    assert scores.argmax(dim=1).tolist() == [1, 0, 0]  # class 2 has no prototype
    assert scores[0, 1].item() == pytest.approx(-1.0)


def test_only_prototypes_cross_the_wire_and_equal_class_means(tmp_path: Path) -> None:
    log = StateLog(MODEL)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*BASE, "rounds=2", "strategy=fedproto"]
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    width = model.fc.in_features
    for pid in range(4):
        assert log.received[1, pid] == []
        protos, counts = log.uploaded[1, pid]
        assert protos.shape == (10, width) and counts.shape == (10,)
        data = experiment.client_data(pid)
        set_weights(model, log.after[1, pid])
        model.eval()
        with torch.no_grad():
            features = represent(model, data.prepare(data.train.images)).double().numpy()
        labels = data.train.labels.numpy()
        for cls in range(10):
            chosen = labels == cls
            assert counts[cls] == chosen.sum()
            expected = features[chosen].mean(axis=0) if chosen.any() else np.zeros(width)
            np.testing.assert_allclose(protos[cls], expected, rtol=1e-5, atol=1e-6)
    expected = aggregate_prototypes([log.uploaded[1, p] for p in range(4)])
    for pid in range(4):
        assert_arrays_close(log.received[2, pid], expected, rtol=0, atol=0)
    assert_arrays_close(
        strategy.prototypes, aggregate_prototypes([log.uploaded[2, p] for p in range(4)])
    )
    assert not [r for r in rows if r["stage"] == "G"]


def test_fedproto_state_round_two(tmp_path: Path) -> None:
    """Round 2 trains the *stored* model with CE + λ·MSE(f(x), C̄^{(y)}) (recomputed here
    independently), stores it, and stage L1 predicts by the nearest global prototype."""
    lam = 0.5
    log = StateLog(MODEL)
    overrides = [*BASE, "rounds=2", "strategy=fedproto", f"strategy.lam={lam}"]
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    settings = experiment.train_settings(2)
    protos, counts = (torch.from_numpy(a) for a in log.received[2, 0])
    protos = protos.float()
    present = counts > 0
    for pid in range(4):
        assert_arrays_close(log.before[2, pid], log.after[1, pid], rtol=0, atol=0)
        data = experiment.client_data(pid)
        set_weights(model, log.before[2, pid])
        model.train()
        optimizer = settings.make_optimizer(model.parameters())
        order = data_order(0, 2, pid)
        generator = order
        for index in batch_indices(
            len(data.train), settings.batch_size, generator, settings.epochs
        ):
            optimizer.zero_grad()
            x, y = data.prepare(data.train.images[index]), data.train.labels[index]
            features = model.represent(x)
            target = torch.stack(
                [
                    protos[c] if present[c] else f.detach()
                    for f, c in zip(features, y.tolist(), strict=True)
                ]
            )
            loss = nn.functional.cross_entropy(model.fc(features), y)
            loss = loss + lam * ((features - target) ** 2).mean()
            loss.backward()
            optimizer.step()
        assert_arrays_close(get_weights(model), log.after[2, pid], rtol=1e-4, atol=2e-5)
    # stage L1 of round 2 uses the prototypes aggregated from round 2's uploads
    round2 = aggregate_prototypes([log.uploaded[2, p] for p in range(4)])
    classifier = NearestPrototype(
        model, torch.from_numpy(round2[0]).float(), torch.from_numpy(round2[1] > 0)
    )
    for pid in range(4):
        data = experiment.client_data(pid)
        set_weights(model, log.after[2, pid])
        result = evaluate(classifier, data.test, data.prepare, 512)
        (l1,) = [r for r in rows if r["stage"] == "L1" and r["round"] == 2 and r["client"] == pid]
        assert l1["acc_local"] == pytest.approx(result.accuracy)
        assert l1["loss_local"] == pytest.approx(result.loss, rel=1e-5)


def test_fedproto_learns(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=fedproto"], tmp_path
    )
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 4 and np.mean(l1) > 0.6
