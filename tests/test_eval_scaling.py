"""Evaluation that scales: each client's own stratified slice of the global test set (or a
stratified subsample all clients share) for the clients' Acc(G), and stage L2 measured only on
the training clients that are also in the round's evaluation sample.

Defaults: ``eval.client_global_test=slice`` with ``eval.global_test_max_samples=2000`` (the cap of
a slice; ``subsample``: the size of the shared subsample, null or 0: the whole set), stage G on
the server on the whole set unless ``eval.server_test_max_samples`` asks for a stratified
subsample; ``eval.l2_clients=evaluated`` (``trained``: every training client).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.client.app import app as client_app
from pflower.client.app import client_fn
from pflower.compose import compose_config
from pflower.config import RUN_CONFIG_KEY, overrides_to_string
from pflower.core.experiment import Experiment, _stratified_slices, _stratified_subsample
from pflower.core.strategy import Phase, round_rng
from pflower.core.training import EvalSums, evaluate, evaluation_sums, get_weights
from pflower.datasets.base import ImageSplit
from pflower.forkbackend import ForkWorkers, forked_workers
from pflower.registry import ConfigError
from pflower.server.app import StageGWorkers, batch_ranges, global_evaluator
from tests.inprocess import run_inprocess
from tests.test_core import comparable, stage_rows

BASE = [
    "dataset=digits",
    "partition=pathological",
    "model=small_cnn",
    "num_clients=4",
    "rounds=2",
    "train.local_epochs=1",
    "train.batch_size=32",
]
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


# -------------------------------------- stage G split over the fork backend's workers
@pytest.mark.parametrize(
    ("size", "batch_size", "parts", "expected"),
    [
        (1050, 100, 2, [(0, 500), (500, 1050)]),
        (250, 100, 4, [(0, 100), (100, 200), (200, 250)]),  # no more parts than batches
        (300, 100, 1, [(0, 300)]),
        (0, 100, 2, [(0, 0)]),
    ],
)
def test_batch_ranges_cut_whole_batches(
    size: int, batch_size: int, parts: int, expected: list[tuple[int, int]]
) -> None:
    assert batch_ranges(size, batch_size, parts) == expected


def test_batch_ranges_cover_the_set_in_order_on_batch_bounds() -> None:
    for size in (1, 99, 512, 1797, 15344):
        for parts in (1, 2, 3, 16):
            ranges = batch_ranges(size, 64, parts)
            assert ranges[0][0] == 0 and ranges[-1][1] == size
            assert all(stop == start for (_, stop), (start, _) in pairwise(ranges))
            assert all(start % 64 == 0 and start < stop for start, stop in ranges)
            sizes = [stop - start for start, stop in ranges[:-1]]
            assert not sizes or max(sizes) - min(sizes) <= 64


def test_the_sums_of_parts_combine_into_the_whole_result_bit_for_bit() -> None:
    exp = experiment()
    model, test = exp.new_model(), exp.full_global_test
    whole = evaluate(model, test, exp.prepare(), 32)
    parts = [
        evaluation_sums(model, ImageSplit(test.images[a:b], test.labels[a:b]), exp.prepare(), 32)
        for a, b in batch_ranges(len(test), 32, 3)
    ]
    assert len(parts) == 3
    assert EvalSums.combine(parts) == whole  # exact: the same batches, an exact sum
    assert EvalSums.combine(list(reversed(parts))) == whole
    assert math.isnan(EvalSums.combine([]).loss)


class InlinePool:
    """Stands in for the fork workers: runs each call here, records its arguments, and lets the
    calls listed in ``lost`` fail as a worker that ended would."""

    def __init__(self, count: int, lost: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.count = count
        self.lost = lost
        self.parts: list[tuple[int, int]] = []

    def call(self, function: Callable[..., object], *args: object) -> object:
        self.parts.append((int(args[2]), int(args[3])))  # type: ignore[call-overload]
        if len(self.parts) - 1 in self.lost:
            raise RuntimeError("fork worker 1 ended (exit code -9) while running a job")
        return function(*args)


@pytest.mark.parametrize("lost", [set(), {1}])
def test_stage_g_over_workers_equals_stage_g_in_one_process(
    monkeypatch: pytest.MonkeyPatch, lost: set[int]
) -> None:
    """Split over three workers (a lost part evaluated on the server), stage G reports exactly
    what one process reports."""
    exp = experiment("eval.batch_size=50")  # 288 test images: 6 batches
    weights = exp.initial_weights()
    alone = global_evaluator(exp)(weights)
    pool = InlinePool(3, lost)
    monkeypatch.setattr(StageGWorkers, "pool", pool)
    assert global_evaluator(exp)(weights) == alone
    size, batch_size = len(exp.server_test), exp.settings.eval.batch_size
    assert sorted(pool.parts) == batch_ranges(size, batch_size, 3) and len(pool.parts) == 3


def test_the_forked_workers_evaluate_stage_g_while_they_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside ``forked_workers`` stage G's parts go to the workers (one each) and the result is
    the one-process result; outside, stage G runs on the server again."""
    exp = experiment("eval.batch_size=50")
    weights = exp.initial_weights()
    alone = global_evaluator(exp)(weights)
    called: list[tuple[object, ...]] = []
    call = ForkWorkers.call

    def watched(self: ForkWorkers, function: Callable[..., object], *args: object) -> object:
        called.append(args[2:])
        return call(self, function, *args)

    monkeypatch.setattr(ForkWorkers, "call", watched)
    with forked_workers(client_app, [*BASE, "eval.batch_size=50"], 2):
        assert StageGWorkers.pool is not None
        assert global_evaluator(exp)(weights) == alone
    assert StageGWorkers.pool is None
    assert sorted(called) == batch_ranges(len(exp.server_test), 50, 2)


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
