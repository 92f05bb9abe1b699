"""The run-level configuration schema: every key of ``conf/config.yaml``, its type and its default.

These dataclasses are the single source of truth for run-level settings. They are registered with
Hydra's ConfigStore ([`pflower.compose`][pflower.compose]) as the schema ``conf/config.yaml``
extends, so a
typo'd key or a value of the wrong type fails while Hydra composes; ``__post_init__`` rejects
values outside their allowed range when the composed tree is turned into these objects
(``OmegaConf.to_object``). The resulting [`ExperimentConfig`][pflower.config.ExperimentConfig] is
the one typed settings object
that the server and every client read.

The ``dataset``, ``partition``, ``split`` and ``model`` blocks are chosen by name and checked
against their factories' signatures ([`pflower.registry`][pflower.registry]); the ``strategy`` block
is the
selected algorithm's own options dataclass ([`pflower.core.options`][pflower.core.options]).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import cache
from typing import Any

from omegaconf import MISSING

from pflower.config.base import (
    EXECUTION_KEYS,
    RUN_CONFIG_KEY,
    app_dir,
    conf_dir,
    overrides_from_run_config,
    overrides_to_string,
    require,
)
from pflower.config.record import RunRecord
from pflower.config.sections import (
    AttackConfig,
    AttackKind,
    BackendConfig,
    CheckpointConfig,
    ClientGlobalTest,
    ClientStateConfig,
    EvalConfig,
    FailuresConfig,
    L2Clients,
    Numerics,
    RobustConfig,
    RobustKind,
    SelectionConfig,
    SelectionSplit,
    StateStore,
    TrackingConfig,
    TrackingKind,
)
from pflower.config.training import (
    Amp,
    AugmentConfig,
    Device,
    Optimizer,
    TrainConfig,
)

__all__ = [
    "EXECUTION_KEYS",
    "RUN_CONFIG_KEY",
    "Amp",
    "AttackConfig",
    "AttackKind",
    "AugmentConfig",
    "BackendConfig",
    "CheckpointConfig",
    "ClientGlobalTest",
    "ClientStateConfig",
    "Device",
    "EvalConfig",
    "ExperimentConfig",
    "FailuresConfig",
    "L2Clients",
    "Numerics",
    "Optimizer",
    "RobustConfig",
    "RobustKind",
    "RunRecord",
    "SelectionConfig",
    "SelectionSplit",
    "StateStore",
    "TrackingConfig",
    "TrackingKind",
    "TrainConfig",
    "app_dir",
    "conf_dir",
    "overrides_from_run_config",
    "overrides_to_string",
    "plain",
    "require",
    "run_level_defaults",
]


@dataclass
class ExperimentConfig:
    """The whole experiment: the schema of ``conf/config.yaml``.

    Attributes:
        dataset, partition, split, model: the named blocks of the config groups of the same name.
        strategy: the algorithm's options (an
            [`AlgorithmOptions`][pflower.core.options.AlgorithmOptions]).
        backend: the simulation backend.
        seed: drives partitioning, model initialization, client sampling and data order.
        num_clients: K, the number of clients (= SuperNodes in a deployment).
        rounds: T, the number of federated rounds.
        fraction: share of clients sampled for training each round.
        min_clients: never sample fewer clients than this.
        round_timeout: seconds to wait for client replies each round (null: no limit).
        connect_timeout: seconds the server waits for nodes: before round 1 for all
            ``num_clients`` of them (then the run fails, naming the expected and the connected
            nodes), before a later round for nodes that left (then it goes on without them).
        connect_log_every: seconds between the log lines that name the nodes still missing.
        train, eval, failures, selection, attack, robust, checkpoint, client_state: see their
            classes.
        output_dir: the run directory (null: ``runs/<date>/<time>``, or ``hydra.run.dir`` where
            given; a sweep's job folder in a sweep).
        overwrite: replace the run that ``output_dir`` holds (its files are deleted when the run
            starts); without it a run refuses a folder that holds another run
            (``pflower.results.ownership``).
        progress: print a line per round to the terminal.
        plots: draw ``plots/accuracy.png`` and ``plots/clients.png`` when the run completes
            (0.5-1 s of matplotlib); ``false`` for runs whose figures nobody looks at, such as
            a test's.
        numerics: ``avx2`` (default) holds torch's CPU kernels to AVX2 so that runs repeat to the
            last digit on any x86-64 CPU with AVX2; ``native`` lets them use AVX-512
            (`Numerics`). Records made before this key existed do not say which they
            used (``pflower reproduce`` tells).
        tracking: a tracker that also receives the per-round metrics (`TrackingConfig`).
    """

    dataset: Any = MISSING
    partition: Any = MISSING
    split: Any = MISSING
    model: Any = MISSING
    strategy: Any = MISSING
    backend: BackendConfig = field(default_factory=BackendConfig)
    seed: int = 0
    num_clients: int = 10
    rounds: int = 10
    fraction: float = 1.0
    min_clients: int = 1
    round_timeout: float | None = None
    connect_timeout: float = 300.0
    connect_log_every: float = 10.0
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    failures: FailuresConfig = field(default_factory=FailuresConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    client_state: ClientStateConfig = field(default_factory=ClientStateConfig)
    output_dir: str | None = None
    overwrite: bool = False
    progress: bool = True
    plots: bool = True
    numerics: Numerics = Numerics.avx2

    def __post_init__(self) -> None:
        require(
            self.num_clients >= 1, f"num_clients must be an integer >= 1, got {self.num_clients}"
        )
        require(self.rounds >= 1, f"rounds must be an integer >= 1, got {self.rounds}")
        require(self.seed >= 0, f"seed must be an integer >= 0, got {self.seed}")
        require(0.0 < self.fraction <= 1.0, f"fraction must be in (0, 1], got {self.fraction!r}")
        require(
            1 <= self.min_clients <= self.num_clients,
            f"min_clients must be between 1 and num_clients={self.num_clients}, "
            f"got {self.min_clients}",
        )
        require(
            self.round_timeout is None or self.round_timeout > 0,
            f"round_timeout must be null or > 0 seconds, got {self.round_timeout!r}",
        )
        if self.selection.split == SelectionSplit.val:
            split = self.split
            val_fraction = (
                split.get("val_fraction", 0.0)
                if isinstance(split, Mapping)
                else getattr(split, "val_fraction", 0.0)
            )
            require(
                float(val_fraction) > 0.0,
                "selection.split=val needs a validation share: set split.val_fraction > 0 "
                "(e.g. 0.1)",
            )
        require(
            self.eval.rounds is None or all(r <= self.rounds for r in self.eval.rounds),
            f"eval.rounds={list(self.eval.rounds or [])} lists rounds past the run's last, "
            f"rounds={self.rounds}",
        )
        require(
            self.num_unseen < self.num_clients,
            f"eval.unseen_fraction={self.eval.unseen_fraction} holds out {self.num_unseen} of "
            f"num_clients={self.num_clients} clients: at least one must train",
        )
        require(
            self.connect_timeout > 0,
            f"connect_timeout must be > 0 seconds, got {self.connect_timeout!r}",
        )
        require(
            self.connect_log_every > 0,
            f"connect_log_every must be > 0 seconds, got {self.connect_log_every!r}",
        )

    @property
    def num_unseen(self) -> int:
        """How many clients ``eval.unseen_fraction`` holds out of training."""
        fraction = self.eval.unseen_fraction
        return max(1, int(fraction * self.num_clients)) if fraction > 0 else 0

    def is_eval_round(self, server_round: int) -> bool:
        """Stages L1/L2/G are evaluated in the rounds ``eval.rounds`` lists, else every
        ``eval.every`` rounds, and always in the last."""
        if server_round == self.rounds:
            return True
        if self.eval.rounds is not None:
            return server_round in self.eval.rounds
        return server_round % self.eval.every == 0


@cache
def _defaults() -> dict[str, Any]:
    return {k: v for k, v in asdict(ExperimentConfig()).items() if v != MISSING}


def plain(value: Any) -> Any:
    """``value`` with every enum replaced by its value, recursively (dicts and lists)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value.value if isinstance(value, Enum) else value


def run_level_defaults() -> dict[str, Any]:
    """Every run-level key of [`ExperimentConfig`][pflower.config.ExperimentConfig] with its
    default, as nested plain values
    (the named blocks, dataset to strategy, have no defaults and are left out).

    A configuration recorded before a key existed counts as holding this default: a key is only
    ever added with a default that keeps the earlier behaviour. Resuming a checkpoint and
    grouping runs in a report rely on it. A fresh copy: callers may change it.
    """
    return plain(_defaults())
