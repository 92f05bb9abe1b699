"""Evaluation that scales: each client's own stratified slice of the global test set (or a
stratified subsample all clients share) for the clients' Acc(G), and stage L2 measured only on
the training clients that are also in the round's evaluation sample.

Defaults: ``eval.client_global_test=slice`` with ``eval.global_test_max_samples=2000`` (the cap of
a slice; ``subsample``: the size of the shared subsample, null or 0: the whole set), stage G on
the server on the whole set unless ``eval.server_test_max_samples`` asks for a stratified
subsample; ``eval.l2_clients=evaluated`` (``trained``: every training client).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.client.app import client_fn
from pflower.compose import compose_config
from pflower.config import RUN_CONFIG_KEY, overrides_to_string
from pflower.core.experiment import Experiment, _stratified_slices, _stratified_subsample
from pflower.core.strategy import Phase, round_rng
from pflower.core.training import evaluate, get_weights
from pflower.registry import ConfigError
from pflower.server.app import global_evaluator
from tests.helpers import (
    comparable,
    stage_rows,
    tiny,
)
from tests.inprocess import run_inprocess

BASE = tiny()
LIMIT = 100
SHARED = "eval.client_global_test=subsample"


def experiment(*overrides: str) -> Experiment:
    """A fresh (uncached) experiment of ``BASE`` plus ``overrides``."""
    return Experiment(compose_config([*BASE, *overrides]))


# ------------------------------------------------------------------ the global-test subsample
def test_subsample_is_stratified_seeded_and_the_same_for_every_client() -> None:
    full = experiment().full_global_test
    sub = experiment(SHARED, f"eval.global_test_max_samples={LIMIT}").global_test
    assert len(sub) == LIMIT < len(full)
    # stratified: every class within one sample of its share of the whole set
    full_counts = np.bincount(full.labels.numpy(), minlength=10)
    sub_counts = np.bincount(sub.labels.numpy(), minlength=10)
    assert np.all(np.abs(sub_counts - full_counts * LIMIT / len(full)) < 1.0)
    assert sub_counts.sum() == LIMIT
    # a subset of the whole set: every chosen image is one of its images, no repeats
    full_rows = {tuple(image.flatten().tolist()) for image in full.images}
    sub_rows = [tuple(image.flatten().tolist()) for image in sub.images]
    assert len(set(sub_rows)) == LIMIT and set(sub_rows) <= full_rows
    # deterministic by seed: rebuilt from scratch, the same samples; another seed, others
    again = experiment(SHARED, f"eval.global_test_max_samples={LIMIT}").global_test
    assert torch.equal(again.images, sub.images) and torch.equal(again.labels, sub.labels)
    labels = full.labels.numpy()
    for seed in (0, 1):
        assert np.array_equal(
            _stratified_subsample(labels, LIMIT, seed), _stratified_subsample(labels, LIMIT, seed)
        )
    assert not np.array_equal(
        _stratified_subsample(labels, LIMIT, 0), _stratified_subsample(labels, LIMIT, 1)
    )
    # the same for every client (and so for every round: it is built once per process)
    exp = experiment(SHARED, f"eval.global_test_max_samples={LIMIT}")
    tests = [exp.client_data(pid).global_test for pid in range(4)]
    assert all(torch.equal(t.images, tests[0].images) for t in tests)
    assert torch.equal(tests[0].labels, exp.global_test.labels)


@pytest.mark.parametrize("whole", ["null", "0", "100000"])
def test_null_zero_or_a_larger_limit_is_the_whole_set(whole: str) -> None:
    exp = experiment(SHARED, f"eval.global_test_max_samples={whole}")
    full = exp.federation.global_test_split()
    assert torch.equal(exp.global_test.images, full.images)
    assert torch.equal(exp.global_test.labels, full.labels)


@pytest.mark.parametrize("key", ["global_test_max_samples", "server_test_max_samples"])
def test_negative_limit_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"eval.{key} must be null"):
        compose_config([*BASE, f"eval.{key}=-1"])


def test_stage_g_uses_the_whole_set_by_default() -> None:
    exp = experiment(SHARED, f"eval.global_test_max_samples={LIMIT}")
    weights = exp.initial_weights()
    result = global_evaluator(exp)(weights)
    model = exp.new_model()
    whole = evaluate(model, exp.federation.global_test_split(), exp.prepare(), 512)
    assert result == {"acc": whole.accuracy, "loss": whole.loss}
    assert len(exp.full_global_test) > len(exp.global_test) == LIMIT


def test_clients_measure_acc_g_on_the_subsample_and_stage_g_is_unchanged(tmp_path: Path) -> None:
    whole, _ = run_inprocess(
        [*BASE, SHARED, "eval.global_test_max_samples=null"], tmp_path / "whole"
    )
    sub, _ = run_inprocess(
        [*BASE, SHARED, f"eval.global_test_max_samples={LIMIT}"], tmp_path / "sub"
    )
    # stage G: the same whole set, the same models (training does not depend on evaluation)
    assert comparable(stage_rows(whole, "G")) == comparable(stage_rows(sub, "G"))
    # local metrics unchanged; Acc(G) of every client counted on LIMIT samples
    for stage in ("L1", "L2"):
        rows_whole, rows_sub = stage_rows(whole, stage), stage_rows(sub, stage)
        assert [(r["client"], r["acc_local"]) for r in rows_whole] == [
            (r["client"], r["acc_local"]) for r in rows_sub
        ]
        for row in rows_sub:
            assert abs(row["acc_global"] * LIMIT - round(row["acc_global"] * LIMIT)) < 1e-9
    # the whole-set run evaluates exactly what evaluating on the whole set gives
    exp = experiment(SHARED, "eval.global_test_max_samples=null")
    assert len(exp.global_test) == len(exp.full_global_test)


# --------------------------------------------------- stage G on a subsample (an option)
def test_stage_g_on_a_stratified_subsample_when_asked_and_the_clients_unchanged() -> None:
    exp = experiment(f"eval.server_test_max_samples={LIMIT}")
    test, full = exp.server_test, exp.full_global_test
    assert len(test) == LIMIT < len(full)
    full_counts = np.bincount(full.labels.numpy(), minlength=10)
    counts = np.bincount(test.labels.numpy(), minlength=10)
    assert np.all(np.abs(counts - full_counts * LIMIT / len(full)) < 1.0)
    # one seeded draw: the same samples as the clients' shared subsample of that size
    shared = experiment(SHARED, f"eval.global_test_max_samples={LIMIT}").global_test
    assert torch.equal(test.images, shared.images) and torch.equal(test.labels, shared.labels)
    # stage G scores the model on exactly these samples
    result = global_evaluator(exp)(exp.initial_weights())
    expected = evaluate(exp.new_model(), test, exp.prepare(), 512)
    assert result == {"acc": expected.accuracy, "loss": expected.loss}
    # the clients' Acc(G) slices are still cut from the whole set
    default = experiment()
    assert all(np.array_equal(a, b) for a, b in zip(exp._slices, default._slices, strict=True))
    assert torch.equal(
        exp.client_data(0).global_test.images, default.client_data(0).global_test.images
    )


def test_a_run_records_stage_g_of_the_subsample(tmp_path: Path) -> None:
    overrides = [*BASE, "rounds=1", f"eval.server_test_max_samples={LIMIT}"]
    rows, _ = run_inprocess(overrides, tmp_path / "run")
    exp = experiment("rounds=1", f"eval.server_test_max_samples={LIMIT}")
    initial = global_evaluator(exp)(exp.initial_weights())
    (g0,) = stage_rows(rows, "G", 0)
    assert g0["acc"] == pytest.approx(initial["acc"]) and g0["loss"] == pytest.approx(
        initial["loss"]
    )
    assert all(
        abs(r["acc"] * LIMIT - round(r["acc"] * LIMIT)) < 1e-9 for r in stage_rows(rows, "G")
    )


# ------------------------------------------------------------ each client's own slice (default)
def test_slices_are_disjoint_stratified_cover_the_set_and_are_seeded() -> None:
    exp = experiment("eval.global_test_max_samples=null")
    full = exp.federation.global_test
    labels = exp.federation.pool.labels.numpy()[full]
    slices = [exp.client_data(pid).global_test for pid in range(4)]
    chosen = np.concatenate([full[s] for s in exp._slices])
    assert sorted(chosen.tolist()) == sorted(full.tolist()), "every sample once, in one slice"
    sizes = [len(s) for s in slices]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(full)
    whole_counts = np.bincount(labels, minlength=10)
    for split in slices:  # each class within one sample of its share of the whole set
        counts = np.bincount(split.labels.numpy(), minlength=10)
        assert np.all(np.abs(counts - whole_counts / 4) < 1.0)
    again = experiment("eval.global_test_max_samples=null")
    assert all(np.array_equal(a, b) for a, b in zip(exp._slices, again._slices, strict=True))
    other = experiment("eval.global_test_max_samples=null", "seed=1")
    assert not all(np.array_equal(a, b) for a, b in zip(exp._slices, other._slices, strict=True))


def test_a_slice_is_cut_to_the_cap_keeping_class_proportions() -> None:
    cap = 40
    exp = experiment(f"eval.global_test_max_samples={cap}")
    whole = np.bincount(exp.full_global_test.labels.numpy(), minlength=10)
    for pid in range(4):
        split = exp.client_data(pid).global_test
        assert len(exp._slices[pid]) == cap < len(exp.full_global_test) // 4
        counts = np.bincount(split.labels.numpy(), minlength=10)
        assert np.all(np.abs(counts - whole * cap / whole.sum()) <= 1.5)


def test_more_clients_than_test_samples_get_one_sample_each() -> None:
    slices = _stratified_slices(np.array([0, 1, 1, 2, 0]), 12, None, seed=3)
    assert all(len(s) == 1 for s in slices)
    assert sorted(int(s[0]) for s in slices[:5]) == [0, 1, 2, 3, 4]


def test_clients_measure_acc_g_on_their_slice(tmp_path: Path) -> None:
    rows, _ = run_inprocess([*BASE, "eval.global_test_max_samples=null"], tmp_path / "sliced")
    exp = experiment("eval.global_test_max_samples=null")
    sizes = {pid: len(exp.client_data(pid).global_test) for pid in range(4)}
    for stage in ("L1", "L2"):
        for row in stage_rows(rows, stage):
            correct = row["acc_global"] * sizes[row["client"]]
            assert abs(correct - round(correct)) < 1e-9, "Acc(G) counted on the client's slice"
    shared, _ = run_inprocess(
        [*BASE, SHARED, "eval.global_test_max_samples=null"], tmp_path / "all"
    )
    assert comparable(stage_rows(rows, "G")) == comparable(stage_rows(shared, "G"))


# --------------------------------------------------------------- L2 on the evaluated clients
def drawn(seed: int, phase: Phase, server_round: int, fraction: float, n: int = 4) -> set[int]:
    """The partitions the strategy's seeded draw picks (min_clients=1, all nodes connected)."""
    count = max(int(n * fraction), 1)
    if count >= n:
        return set(range(n))
    chosen = round_rng(seed, phase, server_round).choice(n, size=count, replace=False)
    return {int(i) for i in chosen}


def clients_by_round(rows: list[dict], stage: str) -> dict[int, set[int]]:
    result: dict[int, set[int]] = {}
    for row in rows:
        if row["stage"] == stage:
            result.setdefault(row["round"], set()).add(row["client"])
    return result


def test_l2_rows_only_for_training_clients_in_the_evaluation_sample(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        [*BASE, "rounds=3", "fraction=0.75", "eval.fraction=0.5"], tmp_path / "run"
    )
    l1, l2 = clients_by_round(rows, "L1"), clients_by_round(rows, "L2")
    assert sorted(l1) == [1, 2, 3]
    for server_round in (1, 2, 3):
        trained = drawn(0, Phase.FIT_SAMPLING, server_round, 0.75)
        evaluated = drawn(0, Phase.EVALUATE_SAMPLING, server_round, 0.5)
        assert l1[server_round] == evaluated
        assert l2.get(server_round, set()) == trained & evaluated
    assert any(len(l2.get(r, set())) < 3 for r in (1, 2, 3))  # some trained clients skipped


def test_l2_clients_trained_measures_every_training_client(tmp_path: Path) -> None:
    overrides = [*BASE, "rounds=3", "fraction=0.75", "eval.fraction=0.5"]
    every, _ = run_inprocess([*overrides, "eval.l2_clients=trained"], tmp_path / "every")
    sampled, _ = run_inprocess(overrides, tmp_path / "sampled")
    l2 = clients_by_round(every, "L2")
    for server_round in (1, 2, 3):
        assert l2[server_round] == drawn(0, Phase.FIT_SAMPLING, server_round, 0.75)
    # the rows of the clients measured in both runs agree; training is the same
    measured = {(r["round"], r["client"]) for r in stage_rows(sampled, "L2")}
    assert comparable(
        [r for r in stage_rows(every, "L2") if (r["round"], r["client"]) in measured]
    ) == comparable(stage_rows(sampled, "L2"))
    assert comparable(stage_rows(every, "G")) == comparable(stage_rows(sampled, "G"))
    assert comparable(stage_rows(every, "L1")) == comparable(stage_rows(sampled, "L1"))


def test_eval_fraction_one_keeps_l2_for_every_training_client(tmp_path: Path) -> None:
    overrides = [*BASE, "fraction=0.5"]
    default, _ = run_inprocess(overrides, tmp_path / "default")
    every, _ = run_inprocess([*overrides, "eval.l2_clients=trained"], tmp_path / "every")
    for server_round in (1, 2):
        assert clients_by_round(default, "L2")[server_round] == drawn(
            0, Phase.FIT_SAMPLING, server_round, 0.5
        )
    assert comparable(default) == comparable(every)


def test_a_client_told_not_to_measure_l2_skips_the_evaluation() -> None:
    from flwr.app import Context, RecordDict

    overrides = [*BASE, "rounds=1"]
    run_config = {RUN_CONFIG_KEY: overrides_to_string(overrides)}

    def fresh_client():  # a new node each time: no state carried between the two fits
        context = Context(
            run_id=1,
            node_id=1,
            node_config={"partition-id": 0, "num-partitions": 4},
            state=RecordDict(),
            run_config=run_config,
        )
        return client_fn(context).numpy_client  # type: ignore[attr-defined]

    exp = Experiment.of(compose_config(overrides))
    weights = get_weights(exp.new_model())
    _, _, skipped = fresh_client().fit(weights, {"server-round": 1, "measure-l2": False})
    _, _, measured = fresh_client().fit(weights, {"server-round": 1})
    assert "acc_local" not in skipped and "acc_global" not in skipped
    assert {"acc_local", "acc_global", "loss_local", "loss_global"} <= set(measured)
    assert skipped["train_loss"] == measured["train_loss"]
