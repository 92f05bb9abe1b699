"""Optional experiment trackers: TensorBoard and MLflow receive what ``metrics.jsonl`` records.

``tracking=tensorboard`` or ``tracking=mlflow`` (the ``tracking`` group,
[`TrackingConfig`][pflower.config.TrackingConfig]) adds a *sink* to the run's recorder.
``metrics.jsonl``
stays the record of the run: rows are written there first, and a sink that fails mid-run is
switched off with a warning, never taking rows with it.

What a sink receives, once per round (when the round's results are in, and for any round left at
the end of the run), with the round as the step:

- ``G/acc``, ``G/loss``: the global model on the global test set (stage G; round 0 is the initial
  model);
- ``L1/<metric>``, ``L2/<metric>``: the unweighted mean over the round's clients of every numeric
  per-client metric of stage L1 / L2 (``acc_local``, ``loss_local``, ``acc_global``,
  ``loss_global``, and the algorithm's own, e.g. ``acc_pm``/``acc_gm``/``acc_hm``; booleans count
  as 0/1, so ``hm_choice_pm`` becomes a share);
- ``server/<metric>``: server-side state of the round (e.g. ``server/client_store_bytes``).

The general rule: ``<stage>/<key>`` is the mean over the round's rows of that stage of every
number under ``key`` (``round``, ``client`` and ``num_test`` are not metrics; ``failure`` and
``time`` rows are not sent). The resolved configuration goes in once, as parameters with dotted
keys (``train.lr``, ``strategy.name``, ...): numbers as numbers where the tracker keeps types,
everything else as text (``null``, ``true``, lists as JSON).

The trackers' packages are optional extras, imported only when their sink is chosen:
``pip install -e ".[tensorboard]"`` (``tensorboard``; the writer is torch's
``torch.utils.tensorboard``) and ``pip install -e ".[mlflow]"`` (``mlflow-skinny``). MLflow's
default store is SQLite in the run directory (``sqlite:///<run_dir>/mlflow.db``): recent MLflow 3
releases refuse the plain-file store (``file:``/``mlruns``) unless ``MLFLOW_ALLOW_FILE_STORE=true``
is set. A run resumed from a checkpoint sends only the rounds after it (MLflow: into the same MLflow
run).
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pflower.config import TrackingKind
from pflower.registry import ConfigError

logger = logging.getLogger(__name__)

NOT_METRICS = frozenset({"round", "stage", "client", "num_test"})
"""Row keys that identify or weight a row rather than measure something."""
NOT_TRACKED_STAGES = frozenset({"failure", "time"})
"""Row kinds that carry no per-round scalars."""
TRACKED_METRICS = ("G/acc", "L1/acc_local", "L1/acc_global", "L2/acc_local")
"""Metrics that TensorBoard's HParams dashboard shows beside each run's parameters."""

EXTRAS = {TrackingKind.tensorboard: "tensorboard", TrackingKind.mlflow: "mlflow"}
"""The ``pyproject.toml`` extra that installs each tracker."""
_MODULES = {
    TrackingKind.tensorboard: ("tensorboard", "torch.utils.tensorboard"),
    TrackingKind.mlflow: ("mlflow",),
}

Row = Mapping[str, Any]
Params = dict[str, str | float | int]


class Sink(Protocol):
    """A tracker that receives a run's parameters once and its metrics once per round."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """The flattened configuration ([`flat_params`][pflower.results.tracking.flat_params])."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """The scalars of round ``step``
        ([`round_metrics`][pflower.results.tracking.round_metrics])."""

    def close(self, completed: bool) -> None:
        """The run ended (``completed`` or failed); flush and release."""


# ------------------------------------------------------------------------------- what is sent
def _number(value: Any) -> float | None:
    """``value`` as a float if it is a number or a boolean, else None."""
    if isinstance(value, bool | int | float):
        return float(value)
    return None


def round_metrics(rows: Iterable[Row], server_round: int) -> dict[str, float]:
    """The scalars of ``server_round``: ``<stage>/<key>`` = mean over that stage's rows of the
    round of every number under ``key`` (rows lacking the key do not count)."""
    values: dict[str, list[float]] = {}
    for row in rows:
        if row["round"] != server_round or row["stage"] in NOT_TRACKED_STAGES:
            continue
        for key, value in row.items():
            number = _number(value)
            if key not in NOT_METRICS and number is not None:
                values.setdefault(f"{row['stage']}/{key}", []).append(number)
    return {tag: math.fsum(numbers) / len(numbers) for tag, numbers in values.items()}


def param_text(value: Any) -> str:
    """A configuration value as a parameter string: strings as they are, others as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Params:
    """The configuration with dotted keys; numbers (not booleans) stay numbers, every other value
    becomes [`param_text`][pflower.results.tracking.param_text]."""
    flat: Params = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{dotted}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[dotted] = value
        else:
            flat[dotted] = param_text(value)
    return flat


# ------------------------------------------------------------------------------ the trackers
def import_tracker(kind: TrackingKind) -> list[ModuleType]:
    """Import the packages of tracker ``kind``.

    Raises:
        ConfigError: a package is not installed; the message names the extra that installs it.
    """
    modules = []
    for name in _MODULES.get(kind, ()):
        try:
            modules.append(import_module(name))
        except ImportError as error:
            raise ConfigError(
                f"tracking={kind.value} needs the '{name.split('.')[0]}' package, which is not "
                f'installed ({error}). Install it with: pip install -e ".[{EXTRAS[kind]}]" '
                f"(or choose tracking=none)"
            ) from error
    return modules


class TensorBoardSink:
    """Scalars with ``add_scalar`` (tag ``G/acc``, step = round); the configuration as HParams
    (the HParams dashboard) and as YAML-like text (the Text dashboard, tag ``config``)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log_params(self, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        file_writer = self.writer.file_writer
        assert file_writer is not None  # SummaryWriter opens it in __init__
        for summary in hparams(dict(params), dict.fromkeys(TRACKED_METRICS, 0.0)):
            file_writer.add_summary(summary)
        lines = [f"    {key}: {param_text(value)}" for key, value in params.items()]
        self.writer.add_text("config", "\n".join(lines))  # indented: Markdown code block
        self.writer.flush()

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self, completed: bool) -> None:
        self.writer.close()


class MlflowSink:
    """One MLflow run (through ``MlflowClient``, no global state) under ``experiment``, tagged
    ``pflower.run_dir``: parameters and metrics with ``log_batch`` (step = round), ended FINISHED
    or FAILED. A resumed run (``resume``) continues the latest MLflow run of the same run
    directory; a parameter whose value changed (e.g. ``rounds``, extended) keeps its first value,
    MLflow parameters being immutable, and the new one is recorded as tag
    ``pflower.resumed.<key>``."""

    MAX_PARAM_CHARS = 6000
    """MLflow's limit on a parameter value."""

    def __init__(
        self, uri: str, experiment: str, run_name: str, run_dir: Path, resume: bool = False
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        with _quiet_store_setup():  # a new SQLite store logs its schema migration
            self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        run_dir_tag = str(run_dir.resolve())
        previous = self._latest_run(experiment_id, run_dir_tag) if resume else None
        self.logged_params: dict[str, str] = {}
        if previous is None:
            run = self.client.create_run(
                experiment_id, run_name=run_name, tags={"pflower.run_dir": run_dir_tag}
            )
            self.run_id: str = run.info.run_id
        else:
            self.run_id = previous.info.run_id
            self.logged_params = dict(previous.data.params)
            self.client.update_run(self.run_id, status="RUNNING")

    def _latest_run(self, experiment_id: str, run_dir_tag: str) -> Any:
        """The latest MLflow run tagged with this run directory (None if there is none)."""
        quoted = run_dir_tag.replace("'", "\\'")
        runs = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`pflower.run_dir` = '{quoted}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0] if runs else None

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        texts = {key: param_text(value)[: self.MAX_PARAM_CHARS] for key, value in params.items()}
        new = [Param(key, text) for key, text in texts.items() if key not in self.logged_params]
        changed = [
            RunTag(f"pflower.resumed.{key}", text)
            for key, text in texts.items()
            if key in self.logged_params and self.logged_params[key] != text
        ]
        for start in range(0, len(new), 100):  # log_batch takes at most 100 parameters
            self.client.log_batch(self.run_id, params=new[start : start + 100])
        if changed:
            self.client.log_batch(self.run_id, tags=changed)
        self.logged_params.update((param.key, param.value) for param in new)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(tag, value, now, step) for tag, value in metrics.items()]
        for start in range(0, len(entries), 1000):
            self.client.log_batch(self.run_id, metrics=entries[start : start + 1000])

    def close(self, completed: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if completed else "FAILED")


@contextmanager
def _quiet_store_setup() -> Iterator[None]:
    """MLflow's INFO lines and SQLAlchemy's deprecation warnings while MLflow creates a store."""
    mlflow_logger = logging.getLogger("mlflow")
    level = mlflow_logger.level
    mlflow_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        mlflow_logger.setLevel(level)


def default_mlflow_uri(run_dir: Path) -> str:
    """The SQLite store in the run directory."""
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def open_sink(tracking: Mapping[str, Any], run_dir: Path, resume: bool = False) -> Sink | None:
    """The sink that the ``tracking`` block of a resolved configuration selects (None: none);
    ``resume``: the run continues from a checkpoint (MLflow continues its run).

    Raises:
        ConfigError: the tracker's package is missing, or its store cannot be opened.
    """
    kind = TrackingKind(str(tracking.get("name", "none")))
    if kind == TrackingKind.none:
        return None
    import_tracker(kind)
    try:
        if kind == TrackingKind.tensorboard:
            return TensorBoardSink(Path(tracking.get("dir") or run_dir / "tensorboard"))
        uri = tracking.get("uri") or default_mlflow_uri(run_dir)
        name = tracking.get("run_name") or str(run_dir)
        experiment = str(tracking.get("experiment") or "pflower")
        return MlflowSink(uri, experiment, name, run_dir, resume)
    except Exception as error:
        raise ConfigError(
            f"tracking={kind.value} could not start: {type(error).__name__}: {error}"
        ) from error


# ------------------------------------------------------------------------- the recorder's hook
class Tracker:
    """What [`RunRecorder`][pflower.results.rundir.RunRecorder] calls: sends each round's scalars to
    the
    sink once, and isolates the run from the sink (its first error switches it off, with a
    warning; ``metrics.jsonl`` is written before the sink is called).

    The recorder passes its whole, append-only list of rows; the tracker reads only the rows added
    since its last call (a 2,000-round run is not rescanned every round) and holds those of the
    rounds not sent yet. The first ``already_recorded`` rows count as sent (a resumed run does not
    send its earlier rounds twice).
    """

    def __init__(
        self,
        sink: Sink | None,
        warn: Callable[[str], None] | None = None,
        already_recorded: int = 0,
    ) -> None:
        self.sink = sink
        self._warn = warn or logger.warning
        self._read = already_recorded
        self._pending: dict[int, list[Row]] = {}

    @classmethod
    def open(
        cls,
        config: Mapping[str, Any],
        run_dir: Path,
        warn: Callable[[str], None] | None = None,
        already_recorded: int = 0,
    ) -> Tracker:
        """The tracker that a resolved configuration selects, with its parameters logged;
        ``already_recorded`` rows of the recorder are not sent.

        Raises:
            ConfigError: see [`open_sink`][pflower.results.tracking.open_sink].
        """
        sink = open_sink(config.get("tracking") or {}, run_dir, resume=already_recorded > 0)
        tracker = cls(sink, warn, already_recorded)
        if tracker.sink is not None:
            tracker._guarded(tracker.sink.log_params, flat_params(config))
        return tracker

    def round_done(self, rows: Sequence[Row], server_round: int) -> None:
        """Send every round up to ``server_round`` that has rows and was not sent yet."""
        self._guarded(self._send, rows, server_round)

    def close(self, rows: Sequence[Row], completed: bool) -> None:
        """Send the rounds not sent yet, then end the tracker's run."""
        self._guarded(self._send, rows, None)
        if self.sink is not None:
            self._guarded(self.sink.close, completed)
        self.sink = None

    def _guarded(self, action: Callable[..., None], *args: Any) -> None:
        """``action(*args)`` unless the sink is off; its first error switches the sink off."""
        if self.sink is None:
            return
        try:
            action(*args)
        except Exception as error:
            self._warn(
                f"tracking stopped: {type(self.sink).__name__} failed "
                f"({type(error).__name__}: {error}); metrics.jsonl still has every row"
            )
            self.sink = None

    def _send(self, rows: Sequence[Row], up_to: int | None) -> None:
        """Read the rows added since the last call; send each complete round (all rounds
        ``<= up_to``; every round if ``up_to`` is None) once."""
        assert self.sink is not None
        for row in rows[self._read :]:
            if row["stage"] not in NOT_TRACKED_STAGES:
                self._pending.setdefault(int(row["round"]), []).append(row)
        self._read = len(rows)
        for server_round in sorted(self._pending):
            if up_to is not None and server_round > up_to:
                break
            metrics = round_metrics(self._pending.pop(server_round), server_round)
            if metrics:
                self.sink.log_metrics(server_round, metrics)
