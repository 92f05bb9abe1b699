"""The ServerApp: builds the configured algorithm's Strategy and the run's recorder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from flwr.app import Context
from flwr.common import NDArrays
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from omegaconf import DictConfig

from pflower.client.training import evaluate, set_weights
from pflower.config import config_from_run_config
from pflower.experiment import Experiment
from pflower.server.recorder import RunRecorder
from pflower.strategies.base import GlobalEvaluator, PersonalizedStrategy, RunSettings


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

    def evaluate_global(weights: NDArrays) -> dict[str, float]:
        set_weights(model, weights)
        result = evaluate(model, test, prepare, experiment.cfg.eval.batch_size)
        return {"acc": result.accuracy, "loss": result.loss}

    return evaluate_global


def build_strategy(cfg: DictConfig, run_dir: Path) -> PersonalizedStrategy:
    """The configured algorithm's Strategy, wired to a recorder writing into ``run_dir``."""
    experiment = Experiment.of(cfg)
    algorithm = experiment.algorithm
    run = RunSettings(
        num_clients=cfg.num_clients,
        rounds=cfg.rounds,
        seed=cfg.seed,
        fraction=cfg.fraction,
        min_clients=cfg.min_clients,
        eval_every=cfg.eval.every,
        eval_fraction=cfg.eval.fraction,
        max_failed_fraction=cfg.failures.max_failed_fraction,
        round_timeout=cfg.round_timeout,
    )
    return algorithm.strategy_class(
        options=algorithm,
        run=run,
        initial_weights=experiment.initial_weights(),
        evaluate_global=global_evaluator(experiment),
        recorder=RunRecorder(run_dir, cfg),
    )


def server_fn(context: Context) -> ServerAppComponents:
    cfg = config_from_run_config(context.run_config)
    strategy = build_strategy(cfg, run_directory(cfg))
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=cfg.rounds, round_timeout=cfg.round_timeout),
    )


app = ServerApp(server_fn=server_fn)
