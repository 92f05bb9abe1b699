"""The deployment's topology: addresses, security material and the Flower command lines.

The argument builders are the single description of the SuperLink, SuperNode and SuperExec
processes; both the local processes ([`pflower.deploy.local`][pflower.deploy.local]) and the
docker-compose files
([`pflower.deploy.compose`][pflower.deploy.compose]) are built from them, so that the two targets
cannot drift apart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


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
        """``host:port`` of the Fleet API."""
        return f"{self.host}:{self.fleet_port}"

    @property
    def fleet_dial_host(self) -> str:
        """Where this machine reaches the Fleet API."""
        return self.host if self.fleet_bind in (None, "0.0.0.0") else self.fleet_bind

    @property
    def control_address(self) -> str:
        """``host:port`` of the Control API (what ``flwr`` dials)."""
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
        """The CA certificate that clients verify the SuperLink with (None without TLS)."""
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
    # fmt: off
    args = [
        "--isolation", isolation,
        "--database", database,
        "--fleet-api-address", f"{fleet_host}:{endpoints.fleet_port}",
        "--host", endpoints.host,
        "--port", str(endpoints.control_port),
        "--disable-runtime-dependency-installation",
    ]
    # fmt: on
    if security.certificates is None:
        return ["--insecure", *args]
    certs = security.certificates
    # fmt: off
    args += [
        "--ssl-ca-certfile", str(certs / "ca.crt"),
        "--ssl-certfile", str(certs / "server.pem"),
        "--ssl-keyfile", str(certs / "server.key"),
    ]
    # fmt: on
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
    client_state_dir: str | None = None,
) -> list[str]:
    """Arguments of ``flower-supernode`` for node ``index`` of ``num_nodes``.

    ``runtime`` is the ``(host, port)`` where the node serves its ClientApp executor;
    ``client_state_dir`` (node config ``client-state-dir``) where its ClientApps keep the client's
    state snapshots, when not in the run's ``output_dir`` (see ``pflower resume``).
    """
    host, port = runtime
    node_config = f"partition-id={index} num-partitions={num_nodes}"
    if client_state_dir is not None:
        node_config += f' client-state-dir="{client_state_dir}"'
    # fmt: off
    args = [
        "--superlink", superlink,
        "--isolation", isolation,
        "--host", host,
        "--port", str(port),
        "--node-config", node_config,
    ]
    # fmt: on
    if security.ca is None:
        return ["--insecure", *args]
    args += ["--root-certificates", str(security.ca)]
    key = security.node_key(index)
    if key is not None:
        args += ["--auth-supernode-private-key", str(key)]
    return args


def launcher_command(
    component: str, args: list[str], python: str | None = None, fork_server: bool = True
) -> list[str]:
    """The command running ``flower-<component> args`` (``supernode``, ``superexec`` or
    ``superlink``) through pflower's launcher
    ([`pflower.deploy.launcher`][pflower.deploy.launcher]: short polling intervals and, where
    apps run and ``fork_server``, a fork server for the ClientApps, or a SuperLink's ServerApps)
    on ``python`` (default: this interpreter)."""
    options = [] if fork_server else ["--no-fork-server"]
    launcher = [python or sys.executable, "-m", "pflower.deploy.launcher", *options, component]
    return [*launcher, "--", *args]


def superexec_args(runtime_address: str, root_certificates: str | None) -> list[str]:
    """Arguments of ``flower-superexec``, the executor of ServerApp or ClientApp processes."""
    if root_certificates is None:
        return ["--insecure", "--runtime-api-address", runtime_address]
    return ["--root-certificates", root_certificates, "--runtime-api-address", runtime_address]
