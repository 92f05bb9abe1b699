"""Multi-node deployment: one SuperLink and N SuperNodes, as local processes or as containers.

A deployment runs the same ServerApp and ClientApp as a simulation. The SuperNodes talk to the
SuperLink's Fleet API over gRPC (port 9092); ``flwr run`` and the ServerApp executor use its HTTP
Control/runtime API (port 8000); each SuperNode serves its ClientApp executor on its own runtime
API port (9094 + i). Node ``i`` carries the node config ``partition-id=i num-partitions=N``, and
its client's personalized state (``context.state``) lives in that SuperNode for the whole run.

One description of the topology serves two targets, so that they cannot drift apart:

- ``pflower deploy up|status|down`` starts, inspects and stops the topology as processes on this
  machine (no Docker), with one log file per process in ``<dir>/logs`` and the process table in
  ``<dir>/deployment.json``; ``pflower deploy run <overrides>`` submits an experiment to it;
- ``pflower deploy compose --num-clients N`` writes ``docker/compose.yml`` and its overlays
  (TLS plus SuperNode authentication, GPUs) for N clients.

Every process started here carries the environment variable :data:`TAG_VARIABLE`; Flower's own
child processes (SuperExec, ServerApp and ClientApp processes, which start new sessions) inherit it.
Stopping a deployment ends exactly the processes that carry its tag, and no others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
import yaml

TAG_VARIABLE = "PFLOWER_DEPLOY_TAG"
"""Environment variable naming the deployment and process a process belongs to."""

CONNECTION = "pflower-local"
"""Name of the SuperLink connection written to the deployment's Flower configuration."""

STATE_FILE = "deployment.json"
DEFAULT_DIR = Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / (
    "pflower/deploy")
"""Default deployment directory. Outside the repository on purpose: ``flwr run .`` packs every
source-like file under the app directory that ``.gitignore`` does not exclude, and this folder
holds the apps installed on each node."""


# ----------------------------------------------------------------------------- topology
@dataclass(frozen=True)
class Endpoints:
    """Where the SuperLink listens and where the first SuperNode serves its runtime API.

    Attributes:
        host: address of the SuperLink's Control/runtime API and the host the SuperNodes and
            ``flwr`` dial.
        fleet_port: Fleet API (gRPC, SuperNodes connect here).
        control_port: Control API for ``flwr`` and the runtime API for the ServerApp (HTTP).
        node_port: runtime API of SuperNode 0 (HTTP); node ``i`` uses ``node_port + i``.
        fleet_bind: interface the Fleet API binds to (``0.0.0.0`` to accept other hosts);
            ``None`` binds to ``host``.
    """

    host: str = "127.0.0.1"
    fleet_port: int = 9092
    control_port: int = 8000
    node_port: int = 9094
    fleet_bind: str | None = None

    @property
    def fleet_address(self) -> str:
        return f"{self.host}:{self.fleet_port}"

    @property
    def fleet_dial_host(self) -> str:
        """Where this machine reaches the Fleet API."""
        return self.host if self.fleet_bind in (None, "0.0.0.0") else self.fleet_bind

    @property
    def control_address(self) -> str:
        return f"{self.host}:{self.control_port}"


@dataclass(frozen=True)
class Security:
    """TLS certificates and SuperNode keys, in the layout that ``docker/certs.sh`` writes.

    Attributes:
        certificates: directory with ``ca.crt``, ``server.pem`` and ``server.key``; ``None``
            runs without TLS.
        node_keys: directory with one OpenSSH EC key pair per node (``supernode-<i>`` and
            ``supernode-<i>.pub``); turns on SuperNode authentication (requires TLS).
    """

    certificates: Path | None = None
    node_keys: Path | None = None

    def __post_init__(self) -> None:
        if self.node_keys is not None and self.certificates is None:
            raise ValueError("SuperNode authentication requires TLS: give the certificates too")

    @property
    def ca(self) -> Path | None:
        return None if self.certificates is None else self.certificates / "ca.crt"

    def node_key(self, index: int) -> Path | None:
        """Private key of SuperNode ``index`` (None without authentication)."""
        return None if self.node_keys is None else self.node_keys / f"supernode-{index}"


def superlink_args(
    endpoints: Endpoints, security: Security, database: str, isolation: str = "subprocess"
) -> list[str]:
    """Arguments of ``flower-superlink``.

    Runtime dependency installation stays off: the apps' dependencies are those of the
    environment (the virtualenv, or the image), never installed at run time.
    """
    fleet_host = endpoints.fleet_bind or endpoints.host
    args = [
        "--isolation", isolation,
        "--database", database,
        "--fleet-api-address", f"{fleet_host}:{endpoints.fleet_port}",
        "--host", endpoints.host,
        "--port", str(endpoints.control_port),
        "--disable-runtime-dependency-installation",
    ]
    if security.certificates is None:
        return ["--insecure", *args]
    certs = security.certificates
    args += [
        "--ssl-ca-certfile", str(certs / "ca.crt"),
        "--ssl-certfile", str(certs / "server.pem"),
        "--ssl-keyfile", str(certs / "server.key"),
    ]
    if security.node_keys is not None:
        args.append("--enable-supernode-auth")
    return args


def supernode_args(
    index: int,
    num_nodes: int,
    superlink: str,
    runtime: tuple[str, int],
    security: Security,
    isolation: str = "subprocess",
) -> list[str]:
    """Arguments of ``flower-supernode`` for node ``index`` of ``num_nodes``."""
    host, port = runtime
    args = [
        "--superlink", superlink,
        "--isolation", isolation,
        "--host", host,
        "--port", str(port),
        "--node-config", f"partition-id={index} num-partitions={num_nodes}",
    ]
    if security.ca is None:
        return ["--insecure", *args]
    args += ["--root-certificates", str(security.ca)]
    key = security.node_key(index)
    if key is not None:
        args += ["--auth-supernode-private-key", str(key)]
    return args


def superexec_args(runtime_address: str, root_certificates: str | None) -> list[str]:
    """Arguments of ``flower-superexec``, the executor of ServerApp or ClientApp processes."""
    if root_certificates is None:
        return ["--insecure", "--runtime-api-address", runtime_address]
    return ["--root-certificates", root_certificates, "--runtime-api-address", runtime_address]


# ------------------------------------------------------------------------- processes
@dataclass
class ManagedProcess:
    """A process started by a deployment; ``tag`` marks it and all its descendants."""

    name: str
    pid: int
    command: list[str]
    log: str
    tag: str


def executable(name: str) -> str:
    """A Flower executable of this Python environment (the one running pflower)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def process_environment(tag: str, flwr_home: Path) -> dict[str, str]:
    """The environment of a deployment process.

    ``PATH`` starts with this interpreter's scripts directory because SuperLink and SuperNode
    start ``flower-superexec`` by name; ``FLWR_HOME`` keeps each process's installed apps
    apart, like on separate hosts, and away from the user's ``~/.flwr``.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(flwr_home)
    env["PYTHONUNBUFFERED"] = "1"
    env[TAG_VARIABLE] = tag
    return env


def launch(
    name: str,
    command: Sequence[str],
    log: Path,
    tag: str,
    flwr_home: Path,
    wrapper: Sequence[str] = (),
) -> tuple[ManagedProcess, subprocess.Popen[bytes]]:
    """Start ``command`` in a new session, its output appended to ``log``.

    ``wrapper`` is prepended (e.g. ``ip netns exec <ns>`` to run it in a network namespace).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    flwr_home.mkdir(parents=True, exist_ok=True)
    argv = [*wrapper, *command]
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=process_environment(tag, flwr_home),
            start_new_session=True,
        )
    return ManagedProcess(name, popen.pid, argv, str(log), tag), popen


_PROC = Path("/proc")


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` or a tag below it (``tag/...``).

    Reads ``/proc/<pid>/environ`` (Linux); processes of other users and zombies are skipped.
    Without ``/proc`` the answer is empty.
    """
    if not _PROC.is_dir():
        return []
    wanted = f"{TAG_VARIABLE}={tag}".encode()
    below = f"{TAG_VARIABLE}={tag}/".encode()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v == wanted or v.startswith(below) for v in variables):
            found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _targets(tag: str, leaders: Sequence[int]) -> list[int]:
    """The processes to signal: tagged ones, or without ``/proc`` the live session leaders."""
    if _PROC.is_dir():
        return tagged_pids(tag)
    return [pid for pid in leaders if _running(pid)]


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    kill = os.kill if _PROC.is_dir() else os.killpg
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, sig)


def terminate(tag: str, leaders: Sequence[int] = (), grace: float = 10.0,
              sig: signal.Signals = signal.SIGTERM) -> None:
    """End every process carrying ``tag``: ``sig`` first, SIGKILL after ``grace`` seconds.

    Flower's processes start their own sessions, so process groups do not reach them all;
    the tag does, also after a parent died and its children were re-parented. Where there is
    no ``/proc`` (macOS), the process groups of ``leaders`` (the processes we started, each a
    session leader) are signalled instead; Flower's child processes follow their parents.
    """
    _signal_all(_targets(tag, leaders), sig)
    deadline = time.monotonic() + grace
    while (remaining := _targets(tag, leaders)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(remaining, signal.SIGKILL)
    while _targets(tag, leaders) and time.monotonic() < deadline + 5:
        time.sleep(0.1)


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen | None = None
                  ) -> None:
    """Block until ``host:port`` accepts TCP connections (fail early if ``process`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.args[0]} exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


# ------------------------------------------------------------------------- deployment
@dataclass
class Deployment:
    """A SuperLink and its SuperNodes as processes on this machine, rooted in ``directory``.

    ``directory`` holds ``logs/<process>.log``, each process's ``FLWR_HOME`` under ``home/``,
    the SuperLink's state database, the Flower CLI configuration (``flwr/config.toml``, with
    the connection :data:`CONNECTION`) and the process table :data:`STATE_FILE`.
    """

    directory: Path
    num_clients: int
    endpoints: Endpoints = field(default_factory=Endpoints)
    security: Security = field(default_factory=Security)
    tag: str = field(default_factory=lambda: f"pflower-{uuid.uuid4().hex[:12]}")
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    _popens: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()

    # ---------------------------------------------------------------------- paths
    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def cli_home(self) -> Path:
        """``FLWR_HOME`` for ``flwr`` commands against this deployment."""
        return self.directory / "flwr"

    def _home(self, name: str) -> Path:
        return self.directory / "home" / name

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, command: list[str], wrapper: Sequence[str] = ()) -> None:
        process, popen = launch(
            name, command, self.logs / f"{name}.log", f"{self.tag}/{name}", self._home(name),
            wrapper,
        )
        self.processes[name] = process
        self._popens[name] = popen

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start the SuperLink and wait until its Fleet and Control APIs accept connections."""
        database = str(self.directory / "superlink" / "state.db")
        (self.directory / "superlink").mkdir(parents=True, exist_ok=True)
        self._start(
            "superlink",
            [executable("flower-superlink"),
             *superlink_args(self.endpoints, self.security, database)],
        )
        self.write_cli_config()
        popen = self._popens["superlink"]
        wait_for_port(self.endpoints.host, self.endpoints.control_port, timeout, popen)
        wait_for_port(self.endpoints.fleet_dial_host, self.endpoints.fleet_port, timeout, popen)

    def start_supernode(
        self, index: int, wrapper: Sequence[str] = (), superlink_host: str | None = None,
        runtime_port: int | None = None,
    ) -> None:
        """Start SuperNode ``index`` (name ``supernode-<index>``).

        ``wrapper`` and ``superlink_host`` place it elsewhere, e.g. in a network namespace that
        reaches the SuperLink at another address; ``runtime_port`` defaults to
        ``node_port + index``.
        """
        port = self.endpoints.node_port + index if runtime_port is None else runtime_port
        superlink = f"{superlink_host or self.endpoints.host}:{self.endpoints.fleet_port}"
        args = supernode_args(index, self.num_clients, superlink, ("127.0.0.1", port),
                              self.security)
        self._start(f"supernode-{index}", [executable("flower-supernode"), *args], wrapper)

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM, grace: float = 10.0) -> None:
        """End process ``name`` and everything it started."""
        terminate(f"{self.tag}/{name}", [self.processes[name].pid], grace, sig)
        popen = self._popens.pop(name, None)
        if popen is not None:
            popen.wait(timeout=grace + 5)

    def stop_all(self, grace: float = 10.0) -> None:
        """End the SuperNodes, then the SuperLink, then anything else carrying the tag."""
        for name in sorted(self.processes, key=lambda n: n == "superlink"):
            self.stop(name, grace=grace)
        terminate(self.tag, [p.pid for p in self.processes.values()], grace)

    def alive(self, name: str) -> bool:
        """Whether process ``name`` still runs."""
        popen = self._popens.get(name)
        if popen is not None:
            return popen.poll() is None
        process = self.processes[name]
        return bool(_targets(process.tag, [process.pid]))

    # ----------------------------------------------------------------- flwr CLI
    def write_cli_config(self) -> Path:
        """Write the Flower CLI configuration holding the connection :data:`CONNECTION`."""
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

    def flwr(self, *args: str, timeout: float = 120.0, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        """Run ``flwr <args>`` against this deployment (its own ``FLWR_HOME``)."""
        env = dict(os.environ, FLWR_HOME=str(self.cli_home))
        return subprocess.run(
            [executable("flwr"), *args], env=env, capture_output=True, text=True,
            timeout=timeout, check=check,
        )

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

    def wait_for_nodes(self, count: int, timeout: float = 60.0) -> None:
        """Block until ``count`` SuperNodes are online."""
        deadline = time.monotonic() + timeout
        while self.online_nodes() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} SuperNodes online after {timeout:.0f}s")
            time.sleep(2.0)

    def submit(self, overrides: Sequence[str]) -> str:
        """Start a run of the pflower app with Hydra ``overrides`` (``flwr run``); its run id.

        The overrides travel in a TOML file: ``--run-config`` key=value pairs cannot carry a
        double quote.
        """
        from pflower.config import RUN_CONFIG_KEY, app_dir, overrides_to_string

        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
            file.write(tomli_w.dumps({RUN_CONFIG_KEY: overrides_to_string(overrides)}))
        try:
            result = self.flwr("run", str(app_dir()), CONNECTION, "--run-config", file.name,
                               "--format", "json")
        finally:
            os.unlink(file.name)
        return str(json.loads(result.stdout)["run-id"])

    def run_status(self, run_id: str) -> str:
        """Status of run ``run_id`` as ``flwr list`` reports it (e.g. ``finished:completed``)."""
        result = self.flwr("list", CONNECTION, "--run-id", run_id, "--format", "json")
        return str(json.loads(result.stdout)["runs"][0]["status"])

    def wait_for_run(self, run_id: str, timeout: float | None, to_terminal: bool = False
                     ) -> str:
        """Block until run ``run_id`` finished; returns its final status.

        Follows the run's log with ``flwr log --stream``, which returns when the run ends (one
        process for the whole wait, not repeated polls), into ``logs/run-<id>.log`` or, with
        ``to_terminal``, to this process's output.
        """
        env = dict(os.environ, FLWR_HOME=str(self.cli_home))
        command = [executable("flwr"), "log", run_id, CONNECTION, "--stream"]
        with contextlib.ExitStack() as stack:
            out = None if to_terminal else stack.enter_context(
                (self.logs / f"run-{run_id}.log").open("a"))
            try:
                subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout, check=False)
            except subprocess.TimeoutExpired as error:
                raise TimeoutError(f"run {run_id} did not finish in {timeout:.0f}s") from error
        for _ in range(30):  # the status may trail the end of the log by a moment
            if (status := self.run_status(run_id)).startswith("finished"):
                return status
            time.sleep(1.0)
        return status

    # ------------------------------------------------------------------ state file
    def save(self) -> None:
        """Write the process table so that a later ``status``/``down`` finds the processes."""
        state = {
            "tag": self.tag,
            "num_clients": self.num_clients,
            "endpoints": asdict(self.endpoints),
            "security": {k: None if v is None else str(v)
                         for k, v in asdict(self.security).items()},
            "processes": [asdict(p) for p in self.processes.values()],
        }
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, directory: Path) -> Deployment:
        """The deployment whose process table ``directory`` holds."""
        state = json.loads((directory / STATE_FILE).read_text())
        security = Security(**{k: None if v is None else Path(v)
                               for k, v in state["security"].items()})
        processes = {p["name"]: ManagedProcess(**p) for p in state["processes"]}
        return cls(directory, state["num_clients"], Endpoints(**state["endpoints"]), security,
                   state["tag"], processes)


# ---------------------------------------------------------------------- docker compose
IMAGE = "pflower"
NODE_DATA = "/data"
CERTS = Path("/certs")
KEYS = Path("/keys")
COMPOSE_HEADER = (
    "# Generated by `pflower deploy compose --num-clients {n}` (pflower/deploy.py): regenerate\n"
    "# rather than edit. Usage: docker/README.md.\n"
)


def _image(variant: str) -> dict[str, Any]:
    """The image of a service; every service builds it, so ``docker compose up --build`` works
    whatever the order (identical builds are cached)."""
    return {
        "image": f"{IMAGE}:{variant}",
        "build": {"context": "..", "dockerfile": "docker/Dockerfile",
                  "args": {"VARIANT": variant}},
    }


def _service(entrypoint: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {**_image("cpu"), "entrypoint": [entrypoint], "command": command, **extra}


def _node_port(index: int) -> int:
    return Endpoints().node_port + index


def _compose_security(tls: bool) -> Security:
    return Security(CERTS, KEYS) if tls else Security()


def _compose_superlink(tls: bool) -> list[str]:
    endpoints = Endpoints(host="0.0.0.0")
    return superlink_args(endpoints, _compose_security(tls), "/state/state.db", "process")


def _compose_supernode(index: int, num_clients: int, tls: bool) -> list[str]:
    return supernode_args(index, num_clients, f"superlink:{Endpoints().fleet_port}",
                          ("0.0.0.0", _node_port(index)), _compose_security(tls), "process")


def compose_base(num_clients: int) -> dict[str, Any]:
    """``compose.yml``: SuperLink, ServerApp executor, and per node a SuperNode and its
    ClientApp executor, without TLS."""
    control = Endpoints().control_port
    services: dict[str, Any] = {
        "superlink": _service(
            "flower-superlink", _compose_superlink(tls=False),
            ports=[f"{control}:{control}", f"{Endpoints().fleet_port}:{Endpoints().fleet_port}"],
            volumes=["superlink-state:/state"],
        ),
        "serverapp": _service(
            "flower-superexec", superexec_args(f"superlink:{control}", None),
            environment={"PFLOWER_DATA": NODE_DATA},
            volumes=[f"server-data:{NODE_DATA}", "results:/results"],
            depends_on=["superlink"], restart="on-failure",
        ),
    }
    volumes: dict[str, Any] = {"superlink-state": {}, "server-data": {}, "results": {}}
    for index in range(num_clients):
        data = f"node-{index}-data:{NODE_DATA}"
        services[f"supernode-{index}"] = _service(
            "flower-supernode", _compose_supernode(index, num_clients, tls=False),
            environment={"PFLOWER_DATA": NODE_DATA}, volumes=[data],
            depends_on=["superlink"], restart="on-failure",
        )
        services[f"clientapp-{index}"] = _service(
            "flower-superexec",
            superexec_args(f"supernode-{index}:{_node_port(index)}", None),
            environment={"PFLOWER_DATA": NODE_DATA}, volumes=[data],
            depends_on=[f"supernode-{index}"], restart="on-failure",
        )
        volumes[f"node-{index}-data"] = {}
    return {"name": "pflower", "services": services, "volumes": volumes}


def compose_tls(num_clients: int) -> dict[str, Any]:
    """``with-tls.yml``: TLS on the SuperLink's APIs and SuperNode authentication.

    Certificates and keys come from ``docker/certs`` (``docker/certs.sh``).
    """
    ca = f"./certs/ca.crt:{CERTS}/ca.crt:ro"
    services: dict[str, Any] = {
        "superlink": {
            "command": _compose_superlink(tls=True),
            "volumes": [ca, f"./certs/server.pem:{CERTS}/server.pem:ro",
                        f"./certs/server.key:{CERTS}/server.key:ro"],
        },
        "serverapp": {
            "command": superexec_args(f"superlink:{Endpoints().control_port}",
                                      f"{CERTS}/ca.crt"),
            "volumes": [ca],
        },
    }
    for index in range(num_clients):
        key = f"supernode-{index}"
        services[key] = {
            "command": _compose_supernode(index, num_clients, tls=True),
            "volumes": [ca, f"./certs/{key}:{KEYS}/{key}:ro"],
        }
    return {"services": services}


def compose_gpu(num_clients: int) -> dict[str, Any]:
    """``with-gpu.yml``: the CUDA image and a GPU reservation for every ClientApp executor."""
    def reservation() -> dict[str, Any]:
        device = {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
        return {"resources": {"reservations": {"devices": [device]}}}

    return {"services": {f"clientapp-{i}": {**_image("cuda"), "deploy": reservation()}
                         for i in range(num_clients)}}


COMPOSE_FILES = {"compose.yml": compose_base, "with-tls.yml": compose_tls,
                 "with-gpu.yml": compose_gpu}


def render_compose(num_clients: int) -> dict[str, str]:
    """The text of every compose file for ``num_clients`` nodes, by file name."""
    header = COMPOSE_HEADER.format(n=num_clients)
    return {
        name: header + yaml.safe_dump(build(num_clients), sort_keys=False, width=100)
        for name, build in COMPOSE_FILES.items()
    }


# --------------------------------------------------------------------------- command line
def _security_from(args: argparse.Namespace) -> Security:
    certificates = Path(args.certificates).resolve() if args.certificates else None
    node_keys = Path(args.node_keys).resolve() if args.node_keys else None
    return Security(certificates, node_keys)


def _up(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if (directory / STATE_FILE).exists() and _any_alive(Deployment.load(directory)):
        print(f"a deployment is already running in {directory}; `pflower deploy down` first")
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    endpoints = Endpoints(args.host, args.fleet_port, args.control_port, args.node_port)
    deployment = Deployment(directory, args.num_clients, endpoints, _security_from(args))
    try:
        deployment.start_superlink(args.timeout)
        if deployment.security.node_keys is not None:
            deployment.register_nodes()
        for index in range(args.num_clients):
            deployment.start_supernode(index)
        deployment.save()
        deployment.wait_for_nodes(args.num_clients, args.timeout)
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as error:
        deployment.stop_all()
        print(f"deployment failed: {error}\nlogs: {deployment.logs}")
        return 1
    except BaseException:  # Ctrl-C or a bug: leave nothing running
        deployment.stop_all()
        raise
    _print_status(deployment)
    print(f"\nsubmit a run:  pflower deploy run --dir {args.dir} <hydra overrides>"
          f"\nor with flwr:   FLWR_HOME={deployment.cli_home} flwr run . {CONNECTION} "
          f"--run-config 'overrides=\"num_clients={args.num_clients} ...\"' --stream")
    return 0


def _any_alive(deployment: Deployment) -> bool:
    return any(deployment.alive(name) for name in deployment.processes)


def _print_status(deployment: Deployment) -> bool:
    all_alive = True
    print(f"deployment {deployment.tag} in {deployment.directory}")
    print(f"  Control API {deployment.endpoints.control_address}, "
          f"Fleet API {deployment.endpoints.fleet_address}, "
          f"TLS {'on' if deployment.security.ca else 'off'}, "
          f"SuperNode auth {'on' if deployment.security.node_keys else 'off'}")
    for name, process in deployment.processes.items():
        alive = deployment.alive(name)
        all_alive &= alive
        print(f"  {name:14s} pid {process.pid:<8d} {'running' if alive else 'STOPPED':8s} "
              f"log {process.log}")
    return all_alive


def _status(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}")
        return 1
    deployment = Deployment.load(directory)
    return 0 if _print_status(deployment) else 1


def _down(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}")
        return 0
    deployment = Deployment.load(directory)
    deployment.stop_all()
    (directory / STATE_FILE).unlink()
    print(f"stopped deployment {deployment.tag}; logs kept in {deployment.logs}")
    return 0


def _run(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}; `pflower deploy up` first")
        return 1
    deployment = Deployment.load(directory)
    overrides = list(args.overrides)
    if not any(o.startswith("num_clients=") for o in overrides):
        overrides.insert(0, f"num_clients={deployment.num_clients}")
    if not any(o.startswith("output_dir=") for o in overrides):
        stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
        overrides.append(f"output_dir={Path('runs').resolve() / stamp}")
    run_id = deployment.submit(overrides)
    print(f"run {run_id} started; following its log (Ctrl-C stops following, not the run)")
    try:
        status = deployment.wait_for_run(run_id, timeout=None, to_terminal=True)
    except KeyboardInterrupt:
        print(f"\nstopped following run {run_id}; it goes on. Stop it with: "
              f"FLWR_HOME={deployment.cli_home} flwr stop {run_id} {CONNECTION}")
        return 130
    print(f"run {run_id}: {status}")
    return 0 if status == "finished:completed" else 1


def _compose(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_compose(args.num_clients).items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pflower deploy",
        description="A SuperLink and N SuperNodes as local processes (up/status/run/down), "
                    "or the docker-compose files for N nodes (compose).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def with_dir(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
        command.add_argument("--dir", default=str(DEFAULT_DIR),
                             help="deployment directory: logs, state, process table "
                                  f"(default: {DEFAULT_DIR})")
        return command

    up = with_dir(commands.add_parser("up", help="start the SuperLink and the SuperNodes"))
    up.add_argument("-n", "--num-clients", type=int, default=3)
    up.add_argument("--host", default="127.0.0.1",
                    help="address the SuperLink listens on and the SuperNodes dial")
    up.add_argument("--fleet-port", type=int, default=Endpoints.fleet_port)
    up.add_argument("--control-port", type=int, default=Endpoints.control_port)
    up.add_argument("--node-port", type=int, default=Endpoints.node_port,
                    help="runtime API port of SuperNode 0 (node i: +i)")
    up.add_argument("--certificates", help="TLS: directory with ca.crt, server.pem, server.key "
                                           "(docker/certs.sh)")
    up.add_argument("--node-keys", help="SuperNode authentication: directory with "
                                        "supernode-<i>[.pub] keys (needs --certificates)")
    up.add_argument("--timeout", type=float, default=60.0)
    up.set_defaults(handler=_up)
    with_dir(commands.add_parser("status", help="show the processes")).set_defaults(
        handler=_status)
    with_dir(commands.add_parser("down", help="stop every process")).set_defaults(handler=_down)
    run = with_dir(commands.add_parser("run", help="run an experiment on the deployment"))
    run.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml")
    run.set_defaults(handler=_run)
    compose = commands.add_parser("compose", help="write the docker-compose files")
    compose.add_argument("-n", "--num-clients", type=int, default=3)
    compose.add_argument("--out", default="docker", help="directory (default: docker)")
    compose.set_defaults(handler=_compose)
    return parser


def main(argv: list[str]) -> int:
    """``pflower deploy up|status|run|down|compose``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ValueError as error:
        print(f"error: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
