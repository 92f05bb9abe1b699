"""A run's life from the command line, as real ``pflower`` processes (issue 37, item 9): it writes
only its run directory (Hydra's own ``.hydra/`` and ``<job>.log`` nowhere), an output directory
it cannot write is refused with exit code 2 before anything starts, and a run ended by SIGTERM
or SIGINT (``kill``, ``timeout``, Ctrl-C) leaves a failed ``summary.json`` saying so.

Timeouts are generous: these run beside other work on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["dataset=digits", "num_clients=2", "progress=false"]
START_S = 300.0
"""Most seconds a tiny run may take to reach its first rounds on a loaded 2-core machine."""


def pflower(*args: str) -> list[str]:
    return [sys.executable, "-m", "pflower", *args]


def environment() -> dict[str, str]:
    """This checkout first on the path: the commands run in a scratch directory."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_pflower(
    cwd: Path, *args: str, timeout: float = START_S
) -> subprocess.CompletedProcess[str]:
    """``python -m pflower args...`` run to its end in ``cwd``, its output captured."""
    return subprocess.run(
        pflower(*args), cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout
    )


def every_file(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.slow
def test_an_output_dir_that_cannot_be_written_is_refused_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    """``output_dir`` below a plain file cannot be made (by root either): exit code 2 with one
    message, and the working directory holds what it held (no ``runs/.../.hydra``, no
    ``cli.log``)."""
    (tmp_path / "a-file").write_text("not a directory\n")
    result = run_pflower(tmp_path, *TINY, "rounds=1", f"output_dir={tmp_path / 'a-file' / 'run'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "cannot write results to" in output and "output_dir" in output
    assert "Traceback" not in output
    assert every_file(tmp_path) == ["a-file"]


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="no sysfs here")
@pytest.mark.slow
def test_an_output_dir_under_sys_is_refused(tmp_path: Path) -> None:
    result = run_pflower(tmp_path, *TINY, "rounds=1", "output_dir=/sys/pflower-test-run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot write results to /sys/pflower-test-run" in result.stdout
    assert every_file(tmp_path) == []


@pytest.mark.slow
def test_a_run_writes_only_its_run_directory(tmp_path: Path) -> None:
    """Without ``output_dir`` a run writes ``runs/<date>/<time>/`` and nothing else: no Hydra
    ``.hydra/`` folder or ``cli.log`` there or in the working directory."""
    result = run_pflower(tmp_path, *TINY, "rounds=1", timeout=2 * START_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (day,) = (tmp_path / "runs").iterdir()
    (run_dir,) = day.iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    files = every_file(tmp_path)
    assert all(f == "runs" or f.startswith(f"runs{os.sep}") for f in files), files
    assert not [f for f in files if ".hydra" in f or f.endswith("cli.log")], files


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "to"),
    [(signal.SIGTERM, "thread"), (signal.SIGTERM, "group"), (signal.SIGINT, "process")],
    ids=["SIGTERM-caught-by-a-worker-thread", "SIGTERM-to-the-process-group", "SIGINT"],
)
def test_a_run_ended_by_a_signal_records_a_failed_summary(
    tmp_path: Path, sig: signal.Signals, to: str
) -> None:
    """The signal goes to the ``pflower`` process alone, as ``timeout`` or ``kill`` sends it:
    the process ends (by that signal) and ``summary.json`` says the run failed, interrupted,
    with the rounds recorded before. The run starts with the signal's default disposition, as
    one started from a terminal does: a test suite started as a background job of a
    non-interactive shell has SIGINT ignored, its children inherit that, and pflower keeps an
    ignored signal ignored (by design), so without the reset the run would not be interrupted.

    SIGTERM is sent with the id of the newest thread, which Linux then prefers to deliver it to
    (any thread may catch a process's signal): with the main thread asleep in the simulation
    engine's join, its handler used to run only after the 200th round, and the summary said
    "completed" (:mod:`pflower.runtime.signals`).

    Sent to the process group, as ``pflower tune`` and ``timeout`` send it, the signal reaches
    the forked workers too: they leave it to the driver, whose summary says "interrupted" (a
    worker that died of it would fail its message, and the run could be recorded as failed by
    its round's failure policy first)."""
    run_dir = tmp_path / "run"
    process = start_long_run(
        tmp_path,
        run_dir,
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
        start_new_session=to == "group",
    )
    try:
        wait_for_round(process, run_dir, 2)
        if to == "group":
            os.killpg(process.pid, sig)
        elif to == "thread":
            newest = max(int(tid) for tid in os.listdir(f"/proc/{process.pid}/task"))
            try:
                os.kill(newest, sig)
            except ProcessLookupError:  # the thread ended meanwhile
                process.send_signal(sig)
        else:
            process.send_signal(sig)
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == -sig, code
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == f"interrupted by {sig.name}"
    assert summary["final_round"] is not None and summary["final_round"] >= 2
    assert summary["rounds"] == 200


def start_long_run(cwd: Path, run_dir: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """A 200-round run into ``run_dir`` started in the background (to be stopped by the test)."""
    return subprocess.Popen(
        pflower(*TINY, "rounds=200", "checkpoint.every=0", f"output_dir={run_dir}"),
        cwd=cwd,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **popen,
    )


def wait_for_round(process: subprocess.Popen[bytes], run_dir: Path, server_round: int) -> None:
    deadline = time.monotonic() + 2 * START_S
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and f'"round": {server_round},' in metrics.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach round {server_round} (exit {process.poll()})")


@pytest.mark.slow
def test_a_run_into_a_live_runs_folder_is_refused_until_that_run_is_killed(
    tmp_path: Path,
) -> None:
    """Issue 61, item 1: two runs into one ``output_dir`` both exited 0, the second's rows
    replacing the first's in ``metrics.jsonl`` while ``run.log`` mixed both. Now the second is
    refused (exit code 2) before it writes anything, with ``overwrite=true`` too while the first
    is alive; once the first is killed with SIGKILL (no handler runs) ``overwrite=true``
    replaces it."""
    run_dir = tmp_path / "run"
    first = start_long_run(tmp_path, run_dir)
    try:
        wait_for_round(first, run_dir, 2)
        for extra, message in (
            ((), "holds another run"),
            (("overwrite=true",), f"is being written by a live run (process {first.pid})"),
        ):
            second = run_pflower(
                tmp_path, *TINY, "rounds=1", "seed=1", f"output_dir={run_dir}", *extra
            )
            output = " ".join((second.stdout + second.stderr).split())
            assert second.returncode == 2, output
            assert message in output and "Traceback" not in output
        assert first.poll() is None
        assert "seed: 1" not in (run_dir / "config.yaml").read_text()
    finally:
        first.kill()
        first.wait()
    third = run_pflower(
        tmp_path, *TINY, "rounds=1", "overwrite=true", f"output_dir={run_dir}", timeout=2 * START_S
    )
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 1
    assert max(json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").open()) == 1


@pytest.mark.slow
def test_a_run_stopped_by_a_file_size_limit_says_why_and_exits_1(tmp_path: Path) -> None:
    """Issue 61, item 2, as the issue ran it (``ulimit -f 40``): a traceback and no summary
    before; now one line, exit code 1, and ``summary.json`` saying the run failed and why.
    (FedAvg's clients keep no state: with FLIU's, the clients' snapshots fail first, and the
    round fails as a round whose clients all failed does.)"""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        pflower(
            *TINY, "strategy=fedavg", "rounds=2", "checkpoint.every=1", f"output_dir={run_dir}"
        ),
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=2 * START_S,
        preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_FSIZE, (40 * 1024, resource.RLIM_INFINITY)
        ),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "File too large" in summary["error"]
    assert f"run failed: {summary['error']}" in " ".join(output.split())
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
