"""Stopping ``pflower tune`` by hand: one line saying how to go on, never a traceback, from the
driver or from the fork server that Ctrl-C in a terminal reaches too; and a signal that stops
a run but not the driver costs the study no configuration."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflower.tuning import cli as tune_cli

SUITE = """\
name: tiny
trials: 2
final_seeds: [1]
methods: [fedavg]
settings:
  - name: digits
    overrides: [dataset=digits, num_clients=4, rounds=2]
"""


@pytest.mark.parametrize(
    ("stop", "said"),
    [(KeyboardInterrupt(), "Ctrl-C"), (KeyboardInterrupt("stopped by SIGTERM"), "SIGTERM")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stopped_tune_says_how_to_go_on_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stop: KeyboardInterrupt,
    said: str,
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)

    def interrupted(*_: object, **__: object) -> None:
        raise stop

    monkeypatch.setattr(tune_cli, "run_suite", interrupted)
    monkeypatch.setattr(tune_cli, "_runner", lambda args, stack: None)
    code = tune_cli.main(["--suite", str(suite), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 130
    assert err.count("\n") == 1 and f"stopped by {said}." in err, err
    assert "run the same command again" in err and str(tmp_path / "out") in err


def _catches(pid: int, signum: signal.Signals, mask: str = "SigCgt") -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux: ``SigCgt``; with
    ``mask="SigIgn"``: whether it ignores it)."""
    status = Path(f"/proc/{pid}/status").read_text()
    bits = int(next(line for line in status.splitlines() if line.startswith(mask))[7:], 16)
    return bool(bits >> (signum - 1) & 1)


def test_the_fork_server_ends_quietly_on_ctrl_c_then_sigterm(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the fork server too (it is in the driver's process group),
    and the driver then stops it with SIGTERM: both while it is still importing. It used to
    print a KeyboardInterrupt traceback, then a second one from its exit handlers."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "socket"))
    listener.listen()
    fd = str(listener.fileno())
    server = subprocess.Popen(
        [sys.executable, "-m", "pflower.runtime.forkserver", "--fd", fd, "--preload", "torch"],
        pass_fds=[listener.fileno()],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    listener.close()
    try:
        deadline = time.monotonic() + 120
        while not _catches(server.pid, signal.SIGTERM):  # its handlers are in: importing torch
            assert server.poll() is None and time.monotonic() < deadline, "it never started"
            time.sleep(0.02)
        server.send_signal(signal.SIGINT)
        time.sleep(0.05)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=120)
    finally:
        server.kill()
    # 0, or SIGTERM's own end where it came as the interpreter was finishing (it restores the
    # default handlers then): either way, nothing printed
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err


def _maps_torch(pid: int) -> bool:
    """Whether process ``pid`` has loaded torch's library: it is importing torch, or has."""
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()


def test_ctrl_c_while_pflower_starts_prints_one_line(tmp_path: Path) -> None:
    """Ctrl-C while ``pflower tune`` is still importing torch (before the command has a handler
    of its own): one line and exit code 130, where it used to print Python's traceback."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    command = [sys.executable, "-m", "pflower", "tune", "--suite", str(suite)]
    tune = subprocess.Popen(
        [*command, "--out", str(tmp_path / "out")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # as in a terminal: a test worker of pytest-xdist ignores SIGINT, and so would its child
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not _maps_torch(tune.pid):
            assert tune.poll() is None and time.monotonic() < deadline, "it never imported torch"
            time.sleep(0.01)
        tune.send_signal(signal.SIGINT)
        _, err = tune.communicate(timeout=120)
    finally:
        tune.kill()
    assert tune.returncode == 130, err
    assert err == "pflower: stopped by Ctrl-C.\n"
    assert not (tmp_path / "out").exists()  # nothing started


def test_a_trial_left_running_by_a_stopped_tune_is_retried_at_once(tmp_path: Path) -> None:
    """A ``pflower tune`` that was killed leaves its trial RUNNING. While another driver holds
    the setting (it may be running that trial), the trial is left to the heartbeat check; once
    no driver is left, the next one fails it at once and its values are enqueued again, where
    it used to sit out the heartbeat's 90 s grace period first."""
    import fcntl

    from optuna.trial import TrialState

    from pflower.tuning.ledger import driving
    from pflower.tuning.search import Layout, open_study

    layout = Layout(tmp_path / "out")
    study = open_study(layout, "digits", "fedavg", 0, parallel=True)
    left = study.ask()
    lr = left.suggest_float("train.lr", 1e-3, 1e-1, log=True)
    said: list[str] = []
    lock = layout.drivers_file("digits")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as other:  # another driver, alive
        fcntl.flock(other, fcntl.LOCK_SH)
        with driving(lock, study, said.append):
            assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]
    assert said == []
    with driving(lock, study, said.append):  # nobody else: the trial was left behind
        trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].params == {"train.lr": lr}  # retried with its values
    assert said == [
        "fedavg: trial 0 was left running by a stopped pflower tune (retried with the same values)"
    ]


def test_a_run_that_recorded_an_interruption_is_not_a_failed_configuration(tmp_path: Path) -> None:
    """A run ended by a signal that did not come from ``pflower tune``'s own stops (a ``kill`` of
    the run; a SIGINT to the group of a driver that ignored it, before the fork server kept it
    ignored too) records itself as interrupted: the runner says so (`RunInterrupted`) instead of
    failing the values with it, which cost a study of the cpu suite one configuration."""
    from pflower.tuning.runner import RunInterrupted, TrialFailed, run_pflower

    run_dir = tmp_path / "run"
    summary = {"status": "failed", "error": "interrupted by SIGINT"}
    record = f"import json, sys; open({str(run_dir / 'summary.json')!r}, 'w').write("
    command = [sys.executable, "-c", f"{record}json.dumps({summary!r})); sys.exit(130)"]
    with pytest.raises(RunInterrupted, match=r"^interrupted by SIGINT \(see .*tune_stdout.log\)"):
        run_pflower(command, run_dir)
    summary = {"status": "failed", "error": "every client's update is NaN"}
    command = [sys.executable, "-c", f"{record}json.dumps({summary!r})); sys.exit(1)"]
    with pytest.raises(TrialFailed, match="NaN") as failed:
        run_pflower(command, run_dir)
    assert not isinstance(failed.value, RunInterrupted)


@pytest.mark.parametrize("stop", ["pruned", "timeout"])
def test_the_runners_own_stops_are_not_taken_for_an_outside_interruption(
    tmp_path: Path, stop: str
) -> None:
    """Pruning and a timeout stop the run with SIGTERM, and the run then records itself as
    interrupted, as after a ``kill``: the runner still says what it did (pruned, timed out),
    so neither is retried as an interruption."""
    from pflower.results.rows import ROUND_DONE_FILE
    from pflower.tuning.runner import Pruned, RunInterrupted, TrialFailed, run_pflower

    run_dir = tmp_path / "run"
    # a run: round 1's rows, marked done; on SIGTERM it records the interruption and ends
    script = f"""
import json, pathlib, signal, sys, time
run = pathlib.Path({str(run_dir)!r})
def interrupted(*_):
    (run / "summary.json").write_text(json.dumps(
        {{"status": "failed", "error": "interrupted by SIGTERM"}}))
    sys.exit(143)
signal.signal(signal.SIGTERM, interrupted)
row = {{"round": 1, "stage": "L1", "client": 0, "acc_local": 0.5}}
(run / "metrics.jsonl").write_text(json.dumps(row) + "\\n")
(run / {ROUND_DONE_FILE!r}).write_text("1")
time.sleep(60)
"""
    command = [sys.executable, "-c", script]
    expected: type[Exception] = Pruned if stop == "pruned" else TrialFailed
    with pytest.raises(expected) as raised:
        if stop == "pruned":
            run_pflower(command, run_dir, on_round=lambda _round, _value: True)
        else:
            run_pflower(command, run_dir, timeout_s=3)
    assert not isinstance(raised.value, RunInterrupted)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["error"] == (
        "interrupted by SIGTERM" if stop == "pruned" else "the run took longer than 3 s"
    )


@pytest.mark.parametrize("interruptions", [1, 2, 4])
def test_an_interrupted_trial_is_retried_with_its_values_and_not_counted(
    tmp_path: Path, interruptions: int
) -> None:
    """The study goes on: the interrupted trial's values run again at once, however often in a
    row (a retry that was itself retried used to count, and its values were then skipped as a
    repeat), and the budget counts only the trials whose runs were let finish; after
    `MAX_RETRY` retries the values count as failed, so that a configuration whose runs are
    always killed is not retried forever."""
    from optuna.trial import TrialState

    from pflower.tuning import search
    from pflower.tuning.ledger import MAX_RETRY, budget_counts
    from pflower.tuning.runner import RunInterrupted
    from pflower.tuning.suite import load_suite
    from tests.helpers import tiny_suite

    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(tiny_suite(2, 0, "[1]"))
    suite = load_suite(str(suite_file))
    ran: list[str] = []

    def runner(command: list[str], run_dir: Path, *_: object, **__: object) -> dict[str, object]:
        ran.append(next(c for c in command if c.startswith("train.lr=")))
        if len(ran) <= interruptions:
            raise RunInterrupted("interrupted by SIGTERM (see tune_stdout.log)")
        lr = float(ran[-1].split("=")[1])
        return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": lr}}}}

    said: list[str] = []
    layout = search.Layout(tmp_path / "out")
    study = search.tune(
        suite, suite.settings[0], "fedprox", layout, 2, log=said.append, runner=runner
    )
    states = [t.state for t in study.get_trials()]
    retried = min(interruptions, MAX_RETRY)
    assert len(set(ran[: retried + 1])) == 1  # the same values each time
    assert budget_counts(study) == (2, 0)
    assert said[0] == (
        "fedprox trial 0: interrupted by SIGTERM (see tune_stdout.log); "
        "retried with the same values"
    )
    if interruptions <= MAX_RETRY:  # then a second configuration, both complete
        assert states == [TrialState.FAIL] * interruptions + [TrialState.COMPLETE] * 2
        assert len(set(ran)) == 2
    else:  # the fourth retry's interruption counts: one failed configuration, one complete
        assert states == [TrialState.FAIL] * (MAX_RETRY + 1) + [TrialState.COMPLETE]
        assert said[MAX_RETRY].endswith("; counted as failed (retried enough)")


def test_a_retry_runs_even_when_the_rest_of_the_budget_is_spent(tmp_path: Path) -> None:
    """Values drawn while the budget had room and then interrupted (their driver stopped) run
    when the study resumes, even if the trials that finished meanwhile spent the budget: a
    resumed study tries every configuration it drew, as an uninterrupted one does. The cpu
    suite's mnist_path FedAvg-FT study 0 lost its 31st configuration so: its retry was left
    waiting because a retry that ran before it had spent the budget."""
    from optuna.trial import TrialState

    from pflower.tuning import search
    from pflower.tuning.ledger import budget_counts, spending
    from pflower.tuning.suite import load_suite
    from tests.helpers import tiny_suite

    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(tiny_suite(2, 0, "[1]"))
    suite = load_suite(str(suite_file))
    setting = suite.settings[0]
    ran: list[float] = []

    def runner(command: list[str], run_dir: Path, *_: object, **__: object) -> dict[str, object]:
        ran.append(float(next(c for c in command if c.startswith("train.lr=")).split("=")[1]))
        return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": ran[-1]}}}}

    layout = search.Layout(tmp_path / "out")
    study = search.tune(suite, setting, "fedprox", layout, 2, runner=runner)
    assert budget_counts(study) == (2, 0) and len(ran) == 2  # the budget is spent
    # a third draw, admitted by a driver that was then stopped: left RUNNING
    left = study.ask()
    lr = left.suggest_float("train.lr", 1e-3, 1e-1, log=True)
    said: list[str] = []
    study = search.tune(suite, setting, "fedprox", layout, 2, log=said.append, runner=runner)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [
        TrialState.FAIL,
        TrialState.COMPLETE,
    ]
    assert ran[2] == pytest.approx(lr, rel=1e-5) and len(ran) == 3  # its values ran, once
    assert trials[3].params["train.lr"] == trials[2].params["train.lr"]
    assert spending(trials, suite.search).waiting == 0
    assert said[0].startswith("fedprox: trial 2 was left running by a stopped pflower tune")
    # nothing is left to run: a third command runs nothing
    search.tune(suite, setting, "fedprox", layout, 2, runner=runner)
    assert len(ran) == 3


@pytest.mark.parametrize("ignored", [True, False], ids=["background-job", "terminal"])
def test_the_fork_server_and_its_runs_keep_an_ignored_sigint_ignored(ignored: bool) -> None:
    """Started by a process that ignores SIGINT (``pflower tune ... &`` in a script, without job
    control), the fork server and the runs it forks ignore it too, as the driver does and as a
    run started without the server would: a SIGINT to the job's process group used to end the
    server and its runs while the driver went on (it failed the running trial's values, then
    stopped with a traceback: the server had removed its stand-in). Started from a terminal,
    both catch it."""
    from pflower.runtime.forkserver import ForkServerProcess, server_directory

    before = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.SIG_DFL)
    try:
        server = ForkServerProcess.start(
            server_directory("pflower-test-"), target="signal:pause", preload_modules=()
        )
    finally:
        signal.signal(signal.SIGINT, before)
    stand_in = None
    try:
        server.wait_ready(120)
        stand_in = subprocess.Popen([str(server.shim)], env=server.environment())
        deadline = time.monotonic() + 60
        # forked, and past its signal reset (the server catches SIGTERM, the run does not)
        while not (runs := _children(server.popen.pid)) or _catches(runs[0], signal.SIGTERM):
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.02)
        for pid in (server.popen.pid, runs[0]):
            assert _catches(pid, signal.SIGINT, "SigIgn") is ignored
            assert _catches(pid, signal.SIGINT) is not ignored
        if ignored:
            os.kill(server.popen.pid, signal.SIGINT)
            os.kill(runs[0], signal.SIGINT)
            time.sleep(0.5)
            assert server.popen.poll() is None and stand_in.poll() is None
        os.kill(runs[0], signal.SIGTERM)
        assert stand_in.wait(timeout=60) != 0  # the run ended by SIGTERM, as the stand-in says
    finally:
        if stand_in is not None:
            stand_in.kill()
        server.stop()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def test_a_run_goes_cold_when_the_fork_server_was_killed(tmp_path: Path) -> None:
    """A fork server ended from outside (``kill``) takes its stand-in with it: the runner then
    starts the run as a new process, where it used to stop with a ``FileNotFoundError``."""
    from pflower.runtime.forkserver import ForkServerProcess, server_directory
    from pflower.tuning.runner import TrialFailed, run_pflower

    server = ForkServerProcess.start(server_directory("pflower-test-"), preload_modules=())
    server.stop()  # as SIGTERM ends it: the stand-in's folder is removed
    assert not server.shim.exists()
    run_dir = tmp_path / "run"
    with pytest.raises(TrialFailed, match="exit code 0"):  # it ran: help, and no summary
        run_pflower([sys.executable, "-m", "pflower", "--help"], run_dir, server=server)
    assert "usage" in (run_dir / "tune_stdout.log").read_text().lower()
