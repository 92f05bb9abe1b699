"""Driving a SuperLink through the Flower CLI (``flwr``): register SuperNodes' keys, count the
nodes online, submit a run of the pflower app and follow it to its end.

[`SuperLinkControl`][pflower.deploy.control.SuperLinkControl] is what
[`Deployment`][pflower.deploy.local.Deployment] uses for its SuperLink (``Deployment.control``),
and what talks to the SuperLink of a compose stack: it needs only the Control API's address and
certificates, not the processes. Every ``flwr`` command is bounded in time, and a wait that runs
out names the setting that bounds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import tomli_w

from pflower.deploy.processes import executable
from pflower.deploy.topology import Endpoints, Security

if TYPE_CHECKING:
    from pflower.config import RunRecord

CONNECTION = "pflower-local"
"""Name of the SuperLink connection written to the deployment's Flower configuration."""

FLWR_TIMEOUT_S = 600.0
"""Default of [`SuperLinkControl.timeout`][pflower.deploy.control.SuperLinkControl.timeout]
(``pflower deploy up|run --flwr-timeout``): the most seconds one ``flwr`` command (``run``,
``list``, ``supernode list|register``) may take. On a loaded 2-core machine ``flwr run`` (which
packs and uploads the app) took over 120 s."""

START_TIMEOUT_S = 300.0
"""Default of ``pflower deploy up --timeout``: the most seconds to wait for the SuperLink's
ports and for the SuperNodes to come online."""


class DeployTimeoutError(TimeoutError):
    """A wait of the deployment ran out; the message names the setting that bounds it."""


class SuperLinkGoneError(RuntimeError):
    """The SuperLink no longer answers (stopped, e.g. by ``pflower deploy down``)."""


@dataclass
class SuperLinkControl:
    """The Flower CLI against one SuperLink, with its own ``FLWR_HOME`` (``home``).

    ``home`` holds the CLI configuration (``config.toml``, with the connection
    [`CONNECTION`][pflower.deploy.control.CONNECTION]); ``logs`` receives ``run-<id>.log`` of
    each followed run.
    """

    home: Path
    logs: Path
    endpoints: Endpoints
    security: Security
    num_clients: int
    timeout: float = FLWR_TIMEOUT_S
    """The most seconds one ``flwr`` command may take
    ([`FLWR_TIMEOUT_S`][pflower.deploy.control.FLWR_TIMEOUT_S])."""

    def write_config(self) -> Path:
        """Write the Flower CLI configuration holding the connection
        [`CONNECTION`][pflower.deploy.control.CONNECTION]."""
        connection: dict[str, Any] = {"address": self.endpoints.control_address}
        if self.security.ca is None:
            connection["insecure"] = True
        else:
            connection["root-certificates"] = str(self.security.ca.resolve())
        config = {"superlink": {"default": CONNECTION, CONNECTION: connection}}
        path = self.home / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(config))
        return path

    def flwr(
        self, *args: str, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``flwr <args>`` against this deployment (its own ``FLWR_HOME``), for at most
        ``timeout`` seconds (default
        [`timeout`][pflower.deploy.control.SuperLinkControl.timeout]);
        [`DeployTimeoutError`][pflower.deploy.control.DeployTimeoutError] after
        that, naming the setting."""
        env = dict(os.environ, FLWR_HOME=str(self.home))
        limit = self.timeout if timeout is None else timeout
        try:
            return subprocess.run(
                [executable("flwr"), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=limit,
                check=check,
            )
        except subprocess.TimeoutExpired as error:
            raise DeployTimeoutError(
                f"`flwr {args[0]}` did not finish within {limit:g} s (the setting "
                f"--flwr-timeout of `pflower deploy up|run`, default {FLWR_TIMEOUT_S:g} s): "
                "the machine may be loaded, or the SuperLink unreachable"
            ) from error

    def register_nodes(self) -> None:
        """Register the public keys of all SuperNodes with the SuperLink."""
        if self.security.node_keys is None:
            raise ValueError("this deployment runs without SuperNode authentication")
        for index in range(self.num_clients):
            public = self.security.node_keys / f"supernode-{index}.pub"
            self.flwr("supernode", "register", str(public), CONNECTION)

    def online_nodes(self) -> int:
        """How many SuperNodes the SuperLink currently sees online."""
        result = self.flwr("supernode", "list", CONNECTION, "--format", "json", check=False)
        if result.returncode != 0:
            return 0
        nodes = json.loads(result.stdout).get("nodes", [])
        return sum(1 for node in nodes if str(node.get("status", "")).startswith("online"))

    def wait_for_nodes(self, count: int, timeout: float = START_TIMEOUT_S) -> None:
        """Block until ``count`` SuperNodes are online."""
        deadline = time.monotonic() + timeout
        while self.online_nodes() < count:
            if time.monotonic() > deadline:
                raise DeployTimeoutError(
                    f"fewer than {count} SuperNodes online after {timeout:.0f}s (the setting "
                    f"--timeout of `pflower deploy up`, default {START_TIMEOUT_S:g} s)"
                )
            time.sleep(2.0)

    def submit(self, record: RunRecord) -> str:
        """Start ``record``'s run of the pflower app (``flwr run``); its run id.

        The run config travels in a TOML file: ``--run-config`` key=value pairs cannot carry a
        double quote.
        """
        # Imported here: pflower.config loads Hydra, which the other commands do not need.
        from pflower.config.base import stage_app

        with tempfile.TemporaryDirectory(prefix="pflower-app-") as folder:
            app, run_config = stage_app(Path(folder, "app")), Path(folder, "run-config.toml")
            run_config.write_text(tomli_w.dumps(record.to_run_config()))
            result = self.flwr(
                "run", str(app), CONNECTION, "--run-config", str(run_config), "--format", "json"
            )
        reply = json.loads(result.stdout)
        if "run-id" not in reply:
            raise RuntimeError(f"`flwr run` started no run: {reply.get('error-message', reply)}")
        return str(reply["run-id"])

    def run_status(self, run_id: str) -> str:
        """Status of run ``run_id`` as ``flwr list`` reports it (e.g. ``finished:completed``);
        [`SuperLinkGoneError`][pflower.deploy.control.SuperLinkGoneError] if the SuperLink does not
        answer with one."""
        result = self.flwr("list", CONNECTION, "--run-id", run_id, "--format", "json", check=False)
        try:
            return str(json.loads(result.stdout)["runs"][0]["status"])
        except (ValueError, LookupError, TypeError) as error:
            # e.g. {"success": false, "error-message": ...} once the SuperLink has stopped
            answer = " ".join((result.stdout + result.stderr).split())[:300]
            raise SuperLinkGoneError(
                f"the SuperLink at {self.endpoints.control_address} gave no status for run "
                f"{run_id} ({answer or f'exit code {result.returncode}'})"
            ) from error

    def wait_for_run(self, run_id: str, timeout: float | None, to_terminal: bool = False) -> str:
        """Block until run ``run_id`` finished; returns its final status.

        Follows the run's log with ``flwr log --stream``, which returns when the run ends (one
        process for the whole wait, not repeated polls), into ``logs/run-<id>.log`` or, with
        ``to_terminal``, to this process's output.
        [`SuperLinkGoneError`][pflower.deploy.control.SuperLinkGoneError] if the SuperLink
        stopped answering (``pflower deploy down`` while the run went on: the ServerApp then
        records the run as failed, ``interrupted``, in its ``summary.json``).
        """
        env = dict(os.environ, FLWR_HOME=str(self.home))
        command = [executable("flwr"), "log", run_id, CONNECTION, "--stream"]
        with contextlib.ExitStack() as stack:
            out: TextIO | None = None
            if not to_terminal:
                out = stack.enter_context((self.logs / f"run-{run_id}.log").open("a"))
            try:
                subprocess.run(
                    command,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as error:
                raise DeployTimeoutError(
                    f"run {run_id} did not finish in {timeout:.0f}s"
                ) from error
        for _ in range(30):  # the status may trail the end of the log by a moment
            if (status := self.run_status(run_id)).startswith("finished"):
                return status
            time.sleep(1.0)
        return status
