"""Helpers shared by the test modules: tiny experiments, row selection, array comparisons and
client wrappers that record what crosses the wire.

Test modules import from here (or from :mod:`tests.deploy_helpers` / :mod:`tests.inprocess`),
never from each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.client import Client
from flwr.common import FitIns, FitRes, NDArrays, parameters_to_ndarrays

from pflower.client.app import client_fn
from pflower.config.base import EXECUTION_KEYS
from pflower.core.checkpoint import PersistentClient
from pflower.core.client import PersonalClient
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.training import data_order, get_weights, set_weights, train
from pflower.results.rundir import RunRecorder
from pflower.strategies.proximal import proximal_to
from tests.inprocess import run_inprocess

TINY_DIGITS = ("dataset=digits", "partition=pathological", "model=small_cnn")
"""The smallest real experiment: scikit-learn's 8x8 digits, 2 classes per client, a small CNN."""


def tiny(
    *extra: str,
    clients: int = 4,
    rounds: int | None = 2,
    epochs: int | None = 1,
    batch_size: int | None = 32,
) -> list[str]:
    """Overrides of a tiny digits experiment; ``None`` leaves that key at its default."""
    overrides = [*TINY_DIGITS, f"num_clients={clients}"]
    if rounds is not None:
        overrides.append(f"rounds={rounds}")
    if epochs is not None:
        overrides.append(f"train.local_epochs={epochs}")
    if batch_size is not None:
        overrides.append(f"train.batch_size={batch_size}")
    return [*overrides, *extra]


ADAM_TINY = tiny("train.lr=0.01", "train.optimizer=adam")
"""The server-personalized algorithms' tiny experiment (Adam, as their papers train)."""

REGULARIZED_TINY = tiny("train.lr=0.05", "train.momentum=0.5", rounds=None)
"""The regularized family's tiny experiment; each test sets its rounds."""

RESUME_TINY = tiny("checkpoint.every=2", rounds=6, epochs=None, batch_size=None)
"""Six rounds checkpointed every two: a run to kill and resume."""


def stage_rows(rows: list[dict], stage: str, round_: int | None = None) -> list[dict]:
    """Rows of ``stage`` (optionally of one round), sorted by round and client."""
    return sorted(
        (r for r in rows if r["stage"] == stage and (round_ is None or r["round"] == round_)),
        key=lambda r: (r["round"], r.get("client", -1)),
    )


def comparable(rows: list[dict], stages: tuple[str, ...] = ("L1", "L2", "G")) -> list[tuple]:
    """The results of ``rows`` at ``stages`` as tuples, for exact run-to-run comparisons."""
    keys = (
        "round",
        "stage",
        "client",
        "acc_local",
        "loss_local",
        "acc_global",
        "loss_global",
        "acc",
        "loss",
    )
    return [tuple(r.get(k) for k in keys) for r in rows if r["stage"] in stages]


def assert_arrays_close(left: NDArrays, right: NDArrays, **tolerance: float) -> None:
    """Two lists of arrays of the same length, pairwise equal within ``np.testing`` tolerances."""
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        np.testing.assert_allclose(a, b, **tolerance)


class StateLog:
    """Wraps ``client_fn``: per (round, client) the model received at fit, the config and
    metrics, the uploaded arrays, and the client's stored state before and after fit.

    ``keys`` is one state key (``before``/``after`` then hold its arrays) or a tuple of keys
    (``before``/``after`` then hold a dict of them).
    """

    def __init__(self, keys: str | Sequence[str]) -> None:
        self.keys = keys
        self.received: dict[tuple[int, int], NDArrays] = {}
        self.before: dict[tuple[int, int], Any] = {}
        self.after: dict[tuple[int, int], Any] = {}
        self.uploaded: dict[tuple[int, int], NDArrays] = {}
        self.config: dict[tuple[int, int], dict] = {}
        self.metrics: dict[tuple[int, int], dict] = {}

    def _stored(self, state: ClientState) -> Any:
        if isinstance(self.keys, str):
            return state.get_arrays(self.keys)
        return {k: state.get_arrays(k) for k in self.keys}

    def make_client(self, context) -> Client:
        client = client_fn(context)
        pid = int(context.node_config["partition-id"])
        original_fit = client.fit

        def fit(ins: FitIns) -> FitRes:
            key = (int(ins.config["server-round"]), pid)
            state = ClientState(context.state)
            self.received[key] = parameters_to_ndarrays(ins.parameters)
            self.config[key] = dict(ins.config)
            self.before[key] = self._stored(state)
            res = original_fit(ins)
            self.after[key] = self._stored(state)
            self.uploaded[key] = parameters_to_ndarrays(res.parameters)
            self.metrics[key] = dict(res.metrics)
            return res

        client.fit = fit  # type: ignore[method-assign]
        return client

    def sampled(self, round_: int) -> list[int]:
        """The clients that trained in ``round_``."""
        return sorted(pid for r, pid in self.received if r == round_)


class Recording:
    """A client_fn wrapper that keeps every client's fit input and output, per round."""

    def __init__(self) -> None:
        self.fits: dict[tuple[int, int], tuple[NDArrays, NDArrays, dict]] = {}
        self.trained: dict[tuple[int, int], NDArrays] = {}

    def __call__(self, context):
        from pflower.client.app import client_fn

        client = client_fn(context)
        numpy_client = client.numpy_client  # type: ignore[attr-defined]
        if isinstance(numpy_client, PersistentClient):  # the state-snapshot wrapper
            numpy_client = numpy_client.client
        assert isinstance(numpy_client, PersonalClient)
        original = numpy_client.fit

        def fit(parameters, config):
            result = original(parameters, config)
            key = (int(config["server-round"]), numpy_client.partition_id)
            self.fits[key] = ([a.copy() for a in parameters], [a.copy() for a in result[0]], config)
            self.trained[key] = get_weights(numpy_client.model)
            return result

        numpy_client.fit = fit
        return client


def recorded_run(
    overrides: Sequence[str], output_dir: Path
) -> tuple[list[dict], list[Any], Recording, Any]:
    """An in-process run of ``overrides`` with every client's fits recorded: its rows, the
    clients' contexts, the :class:`Recording` and the server's strategy."""
    recording = Recording()
    strategies: list = []
    rows, contexts = run_inprocess(
        list(overrides), output_dir, make_client=recording, strategies=strategies
    )
    return rows, contexts, recording, strategies[0]


def retrain(
    experiment: Experiment,
    pid: int,
    round_: int,
    start: NDArrays,
    term: Callable[[torch.nn.Module], Callable | None] | None = None,
    lr: float | None = None,
    epochs: int | None = None,
) -> NDArrays:
    """Client ``pid``'s local training in ``round_`` from ``start`` as the shared loop does it
    (same seeded data order), independently of the algorithm's code path; ``term(model)`` builds
    the regularizer on the model (none by default), ``lr``/``epochs`` replace the round's."""
    model = experiment.new_model()
    set_weights(model, start)
    settings = experiment.train_settings(round_)
    if lr is not None or epochs is not None:
        settings = replace(
            settings,
            lr=settings.lr if lr is None else lr,
            epochs=settings.epochs if epochs is None else epochs,
        )
    data = experiment.client_data(pid)
    order = data_order(experiment.settings.seed, round_, pid)
    train(model, data.train, data.prepare, settings, order, term(model) if term else None)
    return get_weights(model)


def assert_pulled_toward_target(
    log: StateLog,
    experiment: Experiment,
    round_: int,
    pid: int,
    target: NDArrays,
    pull: float,
    **tolerance: float,
) -> None:
    """A server-personalized fit (FedAMP, DiversiFed): in ``round_`` client ``pid`` received its
    own ``target``, trained its stored model of the round before (the one it uploaded then) with
    the proximal pull (``pull``/2)·‖v − target‖², and stored and uploaded the result; the retrained
    model must match within ``tolerance`` (rtol/atol)."""
    received = log.received[round_, pid]
    assert_arrays_close(received, target, rtol=1e-5, atol=1e-6)
    assert_arrays_close(log.before[round_, pid], log.uploaded[round_ - 1, pid], rtol=0, atol=0)
    assert_arrays_close(log.after[round_, pid], log.uploaded[round_, pid], rtol=0, atol=0)
    start = log.before[round_, pid]
    trained = retrain(
        experiment, pid, round_, start, lambda model: proximal_to(model, received, pull)
    )
    assert_arrays_close(trained, log.after[round_, pid], **tolerance)


def train_size(context) -> int:
    from pflower.compose import config_from_run_config
    from pflower.core.experiment import Experiment

    experiment = Experiment.of(config_from_run_config(context.run_config))
    return len(experiment.client_data(int(context.node_config["partition-id"])).train)


class Crash(Exception):
    """Stands for the process dying in the middle of a round."""


def stopped_in_round(
    monkeypatch: pytest.MonkeyPatch, experiment: list[str], run_dir: Path, crash_round: int
) -> None:
    """Run ``experiment`` until it dies right after round ``crash_round``'s training was
    aggregated (its clients have written that round's state; no checkpoint covers it)."""
    original = RunRecorder.fit_done

    def fit_done(self: RunRecorder, server_round: int) -> None:
        original(self, server_round)
        if server_round == crash_round:
            raise Crash(f"killed in round {server_round}")

    with monkeypatch.context() as patch:
        patch.setattr(RunRecorder, "fit_done", fit_done)
        with pytest.raises(Crash):
            run_inprocess(experiment, run_dir)


def results(rows: list[dict[str, Any]], after: int = 0) -> list[dict[str, Any]]:
    """Rows of rounds after ``after``, without wall-clock times."""
    return [r for r in rows if r["round"] > after and r["stage"] != "time"]


def summary_without_clock(run_dir: Path) -> dict[str, Any]:
    """``summary.json`` without what the clock decides (the wall time, the seconds per round)
    and without the keys that say how the run executed, not what it computed (its folder,
    checkpoints, plots, ...: `EXECUTION_KEYS`)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("wall_time_s")
    summary["cost"].pop("seconds_per_round", None)
    config = summary.pop("config")
    for key in EXECUTION_KEYS:
        config.pop(key, None)
    return {**summary, "config": config}


def tiny_suite(trials: int, tune_seed: int, final_seeds: str) -> str:
    """The text of a suite of FedProx alone on digits (4 clients, 2 rounds, no pruning):
    ``trials`` trials, tuning seed ``tune_seed``, final seeds ``final_seeds`` (``"[1, 2]"``)."""
    return f"""\
name: tiny
budget: {trials} trials per method, digits, 4 clients, 2 rounds
trials: {trials}
tune_seed: {tune_seed}
final_seeds: {final_seeds}
val_fraction: 0.25
train_knobs: [lr]
pruner: {{enabled: false}}
methods: [fedprox]
settings:
  - name: digits
    overrides: [dataset=digits, num_clients=4, rounds=2, train.local_epochs=1]
"""


def fake_final_run(run_dir: Path, final: float, last10: float | None = None) -> None:
    """A completed final run of a tuning suite, as the leaderboard reads it: ``summary.json``
    with stage-L1 Acc(L) ``final`` (and ``last10``, default the same) and two rounds' rows
    (3 s apart; 1 MB down and 0.5 MB up for one client)."""
    run_dir.mkdir(parents=True)
    summary = {
        "status": "completed",
        "rounds": 2,
        "final_round": 2,
        "wall_time_s": 4.0,
        "final": {"L1": {"acc_local": {"mean": final}}},
        "last10": {"L1": {"acc_local": {"mean": final if last10 is None else last10}}},
        "code": {"fingerprint": "abc123"},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    rows = [
        {"round": 1, "stage": "time", "fit_done_unix_s": 10.0},
        {"round": 2, "stage": "time", "fit_done_unix_s": 13.0},
        {"round": 1, "stage": "L2", "client": 0, "bytes_down": 1_000_000, "bytes_up": 500_000},
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
