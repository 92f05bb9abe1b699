"""Helpers for the deployment tests: network namespaces, waiting, result files, a simulation run.

Everything that starts a process here hands back something the caller stops in a ``finally``
(or a fixture's teardown), so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflower.config import RunRecord
from pflower.deploy.local import Deployment
from pflower.deploy.processes import launch, terminate
from pflower.deploy.topology import Endpoints, Security
from pflower.results.rows import read_rows

REPO = Path(__file__).resolve().parents[1]


def wait_until(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def rows_by_client(rows: Sequence[dict[str, Any]], stage: str) -> dict[tuple[int, int], dict]:
    """Rows of one stage (``L1``/``L2``) keyed by (round, client)."""
    return {(r["round"], r["client"]): r for r in rows if r["stage"] == stage}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports that are all free on ``host`` right now.

    ``pflower deploy up --node-port P`` serves SuperNode ``i``'s runtime API on ``P + i``, so a
    single free port is not enough: ``P + 1`` may be taken (seen once in a CI rehearsal).
    """
    for _ in range(attempts):
        base = free_port(host)
        if base + count > 65536:
            continue
        with ExitStack() as stack:
            try:
                for port in range(base + 1, base + count):
                    stack.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free TCP ports on {host} in {attempts} tries")


def deploy_up_arguments(
    directory: Path, nodes: int, fleet_port: int | None = None, control_port: int | None = None
) -> list[str]:
    """Arguments of ``pflower deploy up`` for ``nodes`` SuperNodes in ``directory``, on free
    loopback ports (or the Fleet and Control API ports given)."""
    return [
        *("up", "--dir", str(directory), "-n", str(nodes)),
        *("--fleet-port", str(fleet_port or free_port())),
        *("--control-port", str(control_port or free_port())),
        *("--node-port", str(free_port_block(nodes))),
    ]


def diagnostics(deployment: Deployment, tail: int = 40) -> str:
    """The last lines of every process log, for assertion messages."""
    parts = []
    for name, process in deployment.processes.items():
        log = Path(process.log)
        text = log.read_text(errors="replace") if log.exists() else ""
        lines = [line for line in text.splitlines() if "uvicorn" not in line and line.strip()]
        parts.append(f"--- {name}\n" + "\n".join(lines[-tail:]))
    return "\n".join(parts)


@dataclass
class Background:
    """A process started in the background with a deployment tag (see :func:`launch`)."""

    popen: subprocess.Popen[bytes]
    tag: str

    def stop(self, grace: float = 10.0) -> None:
        """End the process and everything it started (Ray starts its own sessions)."""
        terminate(self.tag, [self.popen.pid], grace)
        self.popen.wait(timeout=grace + 5)


def simulation(overrides: Sequence[str], run_dir: Path, log: Path) -> Background:
    """Start ``pflower <overrides>`` (a Ray simulation) writing into ``run_dir``.

    Hydra's own output (``.hydra/``) goes next to ``run_dir`` rather than into ``./runs``.
    """
    command = [
        str(Path(sys.executable).parent / "pflower"),
        *overrides,
        f"output_dir={run_dir}",
        f"hydra.run.dir={run_dir.parent / 'hydra'}",
        "progress=false",
    ]
    tag = f"pflower-sim-{uuid.uuid4().hex[:8]}"
    _, popen = launch("simulation", command, log, tag, run_dir.parent / "flwr")
    return Background(popen, tag)


# ------------------------------------------------------------------ network namespaces
def netns_unavailable() -> str | None:
    """Why SuperNodes cannot run in network namespaces here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is missing"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


@dataclass
class Namespaces:
    """One network namespace per SuperNode, joined to this host by a veth pair.

    Node ``i`` sees the host (where the SuperLink listens) at ``host_ip(i)`` over its own /30
    link; names and subnets derive from this process id, so parallel sessions do not collide.
    """

    count: int
    prefix: str = field(default_factory=lambda: f"pf{os.getpid() % 100000}")
    created: list[str] = field(default_factory=list)

    def name(self, index: int) -> str:
        return f"{self.prefix}n{index}"

    def _address(self, index: int, host: int) -> str:
        """Address ``host`` (1 or 2) of node ``index``'s /30 link, inside 10.200.0.0/16."""
        offset = ((os.getpid() % 4096) * 4 + index) * 4 + host
        return f"10.200.{offset // 256}.{offset % 256}"

    def host_ip(self, index: int) -> str:
        return self._address(index, 1)

    def node_ip(self, index: int) -> str:
        return self._address(index, 2)

    def wrapper(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.name(index)]

    def create(self) -> None:
        for index in range(self.count):
            ns = self.name(index)
            host_end, node_end = f"{self.prefix}h{index}", f"{self.prefix}c{index}"
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _ip("link", "set", node_end, "netns", ns)
            _ip("addr", "add", f"{self.host_ip(index)}/30", "dev", host_end)
            _ip("link", "set", host_end, "up")
            _ip("-n", ns, "addr", "add", f"{self.node_ip(index)}/30", "dev", node_end)
            _ip("-n", ns, "link", "set", node_end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Delete the namespaces (their veth ends, and so the pairs, go with them)."""
        for ns in self.created:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        for index in range(self.count):
            subprocess.run(["ip", "link", "delete", f"{self.prefix}h{index}"], capture_output=True)
        self.created.clear()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


# ------------------------------------------------------------------------------ federation
@dataclass
class Federation:
    """A :class:`Deployment` plus where its SuperNodes run: loopback ports, or namespaces."""

    deployment: Deployment
    spaces: Namespaces | None = None
    ports: dict[int, int] = field(default_factory=dict)

    def start_node(self, index: int) -> None:
        """Start (or restart) SuperNode ``index`` where it belongs, on the same port as before.

        In a namespace every node serves its runtime API on the same port: they are separate
        hosts. On loopback each gets a free port of its own.
        """
        if self.spaces is None:
            port = self.ports.setdefault(index, free_port())
            self.deployment.start_supernode(index, runtime_port=port)
        else:
            self.deployment.start_supernode(
                index,
                wrapper=self.spaces.wrapper(index),
                superlink_host=self.spaces.host_ip(index),
                runtime_port=self.deployment.endpoints.node_port,
            )


@contextmanager
def federation(
    directory: Path,
    num_nodes: int,
    in_namespaces: bool = False,
    security: Security | None = None,
    nodes: Sequence[int] | None = None,
) -> Iterator[Federation]:
    """A SuperLink on free loopback ports and SuperNodes ``nodes`` (default: all), online.

    With ``in_namespaces`` every SuperNode runs in a network namespace of its own and reaches
    the SuperLink's Fleet API over a veth pair. Every process is stopped when the block ends.
    """
    spaces = Namespaces(num_nodes) if in_namespaces else None
    endpoints = Endpoints(
        fleet_port=free_port(),
        control_port=free_port(),
        node_port=free_port(),
        fleet_bind="0.0.0.0" if in_namespaces else None,
    )
    deployment = Deployment(directory, num_nodes, endpoints, security or Security())
    fed = Federation(deployment, spaces)
    try:
        if spaces is not None:
            spaces.create()
        deployment.start_superlink()
        started = list(range(num_nodes) if nodes is None else nodes)
        for index in started:
            fed.start_node(index)
        deployment.control.wait_for_nodes(len(started), timeout=60)
        yield fed
    finally:
        deployment.stop_all()
        if spaces is not None:
            spaces.delete()


def iid_digits(strategy: str) -> list[str]:
    """``strategy`` on IID digits with the small CNN, one local epoch: what the deployments and
    the compose stack run and compare with a simulation."""
    return [
        "dataset=digits",
        "partition=iid",
        "model=small_cnn",
        f"strategy={strategy}",
        "train.local_epochs=1",
    ]


RUN_TIMEOUT = 300.0
"""Seconds a deployment test waits for one run to finish."""

ACC_TOLERANCE = 0.01
"""Largest allowed |deployment - simulation| of any accuracy: one of a client's 120 test samples
is 0.0083, so this admits no more than one differently classified sample per client."""

LOSS_RTOL = 1e-3


def deployed_rows(fed: Federation, overrides: Sequence[str], run_dir: Path) -> list[dict]:
    """The rows of ``overrides`` submitted to ``fed`` and run to completion into ``run_dir``."""
    run_id = fed.deployment.control.submit(RunRecord((*overrides,), run_dir))
    status = fed.deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
    assert status == "finished:completed", diagnostics(fed.deployment)
    return read_rows(run_dir)


def assert_same_results(
    deployed: list[dict],
    simulated: list[dict],
    stages: Sequence[str] = ("L1", "L2", "G"),
    fields: tuple[str, ...] = ("acc", "loss", "train_loss"),
) -> None:
    """Every row of ``stages`` in the simulation has a deployment twin whose ``fields`` (names
    starting so) are the same within the tolerances."""

    def compared_fields(row: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in row.items() if k.startswith(fields)}

    keyed = {(r["round"], r["stage"], r.get("client")): r for r in deployed}
    compared = [r for r in simulated if r["stage"] in stages]
    assert compared, "the simulation recorded no results"
    for expected in compared:
        key = (expected["round"], expected["stage"], expected.get("client"))
        assert key in keyed, f"the deployment has no row for round/stage/client {key}"
        got = compared_fields(keyed[key])
        for name, value in compared_fields(expected).items():
            tolerance = ACC_TOLERANCE if name.startswith("acc") else LOSS_RTOL * abs(value)
            assert abs(got[name] - value) <= tolerance, (
                f"{key} {name}: deployment {got[name]} vs simulation {value}"
            )
