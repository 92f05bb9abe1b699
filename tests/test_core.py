"""The federated core: algorithm identities, state across rounds, failures, stage bookkeeping.

These run the real server_fn/client_fn in one process (tests/inprocess.py) on the embedded digits
data with a tiny CNN, so each experiment takes a few seconds.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from flwr.common import NDArrays, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.history import History

from pflower.client.app import client_fn
from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import GlobalEvaluation, GlobalEvaluator, RoundFailedError
from pflower.server import app as server_app
from pflower.server.loop import GlobalStage
from pflower.strategies.fliu import adaptive_gamma, mix
from tests.helpers import (
    comparable,
    stage_rows,
    tiny,
)
from tests.inprocess import run_inprocess

BASE = tiny("train.lr=0.05", rounds=3)


SUMMARY_KEYS = {
    "status",
    "error",
    "rounds",
    "scored_on",
    "final_round",
    "final",
    "last10",
    "last10_rounds",
    "failures",
    "wall_time_s",
    "cost",
    "config",
    "code",
    "numerics",
}


def test_local_keeps_its_model_across_rounds(tmp_path: Path) -> None:
    rows, contexts = run_inprocess([*BASE, "strategy=local"], tmp_path)
    for context in contexts:
        assert ClientState(context.state).get_arrays("local_model") is not None
    # CLT has no personalization step: L1 evaluates exactly the model trained at L2.
    for l1, l2 in zip(stage_rows(rows, "L1"), stage_rows(rows, "L2"), strict=True):
        assert (l1["client"], l1["acc_local"], l1["loss_local"]) == (
            l2["client"],
            l2["acc_local"],
            l2["loss_local"],
        )
    # Training continues from the stored model: local loss keeps falling round over round.
    first = np.mean([r["loss_local"] for r in stage_rows(rows, "L2", 1)])
    last = np.mean([r["loss_local"] for r in stage_rows(rows, "L2", 3)])
    assert last < first


def test_fliu_state_persists_and_mix_is_evaluated_at_l1(tmp_path: Path) -> None:
    rows, contexts = run_inprocess(
        [*BASE, "strategy=fliu", "strategy.gamma_mode=fixed", "strategy.gamma=0.5"], tmp_path
    )
    for context in contexts:
        state = ClientState(context.state)
        assert state.get_scalars("fliu_meta")["last_round"] == 3
        assert state.get_arrays("fliu_local") is not None
    gammas = {r["gamma"] for r in rows if r["stage"] == "L2"}
    assert gammas == {0.5}
    # L1 (the mix) differs from L2 (the trained model) and from the global model (G).
    l1 = stage_rows(rows, "L1", 3)
    l2 = stage_rows(rows, "L2", 3)
    assert [r["loss_local"] for r in l1] != [r["loss_local"] for r in l2]


def test_fedavg_l1_is_the_global_model(tmp_path: Path) -> None:
    exact = [*BASE, "strategy=fedavg", "eval.client_global_test=subsample"]
    rows, _ = run_inprocess([*exact, "eval.global_test_max_samples=null"], tmp_path / "exact")
    for round_ in (1, 2, 3):
        (g,) = stage_rows(rows, "G", round_)
        for row in stage_rows(rows, "L1", round_):
            assert row["acc_global"] == pytest.approx(g["acc"])
            assert row["loss_global"] == pytest.approx(g["loss"], rel=1e-5)
    # by default each client measures Acc(G) on its own slice; the slices partition the global
    # test set, so their size-weighted mean is the global model's accuracy on the whole set
    sliced = [*BASE, "strategy=fedavg", "eval.global_test_max_samples=null"]
    rows, _ = run_inprocess(sliced, tmp_path / "sliced")
    sizes = [len(s) for s in Experiment(compose_config(sliced))._slices]
    for round_ in (1, 2, 3):
        (g,) = stage_rows(rows, "G", round_)
        l1 = stage_rows(rows, "L1", round_)
        assert sorted(r["client"] for r in l1) == list(range(len(sizes)))
        mean = sum(r["acc_global"] * sizes[r["client"]] for r in l1) / sum(sizes)
        assert mean == pytest.approx(g["acc"])


def test_fedavg_ft_personalizes_at_l1(tmp_path: Path) -> None:
    fedavg, _ = run_inprocess([*BASE, "strategy=fedavg"], tmp_path / "a")
    finetune, _ = run_inprocess(
        [*BASE, "strategy=fedavg_ft", "strategy.finetune_epochs=2"], tmp_path / "b"
    )
    # Pathological clients hold 2 classes: fine-tuning on them raises local accuracy.
    acc = lambda rows: np.mean([r["acc_local"] for r in stage_rows(rows, "L1", 3)])  # noqa: E731
    assert acc(finetune) > acc(fedavg)
    assert comparable(stage_rows(finetune, "G")) == comparable(stage_rows(fedavg, "G"))


def test_adaptive_gamma_follows_eq4() -> None:
    n, k = 1000, 10  # mean client size m = 100
    assert adaptive_gamma(1001, n, k) == 0.90
    assert adaptive_gamma(1000, n, k) == 0.75  # strict ">": exactly 10 m is not above 10 m
    assert adaptive_gamma(501, n, k) == 0.75
    assert adaptive_gamma(101, n, k) == 0.50
    assert adaptive_gamma(100, n, k) == 0.25  # n_k = m gives 0.25 (A8)
    assert adaptive_gamma(51, n, k) == 0.25
    assert adaptive_gamma(50, n, k) == 0.10


def test_mix_endpoints_are_exact() -> None:
    rng = np.random.default_rng(0)
    local = [rng.normal(size=(3, 4)).astype(np.float32)]
    global_ = [rng.normal(size=(3, 4)).astype(np.float32)]
    assert np.array_equal(mix(0.0, local, global_)[0], global_[0])
    assert np.array_equal(mix(1.0, local, global_)[0], local[0])
    np.testing.assert_allclose(
        mix(0.25, local, global_)[0], 0.25 * local[0] + 0.75 * global_[0], rtol=1e-6
    )


def failing_client_fn(failing: set[int]):
    """client_fn whose clients in ``failing`` raise in fit and evaluate (a crash while training)."""

    def make(context):
        client = client_fn(context)
        partition_id = int(context.node_config["partition-id"])
        if partition_id in failing:

            def crash(ins):
                raise RuntimeError(f"injected failure on partition {partition_id}")

            client.fit = crash
            client.evaluate = crash
        return client

    return make


def test_a_failed_client_is_tolerated_and_recorded(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        [*BASE, "strategy=fedavg", "rounds=2"], tmp_path, make_client=failing_client_fn({2})
    )
    failures = [r for r in rows if r["stage"] == "failure"]
    assert {(r["round"], r["phase"], r["client"]) for r in failures} == {
        (1, "fit", 2),
        (1, "evaluate", 2),
        (2, "fit", 2),
        (2, "evaluate", 2),
    }
    assert all("injected failure on partition 2" in r["error"] for r in failures)
    assert {r["client"] for r in stage_rows(rows, "L2")} == {0, 1, 3}


def test_a_round_where_every_client_failed_stops_the_run(tmp_path: Path) -> None:
    with pytest.raises(RoundFailedError, match="all 4 clients failed") as error:
        run_inprocess(
            [*BASE, "strategy=fedavg"], tmp_path, make_client=failing_client_fn({0, 1, 2, 3})
        )
    assert "injected failure on partition 3" in str(error.value)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "injected failure on partition 0" in summary["error"]
    # One shape for failed and completed runs, with the resolved configuration in both.
    assert set(summary) == SUMMARY_KEYS
    assert summary["config"]["strategy"]["name"] == "fedavg" and summary["final_round"] is None


def test_summary_says_which_shares_the_accuracies_were_scored_on(tmp_path: Path) -> None:
    """A tuning run (``split.evaluate_on=val``) records its validation accuracies under the same
    names as a final run's test accuracies: ``scored_on`` tells the two files apart."""
    from pflower.results.summary import write_summary

    for evaluate_on in ("test", "val"):
        cfg = compose_config([*BASE, "split.val_fraction=0.2", f"split.evaluate_on={evaluate_on}"])
        path = write_summary(tmp_path / evaluate_on, cfg, [], "completed")
        assert json.loads(path.read_text())["scored_on"] == evaluate_on


def test_read_rows_leaves_out_a_row_still_being_written(tmp_path: Path) -> None:
    """A live run's last line (or that of a run killed while writing it) may be half written:
    it is left out. A bad line before the last is damage, and raises."""
    from pflower.results.rows import read_rows

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1, "stage": "time"}\n{"round": 2, "sta')
    assert read_rows(tmp_path) == [{"round": 1, "stage": "time"}]
    path.write_text('{"round": 1, "sta\n{"round": 2, "stage": "time"}\n')
    with pytest.raises(json.JSONDecodeError):
        read_rows(tmp_path)
    path.unlink()
    assert read_rows(tmp_path) == []


def test_a_run_with_no_reachable_client_stops_instead_of_idling(tmp_path: Path) -> None:
    def unreachable(context):
        client = client_fn(context)

        def refuse(ins):
            raise ConnectionError("node unavailable")

        client.get_properties = refuse
        return client

    with pytest.raises(RoundFailedError, match="only 0 client"):
        run_inprocess([*BASE, "strategy=fedavg"], tmp_path, make_client=unreachable)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    failures = [r for r in rows if r["stage"] == "failure"]
    assert {r["phase"] for r in failures} == {"connect"} and len(failures) == 4
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_too_many_failures_stop_the_run(tmp_path: Path) -> None:
    with pytest.raises(RoundFailedError, match="3 of 4 clients failed"):
        run_inprocess(
            [*BASE, "strategy=fedavg", "failures.max_failed_fraction=0.5"],
            tmp_path,
            make_client=failing_client_fn({0, 1, 2}),
        )


def test_updates_with_nan_are_rejected(tmp_path: Path) -> None:
    def poisoned(context):
        client = client_fn(context)
        if int(context.node_config["partition-id"]) != 1:
            return client
        original_fit = client.fit

        def fit(ins):
            res = original_fit(ins)
            arrays = parameters_to_ndarrays(res.parameters)
            arrays[0] = np.full_like(arrays[0], np.nan)
            res.parameters = ndarrays_to_parameters(arrays)
            return res

        client.fit = fit
        return client

    rows, _ = run_inprocess([*BASE, "strategy=fedavg", "rounds=1"], tmp_path, make_client=poisoned)
    failures = [r for r in rows if r["stage"] == "failure"]
    assert [(r["client"], r["error"]) for r in failures] == [(1, "array 0 contains NaN or Inf")]
    (g,) = stage_rows(rows, "G", 1)
    assert np.isfinite(g["loss"])


def test_partial_participation_is_seeded(tmp_path: Path) -> None:
    overrides = [*BASE, "strategy=fedavg", "fraction=0.5", "num_clients=6"]
    first, _ = run_inprocess(overrides, tmp_path / "a")
    second, _ = run_inprocess(overrides, tmp_path / "b")
    trained = lambda rows: [(r["round"], r["client"]) for r in stage_rows(rows, "L2")]  # noqa: E731
    assert trained(first) == trained(second)
    assert len(trained(first)) == 3 * 3
    assert len({c for _, c in trained(first)}) > 3  # different clients in different rounds


def test_training_does_not_depend_on_how_often_clients_are_evaluated(tmp_path: Path) -> None:
    """Fit and evaluate sampling draw from independent per-round streams: evaluating every round
    instead of every second round leaves which clients train, and what they train, unchanged."""
    overrides = [*BASE, "strategy=fedavg", "fraction=0.5", "num_clients=6", "eval.fraction=0.5"]
    every_round, _ = run_inprocess([*overrides, "rounds=4", "eval.every=1"], tmp_path / "a")
    every_second, _ = run_inprocess([*overrides, "rounds=4", "eval.every=2"], tmp_path / "b")
    for round_ in (2, 4):
        for stage in ("L2", "G"):
            assert comparable(stage_rows(every_round, stage, round_)) == comparable(
                stage_rows(every_second, stage, round_)
            )


def test_end_to_end_learns_on_digits(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        [
            "dataset=digits",
            "partition=pathological",
            "num_clients=10",
            "strategy=fliu",
            "plots=true",
        ],
        tmp_path,
    )
    final_l1 = stage_rows(rows, "L1", 10)
    assert len(final_l1) == 10
    # Each client holds 2 classes: chance is 0.5 locally, 0.1 globally.
    assert np.mean([r["acc_local"] for r in final_l1]) > 0.85
    (g,) = stage_rows(rows, "G", 10)
    assert g["acc"] > 0.5
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS and summary["status"] == "completed"
    assert summary["error"] is None and summary["final_round"] == 10
    assert summary["config"]["strategy"]["gamma_mode"] == "adaptive"
    # the cost: rounds' spacing, and FLIU's traffic, the model down and the model up
    cost = summary["cost"]
    assert cost["seconds_per_round"] > 0
    sent = [r["bytes_down"] for r in stage_rows(rows, "L2")]
    assert cost["mb_down_per_client_round"] == pytest.approx(np.mean(sent) / 1e6)
    assert cost["mb_down_per_client_round"] == pytest.approx(cost["mb_up_per_client_round"])
    assert summary["final"]["L1"]["rho_0.9"] >= 0
    assert summary["last10_rounds"] == [10]  # 10 rounds: the last 10% is the final round
    assert (
        summary["last10"]["L1"]["acc_local"]["mean"] == summary["final"]["L1"]["acc_local"]["mean"]
    )
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 0
    assert (tmp_path / "plots" / "clients.png").stat().st_size > 0
    assert (tmp_path / "config.yaml").read_text().startswith("dataset:")


def test_plots_false_completes_the_run_without_figures(tmp_path: Path) -> None:
    run_inprocess(["dataset=digits", "num_clients=2", "rounds=1", "plots=false"], tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert not (tmp_path / "plots").exists()


def test_stage_g_is_computed_in_the_background_and_recorded_when_finished() -> None:
    recorded: list[tuple[int, dict]] = []
    computing = threading.Event()
    release = threading.Event()

    def compute() -> dict[str, float]:
        computing.set()
        assert release.wait(timeout=30), "the test never released the evaluation"
        return {"acc": 0.5, "loss": 1.5}

    def record(metrics: dict[str, float]) -> tuple[float, dict]:
        recorded.append((threading.get_ident(), metrics))
        return metrics["loss"], dict(metrics)

    history = History()
    with ThreadPoolExecutor(max_workers=1) as executor:
        stage_g = GlobalStage(executor, history)
        stage_g.start(GlobalEvaluation(3, compute, record))  # returns while it computes
        assert computing.wait(timeout=30) and not recorded
        release.set()
        stage_g.finish()
        stage_g.finish()  # nothing left: records nothing twice
        stage_g.start(None)
    assert recorded == [(threading.get_ident(), {"acc": 0.5, "loss": 1.5})]
    assert history.losses_centralized == [(3, 1.5)]
    assert history.metrics_centralized == {"acc": [(3, 0.5)], "loss": [(3, 1.5)]}


def test_stage_g_runs_beside_the_clients_and_keeps_the_row_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's evaluation runs on its own thread while clients work (round 0's during
    round 1's fit), and metrics.jsonl keeps the sequential order: per round L2, G, then L1."""
    threads: list[str] = []
    built = server_app.global_evaluator

    def watched(experiment: Experiment) -> GlobalEvaluator:
        evaluate_global = built(experiment)

        def evaluate(weights: NDArrays) -> dict[str, float]:
            threads.append(threading.current_thread().name)
            return evaluate_global(weights)

        return evaluate

    monkeypatch.setattr(server_app, "global_evaluator", watched)
    rows, _ = run_inprocess([*BASE, "eval.every=2"], tmp_path)
    assert threads and all(name.startswith("pflower-stage-g") for name in threads), threads
    order = [(r["round"], r["stage"]) for r in rows if r["stage"] in ("L1", "L2", "G")]
    assert order[0] == (0, "G")
    for round_ in (2, 3):  # evaluated rounds (every 2nd and the last)
        stages = [stage for r, stage in order if r == round_]
        assert stages.index("G") > max(i for i, s in enumerate(stages) if s == "L2")
        assert stages.index("G") < min(i for i, s in enumerate(stages) if s == "L1")
    assert [r for r, stage in order if stage == "G"] == [0, 2, 3]
