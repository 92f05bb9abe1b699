"""The run-level sections besides ``train``: evaluation, failures, selection, attacks, robust
aggregation, tracking, backend, checkpoints and client state."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum

from pflower.config.base import require


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
    off = "off"
    """None: clients report Acc(L) only (a tuning trial, whose objective reads Acc(L), skips the
    global test set's forward passes)."""


@dataclass
class EvalConfig:
    """When and how stages G, L1 and L2 are evaluated (``eval.*``).

    Attributes:
        every: evaluate every this many rounds, and always in the last round.
        rounds: when given, the rounds evaluated instead (and the last, always): a tuning
            trial evaluates only the rounds its pruner and objective read
            ([`SearchPlan.evaluated_rounds`][pflower.tuning.schedule.SearchPlan.evaluated_rounds]).
            Each round listed once, in ascending order; it takes precedence over ``every``.
            Where every client trains every round (``fraction=1``), leaving a round unevaluated
            changes no number of the rounds evaluated (evaluation samples clients from its own
            per-round stream and reads the models). With ``fraction < 1`` it may: a client of
            FedALA, FedProx-ALA or FedRep-ALA evaluated in a round it did not train in stores
            the ALA of the model it received, which its next round starts from (the authors'
            code applies ALA to every global model on every client: evaluating every round
            does the same, see [`pflower.strategies.ala`][pflower.strategies.ala]).
        fraction: share of clients evaluated at stage L1.
        batch_size: evaluation batch size.
        client_global_test: the samples on which each client measures Acc(G) at stages L1 and
            L2: its own stratified ``slice`` of the global test set, or a ``subsample`` shared by
            all clients (see [`ClientGlobalTest`][pflower.config.sections.ClientGlobalTest]). Stage
            G on the server: see
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
        stages: the stages measured: G (the server's global model), L1 and L2 (every client's
            model before and after local training); L1 always. A tuning trial measures L1 only
            (what its objective reads); leaving a stage out changes no other number of the run
            (the stages only read the models).
        unseen_fraction: share of clients held out of training entirely (pFL-Bench's
            participation gap): max(1, ⌊fraction·N⌋) clients, drawn with the run's seed among the
            benign ones, never train; at every evaluation they receive the server's evaluate
            message, run the algorithm's stage-L1 path (with whatever local adaptation it
            defines) and are scored apart, as stage ``U``. 0: every client may train.
    """

    every: int = 1
    rounds: list[int] | None = None
    fraction: float = 1.0
    batch_size: int = 512
    client_global_test: ClientGlobalTest = ClientGlobalTest.slice
    global_test_max_samples: int | None = 2000
    server_test_max_samples: int | None = None
    l2_clients: L2Clients = L2Clients.evaluated
    rho_thresholds: list[float] = field(default_factory=lambda: [0.5, 0.8, 0.9])
    unseen_fraction: float = 0.0
    stages: list[str] = field(default_factory=lambda: ["G", "L1", "L2"])

    def __post_init__(self) -> None:
        require(self.every >= 1, f"eval.every must be >= 1, got {self.every!r}")
        require(
            self.rounds is None
            or (all(r >= 1 for r in self.rounds) and list(self.rounds) == sorted(set(self.rounds))),
            f"eval.rounds must list rounds >= 1, each once and ascending (or be null: every "
            f"eval.every-th), got {self.rounds!r}",
        )
        require(
            0.0 <= self.unseen_fraction < 1.0,
            f"eval.unseen_fraction must be in [0, 1), got {self.unseen_fraction!r}",
        )
        require(0.0 < self.fraction <= 1.0, f"eval.fraction must be in (0, 1], got {self.fraction}")
        require(
            "L1" in self.stages and set(self.stages) <= {"G", "L1", "L2"},
            f"eval.stages must hold L1 and may hold G and L2, got {list(self.stages)}",
        )
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


class Numerics(StrEnum):
    """How a run holds torch's CPU kernels (``numerics``;
    [`pflower.provenance.hold_kernels`][pflower.provenance.hold_kernels]). The value must be known
    before torch is imported: ``pflower numerics=native ...`` reads it from the command line, other
    processes from ``PFLOWER_NUMERICS``, which the first sets."""

    avx2 = "avx2"
    """ATen, oneDNN and MKL kernels capped at AVX2: the same numbers, to the last digit, on any
    x86-64 CPU with AVX2 (a CPU without it runs native kernels, and ``summary.json`` says so)."""
    native = "native"
    """The widest instruction set the CPU has (AVX-512 where present): faster on such CPUs, but
    their last bits differ from an AVX2 CPU's, and a long run amplifies them."""


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
    norm_clip = "norm_clip"
    """Each update clipped to ``clip_factor`` times the round's median update norm, then the
    strategy's own mean."""


@dataclass
class RobustConfig:
    """The robust-aggregation group (``robust=none|multi_krum|trimmed_mean|median|norm_clip``).

    Replaces the server's (weighted) mean of client models in every algorithm that averages. A
    configuration in which the chosen aggregator cannot act (it would be the plain mean) is
    refused while composing, or for Multi-Krum's f = 0 taken from ``attack``, logged when the
    server starts ([`pflower.robust.aggregators.idle`][pflower.robust.aggregators.idle]).

    Attributes:
        name: the aggregator.
        num_malicious: f of Multi-Krum (null: the number of malicious clients of ``attack``).
        trim_fraction: share cut at each end per coordinate by ``trimmed_mean``, in [0, 0.5).
        clip_factor: ``norm_clip``'s bound on each update's L2 norm, as a multiple of the
            round's median update norm, > 0 (1: Nguyen et al.'s median bound; larger values
            clip only outliers).
    """

    name: RobustKind = RobustKind.none
    num_malicious: int | None = None
    trim_fraction: float = 0.2
    clip_factor: float = 1.0

    def __post_init__(self) -> None:
        require(
            self.num_malicious is None or self.num_malicious >= 0,
            f"robust.num_malicious must be null or >= 0, got {self.num_malicious}",
        )
        require(
            0.0 <= self.trim_fraction < 0.5,
            f"robust.trim_fraction must be in [0, 0.5), got {self.trim_fraction}",
        )
        require(
            0.0 < self.clip_factor < float("inf"),
            f"robust.clip_factor must be a finite number > 0, got {self.clip_factor}",
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
            the experiment built, [`pflower.runtime.forkbackend`][pflower.runtime.forkbackend]) or
            ``ray`` (Flower's Ray
            actors).
        num_cpus_per_client: CPUs per ClientApp worker (Ray reserves them per actor; ``fork``
            starts as many workers as the machine has CPUs for this many each).
        num_gpus_per_client: Ray GPUs (fractional allowed) per ClientApp actor (``ray`` only;
            ``fork`` needs 0: its workers all train on ``train.device``).
        address: Ray cluster to attach to (``auto``: ``RAY_ADDRESS``, else Ray's record of the
            last ``ray start``; or ``host:6379``), null for a local Ray of the run's own unless
            ``RAY_ADDRESS`` names a cluster (``ray`` only;
            [`pflower.runtime.raycluster`][pflower.runtime.raycluster]).
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
            state in ``client_state.dir``; 0 turns both off (the clients' snapshots stay with
            ``client_state.store=disk``).
        resume: continue the run in ``output_dir`` from its checkpoint instead of starting anew
            (``pflower resume <run_dir>`` sets it; the configuration must match the checkpoint's
            except ``rounds``, which may grow, and the execution keys, ``EXECUTION_KEYS``).
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
        store: in memory (Flower's context) or on disk (see
            [`StateStore`][pflower.config.sections.StateStore]).
        dir: the folder of the clients' state snapshots on the machine that runs them; empty:
            ``<output_dir>/client_state``. A SuperNode's node config ``client-state-dir`` takes
            precedence, so that every node can keep its state on its own disk.
    """

    store: StateStore = StateStore.memory
    dir: str = ""
