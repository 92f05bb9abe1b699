"""A deployment as local processes: one SuperLink and N SuperNodes on this machine.

[`Deployment`][pflower.deploy.local.Deployment] starts, inspects and stops them, keeps their process
table in a state file
(so that a later ``pflower deploy status|down`` finds them), and drives the Flower CLI (``flwr``)
against them to register nodes, submit runs and follow them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import tomli_w

from pflower.deploy.processes import (
    ManagedProcess,
    any_running,
    executable,
    launch,
    terminate,
    wait_for_port,
)
from pflower.deploy.topology import (
    Endpoints,
    Security,
    launcher_command,
    superlink_args,
    supernode_args,
)
from pflower.runtime.launcher import SUPERLINK_IN_MEMORY_DB

if TYPE_CHECKING:
    from pflower.config import RunRecord

IN_MEMORY_STATE = SUPERLINK_IN_MEMORY_DB
"""The SuperLink's ``--database`` value that keeps its state in memory."""

CONNECTION = "pflower-local"
"""Name of the SuperLink connection written to the deployment's Flower configuration."""

SERVERAPP_PROGRAM = "flwr-serverapp"
"""The program of the process that runs a run's ServerApp (started by the SuperLink's
SuperExec), stopped first by `Deployment.stop_all`."""

STATE_FILE = "deployment.json"
"""The process table in the deployment directory, written by
[`Deployment.save`][pflower.deploy.local.Deployment.save]."""

FLWR_TIMEOUT_S = 600.0
"""Default of [`Deployment.flwr_timeout`][pflower.deploy.local.Deployment.flwr_timeout] (``pflower
deploy up|run --flwr-timeout``): the
most seconds one ``flwr`` command (``run``, ``list``, ``supernode list|register``) may take. On
a loaded 2-core machine ``flwr run`` (which packs and uploads the app) took over 120 s."""

START_TIMEOUT_S = 300.0
"""Default of ``pflower deploy up --timeout``: the most seconds to wait for the SuperLink's
ports and for the SuperNodes to come online."""


class DeployTimeoutError(TimeoutError):
    """A wait of the deployment ran out; the message names the setting that bounds it."""


class SuperLinkGoneError(RuntimeError):
    """The SuperLink no longer answers (stopped, e.g. by ``pflower deploy down``)."""


DEFAULT_DIR = (
    Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "pflower/deploy"
)
"""Default deployment directory. Outside the repository on purpose: ``flwr run .`` packs every
source-like file under the app directory that ``.gitignore`` does not exclude, and this folder
holds the apps installed on each node."""


@dataclass
class Deployment:
    """A SuperLink and its SuperNodes as processes on this machine, rooted in ``directory``.

    ``directory`` holds ``logs/<process>.log``, each process's ``FLWR_HOME`` under ``home/``,
    the Flower CLI configuration (``flwr/config.toml``, with
    the connection [`CONNECTION`][pflower.deploy.local.CONNECTION]) and the process table
    [`STATE_FILE`][pflower.deploy.local.STATE_FILE].
    """

    directory: Path
    num_clients: int
    endpoints: Endpoints = field(default_factory=Endpoints)
    security: Security = field(default_factory=Security)
    tag: str = field(default_factory=lambda: f"pflower-{uuid.uuid4().hex[:12]}")
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    fast_rounds: bool = True
    """Start SuperNodes through [`pflower.deploy.launcher`][pflower.deploy.launcher] (ClientApp fork
    server, short
    polling intervals); False starts ``flower-supernode`` itself."""
    state_database: str = IN_MEMORY_STATE
    """The SuperLink's ``--database``: its state in memory (Flower's default, lost when the
    SuperLink ends, as these processes are) or the path of a SQLite file in an existing folder
    (Flower commits every change of state to it: the SuperLink then used about twice the CPU
    time per round, on 2 cores part of the round's time)."""
    flwr_timeout: float = FLWR_TIMEOUT_S
    """The most seconds one ``flwr`` command may take
    ([`FLWR_TIMEOUT_S`][pflower.deploy.local.FLWR_TIMEOUT_S]); not kept in
    the state file: each ``pflower deploy`` command sets its own (``--flwr-timeout``)."""
    _popens: dict[str, subprocess.Popen[bytes]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()

    # ---------------------------------------------------------------------- paths
    @property
    def logs(self) -> Path:
        """Directory of the log files, one per process and one per followed run."""
        return self.directory / "logs"

    @property
    def cli_home(self) -> Path:
        """``FLWR_HOME`` for ``flwr`` commands against this deployment."""
        return self.directory / "flwr"

    def _home(self, name: str) -> Path:
        """``FLWR_HOME`` of process ``name``: its own, like on a separate host."""
        return self.directory / "home" / name

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, command: list[str], wrapper: Sequence[str] = ()) -> None:
        process, popen = launch(
            name,
            command,
            self.logs / f"{name}.log",
            f"{self.tag}/{name}",
            self._home(name),
            wrapper,
        )
        self.processes[name] = process
        self._popens[name] = popen
        self.save()  # a restarted process's new pid is what `deploy status|down` must find

    def start_superlink(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the SuperLink and wait until its Fleet and Control APIs accept connections."""
        self._start(
            "superlink",
            [
                executable("flower-superlink"),
                *superlink_args(self.endpoints, self.security, self.state_database),
            ],
        )
        self.write_cli_config()
        popen = self._popens["superlink"]
        wait_for_port(self.endpoints.host, self.endpoints.control_port, timeout, popen)
        wait_for_port(self.endpoints.fleet_dial_host, self.endpoints.fleet_port, timeout, popen)

    def start_supernode(
        self,
        index: int,
        wrapper: Sequence[str] = (),
        superlink_host: str | None = None,
        runtime_port: int | None = None,
    ) -> None:
        """Start SuperNode ``index`` (name ``supernode-<index>``).

        ``wrapper`` and ``superlink_host`` place it elsewhere, e.g. in a network namespace that
        reaches the SuperLink at another address; ``runtime_port`` defaults to
        ``node_port + index``.
        """
        port = self.endpoints.node_port + index if runtime_port is None else runtime_port
        superlink = f"{superlink_host or self.endpoints.host}:{self.endpoints.fleet_port}"
        args = supernode_args(
            index, self.num_clients, superlink, ("127.0.0.1", port), self.security
        )
        command = (
            launcher_command("supernode", args)
            if self.fast_rounds
            else [executable("flower-supernode"), *args]
        )
        self._start(f"supernode-{index}", command, wrapper)

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM, grace: float = 10.0) -> None:
        """End process ``name`` and everything it started."""
        terminate(f"{self.tag}/{name}", [self.processes[name].pid], grace, sig)
        popen = self._popens.pop(name, None)
        if popen is not None:
            popen.wait(timeout=grace + 5)

    def stop_all(self, grace: float = 10.0) -> None:
        """End the runs' ServerApps, then the SuperNodes, then the SuperLink, then anything else
        carrying the tag.

        A ServerApp goes first, while its nodes are still there: on SIGTERM it records its run
        as interrupted (``interrupted by SIGTERM`` in ``summary.json``), which ``pflower
        report`` counts apart from failures. Stopped after its nodes, it saw them vanish and
        failed the round ("only 0 client(s) reachable") before the signal came."""
        terminate(self.tag, grace=grace, program=SERVERAPP_PROGRAM)
        for name in sorted(self.processes, key=lambda n: n == "superlink"):
            self.stop(name, grace=grace)
        terminate(self.tag, [p.pid for p in self.processes.values()], grace)

    def alive(self, name: str) -> bool:
        """Whether process ``name`` still runs."""
        popen = self._popens.get(name)
        if popen is not None:
            return popen.poll() is None
        process = self.processes[name]
        return any_running(process.tag, [process.pid])

    # ----------------------------------------------------------------- flwr CLI
    def write_cli_config(self) -> Path:
        """Write the Flower CLI configuration holding the connection
        [`CONNECTION`][pflower.deploy.local.CONNECTION]."""
        connection: dict[str, Any] = {"address": self.endpoints.control_address}
        if self.security.ca is None:
            connection["insecure"] = True
        else:
            connection["root-certificates"] = str(self.security.ca.resolve())
        config = {"superlink": {"default": CONNECTION, CONNECTION: connection}}
        path = self.cli_home / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(config))
        return path

    def flwr(
        self, *args: str, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``flwr <args>`` against this deployment (its own ``FLWR_HOME``), for at most
        ``timeout`` seconds (default
        [`flwr_timeout`][pflower.deploy.local.Deployment.flwr_timeout]);
        [`DeployTimeoutError`][pflower.deploy.local.DeployTimeoutError] after
        that, naming the setting."""
        env = dict(os.environ, FLWR_HOME=str(self.cli_home))
        limit = self.flwr_timeout if timeout is None else timeout
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
        from pflower.config import app_dir

        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
            file.write(tomli_w.dumps(record.to_run_config()))
        try:
            result = self.flwr(
                "run", str(app_dir()), CONNECTION, "--run-config", file.name, "--format", "json"
            )
        finally:
            os.unlink(file.name)
        return str(json.loads(result.stdout)["run-id"])

    def run_status(self, run_id: str) -> str:
        """Status of run ``run_id`` as ``flwr list`` reports it (e.g. ``finished:completed``);
        [`SuperLinkGoneError`][pflower.deploy.local.SuperLinkGoneError] if the SuperLink does not
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
        [`SuperLinkGoneError`][pflower.deploy.local.SuperLinkGoneError] if the SuperLink
        stopped answering (``pflower deploy down`` while the run went on: the ServerApp then
        records the run as failed, ``interrupted``, in its ``summary.json``).
        """
        env = dict(os.environ, FLWR_HOME=str(self.cli_home))
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

    # ------------------------------------------------------------------ state file
    def save(self) -> None:
        """Write the process table so that a later ``status``/``down`` finds the processes
        (every start of a process does, so it also holds a restarted node's new pid)."""
        state = {
            "tag": self.tag,
            "num_clients": self.num_clients,
            "endpoints": asdict(self.endpoints),
            "security": {
                k: None if v is None else str(v) for k, v in asdict(self.security).items()
            },
            "processes": [asdict(p) for p in self.processes.values()],
            "fast_rounds": self.fast_rounds,
            "state_database": self.state_database,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Deployment:
        """The deployment whose process table ``directory`` holds."""
        directory = Path(directory)
        state = json.loads((directory / STATE_FILE).read_text())
        security = Security(
            **{k: None if v is None else Path(v) for k, v in state["security"].items()}
        )
        processes = {p["name"]: ManagedProcess(**p) for p in state["processes"]}
        return cls(
            directory,
            state["num_clients"],
            Endpoints(**state["endpoints"]),
            security,
            state["tag"],
            processes,
            state.get("fast_rounds", True),
            state.get("state_database", IN_MEMORY_STATE),
        )
