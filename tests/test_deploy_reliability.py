"""``pflower deploy`` when waits run out and when the deployment goes away (issue 37, items 7
and 8), with real processes:

- every wait on a ``flwr`` command is a setting (``--flwr-timeout``, default
  :data:`~pflower.deploy.control.FLWR_TIMEOUT_S`); one that expires ends the command with a message
  naming the setting and exit code 1, never a traceback;
- ``pflower deploy down`` while ``pflower deploy run`` follows the run stops the ServerApp before
  the nodes (issue 61, item 4): it records the run as failed, ``interrupted by SIGTERM``, in
  ``summary.json`` (not "only 0 client(s) reachable"), and the follower ends with one line;
- a restarted SuperNode's pid is in ``deployment.json`` (issue 61, item 6).

Timeouts are generous: these run beside other work on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pflower.deploy.cli import main
from pflower.deploy.control import FLWR_TIMEOUT_S
from pflower.deploy.local import STATE_FILE, Deployment
from pflower.deploy.processes import tagged_pids
from pflower.deploy.topology import Endpoints
from pflower.results.rows import read_rows
from tests.deploy_helpers import REPO, deploy_up_arguments, free_port, wait_until

RUN_TIMEOUT = 600.0


def deploy_run(directory: Path, *arguments: str) -> list[str]:
    """The command line of ``pflower deploy run --dir directory arguments...``."""
    return [sys.executable, "-m", "pflower", "deploy", "run", "--dir", str(directory), *arguments]


def environment() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def test_the_default_flwr_timeout_holds_on_a_loaded_machine() -> None:
    """``flwr run`` took over 120 s (the old fixed limit) on a loaded 2-core machine."""
    assert FLWR_TIMEOUT_S >= 600
    assert Deployment(Path("unused"), 1).flwr_timeout == FLWR_TIMEOUT_S


@pytest.mark.slow
def test_an_expired_flwr_timeout_ends_with_a_message_naming_the_setting(tmp_path: Path) -> None:
    """A deployment table whose SuperLink is not there, and a limit ``flwr run`` cannot meet."""
    directory = tmp_path / "deploy"
    directory.mkdir()
    Deployment(directory, 1, Endpoints(free_port(), free_port(), free_port())).save()
    result = subprocess.run(
        deploy_run(
            directory, "--flwr-timeout", "0.01", "dataset=digits", f"output_dir={tmp_path / 'run'}"
        ),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "`flwr run` did not finish within 0.01 s" in output
    assert "--flwr-timeout" in output
    assert "Traceback" not in output


@pytest.mark.deployment
@pytest.mark.slow
def test_deploy_down_while_following_a_run(tmp_path: Path) -> None:
    directory = tmp_path / "deploy"
    assert main(deploy_up_arguments(directory, 2)) == 0, "pflower deploy up failed"
    tag = Deployment.load(directory).tag
    run_dir = tmp_path / "run"
    log = tmp_path / "follower.log"
    follower = None
    try:
        with log.open("w") as out:
            follower = subprocess.Popen(
                deploy_run(
                    directory,
                    "dataset=digits",
                    "partition=iid",
                    "strategy=fedavg",
                    "rounds=500",
                    "checkpoint.every=0",
                    "progress=false",
                    f"output_dir={run_dir}",
                ),
                env=environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: any(r["stage"] == "L2" for r in read_rows(run_dir)) or follower.poll(),
            RUN_TIMEOUT,
            "the run's first round",
        )
        assert follower.poll() is None, log.read_text()[-3000:]
        assert main(["down", "--dir", str(directory)]) == 0
        code = follower.wait(timeout=RUN_TIMEOUT)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        if (directory / STATE_FILE).exists():
            main(["down", "--dir", str(directory)])
    output = log.read_text()
    assert code == 1, output[-3000:]
    # The ServerApp stops first, while its nodes are there: no round fails, no traceback, and the
    # follower ends with one line of its own, not Flower's "SuperLink unavailable" box.
    assert "Traceback" not in output, output[-3000:]
    assert "Connection to the SuperLink is unavailable" not in output, output[-3000:]
    assert output.rstrip().splitlines()[-1].startswith("stopped following run"), output[-3000:]
    assert "interrupted by SIGTERM" in output and "pflower deploy down" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == ("failed", "interrupted by SIGTERM")
    assert not tagged_pids(tag)


@pytest.mark.deployment
def test_a_restarted_supernode_is_recorded_in_the_process_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``deploy status|down`` read ``deployment.json``: a SuperNode restarted by
    :meth:`Deployment.start_supernode` must be found there under its new pid. No SuperLink is
    needed: the node only retries it."""
    endpoints = Endpoints(free_port(), free_port(), free_port())
    deployment = Deployment(tmp_path / "deploy", 1, endpoints, fast_rounds=False)
    try:
        deployment.start_supernode(0, runtime_port=free_port())
        first = deployment.processes["supernode-0"].pid
        deployment.stop("supernode-0")
        deployment.start_supernode(0, runtime_port=free_port())
        second = deployment.processes["supernode-0"].pid
        loaded = Deployment.load(str(tmp_path / "deploy"))  # a str, as a script passes it
        assert first != second
        assert loaded.processes["supernode-0"].pid == second
        assert loaded.alive("supernode-0")
        assert main(["status", "--dir", str(tmp_path / "deploy")]) == 0
        assert re.search(rf"supernode-0 +pid {second} +running", capsys.readouterr().out)
    finally:
        deployment.stop_all()
    assert not Deployment.load(tmp_path / "deploy").alive("supernode-0")
