"""A deployment as local processes: one SuperLink and N SuperNodes on this machine.

[`Deployment`][pflower.deploy.local.Deployment] starts, inspects and stops them, keeps their process
table in a state file
(so that a later ``pflower deploy status|down`` finds them), and drives the Flower CLI (``flwr``)
against them to register nodes, submit runs and follow them
([`Deployment.control`][pflower.deploy.local.Deployment.control], a
[`SuperLinkControl`][pflower.deploy.control.SuperLinkControl]).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pflower.deploy.control import FLWR_TIMEOUT_S, START_TIMEOUT_S, SuperLinkControl
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
from pflower.runtime.standins import SERVERAPP

IN_MEMORY_STATE = SUPERLINK_IN_MEMORY_DB
"""The SuperLink's ``--database`` value that keeps its state in memory."""

SERVERAPP_PROGRAM = SERVERAPP.command
"""The program of the process that runs a run's ServerApp (started by the SuperLink's
SuperExec), stopped first by `Deployment.stop_all`."""

STATE_FILE = "deployment.json"
"""The process table in the deployment directory, written by
[`Deployment.save`][pflower.deploy.local.Deployment.save]."""

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
    the connection [`CONNECTION`][pflower.deploy.control.CONNECTION]) and the process table
    [`STATE_FILE`][pflower.deploy.local.STATE_FILE].
    """

    directory: Path
    num_clients: int
    endpoints: Endpoints = field(default_factory=Endpoints)
    security: Security = field(default_factory=Security)
    tag: str = field(default_factory=lambda: f"pflower-{uuid.uuid4().hex[:12]}")
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    fast_rounds: bool = True
    """Start the SuperNodes and the SuperLink through
    [`pflower.deploy.launcher`][pflower.deploy.launcher] (ClientApp and ServerApp fork servers,
    short polling intervals); False starts ``flower-supernode`` and ``flower-superlink``
    themselves."""
    state_database: str = IN_MEMORY_STATE
    """The SuperLink's ``--database``: its state in memory (Flower's default, lost when the
    SuperLink ends, as these processes are) or the path of a SQLite file in an existing folder
    (Flower commits every change of state to it: the SuperLink then used about twice the CPU
    time per round, on 2 cores part of the round's time)."""
    flwr_timeout: float = FLWR_TIMEOUT_S
    """The most seconds one ``flwr`` command may take
    ([`FLWR_TIMEOUT_S`][pflower.deploy.control.FLWR_TIMEOUT_S]); not kept in
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
        args = superlink_args(self.endpoints, self.security, self.state_database)
        command = (
            launcher_command("superlink", args)
            if self.fast_rounds
            else [executable("flower-superlink"), *args]
        )
        self._start("superlink", command)
        self.control.write_config()
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
    @property
    def control(self) -> SuperLinkControl:
        """The Flower CLI against this deployment's SuperLink: register nodes, submit runs and
        follow them (each ``flwr`` command bounded by
        [`flwr_timeout`][pflower.deploy.local.Deployment.flwr_timeout])."""
        return SuperLinkControl(
            self.cli_home,
            self.logs,
            self.endpoints,
            self.security,
            self.num_clients,
            self.flwr_timeout,
        )

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
