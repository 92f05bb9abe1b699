"""Stopping ``pflower tune`` by hand: one line saying how to go on, never a traceback, from the
driver or from the fork server that Ctrl-C in a terminal reaches too."""

from __future__ import annotations

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


def _catches(pid: int, signum: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux: ``SigCgt``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))[7:], 16)
    return bool(caught >> (signum - 1) & 1)


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
