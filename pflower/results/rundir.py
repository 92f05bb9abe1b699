"""The run directory: the one place that writes and reads a run's results.

Layout::

    config.yaml      the resolved configuration
    metrics.jsonl    one JSON row per event, each with ``round`` and ``stage``:
                       G        the global model on the global test set (``acc``, ``loss``)
                       L1, L2   one row per client (``client`` = partition id, ``acc_local``,
                                ``loss_local``, ``acc_global``, ``loss_global``, ``num_test``,
                                plus the algorithm's own scalars)
                       U        the same, for the clients held out of training
                                (``eval.unseen_fraction``): their stage-L1 model
                       failure  a client that failed (``phase``, ``client``, ``error``)
                       time     the round's training phase was aggregated (``fit_done_unix_s``)
                       server   server-side state of the round, e.g. ``client_store_bytes``
                                (the per-client model store of server-personalized algorithms)
    summary.json     written when the run ends, completed or failed, always in one shape:
                     ``status``, ``error``, ``rounds`` (planned), ``final_round`` (last round with
                     results), ``final`` (stage aggregates of that round), ``last10`` (the same
                     aggregates averaged over the evaluated rounds among the last 10% of
                     rounds), ``failures``, ``wall_time_s``, ``cost`` (seconds per round and
                     megabytes per client-round, [`run_cost`][pflower.results.rundir.run_cost]), the
                     resolved ``config`` and
                     ``code``: the pflower code that made it (source fingerprint, git commit,
                     whether the checkout had uncommitted changes;
                     [`pflower.provenance`][pflower.provenance])
    plots/           accuracy.png (per round, by stage), clients.png (final per-client accuracy)
    tensorboard/     TensorBoard events, with ``tracking=tensorboard`` (see
    [`.tracking`][pflower.results.tracking])
    mlflow.db        the MLflow store, with ``tracking=mlflow`` (unless ``tracking.uri`` names
                     another)
    run.log          Flower's log
    error.txt        the traceback, when the run failed with an exception
    .pflower.lock    locked while a run writes the folder (``pflower.results.ownership``)
    .summary.reserve space set aside while the run lives, for the summary of a failed write
                     on a full disk (``reserve_space``)

Stage L1 is the client's deployable model after it received the server's message (before local
training), L2 the model after local training, G the global model (the stages of the FLIU paper,
Hussaini et al., Sec. III and Fig. 1); U is stage L1 of the clients held out of training
(the participation gap of pFL-Bench, Chen et al., NeurIPS 2022). Headline numbers
are final-round values, shown beside the last-10% mean; never the best round.

[`Recorder`][pflower.results.rundir.Recorder] is what the server strategy reports to;
[`RunRecorder`][pflower.results.rundir.RunRecorder] writes the files;
[`pflower.results.runs.load_run`][pflower.results.runs.load_run] reads them back (for ``pflower
report``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from pflower.provenance import code_version, numerics
from pflower.results.statistics import summarize_stage
from pflower.results.tracking import Tracker
from pflower.runtime.signals import handlers_run_promptly

G, L1, L2, U = "G", "L1", "L2", "U"
"""The evaluation stages (U: stage L1 of clients that never train)."""
CLIENT_STAGES = (L1, L2, U)
STAGES = (G, L1, L2, U)
FAILURE, TIME, SERVER = "failure", "time", "server"
"""Row kinds that carry no accuracy."""

LAST_FRACTION = 0.1
"""Share of the final rounds whose evaluated rounds are averaged into ``last10``."""

Row = dict[str, Any]
Status = Literal["completed", "failed", "interrupted", "incomplete"]
"""A run as read back: ``interrupted`` is a failed ``summary.json`` of a run stopped by a signal
([`was_interrupted`][pflower.results.rundir.was_interrupted]), ``incomplete`` a run without one
(still running, or killed)."""


def client_row(server_round: int, stage: str, partition_id: int, metrics: Mapping[str, Any]) -> Row:
    """A client's stage row (``partition_id`` in the metrics is replaced by ``client``)."""
    values = {k: v for k, v in metrics.items() if k != "partition_id"}
    return {"round": server_round, "stage": stage, "client": partition_id, **values}


def last_rounds(rounds: int) -> range:
    """The last 10% of ``rounds`` (at least the final round): the ``last10`` window."""
    width = max(1, math.ceil(LAST_FRACTION * rounds))
    return range(rounds - width + 1, rounds + 1)


def round_summary(rows: Iterable[Row], server_round: int, thresholds: Sequence[float]) -> Row:
    """Aggregates of every stage evaluated in ``server_round`` (see
    [`.statistics`][pflower.results.statistics])."""
    in_round = [r for r in rows if r["round"] == server_round]
    summary: Row = {}
    for stage in CLIENT_STAGES:
        stage_rows = [r for r in in_round if r["stage"] == stage]
        if stage_rows:
            summary[stage] = summarize_stage(stage_rows, thresholds)
    global_rows = [r for r in in_round if r["stage"] == G]
    if global_rows:
        summary[G] = {k: v for k, v in global_rows[0].items() if k not in ("round", "stage")}
    return summary


def mean_of_summaries(summaries: Sequence[Row]) -> Row:
    """Leaf-wise mean of round summaries; a leaf missing from some rounds is averaged over the
    rounds that have it."""
    merged: Row = {}
    keys = dict.fromkeys(key for summary in summaries for key in summary)
    for key in keys:
        values = [summary[key] for summary in summaries if key in summary]
        if isinstance(values[0], Mapping):
            merged[key] = mean_of_summaries(values)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            merged[key] = float(np.mean(values))
    return merged


def evaluated_rounds(rows: Iterable[Row]) -> list[int]:
    """Rounds (> 0) that have stage rows, ascending."""
    return sorted({r["round"] for r in rows if r["stage"] in STAGES and r["round"] > 0})


def headline(rows: Sequence[Row], rounds: int, thresholds: Sequence[float]) -> Row:
    """``final_round``, ``final`` and ``last10`` of a run with ``rounds`` planned rounds.

    ``final`` holds the aggregates of the last evaluated round; ``last10`` their mean over the
    evaluated rounds in [`last_rounds`][pflower.results.rundir.last_rounds] (evaluated every round,
    that is the last 10% of rounds;
    with ``eval.every > 1``, only the evaluated ones among them).
    """
    evaluated = evaluated_rounds(rows)
    if not evaluated:
        return {"final_round": None, "final": {}, "last10": {}, "last10_rounds": []}
    window = [r for r in evaluated if r in last_rounds(rounds)] or evaluated[-1:]
    return {
        "final_round": evaluated[-1],
        "final": round_summary(rows, evaluated[-1], thresholds),
        "last10": mean_of_summaries([round_summary(rows, r, thresholds) for r in window]),
        "last10_rounds": window,
    }


def run_cost(rows: Iterable[Row]) -> dict[str, float]:
    """The run's cost figures (``summary.json``'s ``cost``), each left out where the rows do not
    give it:

    - ``seconds_per_round``: the median time between the ends of successive rounds' training
      phases (``time`` rows), so the start-up, the first round's imports and a resume's gap are
      left out and the rounds that also evaluate count as they come;
    - ``mb_down_per_client_round`` / ``mb_up_per_client_round``: the mean array megabytes
      (10^6 bytes) one training client receives with its fit instruction and sends back, per
      round (``bytes_down``/``bytes_up`` of the stage-L2 rows).
    """
    rows = list(rows)
    done = sorted(
        (int(r["round"]), float(r["fit_done_unix_s"])) for r in rows if r["stage"] == TIME
    )
    gaps = [t1 - t0 for (r0, t0), (r1, t1) in itertools.pairwise(done) if r1 == r0 + 1]
    cost = {"seconds_per_round": float(np.median(gaps))} if gaps else {}
    for key in ("bytes_down", "bytes_up"):
        sizes = [float(r[key]) for r in rows if r["stage"] == L2 and key in r]
        if sizes:
            cost[f"mb_{key.removeprefix('bytes_')}_per_client_round"] = float(np.mean(sizes)) / 1e6
    return cost


def recorded_cost(
    run_dir: Path, summary: Mapping[str, Any], rows: Iterable[Row] | None = None
) -> dict[str, float]:
    """A finished run's cost figures: its ``summary.json``'s, or, for a run made before pflower
    recorded them there, computed from its ``metrics.jsonl`` (none where that is gone too).
    ``rows``: that file's rows, where the caller has read them already."""
    if summary.get("cost"):
        return dict(summary["cost"])
    return run_cost(read_rows(run_dir) if rows is None else rows)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The configuration as plain JSON/YAML values (enums as their names)."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(container, dict)
    return cast(dict[str, Any], container)


def write_atomic(path: Path, data: str | bytes, reserve: Path | None = None) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a flushed temporary file and a rename:
    a crash leaves the previous file, never a half-written one, and a write that fails (a full
    disk, a file-size limit) raises with the temporary file removed.

    ``reserve``: a file whose space was set aside for this write (``reserve_space``); where
    the temporary file cannot be written, ``data`` is written over the reserve, which then
    becomes ``path``: on a full disk that needs no new space up to the reserve's size."""
    payload = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        _write_synced(temporary, payload, "wb")
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if reserve is None or not reserve.is_file():
            error.filename = error.filename or str(path)
            raise
        _write_synced(reserve, payload, "r+b")
        temporary = reserve
    os.replace(temporary, path)


def _write_synced(path: Path, payload: bytes, mode: Literal["wb", "r+b"]) -> None:
    """Write ``payload`` as all of ``path`` (opened with ``mode``), flushed to the disk."""
    with path.open(mode) as file:
        file.write(payload)
        file.truncate()
        file.flush()
        os.fsync(file.fileno())


RESERVE_FILE = ".summary.reserve"
"""Space a live run sets aside in its folder for the ``summary.json`` of its failure."""
RESERVE_BYTES = 64 * 1024
"""The size of ``RESERVE_FILE``: several times a summary's (about 8 kB)."""


def reserve_space(run_dir: Path) -> Path | None:
    """Write ``RESERVE_FILE`` (``RESERVE_BYTES`` of zeros, so that writing over it takes
    no new space) and return its path; None, leaving nothing, where it cannot be written (a
    file-size limit below its size: a summary, smaller, may still be written as usual)."""
    path = run_dir / RESERVE_FILE
    try:
        _write_synced(path, bytes(RESERVE_BYTES), "wb")
    except OSError:
        path.unlink(missing_ok=True)
        return None
    return path


def write_summary(
    run_dir: Path,
    cfg: DictConfig,
    rows: Sequence[Row],
    status: Literal["completed", "failed"],
    error: str | None = None,
    wall_time_s: float | None = None,
    reserve: Path | None = None,
) -> Path:
    """Write ``summary.json`` (the same shape for completed and failed runs), over ``reserve``
    where the disk has no room for it (``write_atomic``)."""
    config = resolved_config(cfg)
    summary = {
        "status": status,
        "error": error,
        "rounds": config.get("rounds"),
        "scored_on": config.get("split", {}).get("evaluate_on", "test"),
        **headline(rows, int(config.get("rounds", 0)), config["eval"]["rho_thresholds"]),
        "failures": [r for r in rows if r["stage"] == FAILURE],
        "wall_time_s": wall_time_s,
        "cost": run_cost(rows),
        "config": config,
        "code": code_version(str((config.get("strategy") or {}).get("name") or "") or None),
        "numerics": numerics(),
    }
    path = run_dir / "summary.json"
    write_atomic(path, json.dumps(summary, indent=2), reserve)
    return path


def record_failure(run_dir: Path, cfg: DictConfig, error: BaseException) -> None:
    """Mark ``run_dir`` as failed by ``error`` raised outside the strategy (e.g. a sweep job whose
    simulation could not start): ``error.txt`` with the traceback, ``config.yaml`` if no recorder
    wrote one yet, and ``summary.json`` with whatever rows were recorded."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        config_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
    summary_path = run_dir / "summary.json"
    if summary_path.exists() and json.loads(summary_path.read_text())["status"] == "failed":
        return  # the strategy already recorded why the run stopped
    write_summary(run_dir, cfg, read_rows(run_dir), "failed", f"{type(error).__name__}: {error}")


def check_writable(run_dir: Path) -> None:
    """Make ``run_dir`` (if it does not exist) and write and remove a file in it; the
    ``OSError`` says why a run could not write its results there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=run_dir) as probe:
        probe.write(b"pflower")


WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS}
)
"""Why a write of a run's results fails: no space, a quota or file-size limit, permissions, a
read-only file system."""


def is_write_failure(error: BaseException) -> bool:
    """Is ``error`` a write that failed for one of the reasons in ``WRITE_ERRNOS``?"""
    return isinstance(error, OSError) and error.errno in WRITE_ERRNOS


def write_failure(error: OSError) -> str:
    """The reason recorded for a run stopped by a write that failed with ``error``."""
    return (
        f"writing the run's results failed: {error} (free space, or raise the file-size limit "
        "or the permissions; `pflower resume` continues the run from its last checkpoint)"
    )


INTERRUPTING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that end a run as ``failed`` with the error ``interrupted by <signal>``."""
INTERRUPTED_BY = "interrupted by "


def error_line(summary: Mapping[str, Any]) -> str:
    """The first line of a failed run's error (``summary.json``'s ``error``)."""
    return (str(summary.get("error") or "").strip() or "no error recorded").splitlines()[0]


REJECTION_NOTE = (
    "A client whose update or metrics were not finite is rejected, one that crashed or timed out "
    "is lost, and the round goes on without it. A client left out of the final round's "
    "evaluation is in no client mean of its run, which flatters the method."
)
"""What the reports say under their lists of
[`rejected_replies`][pflower.results.rundir.rejected_replies]."""


@dataclass(frozen=True)
class Rejected:
    """The client replies a completed run rejected or lost (``summary.json``'s ``failures``)."""

    replies: int
    fit: int
    evaluate: int
    first_round: int
    last_round: int
    first_error: str
    """The first failure's client and error."""
    missing_at_end: int
    """Clients whose final-round evaluation is missing: the final client means leave them out."""
    evaluated_at_end: int

    def describe(self) -> str:
        """One line: how many replies, when, the first error and the clients left out."""
        rounds = (
            f"round {self.first_round}"
            if self.first_round == self.last_round
            else f"rounds {self.first_round}-{self.last_round}"
        )
        replies = "1 client reply" if self.replies == 1 else f"{self.replies} client replies"
        text = (
            f"{replies} rejected or lost in {rounds} ({self.fit} fit, "
            f"{self.evaluate} evaluate; first: {self.first_error})"
        )
        if self.missing_at_end:
            text += (
                f"; its final accuracy is the mean of the {self.evaluated_at_end} clients that "
                f"replied, {self.missing_at_end} left out"
            )
        return text


def rejected_replies(summary: Mapping[str, Any]) -> Rejected | None:
    """The client replies a completed run did without (a client whose update or metrics were not
    finite, one that crashed or timed out), from its ``summary.json``; None when it had them all.
    A client missing from the final round's evaluation is in none of the run's final client
    means, so a method whose clients diverge is scored on the clients that did not."""
    failures = [f for f in summary.get("failures") or [] if isinstance(f, Mapping)]
    if not failures:
        return None
    rounds = [int(f.get("round", 0)) for f in failures]
    final_round = int(summary.get("final_round") or max(rounds))
    missing = {
        f.get("client")
        for f in failures
        if f.get("phase") == "evaluate" and int(f.get("round", 0)) == final_round
    }
    first = failures[0]
    final_l1 = ((summary.get("final") or {}).get("L1") or {}).get("num_clients")
    return Rejected(
        replies=len(failures),
        fit=sum(f.get("phase") == "fit" for f in failures),
        evaluate=sum(f.get("phase") == "evaluate" for f in failures),
        first_round=min(rounds),
        last_round=max(rounds),
        first_error=f"client {first.get('client', '?')}, {error_line(first)}",
        missing_at_end=len(missing),
        evaluated_at_end=int(final_l1) if final_l1 is not None else 0,
    )


def was_interrupted(summary: Mapping[str, Any]) -> bool:
    """Did the run of this ``summary.json`` stop on a signal
    ([`INTERRUPTING_SIGNALS`][pflower.results.rundir.INTERRUPTING_SIGNALS]:
    ``kill``, the ``timeout`` command, Ctrl-C), rather than complete or fail by itself?"""
    return summary.get("status") == "failed" and str(summary.get("error") or "").startswith(
        INTERRUPTED_BY
    )


def failed_by_itself(summary: Mapping[str, Any]) -> bool:
    """Did the run of this ``summary.json`` fail (diverge, raise), not just stop on a signal? Such
    a run fails again when rerun as it was; an interrupted one has not run yet."""
    return summary.get("status") == "failed" and not was_interrupted(summary)


def record_interrupted(run_dir: Path, cfg: DictConfig, reason: str) -> None:
    """Write a failed ``summary.json`` (error ``reason``) from the rows ``metrics.jsonl`` holds,
    unless the run already wrote its summary. A last row cut off mid-write is left out."""
    if (run_dir / "summary.json").exists() or not run_dir.is_dir():
        return
    rows = []
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    write_summary(run_dir, cfg, rows, "failed", reason)


@contextlib.contextmanager
def summary_on_signal(run_dir: Path, cfg: DictConfig) -> Iterator[None]:
    """While active, SIGTERM and SIGINT (``kill``, ``timeout``, Ctrl-C) first record the run in
    ``run_dir`` as failed, ``interrupted by SIGTERM``
    ([`record_interrupted`][pflower.results.rundir.record_interrupted]), then do what
    they did before: a default disposition ends the process, a handler (Flower's graceful exit
    in a ServerApp process) is called; an ignored signal stays ignored. SIGINT ends the process
    as SIGTERM does (exit status 130): Python's KeyboardInterrupt would be swallowed by Flower's
    simulation engine, whose server thread then finishes the run. Signal handlers
    belong to the main thread: called on another thread (the ServerApp of a simulation), this
    does nothing, and the caller on the main thread is the one to use it. A signal caught by
    another thread while the main thread waits (a simulation's whole run) is handled at once
    all the same ([`handlers_run_promptly`][pflower.runtime.signals.handlers_run_promptly]). A
    process forked
    while this is active (a simulation's worker) inherits the handler; there it records
    nothing, as the run is its parent's to record."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    owner = os.getpid()
    started = threading.Event()

    def interrupted(signum: int, frame: Any) -> None:
        if os.getpid() == owner:  # not in a child: it may have been forked mid-``set``
            started.set()
            record_interrupted(run_dir, cfg, f"{INTERRUPTED_BY}{signal.Signals(signum).name}")
        before = previous[signum]
        if callable(before) and before is not signal.default_int_handler:
            before(signum, frame)
        else:  # Flower's simulation would swallow a KeyboardInterrupt and go on
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for signum in INTERRUPTING_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:  # an ignored signal stays ignored
            previous[signum] = signal.signal(signum, interrupted)
    try:
        with handlers_run_promptly(interrupted, frozenset(previous), started):
            yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


@dataclass(frozen=True)
class RecorderPosition:
    """Where a resumed run's recorder continues: after the first ``rows`` rows of
    ``metrics.jsonl``, with ``elapsed_s`` seconds of wall time already spent. ``size`` and
    ``sha256`` are the length and the SHA-256 digest of the file's bytes up to that row (empty
    for a checkpoint written before pflower stored them): a resume refuses a file whose first
    ``size`` bytes no longer have that digest
    ([`metrics_changed`][pflower.results.rundir.metrics_changed])."""

    rows: int
    elapsed_s: float
    size: int = 0
    sha256: str = ""


def metrics_changed(run_dir: Path, position: RecorderPosition) -> str | None:
    """Why ``run_dir/metrics.jsonl`` no longer holds what it held at ``position`` (a recorder's
    position stored in a checkpoint), or None if it does: any byte changed, removed or inserted
    before that position counts; rows appended after it (a run that went on after its last
    checkpoint) do not. A position without a digest (an older checkpoint) is compared by its
    row count only."""
    path = run_dir / "metrics.jsonl"
    data = path.read_bytes() if path.is_file() else b""
    if not position.sha256:
        rows = len(read_rows(run_dir))
        if rows < position.rows:
            return (
                f"{path} holds {rows} rows, "
                f"but the checkpoint was written after row {position.rows}"
            )
        return None
    if len(data) < position.size:
        return (
            f"{path} holds {len(data)} bytes, but the checkpoint was written after byte "
            f"{position.size} (row {position.rows})"
        )
    if hashlib.sha256(data[: position.size]).hexdigest() != position.sha256:
        return (
            f"the first {position.size} bytes of {path} (its rows up to the checkpoint) do not "
            "match the SHA-256 digest the checkpoint stored"
        )
    return None


class Recorder:
    """What the server strategy observes, as events; the base class records nothing."""

    def client_stage(self, server_round: int, stage: str, rows: Sequence[Row]) -> None:
        """Per-client rows of stage ``L1`` or ``L2`` (built with
        [`client_row`][pflower.results.rundir.client_row])."""

    def global_stage(self, server_round: int, metrics: Mapping[str, float]) -> None:
        """Metrics of the global model (stage ``G``)."""

    def failures(self, server_round: int, phase: str, failed: Mapping[int | str, str]) -> None:
        """Clients (partition id, or a node description) that failed, with their errors."""

    def rejected(self, server_round: int, phase: str, rejected: Mapping[int, str]) -> None:
        """Clients whose replies the server rejected, with the reasons (also failures)."""
        self.failures(server_round, phase, dict[int | str, str](rejected.items()))

    def fit_done(self, server_round: int) -> None:
        """The training phase of ``server_round`` is aggregated (marks round timing)."""

    def server_state(self, server_round: int, metrics: Mapping[str, float]) -> None:
        """Server-side state after ``server_round``'s aggregation (e.g. memory it holds)."""

    def round_done(self, server_round: int) -> None:
        """All results of ``server_round`` are in."""

    def finish(self) -> None:
        """The last round is done."""

    def fail(self, error: str) -> None:
        """The run stops with ``error``."""

    def write_failed(self, error: OSError) -> str:
        """A write of the run's results failed with ``error``: the run stops, recorded as failed
        (as far as anything can still be written); returns the reason recorded."""
        return write_failure(error)

    def close(self) -> None:
        """The run is over (after ``finish`` or ``fail``, and the last checkpoint)."""


class RunRecorder(Recorder):
    """Writes a run directory as the run goes, and prints one line per round if asked to."""

    def __init__(
        self,
        run_dir: Path,
        cfg: DictConfig,
        console: Console | None = None,
        resume_at: RecorderPosition | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.rounds = int(cfg.rounds)
        self.thresholds = list(cfg.eval.rho_thresholds)
        self.console = (console or _console()) if cfg.progress else None
        self.rows: list[Row] = []
        self._rejected: dict[int, int] = {}  # rejected replies per round, for its progress line
        self._digest = hashlib.sha256()  # of metrics.jsonl's bytes written so far
        self._size = 0
        self._started = time.monotonic() - (resume_at.elapsed_s if resume_at else 0.0)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._reserve = reserve_space(run_dir)  # for the summary of a failure, on a full disk
        self.tracker = Tracker.open(  # tracking=...: also send each round's metrics there
            resolved_config(cfg),
            run_dir,
            logging.getLogger("flwr").warning,
            already_recorded=resume_at.rows if resume_at else 0,
        )
        self._log_handler = logging.FileHandler(run_dir / "run.log")
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger("flwr").addHandler(self._log_handler)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        if resume_at is not None:
            self._rewind(resume_at)
        # unbuffered: a row is on disk, or (a failed write) cut off again, when _write returns
        self._metrics_file = (run_dir / "metrics.jsonl").open(
            "wb" if resume_at is None else "ab", buffering=0
        )

    def _rewind(self, position: RecorderPosition) -> None:
        """Continue a resumed run: keep the rows of ``metrics.jsonl`` up to ``position`` (the
        checkpoint's) and forget the run's end, if the interrupted run recorded one."""
        if problem := metrics_changed(self.run_dir, position):
            raise ValueError(f"{problem}: the run directory was changed since the checkpoint")
        path = self.run_dir / "metrics.jsonl"
        if position.sha256:
            kept = path.read_bytes()[: position.size]
            self.rows = [json.loads(line) for line in kept.decode().splitlines() if line.strip()]
        else:  # an older checkpoint, without a digest: its rows, written again
            self.rows = read_rows(self.run_dir)[: position.rows]
            kept = "".join(json.dumps(row) + "\n" for row in self.rows).encode()
        write_atomic(path, kept)
        self._digest.update(kept)
        self._size = len(kept)
        (self.run_dir / "summary.json").unlink(missing_ok=True)

    @property
    def position(self) -> RecorderPosition:
        """How far the run has got (for a checkpoint): rows written, time elapsed, and the
        length and SHA-256 digest of ``metrics.jsonl`` so far."""
        return RecorderPosition(
            len(self.rows), self._elapsed(), self._size, self._digest.hexdigest()
        )

    def _write(self, row: Row) -> None:
        line = (json.dumps(row) + "\n").encode()
        unwritten = memoryview(line)
        try:
            while unwritten:
                unwritten = unwritten[self._metrics_file.write(unwritten) :]
        except OSError as error:
            self._metrics_file.truncate(self._size)  # no half-written row
            error.filename = error.filename or str(self.run_dir / "metrics.jsonl")
            raise
        self.rows.append(row)
        self._digest.update(line)
        self._size += len(line)

    def client_stage(self, server_round: int, stage: str, rows: Sequence[Row]) -> None:
        for row in rows:
            self._write(row)

    def global_stage(self, server_round: int, metrics: Mapping[str, float]) -> None:
        self._write({"round": server_round, "stage": G, **metrics})

    def failures(self, server_round: int, phase: str, failed: Mapping[int | str, str]) -> None:
        for client, error in failed.items():
            row = {"round": server_round, "stage": FAILURE, "phase": phase, "client": client}
            self._write({**row, "error": error})
            if self.console:
                self.console.print(
                    f"[red]round {server_round}: client {client} failed ({phase}): {error}"
                )

    def rejected(self, server_round: int, phase: str, rejected: Mapping[int, str]) -> None:
        self._rejected[server_round] = self._rejected.get(server_round, 0) + len(rejected)
        super().rejected(server_round, phase, rejected)

    def fit_done(self, server_round: int) -> None:
        self._write({"round": server_round, "stage": TIME, "fit_done_unix_s": time.time()})

    def server_state(self, server_round: int, metrics: Mapping[str, float]) -> None:
        self._write({"round": server_round, "stage": SERVER, **metrics})

    def round_done(self, server_round: int) -> None:
        self.tracker.round_done(self.rows, server_round)
        if self.console:
            self.console.print(self._progress_line(server_round))

    def _progress_line(self, server_round: int) -> str:
        summary = round_summary(self.rows, server_round, self.thresholds)
        parts = [f"round {server_round}/{self.rounds}", f"{self._elapsed():6.1f}s"]
        for stage in CLIENT_STAGES:
            if stage in summary and "acc_local" in summary[stage]:
                part = f"{stage} acc(L) {summary[stage]['acc_local']['mean']:.3f}"
                if "acc_global" in summary[stage]:
                    part += f" acc(G) {summary[stage]['acc_global']['mean']:.3f}"
                parts.append(part)
        if G in summary:
            parts.append(f"G acc {summary[G]['acc']:.3f}")
        if self._rejected.get(server_round):
            parts.append(f"{self._rejected[server_round]} rejected")
        return " | ".join(parts)

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def finish(self) -> None:
        """Write summary.json and the plots (the last round is complete)."""
        write_summary(self.run_dir, self.cfg, self.rows, "completed", None, self._elapsed())
        self.tracker.close(self.rows, completed=True)
        self._close()
        from pflower.results.plots import plot_run, run_title  # matplotlib only when a run ends

        plot_run(self.rows, self.rounds, CLIENT_STAGES, self.run_dir / "plots", run_title(self.cfg))
        if self.console:
            self.console.print(f"[green]results written to {self.run_dir}")

    def fail(self, error: str) -> None:
        """The run stops with ``error``: record it in summary.json and release the files."""
        write_summary(self.run_dir, self.cfg, self.rows, "failed", error, self._elapsed())
        self.tracker.close(self.rows, completed=False)
        self._close()

    def write_failed(self, error: OSError) -> str:
        """Record the run as failed by ``error`` in ``summary.json``, written over the reserved
        space where the disk is full (a completed summary written before, e.g. when the last
        checkpoint could not be written, is replaced), and release the files."""
        reason = write_failure(error)
        write_summary(
            self.run_dir, self.cfg, self.rows, "failed", reason, self._elapsed(), self._reserve
        )
        with contextlib.suppress(OSError):  # a tracker's own files may not be writable either
            self.tracker.close(self.rows, completed=False)
        self._close()
        return reason

    def close(self) -> None:
        """Release the files and the reserved space."""
        self._close()
        if self._reserve is not None:
            self._reserve.unlink(missing_ok=True)

    def _close(self) -> None:
        self._metrics_file.close()
        logging.getLogger("flwr").removeHandler(self._log_handler)
        self._log_handler.close()


def _console() -> Console:
    """A console that never wraps a round's line when the output is a pipe or a CI log."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=250, soft_wrap=True)


# ---------------------------------------------------------------------------- reading back
def read_rows(run_dir: Path) -> list[Row]:
    """Every row of ``metrics.jsonl`` (none if the file does not exist). A last line that does
    not parse is a row still being written (a live run, read by the tuner's pruner, or one
    killed mid-write) and is left out; a line before it that does not parse is an error."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    with contextlib.suppress(json.JSONDecodeError, IndexError):
        rows.append(json.loads(lines[-1]))
    return rows
