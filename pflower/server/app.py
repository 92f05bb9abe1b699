"""The ServerApp: builds the configured algorithm's Strategy and the run's recorder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import torch
from flwr.app import Context
from flwr.common import NDArrays
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from omegaconf import DictConfig

from pflower.compose import config_from_run_config
from pflower.core.algorithm import algorithm_of
from pflower.core.experiment import Experiment
from pflower.core.strategy import GlobalEvaluator, PersonalizedStrategy
from pflower.core.training import evaluate, set_weights, trainable_mask
from pflower.results.rundir import RunRecorder


def run_directory(cfg: DictConfig) -> Path:
    """Where this run writes its results (``output_dir``, else ``runs/<timestamp>``)."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    return Path("runs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


def global_evaluator(experiment: Experiment) -> GlobalEvaluator:
    """Stage G: evaluates a global model on the global test set, on the server."""
    model = experiment.new_model()
    test = experiment.global_test
    prepare = experiment.prepare()
    batch_size = experiment.settings.eval.batch_size

    def evaluate_global(weights: NDArrays) -> dict[str, float]:
        set_weights(model, weights)
        result = evaluate(model, test, prepare, batch_size)
        return {"acc": result.accuracy, "loss": result.loss}

    return evaluate_global


def build_strategy(cfg: DictConfig, run_dir: Path) -> PersonalizedStrategy:
    """The configured algorithm's Strategy, wired to a recorder writing into ``run_dir``."""
    experiment = Experiment.of(cfg)
    options = experiment.settings.strategy
    strategy = algorithm_of(options).strategy(
        options=options,
        settings=experiment.settings,
        initial_weights=experiment.initial_weights(),
        evaluate_global=global_evaluator(experiment),
        recorder=RunRecorder(run_dir, cfg),
    )
    with torch.random.fork_rng(devices=[]):  # leaves the global RNG as it was
        strategy.trainable_mask = trainable_mask(experiment.new_model())
    return strategy


def server_fn(context: Context) -> ServerAppComponents:
    """The Strategy and the number of rounds of the experiment in the run config."""
    cfg = config_from_run_config(context.run_config)
    strategy = build_strategy(cfg, run_directory(cfg))
    settings = strategy.settings
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=settings.rounds, round_timeout=settings.round_timeout),
    )


app = ServerApp(server_fn=server_fn)
