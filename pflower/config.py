"""The run-level configuration schema: every key of ``conf/config.yaml``, its type and its default.

These dataclasses are the single source of truth for run-level settings. They are registered with
Hydra's ConfigStore (:mod:`pflower.compose`) as the schema ``conf/config.yaml`` extends, so a
typo'd key or a value of the wrong type fails while Hydra composes; ``__post_init__`` rejects
values outside their allowed range when the composed tree is turned into these objects
(``OmegaConf.to_object``). The resulting :class:`ExperimentConfig` is the one typed settings object
that the server and every client read.

The ``dataset``, ``partition``, ``split`` and ``model`` blocks are chosen by name and checked
against their factories' signatures (:mod:`pflower.registry`); the ``strategy`` block is the
selected algorithm's own options dataclass (:mod:`pflower.core.options`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from pflower.registry import ConfigError
from pflower.searchspace import tunable

EXECUTION_KEYS = (
    "output_dir",
    "progress",
    "checkpoint",
    "client_state",
    "tracking",
    "backend",
    "connect_timeout",
    "connect_log_every",
    "round_timeout",
)
"""Top-level keys that say how and where a run executes, not what it computes: runs that differ
only in them are the same experiment (reports group them; a resumed run may change them)."""

RUN_CONFIG_KEY = "overrides"
"""The run-config key (``[tool.flwr.app.config]``) that carries the Hydra overrides."""

_PACKAGE_DIR = Path(__file__).resolve().parent


def app_dir() -> Path:
    """The Flower app directory: the one holding ``pyproject.toml`` and ``conf/``.

    In a source checkout (editable install) that is the repository root; a wheel install carries a
    copy of both under ``pflower/_app``.
    """
    for candidate in (_PACKAGE_DIR.parent, _PACKAGE_DIR / "_app"):
        if (candidate / "pyproject.toml").is_file() and (candidate / "conf").is_dir():
            return candidate
    raise FileNotFoundError(
        f"No pflower app directory (pyproject.toml + conf/) near {_PACKAGE_DIR}"
    )


def conf_dir() -> Path:
    """The Hydra config tree."""
    return app_dir() / "conf"


def overrides_to_string(overrides: Sequence[str]) -> str:
    """Pack Hydra overrides into the single run-config string (shell quoting preserved)."""
    return shlex.join(overrides)


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """Unpack the Hydra overrides that a Flower run config carries."""
    return shlex.split(str(run_config.get(RUN_CONFIG_KEY, "")))


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


class Optimizer(StrEnum):
    """Local optimizers (a fresh one every round, as in the papers)."""

    sgd = "sgd"
    adam = "adam"


class Amp(StrEnum):
    """Mixed precision of the shared training and evaluation loops (``train.amp``)."""

    off = "off"
    """float32 throughout (the default: results bit-identical to runs without the option)."""
    bf16 = "bf16"
    """``torch.autocast`` to bfloat16 (no loss scaling needed)."""
    fp16 = "fp16"
    """``torch.autocast`` to float16, with a ``GradScaler`` on CUDA."""


class Device(StrEnum):
    """Where models train and evaluate (``train.device``)."""

    auto = "auto"
    """CUDA in every process that sees a CUDA device, else the CPU."""
    cpu = "cpu"
    cuda = "cuda"
    """CUDA, required: a process that runs a model (the server's stage G, every client) and sees no
    CUDA device stops with a configuration error; a simulation checks before it starts."""


@dataclass
class AugmentConfig:
    """Training-time image augmentation (``train.augment.*``; off by default), per sample and
    only on training batches (never at evaluation), the same for every algorithm; see
    :mod:`pflower.core.augment` and docs/guide/augmentation.md.

    Attributes:
        rotation: rotate each training image by an angle drawn uniformly from
            [-rotation, rotation] degrees (0: off; at most 180).
        hflip: probability of mirroring a training image left-right (0: off).
        vflip: probability of mirroring a training image top-bottom (0: off).
    """

    rotation: float = 0.0
    hflip: float = 0.0
    vflip: float = 0.0

    def __post_init__(self) -> None:
        require(
            0 <= self.rotation <= 180,
            f"train.augment.rotation must be in [0, 180] degrees, got {self.rotation!r}",
        )
        for name in ("hflip", "vflip"):
            value = getattr(self, name)
            require(
                0 <= value <= 1,
                f"train.augment.{name} must be a probability in [0, 1], got {value!r}",
            )


@dataclass
class TrainConfig:
    """Client-side local training, the same for every algorithm (``train.*``).

    Attributes:
        local_epochs: passes over the client's training split per round.
        local_steps: if set, exactly this many mini-batches per round instead of epochs.
        batch_size: mini-batch size.
        optimizer: ``sgd`` or ``adam``.
        lr: learning rate of round 1.
        lr_decay: per-round decay, ``lr_t = lr * lr_decay^(t-1)``.
        momentum: SGD momentum.
        weight_decay: L2 weight decay of the optimizer.
        threads: torch threads per client worker.
        device: ``auto`` (CUDA where present), ``cpu`` or ``cuda`` (see :class:`Device`).
        amp: mixed precision of the shared loops, ``off``, ``bf16`` or ``fp16`` (:class:`Amp`).
        channels_last: models and image batches in channels-last memory format (faster
            convolutions on GPUs with tensor cores).
        data_on_device: a client's data copied to the model's device once per message instead
            of every batch, when it fits in the device's free memory (a no-op on the CPU).
        augment: random rotation and flips of training images (:class:`AugmentConfig`; off).
        ``amp``, ``channels_last`` and ``data_on_device`` are opt-in speed options of local
        training in ``pflower.core.training`` (algorithms with loops of their own ignore them;
        evaluation stays float32); with their defaults results are unchanged
        (docs/guide/speed.md).
    """

    local_epochs: int = tunable(
        2,
        choices=(1, 2, 5),
        source="FedAvg (McMahan et al., 2017), Sec. 3: E in {1, 5, 20}",
    )
    local_steps: int | None = None
    batch_size: int = 16
    optimizer: Optimizer = Optimizer.sgd
    lr: float = tunable(
        0.05,
        low=1e-3,
        high=0.3,
        log=True,
        source="FedAvg (McMahan et al., 2017), Sec. 3: lr on a log grid",
    )
    lr_decay: float = 1.0
    momentum: float = tunable(
        0.9, choices=(0.0, 0.5, 0.9), source="plain SGD, and the 0.5 / 0.9 of the papers' runs"
    )
    weight_decay: float = 0.0
    threads: int = 1
    device: Device = Device.auto
    amp: Amp = Amp.off
    channels_last: bool = False
    data_on_device: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        require(self.lr > 0, f"train.lr must be > 0, got {self.lr!r}")
        require(0 < self.lr_decay <= 1, f"train.lr_decay must be in (0, 1], got {self.lr_decay}")
        require(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        require(self.local_epochs >= 0, f"train.local_epochs must be >= 0, got {self.local_epochs}")
        require(
            self.local_steps is None or self.local_steps >= 1,
            f"train.local_steps must be null or >= 1, got {self.local_steps!r}",
        )
        require(self.momentum >= 0, f"train.momentum must be >= 0, got {self.momentum!r}")
        require(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        require(self.threads >= 1, f"train.threads must be >= 1, got {self.threads!r}")

    def lr_at(self, server_round: int) -> float:
        """The learning rate of round ``server_round`` (1-based)."""
        return self.lr * self.lr_decay ** (server_round - 1)


class L2Clients(StrEnum):
    """Which training clients measure stage L2 in an evaluation round (``eval.l2_clients``)."""

    evaluated = "evaluated"
    """Only those that are also in the round's evaluation sample (``eval.fraction``)."""
    trained = "trained"
    """Every client that trained in the round."""


class ClientGlobalTest(StrEnum):
    """The samples of the global test set on which each client measures Acc(G)
    (``eval.client_global_test``)."""

    slice = "slice"
    """Client i's own slice: the set dealt, class by class in proportion, into ``num_clients``
    disjoint slices (each capped at ``eval.global_test_max_samples``). An evaluation stage reads
    the global test set at most once in all, whatever the number of clients, and the mean over
    all clients counts every sample once."""
    subsample = "subsample"
    """The same stratified subsample of ``eval.global_test_max_samples`` samples for every client
    (null or 0: the whole set, the exact protocol): an evaluation stage costs clients × samples."""


@dataclass
class EvalConfig:
    """When and how stages G, L1 and L2 are evaluated (``eval.*``).

    Attributes:
        every: evaluate every this many rounds, and always in the last round.
        fraction: share of clients evaluated at stage L1.
        batch_size: evaluation batch size.
        client_global_test: the samples on which each client measures Acc(G) at stages L1 and
            L2: its own stratified ``slice`` of the global test set, or a ``subsample`` shared by
            all clients (see :class:`ClientGlobalTest`). Stage G on the server: see
            ``server_test_max_samples``.
        global_test_max_samples: the most samples of a client's Acc(G): the cap of its slice, or
            the size of the shared stratified subsample (class proportions of the whole set,
            drawn with the run's seed, the same samples for every client and round); null or 0:
            no cap (with ``subsample``, the whole set, exactly).
        server_test_max_samples: the most samples of stage G (the server's evaluation of its
            model): null or 0, the whole global test set (the default, exact: the papers' test
            accuracy of the global model); else a stratified subsample of that size (class
            proportions of the whole set, drawn with the run's seed, the same samples in every
            round), for runs where evaluating the whole set each evaluation round would cost more
            than the round's training (thousands of clients with a few samples each).
        l2_clients: which of a round's training clients measure stage L2 in an evaluation round:
            ``evaluated`` (those also in the round's evaluation sample, ``eval.fraction``) or
            ``trained`` (all of them).
        rho_thresholds: accuracy thresholds ε of ρ_ε (clients with Acc(L) > ε).
        unseen_fraction: share of clients held out of training entirely (pFL-Bench's
            participation gap): max(1, ⌊fraction·N⌋) clients, drawn with the run's seed among the
            benign ones, never train; at every evaluation they receive the server's evaluate
            message, run the algorithm's stage-L1 path (with whatever local adaptation it
            defines) and are scored apart, as stage ``U``. 0: every client may train.
    """

    every: int = 1
    fraction: float = 1.0
    batch_size: int = 512
    client_global_test: ClientGlobalTest = ClientGlobalTest.slice
    global_test_max_samples: int | None = 2000
    server_test_max_samples: int | None = None
    l2_clients: L2Clients = L2Clients.evaluated
    rho_thresholds: list[float] = field(default_factory=lambda: [0.5, 0.8, 0.9])
    unseen_fraction: float = 0.0

    def __post_init__(self) -> None:
        require(self.every >= 1, f"eval.every must be >= 1, got {self.every!r}")
        require(
            0.0 <= self.unseen_fraction < 1.0,
            f"eval.unseen_fraction must be in [0, 1), got {self.unseen_fraction!r}",
        )
        require(0.0 < self.fraction <= 1.0, f"eval.fraction must be in (0, 1], got {self.fraction}")
        require(self.batch_size >= 1, f"eval.batch_size must be >= 1, got {self.batch_size}")
        require(
            self.global_test_max_samples is None or self.global_test_max_samples >= 0,
            f"eval.global_test_max_samples must be null (or 0: the whole set) or >= 1, got "
            f"{self.global_test_max_samples!r}",
        )
        require(
            self.server_test_max_samples is None or self.server_test_max_samples >= 0,
            f"eval.server_test_max_samples must be null (or 0: the whole set) or >= 1, got "
            f"{self.server_test_max_samples!r}",
        )
        require(
            all(0.0 < t < 1.0 for t in self.rho_thresholds),
            f"eval.rho_thresholds must lie in (0, 1), got {list(self.rho_thresholds)}",
        )


@dataclass
class FailuresConfig:
    """The failure policy (``failures.*``).

    Attributes:
        max_failed_fraction: a round in which more than this share of the sampled clients failed
            stops the run with an error (a round where all failed always does).
    """

    max_failed_fraction: float = 0.5

    def __post_init__(self) -> None:
        require(
            0.0 <= self.max_failed_fraction < 1.0,
            f"failures.max_failed_fraction must be in [0, 1), got {self.max_failed_fraction}",
        )


class SelectionSplit(StrEnum):
    """Which split picks a client's personalized or global model (``selection.split``)."""

    test = "test"
    """The better of the two on the client's own test split (the FLAME paper's hybrid model, an
    oracle choice)."""
    val = "val"
    """The better of the two on the client's validation share (needs ``split.val_fraction > 0``);
    ties go to the personalized model; the chosen model's test accuracy is reported."""


@dataclass
class SelectionConfig:
    """Model selection between a personalized (PM) and a global model (GM) (``selection.*``).

    Applies to algorithms whose clients hold both models; each client then reports PM, GM and the
    hybrid model HM (the better of the two) at stage L1.

    Attributes:
        split: ``test`` (oracle, as in the FLAME paper) or ``val`` (honest holdout choice).
    """

    split: SelectionSplit = SelectionSplit.test


class AttackKind(StrEnum):
    """Byzantine attacks (``attack=<name>``; FLAME paper, Sec. VI-B3; see pflower.robust)."""

    none = "none"
    label_flip = "label_flip"
    """Label poisoning: honest training on labels drawn uniformly from the classes."""
    same_value = "same_value"
    """Upload c·1, c ~ N(0, noise_std²) per round."""
    sign_flip = "sign_flip"
    """Upload −|c|·w (the received model), c ~ N(0, noise_std²)."""
    gaussian = "gaussian"
    """Upload a vector drawn from N(0, noise_std² I)."""


@dataclass
class AttackConfig:
    """The attack group (``attack=none|label_flip|same_value|sign_flip|gaussian``).

    Attributes:
        name: the attack.
        fraction: share of malicious clients; |M| = max(1, floor(fraction * num_clients)).
        noise_std: σ of the attack's noise (the FLAME paper's variance 0.1: σ = √0.1).
    """

    name: AttackKind = AttackKind.none
    fraction: float = 0.2
    noise_std: float = 0.1**0.5

    def __post_init__(self) -> None:
        require(
            0.0 <= self.fraction < 1.0, f"attack.fraction must be in [0, 1), got {self.fraction}"
        )
        require(self.noise_std >= 0, f"attack.noise_std must be >= 0, got {self.noise_std}")


class RobustKind(StrEnum):
    """Robust aggregators (``robust=<name>``; see pflower.robust)."""

    none = "none"
    multi_krum = "multi_krum"
    trimmed_mean = "trimmed_mean"
    median = "median"


@dataclass
class RobustConfig:
    """The robust-aggregation group (``robust=none|multi_krum|trimmed_mean|median``).

    Replaces the server's (weighted) mean of client models in every algorithm that averages.

    Attributes:
        name: the aggregator.
        num_malicious: f of Multi-Krum (null: the number of malicious clients of ``attack``).
        trim_fraction: share cut at each end per coordinate by ``trimmed_mean``, in [0, 0.5).
    """

    name: RobustKind = RobustKind.none
    num_malicious: int | None = None
    trim_fraction: float = 0.2

    def __post_init__(self) -> None:
        require(
            self.num_malicious is None or self.num_malicious >= 0,
            f"robust.num_malicious must be null or >= 0, got {self.num_malicious}",
        )
        require(
            0.0 <= self.trim_fraction < 0.5,
            f"robust.trim_fraction must be in [0, 0.5), got {self.trim_fraction}",
        )


class TrackingKind(StrEnum):
    """Experiment trackers that also receive a run's per-round metrics (``tracking=<name>``; see
    pflower.results.tracking). Each needs its optional extra: ``pip install -e ".[<name>]"``."""

    none = "none"
    tensorboard = "tensorboard"
    """TensorBoard event files (``tracking.dir``, default ``<run_dir>/tensorboard``)."""
    mlflow = "mlflow"
    """An MLflow run (``tracking.uri``, default ``sqlite:///<run_dir>/mlflow.db``)."""


@dataclass
class TrackingConfig:
    """The tracking group (``tracking=none|tensorboard|mlflow``).

    ``metrics.jsonl`` is always written; a tracker gets the same per-round metrics as scalars
    (``G/acc``, ``L1/acc_local``, ...: the mean over clients of each stage's metrics) and the
    resolved configuration as parameters.

    Attributes:
        name: the tracker.
        dir: TensorBoard's event directory (null: ``<run_dir>/tensorboard``).
        uri: MLflow's tracking URI (null: the SQLite store ``sqlite:///<run_dir>/mlflow.db``);
            e.g. ``sqlite:////data/mlflow.db`` to collect a sweep in one store, or
            ``http://host:5000`` for a tracking server.
        experiment: the MLflow experiment that the run is logged under.
        run_name: the MLflow run name (null: the run directory's path).
    """

    name: TrackingKind = TrackingKind.none
    dir: str | None = None
    uri: str | None = None
    experiment: str = "pflower"
    run_name: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.experiment), "tracking.experiment must not be empty")


@dataclass
class BackendConfig:
    """Flower's simulation backend (``backend=fork|ray|ray_cluster``).

    Attributes:
        name: the engine's workers: ``fork`` (the default: processes forked from the driver with
            the experiment built, :mod:`pflower.runtime.forkbackend`) or ``ray`` (Flower's Ray
            actors).
        num_cpus_per_client: CPUs per ClientApp worker (Ray reserves them per actor; ``fork``
            starts as many workers as the machine has CPUs for this many each).
        num_gpus_per_client: Ray GPUs (fractional allowed) per ClientApp actor (``ray`` only;
            ``fork`` needs 0: its workers all train on ``train.device``).
        address: Ray cluster to attach to (``auto``, ``host:6379``), null for a local Ray
            (``ray`` only).
        workers: how many workers ``fork`` starts; null: from ``num_cpus_per_client``.
    """

    name: str = "fork"
    num_cpus_per_client: float = 1.0
    num_gpus_per_client: float = 0.0
    address: str | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        require(
            self.name in ("ray", "fork"), f"backend.name must be 'ray' or 'fork', got {self.name!r}"
        )
        require(
            self.num_cpus_per_client > 0,
            f"backend.num_cpus_per_client must be > 0, got {self.num_cpus_per_client}",
        )
        require(
            self.num_gpus_per_client >= 0,
            f"backend.num_gpus_per_client must be >= 0, got {self.num_gpus_per_client}",
        )
        require(
            self.workers is None or self.workers >= 1,
            f"backend.workers must be >= 1 (or null), got {self.workers}",
        )
        require(
            self.name == "ray" or self.address is None,
            "backend.address attaches to a Ray cluster: use backend=ray_cluster (or backend=ray)",
        )
        require(
            self.name == "ray" or self.num_gpus_per_client == 0,
            "backend.num_gpus_per_client shares GPUs among Ray actors: use backend=ray "
            "(forked workers all train on train.device)",
        )
        require(
            self.name == "ray" or hasattr(os, "fork"),
            "backend=fork forks worker processes, which this platform cannot: use backend=ray",
        )


@dataclass
class CheckpointConfig:
    """Checkpoints of a run, to resume it after a crash (``checkpoint.*``; ``pflower resume``).

    Attributes:
        every: the server writes a checkpoint into the run directory (``checkpoint.pkl``) after
            every ``every``-th round and after the last one; each client keeps snapshots of its
            state in ``client_state.dir``; 0 turns both off.
        resume: continue the run in ``output_dir`` from its checkpoint instead of starting anew
            (``pflower resume <run_dir>`` sets it; the configuration must match the checkpoint's
            except ``rounds``, which may grow).
    """

    every: int = 10
    resume: bool = False

    def __post_init__(self) -> None:
        require(self.every >= 0, f"checkpoint.every must be >= 0 rounds, got {self.every}")


class StateStore(StrEnum):
    """Where a client's personal state lives between the messages it handles
    (``client_state.store``)."""

    memory = "memory"
    """Flower's ``context.state``: in memory, in the process that holds the nodes' contexts (a
    simulation's driver holds every client's); snapshots on disk only while checkpoints are on."""
    disk = "disk"
    """Snapshots in ``client_state.dir``, loaded for every message; ``context.state`` is emptied
    after each one, so memory holds only the state of the clients being run. For populations whose
    personal state does not fit in memory (10,000 clients, ResNet-sized personal models)."""


@dataclass
class ClientStateConfig:
    """Where clients keep their personal state between rounds (``client_state.*``).

    Attributes:
        store: in memory (Flower's context) or on disk (see :class:`StateStore`).
        dir: the folder of the clients' state snapshots on the machine that runs them; empty:
            ``<output_dir>/client_state``. A SuperNode's node config ``client-state-dir`` takes
            precedence, so that every node can keep its state on its own disk.
    """

    store: StateStore = StateStore.memory
    dir: str = ""


@dataclass
class ExperimentConfig:
    """The whole experiment: the schema of ``conf/config.yaml``.

    Attributes:
        dataset, partition, split, model: the named blocks of the config groups of the same name.
        strategy: the algorithm's options (an :class:`~pflower.core.options.AlgorithmOptions`).
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
        output_dir: the run directory (null: Hydra's run dir, or ``runs/<time>`` for ``flwr run``).
        progress: print a line per round to the terminal.
        tracking: a tracker that also receives the per-round metrics (:class:`TrackingConfig`).
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
    progress: bool = True

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
        """Stages L1/L2/G are evaluated every ``eval.every`` rounds and always in the last."""
        return server_round % self.eval.every == 0 or server_round == self.rounds


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
    """Every run-level key of :class:`ExperimentConfig` with its default, as nested plain values
    (the named blocks, dataset to strategy, have no defaults and are left out).

    A configuration recorded before a key existed counts as holding this default: a key is only
    ever added with a default that keeps the earlier behaviour. Resuming a checkpoint and
    grouping runs in a report rely on it. A fresh copy: callers may change it.
    """
    return plain(_defaults())
