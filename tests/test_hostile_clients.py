"""Hostile clients: every malformed or dishonest reply is rejected with a logged reason, and the
global model is what it would have been had that client simply failed.

In-process (no Ray): the real ServerApp and ClientApp functions, with one client (partition
:data:`VICTIM`) whose replies are tampered with after it has trained. The reference run makes
the same client fail plainly (an exception after training), so the two global models must be
equal array for array.

A finite but huge update (one entry 1e30) passes every check, so only robust aggregation can
stop it: the plain mean breaks the next round, and every defense that claims to stop it (median,
norm clipping, and trimmed mean / Multi-Krum configured so that they can act) keeps every loss of
a three-round run finite; the configurations in which they cannot act are refused or logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context
from flwr.client import Client
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from pflower.client.app import client_fn
from pflower.compose import compose_config
from pflower.core.strategy import PersonalizedStrategy, RoundFailedError
from pflower.registry import ConfigError
from pflower.results.failures import every_client_acc, rejected_replies
from tests.inprocess import run_inprocess

VICTIM = 1
BASE = [
    "dataset=digits",
    "model=small_cnn",
    "num_clients=3",
    "rounds=1",
    "train.local_epochs=1",
    "strategy=fedavg",
]
Tamper = Callable[[FitRes], FitRes]


def _arrays(res: FitRes, change: Callable[[list[np.ndarray]], list[np.ndarray]]) -> FitRes:
    arrays = change([a.copy() for a in parameters_to_ndarrays(res.parameters)])
    return FitRes(res.status, ndarrays_to_parameters(arrays), res.num_examples, res.metrics)


def _metrics(res: FitRes, **changes: object) -> FitRes:
    return FitRes(res.status, res.parameters, res.num_examples, {**res.metrics, **changes})


def _first(arrays: list[np.ndarray], value: np.ndarray) -> list[np.ndarray]:
    return [value, *arrays[1:]]


def _poison(value: float) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    def change(arrays: list[np.ndarray]) -> list[np.ndarray]:
        arrays[0].flat[0] = value
        return arrays

    return change


TAMPERED: dict[str, tuple[Tamper, str]] = {
    "nan": (lambda r: _arrays(r, _poison(np.nan)), "NaN or Inf"),
    "inf": (lambda r: _arrays(r, _poison(np.inf)), "NaN or Inf"),
    "wrong shape": (lambda r: _arrays(r, lambda a: _first(a, a[0].reshape(-1))), "shape"),
    "wrong count": (lambda r: _arrays(r, lambda a: a[:-1]), "arrays, expected"),
    "wrong dtype": (lambda r: _arrays(r, lambda a: _first(a, a[0].astype(np.float64))), "dtype"),
    "oversized": (
        lambda r: _arrays(r, lambda a: _first(a, np.zeros(10**6 + a[0].size, a[0].dtype))),
        "shape",
    ),
    "non-numeric metric": (lambda r: _metrics(r, train_loss="garbage"), "train_loss"),
    "accuracy out of range": (lambda r: _metrics(r, acc_local=1e300), "acc_local"),
    "negative loss": (lambda r: _metrics(r, loss_global=-1.0), "loss_global"),
    "infinite loss": (lambda r: _metrics(r, train_loss=float("inf")), "train_loss"),
    "inflated num_examples": (
        lambda r: FitRes(r.status, r.parameters, 10**12, r.metrics),
        "num_examples",
    ),
    "another partition id": (lambda r: _metrics(r, partition_id=0), "partition_id"),
}


def _tampering(victim: int, fit: Tamper) -> Callable[[Context], Client]:
    def make_client(context: Context) -> Client:
        client = client_fn(context)
        if int(context.node_config["partition-id"]) == victim:
            honest = client.fit
            client.fit = lambda ins: fit(honest(ins))  # type: ignore[method-assign]
        return client

    return make_client


def _raise(res: FitRes) -> FitRes:
    raise RuntimeError("the client failed after training")


def _run(
    tmp_path: Path,
    name: str,
    make_client: Callable[[Context], Client],
    overrides: Sequence[str] = tuple(BASE),
):
    strategies: list[PersonalizedStrategy] = []
    rows, _ = run_inprocess(list(overrides), tmp_path / name, make_client, strategies)
    return rows, strategies[0], (tmp_path / name / "run.log").read_text()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """The global model after round 1 when the victim fails plainly."""
    tmp = tmp_path_factory.mktemp("reference")
    _, strategy, _ = _run(tmp, "reference", _tampering(VICTIM, _raise))
    return strategy.global_weights


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_upload_is_rejected_logged_and_ignored(
    tmp_path: Path, case: str, reference: list[np.ndarray]
) -> None:
    tamper, reason = TAMPERED[case]
    rows, strategy, log = _run(tmp_path, "run", _tampering(VICTIM, tamper))
    failures = [r for r in rows if r["stage"] == "failure"]
    assert [(r["round"], r["phase"], r["client"]) for r in failures] == [(1, "fit", VICTIM)]
    assert reason in failures[0]["error"]
    assert not [r for r in rows if r["stage"] == "L2" and r["client"] == VICTIM]
    warning = [line for line in log.splitlines() if "rejected" in line and "WARNING" in line]
    assert len(warning) == 1, log
    assert f"client {VICTIM}" in warning[0] and "round 1" in warning[0] and reason in warning[0]
    for got, want in zip(strategy.global_weights, reference, strict=True):
        np.testing.assert_array_equal(got, want)


HUGE = [*BASE, "num_clients=4", "rounds=3"]
"""Four clients, three rounds: partition :data:`VICTIM` uploads its model with one entry 1e30."""

DEFENSES = {
    "median": ["robust=median"],
    "norm_clip": ["robust=norm_clip"],
    "trimmed_mean cutting one": ["robust=trimmed_mean", "robust.trim_fraction=0.25"],
    "multi_krum with f = 1": ["robust=multi_krum", "robust.num_malicious=1"],
    "norm_clip under FLAME (its cached z_i)": ["strategy=flame", "robust=norm_clip"],
    "norm_clip under FedPer (heads kept)": ["strategy=fedper", "robust=norm_clip"],
}
"""Overrides added to :data:`HUGE` (a ``strategy=`` replaces FedAvg)."""


def _huge(res: FitRes) -> FitRes:
    return _arrays(res, _poison(1e30))


def test_a_huge_finite_update_breaks_the_plain_mean(tmp_path: Path) -> None:
    """Nothing rejects the 1e30 entry; FedAvg's mean carries 2.5e29 into round 2, whose every
    upload is then NaN: the round fails."""
    with pytest.raises(RoundFailedError, match="Round 2: all 4 clients failed"):
        _run(tmp_path, "run", _tampering(VICTIM, _huge), HUGE)


@pytest.mark.parametrize("defense", sorted(DEFENSES))
def test_a_defense_keeps_every_loss_finite_under_a_huge_update(
    tmp_path: Path, defense: str
) -> None:
    overrides = DEFENSES[defense]
    if any(o.startswith("strategy=") for o in overrides):
        overrides = [*(o for o in HUGE if not o.startswith("strategy=")), *overrides]
    else:
        overrides = [*HUGE, *overrides]
    rows, strategy, _ = _run(tmp_path, "run", _tampering(VICTIM, _huge), overrides)
    assert not [r for r in rows if r["stage"] == "failure"]
    losses = [r["loss"] for r in rows if r["stage"] == "G"]
    losses += [r["loss_local"] for r in rows if r["stage"] in ("L1", "L2")]
    assert len([r for r in rows if r["stage"] == "L1"]) == 3 * 4  # rounds 1 to 3, 4 clients
    if strategy.has_global_model:
        assert len([r for r in rows if r["stage"] == "G"]) == 4  # rounds 0 to 3
    assert all(np.isfinite(loss) for loss in losses), losses
    assert max(float(np.abs(a).max()) for a in strategy.global_weights) < 100.0


def test_trimmed_mean_that_would_cut_nobody_is_refused_with_the_numbers() -> None:
    """The default trim_fraction 0.2 of 4 clients cuts int(0.8) = 0 values: refused, exit 2."""
    with pytest.raises(ConfigError, match=r"int\(0\.2 x 4\) = 0 .*trim_fraction >= 0\.25"):
        compose_config([*HUGE, "robust=trimmed_mean"])


def test_multi_krum_assuming_no_attacker_is_logged_with_the_numbers(tmp_path: Path) -> None:
    """attack=none gives f = 0: Multi-Krum keeps all 4 updates. The run is allowed (the
    attack-free point of a robustness study) but says so first; the 1e30 update then breaks
    it as it breaks the plain mean."""
    overrides = [*HUGE, "robust=multi_krum"]
    with pytest.raises(RoundFailedError, match="Round 2: all 4 clients failed"):
        _run(tmp_path, "run", _tampering(VICTIM, _huge), overrides)
    first = (tmp_path / "run" / "run.log").read_text().splitlines()[0]
    assert "WARNING" in first and "f = 0" in first and "keeps all n - f = 4 of the 4" in first
    assert "robust.num_malicious" in first


def test_out_of_range_evaluation_metrics_are_rejected_and_not_recorded(tmp_path: Path) -> None:
    def make_client(context: Context) -> Client:
        client = client_fn(context)
        if int(context.node_config["partition-id"]) == VICTIM:
            honest = client.evaluate

            def evaluate(ins: EvaluateIns) -> EvaluateRes:
                res = honest(ins)
                metrics = {**res.metrics, "acc_global": 7.0}
                return EvaluateRes(res.status, res.loss, res.num_examples, metrics)

            client.evaluate = evaluate  # type: ignore[method-assign]
        return client

    rows, _, log = _run(tmp_path, "run", make_client)
    assert not [r for r in rows if r["stage"] == "L1" and r["client"] == VICTIM]
    assert [r["client"] for r in rows if r["stage"] == "L1"] == [0, 2]
    failures = [r for r in rows if r["stage"] == "failure"]
    assert [(r["phase"], r["client"]) for r in failures] == [("evaluate", VICTIM)]
    assert "acc_global" in failures[0]["error"]
    assert any("rejected" in line and "acc_global" in line for line in log.splitlines())
    # the run's own mean is over the 2 clients that replied; the leaderboard's over all 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    replied = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 1]
    assert summary["final"]["L1"]["acc_local"]["mean"] == pytest.approx(np.mean(replied))
    assert rejected_replies(summary).missing_at_end == 1  # type: ignore[union-attr]
    assert every_client_acc(summary) == pytest.approx(sum(replied) / 3)


def test_a_duplicate_partition_id_is_refused_at_registration(tmp_path: Path) -> None:
    """The node of partition 2 claims partition 1. The node asked first holds the partition
    (here the impostor: nodes are asked in registration order), the other is refused with its
    reason recorded and logged; the impostor's upload then reports its real partition id and is
    rejected too, so nothing of partition 1's claimants reaches the global model."""

    def make_client(context: Context) -> Client:
        client = client_fn(context)
        if int(context.node_config["partition-id"]) == 2:
            honest = client.get_properties

            def get_properties(ins: GetPropertiesIns) -> GetPropertiesRes:
                res = honest(ins)
                return GetPropertiesRes(res.status, {**res.properties, "partition_id": 1})

            client.get_properties = get_properties  # type: ignore[method-assign]
        return client

    rows, strategy, log = _run(tmp_path, "run", make_client)
    held = sorted(strategy.roster.partition_of.values())
    assert held == [0, 1]
    refused = [r for r in rows if r["stage"] == "failure" and r["phase"] == "connect"]
    assert len(refused) >= 1 and "partition 1" in refused[0]["error"]
    assert "already" in refused[0]["error"]
    assert any("WARNING" in line and "already" in line for line in log.splitlines())
    fit = [r for r in rows if r["stage"] == "failure" and r["phase"] == "fit"]
    assert [r["client"] for r in fit] == [1] and "registered partition 1" in fit[0]["error"]
    assert [r["client"] for r in rows if r["stage"] == "L2"] == [0]


def test_the_round_summary_line_counts_rejections(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from pflower.compose import compose_config
    from pflower.results.rundir import RunRecorder

    out = StringIO()
    cfg = compose_config(["dataset=digits", "progress=true"])
    recorder = RunRecorder(tmp_path, cfg, console=Console(file=out, width=200))
    recorder.rejected(1, "fit", {1: "array 0 contains NaN or Inf"})
    recorder.round_done(1)
    recorder.fail("the test is over")
    assert "round 1/" in out.getvalue() and "| 1 rejected" in out.getvalue()
