"""The docker/ deployment built and run for real, with podman and podman-compose.

There is no Docker engine on the CI machines, but Debian's ``podman`` (with ``runc``) builds
``docker/Dockerfile`` and ``podman-compose`` (PyPI) runs ``docker/compose.yml`` as committed.
``docker/podman/setup.sh`` configures podman, makes the ``python:3.11-slim`` base image from a
Debian bookworm root file system when no registry can be reached, and builds the pflower image
(skipped when the image's input hash label matches). This test then:

- starts the compose stack with the TLS overlay (``docker/certs.sh``: TLS on every SuperLink API,
  SuperNode authentication) and ``with-host-network.yml`` (all services on 127.0.0.1: no bridge
  networks), the SuperLink first, registers the SuperNodes' keys with ``flwr``, then the rest;
- runs 2 rounds of FLIU with ``flwr run`` (the pflower app from this checkout);
- reads ``summary.json`` and ``metrics.jsonl`` from inside the ServerApp container;
- checks that each SuperNode kept its client's state: every L1/L2/G row equals an in-process run
  of the same experiment in which state persists, and differs from one in which every client
  forgets its state between messages (so the comparison can tell);
- tears the stack and its volumes down whatever happened.

It skips, saying why, where podman, podman-compose, openssl or ssh-keygen are missing or
``podman info`` fails. From scratch the build takes about 12 minutes on 2 cores (the base image,
PyPI's torch with its CUDA libraries, pflower's dependencies); with the image cached the test
takes 2-3 minutes, plus about 15 s whenever pflower's files changed (the last layer; its
dependencies are a layer of their own, rebuilt only when ``pyproject.toml`` changes).
A static test checks the host-network overlay and the telemetry setting of every service.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.config import RunRecord
from pflower.deploy.compose import render_compose
from pflower.deploy.control import CONNECTION
from pflower.deploy.local import Deployment
from pflower.deploy.topology import Endpoints, Security
from tests.deploy_helpers import REPO, iid_digits, rows_by_client, wait_until
from tests.inprocess import forgetful_client_fn, run_inprocess

DOCKER = REPO / "docker"
SETUP = DOCKER / "podman" / "setup.sh"
COMPOSE = ("compose.yml", "with-tls.yml", "with-host-network.yml")
PROJECT = "pflower"
"""The compose project (``name:`` in compose.yml): containers, volumes and labels carry it."""
NUM_CLIENTS = 3
EXPERIMENT = [*iid_digits("fliu"), f"num_clients={NUM_CLIENTS}", "rounds=2", "eval.every=1"]
RESULTS = "/results/containers-fliu"
"""The run directory inside the ServerApp container (``/results`` is a volume)."""
BUILD_TIMEOUT = 2400.0
RUN_TIMEOUT = 600.0
ACC_TOLERANCE = 0.01
"""One of a client's 120 test samples is 0.0083: at most one sample classified differently."""
LOSS_RTOL = 1e-3


# ------------------------------------------------------------------------------ podman
def _compose_command() -> list[str] | None:
    """How to call podman-compose: the executable on PATH, else this Python's module."""
    if executable := shutil.which("podman-compose"):
        return [executable]
    if find_spec("podman_compose") is not None:
        return [sys.executable, "-m", "podman_compose"]
    return None


@cache
def podman_unavailable() -> str | None:
    """Why the containers cannot run here, or None (also writes podman's configuration)."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    if _compose_command() is None:
        return "podman-compose is not installed (pip install podman-compose)"
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"docker/certs.sh needs {tool}"
    result = subprocess.run(
        [str(SETUP), "config"], capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        return f"podman cannot run here: {(result.stderr or result.stdout).strip()[-500:]}"
    return None


@cache
def podman_env() -> dict[str, str]:
    """This process's environment plus what ``setup.sh env`` exports (CONTAINERS_CONF)."""
    exports = subprocess.run(
        [str(SETUP), "env"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    env = dict(os.environ)
    for line in exports.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


def podman(*args: str, check: bool = True, timeout: float = 120.0) -> str:
    """``podman <args>``'s output."""
    result = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


@dataclass
class Stack:
    """The compose stack of the test: its files (with ``certs/``) and the Flower CLI."""

    directory: Path
    cli: Deployment

    def compose(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        command = [*(_compose_command() or []), *(a for f in COMPOSE for a in ("-f", f)), *args]
        return subprocess.run(
            command,
            cwd=self.directory,
            env=podman_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def container(self, service: str) -> str:
        """The id of ``service``'s container."""
        ids = podman(
            "ps", "-q",
            "--filter", f"label=io.podman.compose.project={PROJECT}",
            "--filter", f"label=com.docker.compose.service={service}",
        ).split()  # fmt: skip
        assert len(ids) == 1, f"expected one running {service} container, found {ids}"
        return ids[0]

    def read(self, service: str, path: str) -> str:
        """The text of ``path`` inside ``service``'s container."""
        return podman("exec", self.container(service), "cat", path)

    def diagnostics(self, tail: int = 30) -> str:
        """The last log lines of every container of the project."""
        parts = []
        for line in podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}",
            "--format", "{{.ID}} {{.Names}} {{.Status}}", check=False,
        ).splitlines():  # fmt: skip
            cid, name, *status = line.split()
            logs = subprocess.run(
                ["podman", "logs", "--tail", str(tail), cid],
                env=podman_env(),
                capture_output=True,
                text=True,
                check=False,
            )
            parts.append(f"--- {name} ({' '.join(status)})\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)

    def down(self) -> None:
        """Remove the project's containers and volumes, whatever state they are in."""
        self.compose("down", "-v", "-t", "5")
        label = f"label=io.podman.compose.project={PROJECT}"
        if ids := podman("ps", "-aq", "--filter", label, check=False).split():
            podman("rm", "-f", "-t", "0", *ids, check=False)
        if volumes := podman("volume", "ls", "-q", "--filter", label, check=False).split():
            podman("volume", "rm", "-f", *volumes, check=False)


def _ports_in_use() -> list[int]:
    """The host ports of the stack (host networking) that something already listens on."""
    endpoints = Endpoints()
    ports = [endpoints.control_port, endpoints.fleet_port]
    ports += [endpoints.node_port + i for i in range(NUM_CLIENTS)]
    busy = []
    for port in ports:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The built image and the running TLS stack with 3 authenticated SuperNodes."""
    if reason := podman_unavailable():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("containers")
    build_log = root / "setup.log"
    with build_log.open("w") as log:
        built = subprocess.run(
            [str(SETUP), "all"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=podman_env(),
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    assert built.returncode == 0, f"docker/podman/setup.sh failed:\n{build_log.read_text()[-4000:]}"

    directory = root / "compose"
    directory.mkdir()
    for name in COMPOSE:  # the committed files, next to certificates of this test's own
        shutil.copy(DOCKER / name, directory / name)
    subprocess.run(
        [str(DOCKER / "certs.sh"), "-o", str(directory / "certs"), "-n", str(NUM_CLIENTS)],
        check=True,
        capture_output=True,
    )
    certs = directory / "certs"
    cli = Deployment(root / "flwr-cli", NUM_CLIENTS, Endpoints(), Security(certs, certs))
    cli.logs.mkdir(parents=True)
    cli.control.write_config()
    stack = Stack(directory, cli)
    stack.down()  # a stack left behind by an interrupted run
    busy = _ports_in_use()
    assert not busy, f"ports {busy} are in use; the stack runs in the host's network"
    try:
        started = stack.compose("up", "-d", "--no-build", "superlink")
        assert started.returncode == 0, started.stderr[-3000:]
        wait_until(
            lambda: cli.control.flwr("supernode", "list", CONNECTION, check=False).returncode == 0,
            120,
            "the SuperLink's Control API",
        )
        cli.control.register_nodes()
        started = stack.compose("up", "-d", "--no-build")
        assert started.returncode == 0, started.stderr[-3000:]
        try:
            cli.control.wait_for_nodes(NUM_CLIENTS, timeout=180)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{stack.diagnostics()}") from error
        yield stack
    finally:
        stack.down()


# --------------------------------------------------------------------------- references
def _compared(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k.startswith(("acc", "loss", "train_loss"))}


def _differences(got: list[dict], expected: list[dict]) -> list[str]:
    """Every L1/L2/G value of ``expected`` that ``got`` misses or misses by more than the
    tolerances."""
    keyed = {(r["round"], r["stage"], r.get("client")): r for r in got}
    problems = []
    for row in expected:
        if row["stage"] not in ("L1", "L2", "G"):
            continue
        key = (row["round"], row["stage"], row.get("client"))
        if key not in keyed:
            problems.append(f"{key}: missing")
            continue
        values = _compared(keyed[key])
        for name, value in _compared(row).items():
            tolerance = ACC_TOLERANCE if name.startswith("acc") else LOSS_RTOL * abs(value)
            if name not in values or abs(values[name] - value) > tolerance:
                problems.append(f"{key} {name}: {values.get(name)} vs {value}")
    return problems


# -------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("num_clients", [3, 5])
def test_host_network_overlay_covers_every_service(num_clients: int) -> None:
    """Every service joins the host's network and resolves every name that a service dials;
    no service sends telemetry."""
    files = {name: yaml.safe_load(text) for name, text in render_compose(num_clients).items()}
    base, overlay = files["compose.yml"]["services"], files["with-host-network.yml"]["services"]
    assert set(overlay) == set(base)
    dialed = {"superlink", *(f"supernode-{i}" for i in range(num_clients))}
    for name, service in overlay.items():
        assert service["network_mode"] == "host"
        assert dict(h.split(":") for h in service["extra_hosts"]) == dict.fromkeys(
            dialed, "127.0.0.1"
        )
        assert base[name]["environment"]["FLWR_TELEMETRY_ENABLED"] == "0", name


@pytest.mark.containers
@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 2 * RUN_TIMEOUT)
def test_compose_stack_runs_a_stateful_algorithm(stack: Stack, tmp_path: Path) -> None:
    cli = stack.cli
    run_id = cli.control.submit(RunRecord((*EXPERIMENT,), Path(RESULTS)))
    status = cli.control.wait_for_run(run_id, RUN_TIMEOUT)
    run_log = (cli.logs / f"run-{run_id}.log").read_text(errors="replace")
    assert status == "finished:completed", f"{status}\n{run_log[-3000:]}\n{stack.diagnostics()}"

    summary = json.loads(stack.read("serverapp", f"{RESULTS}/summary.json"))
    assert summary["status"] == "completed", summary.get("error")
    assert summary["rounds"] == 2 and summary["final_round"] == 2
    assert summary["failures"] in ([], {}, 0, None), (
        f"{json.dumps(summary['failures'], indent=1)}\n{run_log[-3000:]}\n{stack.diagnostics()}"
    )
    rows = [
        json.loads(line)
        for line in stack.read("serverapp", f"{RESULTS}/metrics.jsonl").splitlines()
        if line.strip()
    ]
    for stage in ("L1", "L2"):
        assert set(rows_by_client(rows, stage)) == {
            (r, c) for r in (1, 2) for c in range(NUM_CLIENTS)
        }, f"not every client reported {stage} in every round"

    # Each SuperNode kept its client's state. FLIU's client stores its trained model θ_k in
    # context.state; every message (fit, evaluate) runs in a fresh ClientApp process in the
    # clientapp-i container, so θ_k reaches the next message only through SuperNode i. L1 of
    # round 1 evaluates γθ_k + (1-γ)Θ (θ_k from the fit message), and round 2 trains from it.
    stateful, _ = run_inprocess(EXPERIMENT, tmp_path / "stateful")
    forgetful, _ = run_inprocess(EXPERIMENT, tmp_path / "forgetful", forgetful_client_fn)
    assert not _differences(rows, stateful), (
        "the deployment's results differ from a run in which state persists:\n"
        + "\n".join(_differences(rows, stateful))
    )
    lost = _differences(rows, forgetful)
    for key in [(r, s, c) for r, s in ((1, "L1"), (2, "L2")) for c in range(NUM_CLIENTS)]:
        assert any(p.startswith(f"{key} ") for p in lost), (
            f"{key} is the same with and without client state: the comparison cannot tell"
        )
