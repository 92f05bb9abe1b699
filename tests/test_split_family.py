"""The split-model family and ALA: the zoo's body/head declaration, the ALA module on hand-built
tensors, identities between methods, and state tests that recompute what a client must have done.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.client import Client
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, NDArrays, parameters_to_ndarrays
from torch import nn

from pflower.client.app import client_fn
from pflower.compose import config_from_run_config
from pflower.core.aggregation import weighted_mean, weighted_mean_partial
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import data_order, get_weights, set_weights, train
from pflower.datasets.base import ImageSplit
from pflower.models import build_model, split
from pflower.models.zoo import MODELS
from pflower.strategies import ditto
from pflower.strategies.ala import (
    ALA_LOCAL,
    ALA_META,
    ALA_WEIGHTS,
    ALAClientMixin,
    ALASettings,
    adaptive_local_aggregation,
)
from pflower.strategies.proximal import anchor_tensors, proximal_term
from pflower.strategies.split import PERSONAL
from tests.helpers import assert_arrays_close, comparable, retrain, tiny
from tests.inprocess import run_inprocess

BASE = tiny("train.lr=0.05")


# ---------------------------------------------------------------------- the zoo's split
@pytest.mark.parametrize("name", MODELS.names)
def test_every_zoo_model_declares_its_head_and_features(name: str) -> None:
    """Head = the Linear ``fc``; body = everything else; model(x) = head(represent(x))."""
    shape = (3, 64, 64) if name == "flame_cnn1" else (3, 32, 32)
    vocab = 20 if "vocab_size" in MODELS.accepted_keys(name) else 0  # token ids (1, 1, L)
    if vocab:
        shape = (1, 1, 12)
    torch.manual_seed(0)
    model = build_model(name, {"width": 8} if name.startswith("resnet") else {}, shape, 7, vocab)
    keys = list(model.state_dict())
    assert split.head_keys(model) == ["fc.weight", "fc.bias"]
    assert split.body_keys(model) == [k for k in keys if not k.startswith("fc.")]
    assert sum(split.head_mask(model)) == 2
    assert {id(p) for p in split.head_parameters(model)} == {id(model.fc.weight), id(model.fc.bias)}
    assert len(split.body_parameters(model)) == len(list(model.parameters())) - 2
    model.eval()
    x = torch.randint(0, vocab, (2, *shape)) if vocab else torch.randn(2, *shape)
    features = split.represent(model, x)
    assert features.shape == (2, model.fc.in_features)
    torch.testing.assert_close(split.head(model)(features), model(x))
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(split.batchnorm_mask(model)) == has_bn


def test_a_model_without_a_declared_split_is_rejected_with_a_clear_message() -> None:
    with pytest.raises(Exception, match="declares no body/head split"):
        split.head_keys(nn.Sequential(nn.Linear(2, 2)))


def test_trainable_only_freezes_the_rest_and_restores() -> None:
    model = build_model("mlp", {"hidden": [3]}, (1, 2, 2), 2)
    with split.trainable_only(model, split.head_parameters(model)):
        assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]
    assert all(p.requires_grad for p in model.parameters())


def test_partial_mean_averages_each_array_over_its_senders() -> None:
    a = [np.array([1.0, 2.0]), np.array([10.0])]
    b = [np.array([3.0, 6.0]), np.empty((0,))]
    current = [np.zeros(2), np.array([-1.0])]
    weights = np.array([1.0, 3.0])
    mean = weighted_mean_partial([a, b], weights, current)
    np.testing.assert_allclose(mean[0], [2.5, 5.0])  # (1·1 + 3·3)/4, (1·2 + 3·6)/4
    np.testing.assert_allclose(mean[1], [10.0])  # only a sent it
    none = weighted_mean_partial([[np.empty(0)], [np.empty(0)]], weights, [np.array([7.0])])
    np.testing.assert_allclose(none[0], [7.0])  # nobody sent it: the current global array
    full = [[np.array([1.0, 2.0])], [np.array([3.0, 4.0])]]
    assert all(
        np.array_equal(x, y)
        for x, y in zip(
            weighted_mean_partial(full, weights, [np.zeros(2)]),
            weighted_mean(full, weights),
            strict=True,
        )
    )


# ------------------------------------------------------------------------ ALA, by hand
class TinyNet(nn.Module):
    """Linear → BatchNorm → ReLU → Linear, on 1x1x2 "images"."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.lin(torch.flatten(x, 1)))))


def _tiny_setup(seed: int = 0) -> tuple[nn.Module, NDArrays, NDArrays, ImageSplit]:
    torch.manual_seed(seed)
    model = TinyNet()
    global_ = get_weights(model)
    local = [a + np.random.default_rng(seed).normal(size=a.shape).astype(a.dtype) for a in global_]
    images = torch.randn(40, 1, 1, 2)
    labels = (images[:, 0, 0, 0] > 0).long()
    return model, global_, local, ImageSplit(images, labels)


def _identity(images: torch.Tensor) -> torch.Tensor:
    return images


def _ala(model, global_, local, w, data, **settings):
    return adaptive_local_aggregation(
        model, global_, local, w, data, _identity, ALASettings(**settings), np.random.default_rng(0)
    )


def test_ala_weights_stay_in_the_unit_interval() -> None:
    model, global_, local, data = _tiny_setup()
    result = _ala(model, global_, local, None, data, eta=1000.0, batch_size=4, max_start_epochs=3)
    assert len(result.mix_weights) == 2
    values = np.concatenate([w.ravel() for w in result.mix_weights])
    assert values.min() >= 0.0 and values.max() <= 1.0
    assert np.any((values > 0) & (values < 1)) or np.any(values == 0)  # W actually moved


def test_ala_with_fixed_w_is_eq4_on_the_top_layers_and_overwrites_the_rest() -> None:
    """Eq. 4 without learning (``adapt_after_start=false`` and a stored W): W = 1 gives the global
    model, W = 0 keeps the local model, lower layers are overwritten, buffers stay local."""
    model, global_, local, data = _tiny_setup()
    keys = list(model.state_dict())
    fc = [keys.index("fc.weight"), keys.index("fc.bias")]
    for value, expected in ((1.0, global_), (0.0, local)):
        w = [np.full(global_[i].shape, value, dtype=np.float32) for i in fc]
        result = _ala(model, global_, local, w, data, adapt_after_start=False)
        assert result.epochs == 0
        for i, key in enumerate(keys):
            if i in fc:
                np.testing.assert_array_equal(result.weights[i], expected[i])
            elif key.startswith("bn.running") or key.endswith("num_batches_tracked"):
                np.testing.assert_array_equal(result.weights[i], local[i])  # buffers stay local
            else:
                np.testing.assert_array_equal(result.weights[i], global_[i])  # lower: overwritten
    half = [np.full(global_[i].shape, 0.5, dtype=np.float32) for i in fc]
    result = _ala(model, global_, local, half, data, adapt_after_start=False)
    np.testing.assert_allclose(
        result.weights[fc[0]], local[fc[0]] + 0.5 * (global_[fc[0]] - local[fc[0]]), rtol=1e-6
    )


def test_ala_with_p_0_is_fedavgs_overwrite() -> None:
    model, global_, local, data = _tiny_setup()
    result = _ala(model, global_, local, None, data, layer_idx=0)
    assert result.mix_weights == [] and result.epochs == 0
    params = {name for name, _ in model.named_parameters()}
    for key, got, glob, loc in zip(model.state_dict(), result.weights, global_, local, strict=True):
        np.testing.assert_array_equal(got, glob if key in params else loc)


def test_one_ala_step_matches_the_hand_computed_gradient() -> None:
    """W ← clip(W − η ∇_Θ̂ L ⊙ (Θ − Θ_i), 0, 1) from W = 1, one mini-batch (Eq. 5)."""
    model, global_, local, data = _tiny_setup()
    data = ImageSplit(data.images[:4], data.labels[:4])
    eta = 0.7
    result = _ala(
        model,
        global_,
        local,
        [np.ones((2, 3), np.float32), np.ones(2, np.float32)],
        data,
        eta=eta,
        rand_percent=100.0,
        batch_size=4,
    )
    assert result.epochs == 1
    # Θ̂ with W = 1: lower layers and fc global, buffers local.
    keys = list(model.state_dict())
    start = [
        loc if k.startswith("bn.running") or k.endswith("tracked") else glob
        for k, glob, loc in zip(keys, global_, local, strict=True)
    ]
    reference = TinyNet()
    set_weights(reference, start)
    reference.train()
    loss = nn.functional.cross_entropy(reference(data.images), data.labels)
    loss.backward()
    for w, key, grad in zip(
        result.mix_weights,
        ("fc.weight", "fc.bias"),
        (reference.fc.weight.grad, reference.fc.bias.grad),
        strict=True,
    ):
        i = keys.index(key)
        expected = np.clip(1.0 - eta * grad.numpy() * (global_[i] - local[i]), 0.0, 1.0)
        np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_the_initial_stage_stops_by_its_rule() -> None:
    """More than ``num_pre_loss`` epoch losses and std of the last ``num_pre_loss`` below the
    threshold; one epoch once W exists; the cap when it never converges."""
    model, global_, local, data = _tiny_setup()
    common = {"batch_size": 8, "num_pre_loss": 3, "eta": 0.5}
    loose = _ala(model, global_, local, None, data, threshold=1e9, **common)
    assert loose.epochs == 4 and not loose.capped  # the first epoch count > num_pre_loss
    never = _ala(model, global_, local, None, data, threshold=0.0, max_start_epochs=7, **common)
    assert never.epochs == 7 and never.capped
    later = _ala(model, global_, local, loose.mix_weights, data, threshold=0.0, **common)
    assert later.epochs == 1
    threshold = float(np.std(never.losses[2:5])) + 1e-9
    mid = _ala(model, global_, local, None, data, threshold=threshold, max_start_epochs=7, **common)
    assert mid.losses == never.losses[: mid.epochs]  # same slice, same trajectory
    for end in range(4, mid.epochs):
        assert np.std(mid.losses[end - 3 : end]) >= threshold  # did not stop early
    assert np.std(mid.losses[-3:]) < threshold


# ------------------------------------------------------------- in-process runs: learning
ALL = [
    ["strategy=fedala"],
    ["strategy=fedprox_ala"],
    ["strategy=fedrep_ala"],
    ["strategy=ditto_ala"],
    ["strategy=fedper"],
    ["strategy=fedrep"],
    ["strategy=fedbn"],
    ["strategy=fedbabu", "strategy.finetune_epochs=1"],
    ["strategy=fedprox_ft"],
    ["strategy=fedavg_c"],
    ["strategy=perfedavg"],
    ["strategy=fedrod"],
    ["strategy=fedphp"],
]


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s[0].split("=")[1])
def test_every_split_family_method_learns(strategy: list[str], tmp_path: Path) -> None:
    rows, _ = run_inprocess([*BASE, *strategy], tmp_path)
    first = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 1]
    last = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(last) == 4
    assert np.mean(last) > 0.5 and np.mean(last) >= np.mean(first) - 0.05


# --------------------------------------------------------------------------- identities
@pytest.mark.parametrize(
    ("overrides", "twin", "stages"),
    [
        # FedBN on a model without BatchNorm has nothing to keep local
        pytest.param(["strategy=fedbn"], "fedavg", ("L1", "L2"), id="fedbn-no-bn-is-fedavg"),
        # p = 0 (``layer_idx=0``): Eq. 4 overwrites everything, as FedAvg does
        pytest.param(
            ["strategy=fedala", "strategy.layer_idx=0"],
            "fedavg",
            ("L1", "L2", "G"),
            id="fedala-p0-is-fedavg",
        ),
        # ALA on the body with no mixed tensors overwrites the body: FedRep (small_cnn has no
        # buffers)
        pytest.param(
            ["strategy=fedrep_ala", "strategy.layer_idx=0"],
            "fedrep",
            ("L1", "L2", "G"),
            id="fedrep_ala-p0-is-fedrep",
        ),
        pytest.param(
            ["strategy=ditto_ala", "strategy.layer_idx=0"],
            "ditto",
            ("L1", "L2", "G"),
            id="ditto_ala-p0-is-ditto",
        ),
    ],
)
def test_a_special_case_gives_the_rows_of_its_twin(
    overrides: list[str], twin: str, stages: tuple[str, ...], tmp_path: Path
) -> None:
    rows, _ = run_inprocess([*BASE, *overrides], tmp_path / "special")
    expected, _ = run_inprocess([*BASE, f"strategy={twin}"], tmp_path / "twin")
    assert comparable(rows, stages) == comparable(expected, stages)


def test_fedrep_without_head_epochs_shares_fedbabus_body_update(tmp_path: Path) -> None:
    """τ = 0: the head stays Θ^0's, the body trains under it: FedBABU's federated training."""
    rep, _ = run_inprocess([*BASE, "strategy=fedrep", "strategy.head_epochs=0"], tmp_path / "a")
    babu, _ = run_inprocess([*BASE, "strategy=fedbabu"], tmp_path / "b")
    assert comparable(rep, ("L2",)) == comparable(babu, ("L2",))
    assert len(comparable(rep, ("L2",))) == 8


@pytest.mark.parametrize(
    "variant",
    [
        ["strategy=perfedavg", "strategy.alpha=0"],
        ["strategy=fedphp", "strategy.mu=0", "strategy.lam=0"],
    ],
    ids=["perfedavg_alpha0", "fedphp_mu0_lam0"],
)
def test_reduces_to_fedavg(variant: list[str], tmp_path: Path) -> None:
    """Per-FedAvg with α = 0 (w̃ = w) and FedPHP with μ = λ = 0 are FedAvg exactly."""
    rows, _ = run_inprocess([*BASE, *variant], tmp_path / "a")
    fedavg, _ = run_inprocess([*BASE, "strategy=fedavg"], tmp_path / "b")
    assert comparable(rows) == comparable(fedavg)


def test_fedprox_c_without_init_and_mu_0_is_fedavg_ft(tmp_path: Path) -> None:
    c, _ = run_inprocess(
        [*BASE, "strategy=fedprox_ft", "strategy.mu=0", "strategy.finetune_init=false"],
        tmp_path / "a",
    )
    ft, _ = run_inprocess([*BASE, "strategy=fedavg_ft"], tmp_path / "b")
    assert comparable(c) == comparable(ft)


def test_mmd_matches_a_hand_computation() -> None:
    from pflower.strategies.fedphp import mmd

    a = torch.tensor([[0.0]])
    b = torch.tensor([[3.0]])
    cross = sum(np.exp(-9.0 / (2 * s)) for s in (10, 15, 20, 50))
    assert float(mmd(a, b)) == pytest.approx(8.0 - 2.0 * cross, rel=1e-6)
    assert float(mmd(b, b)) == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------- state tests
class Log:
    """client_fn that records, per (phase, round, client), the received arrays, the client's
    state before and after, and what it sent back."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.received: dict[tuple, NDArrays] = {}
        self.before: dict[tuple, dict] = {}
        self.after: dict[tuple, dict] = {}
        self.sent: dict[tuple, NDArrays] = {}

    def _snapshot(self, state: ClientState) -> dict:
        snap = {key: state.get_arrays(key) for key in self.keys if key != ALA_META}
        snap[ALA_META] = state.get_scalars(ALA_META)
        return snap

    def make_client(self, context) -> Client:
        client = client_fn(context)
        pid = int(context.node_config["partition-id"])
        state = ClientState(context.state)
        original_fit, original_evaluate = client.fit, client.evaluate

        def fit(ins: FitIns) -> FitRes:
            key = ("fit", int(ins.config["server-round"]), pid)
            self.received[key] = parameters_to_ndarrays(ins.parameters)
            self.before[key] = self._snapshot(state)
            res = original_fit(ins)
            self.after[key] = self._snapshot(state)
            self.sent[key] = parameters_to_ndarrays(res.parameters)
            return res

        def evaluate(ins: EvaluateIns) -> EvaluateRes:
            key = ("evaluate", int(ins.config["server-round"]), pid)
            self.received[key] = parameters_to_ndarrays(ins.parameters)
            self.before[key] = self._snapshot(state)
            res = original_evaluate(ins)
            self.after[key] = self._snapshot(state)
            return res

        client.fit, client.evaluate = fit, evaluate
        return client


def _start_phase(experiment: Experiment, received: NDArrays, local: NDArrays, pid: int):
    """ALA's initial stage (no W yet) for global model version 1, as the client runs it."""
    options = experiment.settings.strategy
    data = experiment.client_data(pid)
    return adaptive_local_aggregation(
        experiment.new_model(),
        received,
        local,
        None,
        data.train,
        data.prepare,
        options.ala_settings(32),
        np.random.default_rng([experiment.settings.seed, pid, 1, 0xA1A]),
    )


@pytest.mark.slow
def test_fedala_state_recomputes_ala_and_training(tmp_path: Path) -> None:
    """Round 1 trains from Θ^0 and stores the trained model; stage L1 of round 1 runs the
    initial stage on (Θ^1, trained) and stores Θ̂ and W; round 2 trains from that stored Θ̂
    (not from Θ^1) and stores and uploads the trained model."""
    log = Log((ALA_LOCAL, ALA_WEIGHTS, ALA_META))
    _, contexts = run_inprocess([*BASE, "strategy=fedala"], tmp_path, log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    options = experiment.settings.strategy
    for pid in (0, 3):
        assert log.before["fit", 1, pid][ALA_LOCAL] is None  # ALA deactivated in round 1
        assert_arrays_close(
            log.after["fit", 1, pid][ALA_LOCAL], log.sent["fit", 1, pid], rtol=0, atol=0
        )
        # Stage L1 of round 1: the initial stage on (Θ^1, the trained model).
        expected = _start_phase(
            experiment, log.received["evaluate", 1, pid], log.sent["fit", 1, pid], pid
        )
        stored = log.after["evaluate", 1, pid]
        assert expected.epochs > options.num_pre_loss
        assert (
            stored[ALA_META]["version"] == 1 and stored[ALA_META]["start_epochs"] == expected.epochs
        )
        assert_arrays_close(stored[ALA_LOCAL], expected.weights, rtol=1e-5, atol=1e-6)
        assert_arrays_close(stored[ALA_WEIGHTS], expected.mix_weights, rtol=1e-5, atol=1e-6)
        w = np.concatenate([a.ravel() for a in stored[ALA_WEIGHTS]])
        assert w.min() >= 0.0 and w.max() <= 1.0
        # Round 2 trains from the stored Θ̂ of version 1 (ALA is not run again).
        assert_arrays_close(log.before["fit", 2, pid][ALA_LOCAL], stored[ALA_LOCAL], rtol=0, atol=0)
        trained = retrain(experiment, pid, 2, stored[ALA_LOCAL])
        assert_arrays_close(log.sent["fit", 2, pid], trained, rtol=1e-5, atol=1e-6)
        assert_arrays_close(
            log.after["fit", 2, pid][ALA_LOCAL], log.sent["fit", 2, pid], rtol=0, atol=0
        )
        # Stage L1 of round 2: one ALA epoch from the stored W.
        assert log.after["evaluate", 2, pid][ALA_META]["epochs"] == 1


@pytest.mark.slow
def test_ditto_ala_trains_and_anchors_on_the_ala_model(tmp_path: Path) -> None:
    """Round 2: ALA mixes the received w^2 into the client's round-1 global-step model (Θ̂, start
    phase, W stored); the global step trains from Θ̂ and uploads it; the personal model v_k is
    trained from v_k^1 with its proximal term toward Θ̂, not toward the received w^2."""
    log = Log((ALA_LOCAL, ALA_WEIGHTS, ALA_META, ditto.PERSONAL))
    _, contexts = run_inprocess(
        [*BASE, "strategy=ditto_ala", "strategy.lambda_=0.5"], tmp_path, log.make_client
    )
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    for pid in (0, 3):
        assert log.before["fit", 1, pid][ALA_LOCAL] is None  # ALA deactivated in round 1
        assert_arrays_close(
            log.after["fit", 1, pid][ALA_LOCAL], log.sent["fit", 1, pid], rtol=0, atol=0
        )
        data = experiment.client_data(pid)
        expected = _start_phase(
            experiment, log.received["fit", 2, pid], log.sent["fit", 1, pid], pid
        )
        assert_arrays_close(
            log.after["fit", 2, pid][ALA_WEIGHTS], expected.mix_weights, rtol=1e-5, atol=1e-6
        )
        trained = retrain(experiment, pid, 2, expected.weights)
        assert_arrays_close(log.sent["fit", 2, pid], trained, rtol=1e-5, atol=1e-6)
        assert_arrays_close(
            log.after["fit", 2, pid][ALA_LOCAL], log.sent["fit", 2, pid], rtol=0, atol=0
        )

        def personal(anchor: NDArrays, pid: int = pid, data=data) -> NDArrays:
            model = experiment.new_model()
            set_weights(model, log.after["fit", 1, pid][ditto.PERSONAL])
            train(
                model,
                data.train,
                data.prepare,
                experiment.train_settings(2),
                data_order(experiment.settings.seed, 2, pid),
                proximal_term(anchor_tensors(model, anchor), 0.5, 0.0),
            )
            return get_weights(model)

        stored = log.after["fit", 2, pid][ditto.PERSONAL]
        assert_arrays_close(stored, personal(expected.weights), rtol=1e-5, atol=1e-6)
        toward_received = personal(log.received["fit", 2, pid])
        assert not all(np.allclose(a, b) for a, b in zip(stored, toward_received, strict=True))


def test_fedrep_stores_the_trained_head_and_uploads_the_body(tmp_path: Path) -> None:
    """The head kept is the one trained this round (not the received one); the upload is the
    trained body with empty head arrays; the next round starts from received body + kept head."""
    log = Log((PERSONAL,))
    strategies: list[PersonalizedStrategy] = []
    _, contexts = run_inprocess(
        [*BASE, "strategy=fedrep", "strategy.head_epochs=1"], tmp_path, log.make_client, strategies
    )
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    mask = split.head_mask(experiment.new_model())
    for pid in range(4):
        for round_ in (1, 2):
            sent = log.sent["fit", round_, pid]
            head = log.after["fit", round_, pid][PERSONAL]
            assert [a.size == 0 for a in sent] == mask
            received = log.received["fit", round_, pid]
            received_head = [a for a, m in zip(received, mask, strict=True) if m]
            assert not all(np.array_equal(a, b) for a, b in zip(head, received_head, strict=True))
        # Recompute round 2: head epoch with body frozen, then body epoch with head frozen.
        start = [
            h if m else g
            for m, g, h in zip(
                mask,
                log.received["fit", 2, pid],
                _scatter(mask, log.after["fit", 1, pid][PERSONAL]),
                strict=True,
            )
        ]
        model = experiment.new_model()
        set_weights(model, start)
        data = experiment.client_data(pid)
        settings = experiment.train_settings(2)
        from dataclasses import replace

        with split.trainable_only(model, split.head_parameters(model)):
            train(
                model,
                data.train,
                data.prepare,
                replace(settings, epochs=1),
                data_order(0, 2, pid, 1),
            )
        with split.trainable_only(model, split.body_parameters(model)):
            train(model, data.train, data.prepare, settings, data_order(0, 2, pid))
        expected = get_weights(model)
        assert_arrays_close(
            [a for a, m in zip(expected, mask, strict=True) if m],
            log.after["fit", 2, pid][PERSONAL],
            rtol=1e-5,
            atol=1e-6,
        )
        assert_arrays_close(
            [a for a, m in zip(expected, mask, strict=True) if not m],
            [a for a in log.sent["fit", 2, pid] if a.size],
            rtol=1e-5,
            atol=1e-6,
        )
    # The server's global head never moves (nobody uploads it); the body is the weighted mean.
    (strategy,) = strategies
    initial = experiment.initial_weights()
    for m, g, i in zip(mask, strategy.global_weights, initial, strict=True):
        if m:
            np.testing.assert_array_equal(g, i)


def _scatter(mask: list[bool], personal: NDArrays) -> NDArrays:
    it = iter(personal)
    return [next(it) if m else np.empty(0) for m in mask]


ONE_STEP = [*BASE, "rounds=1", "train.local_steps=1"]


def _batch(seed: list[int], n: int, size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(
        int(np.random.SeedSequence(seed).generate_state(1)[0])
    )
    return torch.randperm(n, generator=generator)[:size]


def test_perfedavg_step_is_first_order_maml(tmp_path: Path) -> None:
    """One local step: w̃ = w − α∇f(w; D), upload w − β∇f(w̃; D') (α = 0.02, β = train.lr)."""
    log = Log(())
    _, contexts = run_inprocess(
        [*ONE_STEP, "strategy=perfedavg", "strategy.alpha=0.02"], tmp_path, log.make_client
    )
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    pid = 1
    data = experiment.client_data(pid)
    model = experiment.new_model()
    set_weights(model, log.received["fit", 1, pid])
    inner = _batch([0, 1, pid, 2], len(data.train), 32)
    outer = _batch([0, 1, pid], len(data.train), 32)
    params = list(model.parameters())
    w = [p.detach().clone() for p in params]
    loss = nn.functional.cross_entropy(
        model(data.prepare(data.train.images[inner])), data.train.labels[inner]
    )
    with torch.no_grad():
        for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
            p -= 0.02 * g
    loss = nn.functional.cross_entropy(
        model(data.prepare(data.train.images[outer])), data.train.labels[outer]
    )
    grads = torch.autograd.grad(loss, params)
    expected = [(v - 0.05 * g).numpy() for v, g in zip(w, grads, strict=True)]
    assert_arrays_close(log.sent["fit", 1, pid], expected, rtol=1e-5, atol=1e-6)


def test_fedrod_stores_the_trained_personal_head(tmp_path: Path) -> None:
    """One step: the body and generic head follow the balanced softmax CE(g(z) + log n_c, y);
    the stored personal head is p − lr ∇_p CE(g(z) + p(z), y) with z, g(z) detached, p = Θ^0's
    head."""
    from pflower.strategies.fedrod import PERSONAL_HEAD

    log = Log((PERSONAL_HEAD,))
    _, contexts = run_inprocess([*ONE_STEP, "strategy=fedrod"], tmp_path, log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    pid = 2
    data = experiment.client_data(pid)
    model = experiment.new_model()
    set_weights(model, log.received["fit", 1, pid])
    batch = _batch([0, 1, pid], len(data.train), 32)
    x, y = data.prepare(data.train.images[batch]), data.train.labels[batch]
    prior = torch.bincount(data.train.labels, minlength=10).float().clamp_min(1e-8).log()
    z = model.represent(x)
    generic = model.fc(z)
    grads = torch.autograd.grad(
        nn.functional.cross_entropy(generic + prior, y), list(model.parameters())
    )
    expected = [
        (p - 0.05 * g).detach().numpy() for p, g in zip(model.parameters(), grads, strict=True)
    ]
    assert_arrays_close(log.sent["fit", 1, pid], expected, rtol=1e-5, atol=1e-6)
    head = nn.Linear(model.fc.in_features, 10)
    head.load_state_dict(model.fc.state_dict())
    loss = nn.functional.cross_entropy(generic.detach() + head(z.detach()), y)
    head_grads = torch.autograd.grad(loss, list(head.parameters()))
    expected_head = [
        (p - 0.05 * g).detach().numpy() for p, g in zip(head.parameters(), head_grads, strict=True)
    ]
    assert_arrays_close(
        log.after["fit", 1, pid][PERSONAL_HEAD], expected_head, rtol=1e-5, atol=1e-6
    )


def test_fedphp_evaluates_the_inherited_model_from_the_stored_one(tmp_path: Path) -> None:
    """The stored w_i is the trained (uploaded) model; stage L1 of round R evaluates
    (1 − μ_{R+1}) Θ^R + μ_{R+1} w_i."""
    from pflower.core.training import evaluate
    from pflower.strategies.fedphp import LOCAL_MODEL, inherit

    log = Log((LOCAL_MODEL,))
    rows, contexts = run_inprocess(
        [*BASE, "strategy=fedphp", "rounds=3"], tmp_path, log.make_client
    )
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    for pid in range(4):
        for round_ in (1, 2):
            stored = log.after["fit", round_, pid][LOCAL_MODEL]
            assert_arrays_close(stored, log.sent["fit", round_, pid], rtol=0, atol=0)
            set_weights(
                model,
                inherit(0.9 * (round_ + 1) / 3, log.received["evaluate", round_, pid], stored),
            )
            data = experiment.client_data(pid)
            result = evaluate(model, data.test, data.prepare, 512)
            (l1,) = [
                r
                for r in rows
                if r["stage"] == "L1" and r["round"] == round_ and r["client"] == pid
            ]
            assert l1["loss_local"] == pytest.approx(result.loss, rel=1e-5)


@pytest.mark.parametrize("evaluated", [None, [2]], ids=["every-round", "rounds-2-and-4"])
def test_each_client_applies_ala_to_every_model_it_receives(
    evaluated: list[int] | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under partial participation a client applies ALA to each global model it receives, at fit
    or at stage-L1 evaluation, from the round it first trained (before, it has no local model).
    Evaluated every round, that is every model, as the authors' server, which sends each model
    to every client; evaluated in some rounds, a client neither selected nor evaluated skips
    that model."""
    applied: set[tuple[int, int]] = set()
    trained: set[tuple[int, int]] = set()
    ala_initialized, start_model = ALAClientMixin.ala_initialized, ALAClientMixin.start_model

    def recording_ala(self, received, version, config):  # type: ignore[no-untyped-def]
        before = int(self.state.get_scalars(ALA_META).get("version", -1))
        result = ala_initialized(self, received, version, config)
        if before < version == int(self.state.get_scalars(ALA_META).get("version", -1)):
            applied.add((self.partition_id, version))
        return result

    def recording_start(self, global_weights, config):  # type: ignore[no-untyped-def]
        trained.add((self.partition_id, int(config["server-round"])))
        return start_model(self, global_weights, config)

    monkeypatch.setattr(ALAClientMixin, "ala_initialized", recording_ala)
    monkeypatch.setattr(ALAClientMixin, "start_model", recording_start)
    rounds = 4
    schedule = [] if evaluated is None else [f"eval.rounds={evaluated}"]
    overrides = tiny("train.lr=0.05", "strategy=fedala", "fraction=0.5", rounds=rounds)
    run_inprocess([*overrides, *schedule], tmp_path)
    looked = set(range(1, rounds + 1)) if evaluated is None else {*evaluated, rounds}
    skipped = []
    for pid in range(4):
        first = min(r for p, r in trained if p == pid)
        received = {t for t in range(first, rounds + 1) if t in looked or (pid, t + 1) in trained}
        assert {v for p, v in applied if p == pid} == received
        skipped += [(pid, t) for t in range(first, rounds + 1) if t not in received]
    assert (skipped == []) == (evaluated is None)
