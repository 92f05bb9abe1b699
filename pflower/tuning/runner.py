"""How one tuning run is executed and read back: [`run_pflower`][pflower.tuning.runner.run_pflower]
(a local process) and
[`RayRunner`][pflower.tuning.runner.RayRunner] (a Ray task), both reporting each finished round's
stage-L1 mean to the
pruner, and the reader of the run's ``summary.json``
([`pflower.tuning.search`][pflower.tuning.search] drives
them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from pflower.plugins import PLUGINS_ENV
from pflower.registry import ConfigError
from pflower.results.disk import write_atomic
from pflower.results.failures import LEFT_OUT_SCORE, every_client_acc, was_interrupted
from pflower.results.rows import TIME, last_round_done, read_rows
from pflower.runtime.forkserver import ForkServerProcess, server_directory
from pflower.runtime.signals import handlers_run_promptly

HEARTBEAT_S = 20
POLL_S = 2.0
ROUND_POLL_S = 0.2
"""How often a run whose rounds go to a pruner is looked at: a round's results reach the
pruner this long after the run wrote them, at most (looking costs a ``stat`` and a small read);
other runs are looked at every `POLL_S` (a run that ends is seen at once either way)."""
REFUSED_EXIT = 2
"""pflower's exit code for a run refused before it starts
([`pflower.cli.GuardedTask`][pflower.cli.GuardedTask])."""
REFUSAL_PREFIXES = ("configuration error:", "dataset error:")
"""How the lines start that say why pflower refused a run ([`pflower.cli`][pflower.cli])."""


# ------------------------------------------------------------------------------ run results
def round_means(rows: Sequence[Mapping[str, Any]], stage: str = "L1") -> dict[int, float]:
    """Per round, the unweighted mean over clients of ``acc_local`` at ``stage``, each client
    whose evaluation reply the round rejected or lost scored
    [`LEFT_OUT_SCORE`][pflower.results.failures.LEFT_OUT_SCORE], as the leaderboard scores it:
    averaging the clients that replied would rank a configuration that diverges some clients
    by the others. A client held out of training (stage U rows, never ``stage``'s) is not
    ``stage``'s."""
    by_round: dict[int, list[float]] = {}
    lost: dict[int, set[Any]] = {}
    seen: dict[str, set[Any]] = {stage: set(), "U": set()}
    for row in rows:
        if row.get("stage") in seen:
            seen[row["stage"]].add(row.get("client"))
        if row.get("stage") == stage and "acc_local" in row and row.get("round", 0) > 0:
            by_round.setdefault(int(row["round"]), []).append(float(row["acc_local"]))
        elif row.get("stage") == "failure" and row.get("phase") == "evaluate":
            lost.setdefault(int(row["round"]), set()).add(row.get("client"))
    held_out = seen["U"] - seen[stage]
    means = {}
    for r in sorted(set(by_round) | set(lost)):
        values = by_round.get(r, []) + [LEFT_OUT_SCORE] * len(lost.get(r, set()) - held_out)
        if values:
            means[r] = sum(values) / len(values)
    return means


def rounds_completed(rows: Sequence[Mapping[str, Any]]) -> int:
    """The rounds a run completed, its compute: those whose training was aggregated (a
    ``time`` row) or that were evaluated (a trial evaluates only the rounds its pruner and
    objective read: its evaluated rounds are not its rounds)."""
    done = {int(r["round"]) for r in rows if r.get("stage") == TIME}
    return len(done | set(round_means(rows)))


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return summary


def _log_tail(run_dir: Path, lines: int = 12) -> str:
    """The end of a run's ``tune_stdout.log``: where pflower printed why it refused the run."""
    try:
        text = (run_dir / "tune_stdout.log").read_text(errors="replace")
    except OSError:
        return f"no log in {run_dir}"
    return "\n".join(text.strip().splitlines()[-lines:])


def objective_of(summary: Mapping[str, Any]) -> float:
    """The tuning objective from a completed run's ``summary.json``
    (see `pflower.tuning.search.OBJECTIVE`): a client left out of an evaluation scored 0
    ([`every_client_acc`][pflower.results.failures.every_client_acc]), as in `round_means`
    and on the leaderboard."""
    return every_client_acc(summary, "last10")


class TrialFailed(RuntimeError):
    """The trial's run did not complete (its reason is the message)."""


class RunInterrupted(TrialFailed):
    """A signal that did not come from ``pflower tune``'s own stops (pruning, a timeout, the
    driver's stop) ended the run: a ``kill`` of the run, or a Ctrl-C that reached the run just
    before the driver's stop did. The run recorded itself as interrupted
    ([`was_interrupted`][pflower.results.failures.was_interrupted]). Not the values' doing: a
    trial is retried with them (up to [`MAX_RETRY`][pflower.tuning.ledger.MAX_RETRY] times), a
    final run runs at the next ``pflower tune``."""


class RunRefused(ConfigError):
    """pflower refused the run before it started (exit code 2 and no ``summary.json``: a
    configuration or dataset error, an output folder it cannot write), which every run of the
    command would meet: the command stops with the run's message rather than spend a trial
    budget, or a final seed, on it ([`pflower.tuning.search.tune`][pflower.tuning.search.tune]
    retries the trial later).
    A profile's point past a range's end may be a value the option refuses: that point is
    recorded as refused
    ([`pflower.tuning.profile.run_profile`][pflower.tuning.profile.run_profile])."""

    def __init__(self, log_tail: str, command: Sequence[str]) -> None:
        self.log_tail, self.command = log_tail, list(command)
        lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(REFUSAL_PREFIXES)]
        self.reason = (errors or lines or ["the run printed nothing"])[0]
        """The line pflower printed to say why (the first that names an error)."""
        super().__init__(f"{log_tail}\n(the command: {' '.join(command)})")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its arguments: a Ray task's error reaches the driver pickled."""
        return type(self), (self.log_tail, self.command)


class Pruned(RuntimeError):
    """The pruner stopped the trial's run."""


class _LiveRuns:
    """The process groups of the runs [`run_pflower`][pflower.tuning.runner.run_pflower] is running
    in this process. Runs on
    worker threads (``--workers N``, final runs) do not see a Ctrl-C, which reaches the main
    thread only: `stop` ends them all, and their threads then raise KeyboardInterrupt
    rather than report a failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self.stopping = threading.Event()

    def add(self, group: int) -> None:
        with self._lock:
            self._groups.add(group)

    def discard(self, group: int) -> None:
        with self._lock:
            self._groups.discard(group)

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            groups = list(self._groups)
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)


LIVE_RUNS = _LiveRuns()


@contextlib.contextmanager
def runs_stop_together() -> Iterator[None]:
    """Around the main thread's wait for worker threads' runs: an exception there (Ctrl-C's
    KeyboardInterrupt) stops every run of this process (`LIVE_RUNS`), and runs not yet
    started do not start. SIGTERM raises the same KeyboardInterrupt meanwhile
    ([`sigterm_interrupts`][pflower.tuning.runner.sigterm_interrupts])."""
    LIVE_RUNS.stopping.clear()
    try:
        with sigterm_interrupts():
            yield
    except BaseException:
        LIVE_RUNS.stop()
        raise


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Make SIGTERM (``kill``, ``timeout``, a batch scheduler's stop) end the driver as Ctrl-C
    does: KeyboardInterrupt in the main thread, which stops the runs and leaves their trials to
    be retried. The runs are processes of sessions of their own, which a signal to the driver's
    process group does not reach: a driver that SIGTERM simply ended left them running, writing
    into folders the next command reuses. On the main thread only (elsewhere nothing changes);
    [`pflower.runtime.signals.handlers_run_promptly`][pflower.runtime.signals.handlers_run_promptly]
    wakes the main thread when another
    thread caught the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    started = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        started.set()
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with handlers_run_promptly(interrupt, frozenset({signal.SIGTERM}), started):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_pflower(
    command: Sequence[str],
    run_dir: Path,
    on_round: Callable[[int, float], bool] | None = None,
    heartbeat: Callable[[], None] | None = None,
    timeout_s: float | None = None,
    server: ForkServerProcess | None = None,
) -> dict[str, Any]:
    """Run one pflower process and return its ``summary.json``.

    ``on_round(round, mean L1 Acc(L))`` is called once per finished round while it runs and
    returning True stops it (raises `Pruned`). The process and its children (a process
    group of their own) are stopped on pruning, timeout or interruption. With a fork ``server``
    (`WarmRunner`) a ``python -m pflower ...`` command runs as the server's child, or as a new
    process where the server has ended (killed from outside: its stand-in is gone with it).
    """
    if LIVE_RUNS.stopping.is_set():
        raise KeyboardInterrupt("stopped with the driver's other runs")
    run_dir.mkdir(parents=True, exist_ok=True)
    argv, env = list(command), None
    if (
        server is not None
        and server.popen.poll() is None  # a server that ended: a new process
        and argv[:3] == [sys.executable, "-m", "pflower"]
    ):
        argv, env = [str(server.shim), *argv[3:]], server.environment()
    log = (run_dir / "tune_stdout.log").open("w")
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    LIVE_RUNS.add(process.pid)
    watch = RoundWatch(run_dir, on_round)
    started = last_beat = time.monotonic()
    timed_out = ""
    try:
        while not _ended(process, watch.wait_s):
            if LIVE_RUNS.stopping.is_set():
                break
            if heartbeat and time.monotonic() - last_beat > HEARTBEAT_S / 2:
                heartbeat()
                last_beat = time.monotonic()
            if timeout_s and time.monotonic() - started > timeout_s:
                timed_out = f"the run took longer than {timeout_s:.0f} s"
                raise TrialFailed(timed_out)
            watch.look()
        if LIVE_RUNS.stopping.is_set():
            raise KeyboardInterrupt("stopped with the driver's other runs")
    finally:
        LIVE_RUNS.discard(process.pid)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
        if timed_out:
            _record_failed(run_dir, timed_out)
    summary = read_summary(run_dir)
    if process.returncode == REFUSED_EXIT and summary is None:
        raise RunRefused(_log_tail(run_dir), command)
    if summary is not None and was_interrupted(summary):  # the driver's own stops raised above
        raise RunInterrupted(f"{summary['error']} (see {run_dir / 'tune_stdout.log'})")
    if process.returncode != 0 or summary is None or summary.get("status") != "completed":
        reason = (summary or {}).get("error") or f"exit code {process.returncode}"
        raise TrialFailed(f"{reason} (see {run_dir / 'tune_stdout.log'})")
    return summary


@dataclass
class RoundWatch:
    """Gives a live run's rounds to ``on_round`` (the pruner), each once, as soon as the run
    marks the round complete ([`last_round_done`][pflower.results.rows.last_round_done]). Before
    the mark, a pruned trial ran on until the next round's rows appeared and the next look
    found them: 1.5 rounds more on average in the cpu suite's fmnist_dir01 trials (rounds the
    study's budget paid for)."""

    run_dir: Path
    on_round: Callable[[int, float], bool] | None
    reported: int = 0

    @property
    def wait_s(self) -> float:
        """How long the runner may wait between looks: `ROUND_POLL_S` where a pruner is
        waiting for the rounds, else `POLL_S`."""
        return POLL_S if self.on_round is None else ROUND_POLL_S

    def look(self) -> None:
        """Report the rounds completed since the last look.

        Raises:
            Pruned: ``on_round`` said to stop after one of them.
        """
        if self.on_round is None:
            return
        done = last_round_done(self.run_dir)
        if done <= self.reported:
            return
        means = round_means(read_rows(self.run_dir))
        for server_round in sorted(r for r in means if self.reported < r <= done):
            if self.on_round(server_round, means[server_round]):
                raise Pruned(f"pruned after round {server_round}")
        self.reported = done


def _ended(process: subprocess.Popen[bytes], wait_s: float) -> bool:
    """Whether ``process`` has ended, waiting for it at most ``wait_s``: a run that ends is
    seen at once, not at the next of the runner's looks every `POLL_S` (which cost a trial
    1 s on average)."""
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _record_failed(run_dir: Path, reason: str) -> None:
    """Record in ``summary.json`` that the run failed for ``reason``. A run stopped with SIGTERM
    records itself as interrupted
    ([`pflower.results.failures.was_interrupted`][pflower.results.failures.was_interrupted]), which
    reads as
    "not run yet"; a run stopped for taking too long did run, and would time out again."""
    summary = read_summary(run_dir) or {}
    write_atomic(
        run_dir / "summary.json", json.dumps({**summary, "status": "failed", "error": reason})
    )


class Runner(Protocol):
    """How one pflower run is executed: [`run_pflower`][pflower.tuning.runner.run_pflower] (a local
    process) or
    [`RayRunner`][pflower.tuning.runner.RayRunner] (a Ray task on a cluster)."""

    def __call__(
        self,
        command: Sequence[str],
        run_dir: Path,
        on_round: Callable[[int, float], bool] | None = None,
        heartbeat: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]: ...


TRIAL_PRELOAD = (
    "pflower.cli",
    "pflower.simulation",
    "pflower.runtime.engine",
    "flwr.simulation",
    "flwr.common.config",
    "pflower.server.app",
    "pflower.client.app",
    "pflower.datasets.builder",
    "pflower.client.app:warm_up",
    "sklearn.datasets",
    "torch._dynamo",
    "pflower.results.plots",
)
"""What the fork server of `WarmRunner` imports (or calls) before it forks runs: what
every ``pflower`` run imports (torch, Flower, Hydra, pflower's apps, its engine and its
partitioners: each module left out is imported by every trial, 1 s for the ServerApp's and
0.5 s for the partitioners' ``flwr_datasets``), Hydra's lazy imports of a
composition (``warm_up``), ``torch._dynamo``, which torch imports at a run's first optimizer
step (2-3 s), and matplotlib, which a run imports to draw its plots at the end (0.4 s of CPU)."""


@dataclass(frozen=True)
class WarmRunner:
    """Runs each ``pflower`` run as a child of a fork server that imported torch, Flower and
    pflower once ([`pflower.runtime.forkserver`][pflower.runtime.forkserver]; `warm_runner` starts
    it): a trial starts without the 5-8 s a new Python process spends importing them, and computes
    what the same command computes in a new process (its environment, directory and arguments are
    the command's; ``tests/test_search_plan.py`` compares every row). The stand-in the runner starts
    forwards SIGTERM and SIGINT to the run (pruning, timeouts, Ctrl-C), and the runs end with the
    server, which ends with this process."""

    server: ForkServerProcess

    def __call__(
        self,
        command: Sequence[str],
        run_dir: Path,
        on_round: Callable[[int, float], bool] | None = None,
        heartbeat: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        return run_pflower(command, run_dir, on_round, heartbeat, timeout_s, self.server)


@contextlib.contextmanager
def warm_runner() -> Iterator[WarmRunner]:
    """A `WarmRunner` whose fork server lives as long as the ``with`` block (and no
    longer than this process)."""
    server = ForkServerProcess.start(
        server_directory("pflower-runs-"),
        target="pflower.cli:main",
        watch_pid=os.getpid(),
        preload_modules=TRIAL_PRELOAD,
        command="pflower",
    )
    try:
        yield WarmRunner(server)
    finally:
        server.stop()


def _run_on_worker(command: Sequence[str], run_dir: str, timeout_s: float | None) -> dict[str, Any]:
    """The body of a Ray task: the run as a process of the worker's node (with its Python)."""
    return run_pflower([sys.executable, *command[1:]], Path(run_dir), timeout_s=timeout_s)


@dataclass(frozen=True)
class RayRunner:
    """Runs every trial (and final run) as one Ray task on a running Ray cluster.

    The driver (``pflower tune --ray auto``) keeps the study and the heartbeats; each task runs
    ``python -m pflower ...`` on whichever node Ray picks, reserving ``num_cpus``, with the driver's
    ``PFLOWER_PLUGINS`` and ``PYTHONPATH`` where set ([`pflower.plugins`][pflower.plugins]: the
    plugin must be importable from that path on every node). Run folders must be on a filesystem
    every node and the driver see (the driver reads ``metrics.jsonl`` for the pruner and
    ``summary.json`` for the objective). A pruned run's task is cancelled, which stops its process
    group.
    """

    num_cpus: float = 1.0

    def __call__(
        self,
        command: Sequence[str],
        run_dir: Path,
        on_round: Callable[[int, float], bool] | None = None,
        heartbeat: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        import ray

        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        env = {k: os.environ[k] for k in (PLUGINS_ENV, "PYTHONPATH") if os.environ.get(k)}
        if env:
            options["runtime_env"] = {"env_vars": env}
        task = ray.remote(**options)(_run_on_worker)
        ref = task.remote(list(command), str(run_dir), timeout_s)
        watch = RoundWatch(run_dir, on_round)
        last_beat = time.monotonic()
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=watch.wait_s)
                if heartbeat and time.monotonic() - last_beat > HEARTBEAT_S / 2:
                    heartbeat()  # a write to the study's storage: not at every look
                    last_beat = time.monotonic()
                if ready:
                    summary: dict[str, Any] = ray.get(ref)  # a TrialFailed re-raises here
                    return summary
                if LIVE_RUNS.stopping.is_set():
                    raise KeyboardInterrupt("stopped with the driver's other runs")
                watch.look()
        except BaseException:
            ray.cancel(ref)  # KeyboardInterrupt in the task: run_pflower stops its processes
            raise
