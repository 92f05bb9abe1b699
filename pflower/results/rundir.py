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
                     megabytes per client-round,
                     [`run_cost`][pflower.results.summary.run_cost]), the resolved ``config`` and
                     ``code``: the pflower code that made it (source fingerprint, git commit,
                     whether the checkout had uncommitted changes;
                     [`pflower.provenance`][pflower.provenance])
    plots/           accuracy.png (per round, by stage), clients.png (final per-client accuracy)
    tensorboard/     TensorBoard events, with ``tracking=tensorboard`` (see
    [`.tracking`][pflower.results.tracking])
    mlflow.db        the MLflow store, with ``tracking=mlflow`` (unless ``tracking.uri`` names
                     another)
    run.log          Flower's log
    .round_done      the last round whose rows are all in metrics.jsonl (for a watcher of the
                     live run: ``pflower tune``'s pruner)
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
report``). The rest of the run directory lives beside this module: the row schema and reading
``metrics.jsonl`` back ([`.rows`][pflower.results.rows]), ``summary.json``
([`.summary`][pflower.results.summary]), how a run's failure and an interrupting signal are
recorded ([`.failures`][pflower.results.failures]), and writing on a disk that may fail
([`.disk`][pflower.results.disk]).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from pflower.results.disk import reserve_space, write_atomic, write_failure
from pflower.results.rows import (
    CLIENT_STAGES,
    FAILURE,
    ROUND_DONE_FILE,
    SERVER,
    TIME,
    G,
    Row,
    read_rows,
)
from pflower.results.summary import resolved_config, round_summary, write_summary
from pflower.results.tracking import Tracker


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
        """Per-client rows of stage ``L1``, ``L2`` or ``U`` (built with
        [`client_row`][pflower.results.rows.client_row])."""

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
    """Writes a run directory as the run goes, and prints one line per evaluated round if asked
    to."""

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
        # an earlier mark (a folder run again with overwrite=true, a resumed run's rounds past
        # its checkpoint) says nothing of this run's rows
        (run_dir / ROUND_DONE_FILE).unlink(missing_ok=True)
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
        """Mark the round complete for a watcher of the run (`ROUND_DONE_FILE`), send its rows
        to the tracker, and print its progress line if asked to."""
        self._mark_round_done(server_round)
        self.tracker.round_done(self.rows, server_round)
        if self.console:
            self.console.print(self._progress_line(server_round))

    def _mark_round_done(self, server_round: int) -> None:
        """Rewrite `ROUND_DONE_FILE` in place (a reader that catches it empty reads 0, which a
        watcher takes as nothing new). Not flushed to the disk, and a failed write is let pass:
        the mark only tells a watcher when to read the rows, which are written, and checked,
        on their own."""
        with contextlib.suppress(OSError):
            (self.run_dir / ROUND_DONE_FILE).write_text(str(server_round))

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
        """Write summary.json and, unless ``plots=false``, the plots (the last round is
        complete)."""
        write_summary(self.run_dir, self.cfg, self.rows, "completed", None, self._elapsed())
        self.tracker.close(self.rows, completed=True)
        self._close()
        if self.cfg.plots:
            from pflower.results.plots import plot_run, run_title  # matplotlib: when a run ends

            plot_run(
                self.rows, self.rounds, CLIENT_STAGES, self.run_dir / "plots", run_title(self.cfg)
            )
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
