"""The ServerApp: builds the configured algorithm's Strategy and the run's recorder."""

from __future__ import annotations

from datetime import datetime
from logging import WARNING
from pathlib import Path

import torch
from flwr.app import Context
from flwr.common import NDArrays
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from omegaconf import DictConfig

from pflower.compose import record_from_run_config
from pflower.config import RunRecord
from pflower.core.algorithm import algorithm_of
from pflower.core.checkpoint import (
    CHECKPOINT_FILE,
    ServerCheckpoint,
    check_compatible,
    check_metrics_unchanged,
    load_checkpoint,
)
from pflower.core.experiment import Experiment
from pflower.core.strategy import GlobalEvaluator, PersonalizedStrategy
from pflower.core.training import evaluate, set_weights, trainable_mask
from pflower.results.ownership import claim_run_dir
from pflower.results.rundir import RecorderPosition, RunRecorder
from pflower.results.summary import resolved_config
from pflower.runtime.logs import plain_flower_console_unless_tty
from pflower.runtime.polling import PromptClientManager
from pflower.server.loop import CheckpointingServer


def run_directory(record: RunRecord) -> Path:
    """Where this run writes its results (``output_dir``, else ``runs/<timestamp>``)."""
    if record.run_dir is not None:
        return record.run_dir
    return Path("runs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


def global_evaluator(experiment: Experiment) -> GlobalEvaluator:
    """Stage G: evaluates a global model on the global test set (all of it, or the subsample
    ``eval.server_test_max_samples`` asks for), on the server, on the ``train.device`` of this
    process."""
    model = experiment.new_model().to(experiment.device)
    test = experiment.server_test
    prepare = experiment.prepare()
    batch_size = experiment.settings.eval.batch_size

    def evaluate_global(weights: NDArrays) -> dict[str, float]:
        set_weights(model, weights)
        result = evaluate(model, test, prepare, batch_size)
        return {"acc": result.accuracy, "loss": result.loss}

    return evaluate_global


def build_strategy(
    cfg: DictConfig, run_dir: Path, resume_at: RecorderPosition | None = None
) -> PersonalizedStrategy:
    """The configured algorithm's Strategy, wired to a recorder writing into ``run_dir``
    (continuing after ``resume_at`` in a resumed run), complete when its constructor returns:
    it is given the model's trainable mask and every client's training-set size, from the
    server's own copy of the federation."""
    experiment = Experiment.of(cfg)
    options = experiment.settings.strategy
    initial_weights = experiment.initial_weights()
    evaluate_global = global_evaluator(experiment)
    recorder = RunRecorder(run_dir, cfg, resume_at=resume_at)
    with torch.random.fork_rng(devices=[]):  # leaves the global RNG as it was
        mask = trainable_mask(experiment.new_model())
    return algorithm_of(options).strategy(
        options=options,
        settings=experiment.settings,
        initial_weights=initial_weights,
        evaluate_global=evaluate_global,
        recorder=recorder,
        trainable_mask=mask,
        train_sizes=[len(client.train) for client in experiment.federation.clients],
    )


def resumable_checkpoint(cfg: DictConfig, run_dir: Path) -> ServerCheckpoint:
    """The checkpoint a run with ``checkpoint.resume=true`` continues from, checked against the
    configuration and the run's rows before anything in ``run_dir`` is touched."""
    checkpoint = load_checkpoint(run_dir)
    path = run_dir / CHECKPOINT_FILE
    check_compatible(checkpoint, resolved_config(cfg), path)
    check_metrics_unchanged(checkpoint, run_dir)
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
    [`CheckpointingServer`][pflower.server.app.CheckpointingServer] (resuming from the run
    directory's checkpoint if asked to), which holds the run directory's claim
    (``pflower.results.ownership``) until the run ends: a deployment's ServerApp refuses a folder
    that holds another run, or that a live run is writing, as ``pflower`` does."""
    record = record_from_run_config(context.run_config)
    cfg = record.composed
    run_dir = run_directory(record)
    checkpoint = resumable_checkpoint(cfg, run_dir) if record.resume else None
    resume_at = None if checkpoint is None else checkpoint.position
    claim = claim_run_dir(run_dir, overwrite=cfg.overwrite, resuming=record.resume)
    try:
        strategy = build_strategy(cfg, run_dir, resume_at)
    except BaseException:
        claim.release()
        raise
    settings = strategy.settings
    server = CheckpointingServer(
        client_manager=PromptClientManager(),  # prompt reply polls in a deployment
        strategy=strategy,
        run_dir=run_dir,
        overrides=list(record.overrides),
        every=checkpoint_every(cfg),
        resume_from=checkpoint,
        claim=claim,
    )
    return ServerAppComponents(
        server=server,
        config=ServerConfig(num_rounds=settings.rounds, round_timeout=settings.round_timeout),
    )


plain_flower_console_unless_tty()
app = ServerApp(server_fn=server_fn)
