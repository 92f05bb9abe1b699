"""Recording how a run failed: an exception raised outside the strategy, a signal that stops
the process (``kill``, ``timeout``, Ctrl-C), and reading back from a ``summary.json`` whether a
run failed by itself or was interrupted, and which client replies a completed run did without.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import threading
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pflower.results.rows import read_rows
from pflower.results.summary import write_summary
from pflower.runtime.signals import handlers_run_promptly


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
[`rejected_replies`][pflower.results.failures.rejected_replies]."""


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


def _left_out(summary: Mapping[str, Any]) -> dict[int, set[Any]]:
    """By round, the clients whose evaluation reply a run rejected or lost."""
    left_out: dict[int, set[Any]] = {}
    for failure in summary.get("failures") or []:
        if isinstance(failure, Mapping) and failure.get("phase") == "evaluate":
            left_out.setdefault(int(failure.get("round", 0)), set()).add(failure.get("client"))
    return left_out


def _held_out_lost(summary: Mapping[str, Any], part: str) -> float:
    """How many clients held out of training (``eval.unseen_fraction``: they evaluate at stage
    U, not L1) the evaluation of ``part`` (``final``, or ``last10`` on average over its rounds)
    lost: those held out, ``max(1, int(fraction * num_clients))`` as
    [`ExperimentConfig.num_unseen`][pflower.config.ExperimentConfig.num_unseen] counts them,
    less those whose stage-U reply came. A failure record does not name its stage, so their
    lost replies are told from L1's by count."""
    config = summary.get("config") or {}
    fraction = float((config.get("eval") or {}).get("unseen_fraction") or 0.0)
    if fraction <= 0:
        return 0.0
    held_out = max(1, int(fraction * int(config["num_clients"])))
    replied = ((summary.get(part) or {}).get("U") or {}).get("num_clients") or 0
    return max(held_out - float(replied), 0.0)


def rejected_replies(summary: Mapping[str, Any]) -> Rejected | None:
    """The client replies a completed run did without (a client whose update or metrics were not
    finite, one that crashed or timed out), from its ``summary.json``; None when it had them all.
    A client missing from the final round's evaluation is in none of the run's final client
    means, so a method whose clients diverge is scored on the clients that did not (the
    leaderboard scores them: [`every_client_acc`][pflower.results.failures.every_client_acc]).
    Clients held out of training are stage U's and not counted among those left out."""
    failures = [f for f in summary.get("failures") or [] if isinstance(f, Mapping)]
    if not failures:
        return None
    rounds = [int(f.get("round", 0)) for f in failures]
    final_round = int(summary.get("final_round") or max(rounds))
    first = failures[0]
    final_l1 = ((summary.get("final") or {}).get("L1") or {}).get("num_clients")
    return Rejected(
        replies=len(failures),
        fit=sum(f.get("phase") == "fit" for f in failures),
        evaluate=sum(f.get("phase") == "evaluate" for f in failures),
        first_round=min(rounds),
        last_round=max(rounds),
        first_error=f"client {first.get('client', '?')}, {error_line(first)}",
        missing_at_end=round(
            len(_left_out(summary).get(final_round, ())) - _held_out_lost(summary, "final")
        ),
        evaluated_at_end=int(final_l1) if final_l1 is not None else 0,
    )


LEFT_OUT_SCORE = 0.0
"""The accuracy a leaderboard gives a client left out of an evaluation: one whose reply was
rejected as not finite has no usable model, as a final run that failed has none
([`FAILED`][pflower.reporting.studies.FAILED]); one lost to a crash or a timeout counts the
same, as the leaderboard cannot tell the machine's fault from the method's (its note names the
error: rerun such a run)."""


def every_client_acc(summary: Mapping[str, Any], part: str = "final") -> float:
    """A completed run's L1 Acc(L), the unweighted mean over every client it evaluated at
    ``part`` (``final``: the final round; ``last10``: the mean over the last-10% window's rounds),
    each client left out scored [`LEFT_OUT_SCORE`][pflower.results.failures.LEFT_OUT_SCORE].

    The run's own summary averages the clients that replied, which scores a method whose clients
    diverge on the clients that did not. For ``last10`` the window's mean counts of clients that
    replied and of clients left out stand for each round's: exact when they are the same in
    every round of the window (a client whose model diverged stays diverged; so in every stored
    run), the first-order value otherwise."""
    stage = summary[part]["L1"]
    acc = float(stage["acc_local"]["mean"])
    final_round = summary.get("final_round")
    window = [final_round] if part == "final" else summary.get("last10_rounds") or []
    rounds = [int(r) for r in window if r is not None]
    left_out = _left_out(summary)
    lost = statistics.fmean(len(left_out.get(r, ())) for r in rounds) if rounds else 0.0
    missing = lost - _held_out_lost(summary, part) if lost else 0.0
    if missing <= 0:
        return acc
    replied = float(stage["num_clients"])
    return (acc * replied + LEFT_OUT_SCORE * missing) / (replied + missing)


def was_interrupted(summary: Mapping[str, Any]) -> bool:
    """Did the run of this ``summary.json`` stop on a signal
    ([`INTERRUPTING_SIGNALS`][pflower.results.failures.INTERRUPTING_SIGNALS]:
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
    ([`record_interrupted`][pflower.results.failures.record_interrupted]), then do what
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
