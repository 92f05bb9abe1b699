"""The ServerApp: builds the configured algorithm's Strategy and the run's recorder."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import lru_cache
from itertools import pairwise
from logging import WARNING
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from flwr.app import Context
from flwr.common import NDArrays
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from omegaconf import DictConfig

from pflower.compose import config_from_run_config
from pflower.config import overrides_from_run_config
from pflower.core.algorithm import algorithm_of
from pflower.core.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    ServerCheckpoint,
    check_compatible,
    load_checkpoint,
)
from pflower.core.experiment import Experiment
from pflower.core.strategy import GlobalEvaluator, PersonalizedStrategy
from pflower.core.training import EvalSums, evaluation_sums, set_weights, trainable_mask
from pflower.datasets.base import ImageSplit
from pflower.results.rundir import RecorderPosition, RunRecorder, read_rows, resolved_config
from pflower.server.loop import CheckpointingServer
from pflower.server.polling import PromptClientManager

_T = TypeVar("_T")


def run_directory(cfg: DictConfig) -> Path:
    """Where this run writes its results (``output_dir``, else ``runs/<timestamp>``)."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    return Path("runs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


class WorkerPool(Protocol):
    """Processes beside the server that run a module-level function on request: the fork
    backend's workers (:class:`pflower.forkbackend.ForkWorkers`)."""

    @property
    def count(self) -> int: ...

    def call(self, function: Callable[..., _T], *args: object) -> _T: ...


class StageGWorkers:
    """The workers over which stage G splits the server's test set, if any."""

    pool: WorkerPool | None = None
    """Set by :func:`pflower.forkbackend.forked_workers` while its workers run; None: stage G
    runs on the server's own thread (Ray's workers, a deployment)."""


def global_evaluator(experiment: Experiment) -> GlobalEvaluator:
    """Stage G: evaluates a global model on the global test set (all of it, or the subsample
    ``eval.server_test_max_samples`` asks for), on the ``train.device``.

    With the fork backend's workers (:class:`StageGWorkers`) the set is cut into one part per
    worker, on batch bounds, and the parts are evaluated on the workers, beside the clients'
    messages: on the server's one thread stage G on 10,000-20,000 images outlasted the clients'
    evaluation at 1,000 clients (``benchmarks/results/README.md``). The parts' sums combine into
    exactly the result of one process (:class:`EvalSums`). A part whose worker ended is
    evaluated here."""
    cfg = experiment.cfg
    pool = StageGWorkers.pool
    parts = batch_ranges(
        len(experiment.server_test),
        experiment.settings.eval.batch_size,
        1 if pool is None else pool.count,
    )

    def evaluate_global(weights: NDArrays) -> dict[str, float]:
        if pool is None or len(parts) == 1:
            sums = [evaluate_server_test_part(cfg, weights, *part) for part in parts]
        else:
            with ThreadPoolExecutor(len(parts), thread_name_prefix="pflower-stage-g") as threads:
                sums = list(threads.map(lambda part: _on_worker(pool, cfg, weights, part), parts))
        result = EvalSums.combine(sums)
        return {"acc": result.accuracy, "loss": result.loss}

    return evaluate_global


def _on_worker(
    pool: WorkerPool, cfg: DictConfig, weights: NDArrays, part: tuple[int, int]
) -> EvalSums:
    """:func:`evaluate_server_test_part` on a worker of ``pool``, or here if the worker ended."""
    try:
        return pool.call(evaluate_server_test_part, cfg, weights, *part)
    except RuntimeError as error:
        log(WARNING, "stage G: samples %s-%s evaluated on the server (%s)", *part, error)
        return evaluate_server_test_part(cfg, weights, *part)


def batch_ranges(size: int, batch_size: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges that cut ``size`` samples into at most ``parts`` runs of whole
    batches of ``batch_size`` (the last batch may be short), as even as whole batches allow;
    at least one range."""
    batches = -(-size // batch_size)
    count = max(1, min(parts, batches))
    bounds = [batches * k // count for k in range(count + 1)]
    return [(first * batch_size, min(last * batch_size, size)) for first, last in pairwise(bounds)]


def evaluate_server_test_part(
    cfg: DictConfig, weights: NDArrays, start: int, stop: int
) -> EvalSums:
    """Stage G's sums on samples ``start:stop`` of the server's test set, in this process (the
    server, or a worker forked from it, where ``cfg``'s experiment is already built)."""
    experiment = Experiment.of(cfg)
    model = _stage_g_model(experiment)
    set_weights(model, weights)
    test = experiment.server_test
    part = ImageSplit(test.images[start:stop], test.labels[start:stop])
    batch_size = experiment.settings.eval.batch_size
    return evaluation_sums(model, part, experiment.prepare(), batch_size)


@lru_cache(maxsize=2)
def _stage_g_model(experiment: Experiment) -> torch.nn.Module:
    """This process's model for stage G of ``experiment``, on its ``train.device``."""
    return experiment.new_model().to(experiment.device)


def build_strategy(
    cfg: DictConfig, run_dir: Path, resume_at: RecorderPosition | None = None
) -> PersonalizedStrategy:
    """The configured algorithm's Strategy, wired to a recorder writing into ``run_dir``
    (continuing after ``resume_at`` in a resumed run)."""
    experiment = Experiment.of(cfg)
    options = experiment.settings.strategy
    strategy = algorithm_of(options).strategy(
        options=options,
        settings=experiment.settings,
        initial_weights=experiment.initial_weights(),
        evaluate_global=global_evaluator(experiment),
        recorder=RunRecorder(run_dir, cfg, resume_at=resume_at),
    )
    with torch.random.fork_rng(devices=[]):  # leaves the global RNG as it was
        strategy.trainable_mask = trainable_mask(experiment.new_model())
    strategy.train_sizes = [len(client.train) for client in experiment.federation.clients]
    return strategy


def resumable_checkpoint(cfg: DictConfig, run_dir: Path) -> ServerCheckpoint:
    """The checkpoint a run with ``checkpoint.resume=true`` continues from, checked against the
    configuration and the run's rows before anything in ``run_dir`` is touched."""
    checkpoint = load_checkpoint(run_dir)
    path = run_dir / CHECKPOINT_FILE
    check_compatible(checkpoint, resolved_config(cfg), path)
    rows = len(read_rows(run_dir))
    if rows < checkpoint.rows:
        raise CheckpointError(
            f"{run_dir / 'metrics.jsonl'} holds {rows} rows, but the checkpoint {path} was "
            f"written after row {checkpoint.rows}: the run directory was changed since"
        )
    return checkpoint


def checkpoint_every(cfg: DictConfig) -> int:
    """``checkpoint.every``, or 0 when the run has no ``output_dir`` (a plain ``flwr run``): its
    clients then have no agreed folder for their state, so no checkpoint could resume it."""
    if cfg.checkpoint.every and not cfg.output_dir:
        log(WARNING, "no checkpoints: checkpoint.every needs output_dir (its clients' state)")
        return 0
    return int(cfg.checkpoint.every)


def server_fn(context: Context) -> ServerAppComponents:
    """The Strategy and the number of rounds of the experiment in the run config, run by a
    :class:`CheckpointingServer` (resuming from the run directory's checkpoint if asked to)."""
    cfg = config_from_run_config(context.run_config)
    run_dir = run_directory(cfg)
    checkpoint = resumable_checkpoint(cfg, run_dir) if cfg.checkpoint.resume else None
    resume_at = (
        None if checkpoint is None else RecorderPosition(checkpoint.rows, checkpoint.elapsed_s)
    )
    strategy = build_strategy(cfg, run_dir, resume_at)
    settings = strategy.settings
    overrides = [
        o
        for o in overrides_from_run_config(context.run_config)
        if not o.startswith(("output_dir=", "checkpoint.resume="))
    ]
    server = CheckpointingServer(
        client_manager=PromptClientManager(),  # prompt reply polls in a deployment
        strategy=strategy,
        run_dir=run_dir,
        overrides=overrides,
        every=checkpoint_every(cfg),
        resume_from=checkpoint,
    )
    return ServerAppComponents(
        server=server,
        config=ServerConfig(num_rounds=settings.rounds, round_timeout=settings.round_timeout),
    )


app = ServerApp(server_fn=server_fn)
