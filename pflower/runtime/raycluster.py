"""Which Ray a Ray-backed simulation uses: a local instance of its own, or a cluster that was
asked for and answers within a deadline.

Left to itself, ``ray.init()`` (what Flower's Ray backend calls, with no address) attaches to the
cluster named in ``RAY_ADDRESS`` or, failing that, in Ray's record of the last cluster started with
``ray start`` (``ray_current_cluster`` in Ray's temp folder,
`RAY_ADDRESS_FILE`). A cluster that died without ``ray
stop`` leaves that record behind, and ``ray.init`` then retries its head for ever inside Ray's C++
client, on the simulation's main thread, where no Python signal handler runs: the run hung after
"configure_fit", a SIGTERM was never handled and only SIGKILL ended it.

So pflower decides before Ray starts (`ray_address`):

- ``backend=ray`` (``backend.address`` null) starts a local instance of its own
  (`LOCAL`, ``ray.init``'s documented ``address="local"``), whatever Ray's record says,
  unless ``RAY_ADDRESS`` asks for a cluster;
- ``backend=ray_cluster`` (``backend.address`` ``auto`` or ``host:port``) attaches to the
  configured address, else ``RAY_ADDRESS``, else the address in Ray's record (Ray's own order);

and a cluster's address must accept a connection within `CONNECT_TIMEOUT_S`, or the run
fails at once with one line naming the address and where it came from
(`RayClusterUnreachable`). ``flwr run .`` calls ``ray.init()`` itself, in Flower's
``flwr-simulation`` process: `local_ray_under_flwr_simulation` gives that process the same
rule through ``RAY_ADDRESS``, before Flower's Ray backend starts.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pflower.registry import ConfigError
from pflower.runtime.fence import RAY_ADDRESS_FILE

LOCAL = "local"
"""``ray.init``'s address that starts a new local instance, ignoring ``RAY_ADDRESS`` and the
cluster record."""

AUTO = "auto"
"""``backend.address``: the cluster this machine belongs to (``RAY_ADDRESS``, else Ray's record)."""

ADDRESS_VARIABLE = "RAY_ADDRESS"
"""Ray's environment variable naming the cluster to attach to."""

CONNECT_TIMEOUT_S = 20.0
"""The most seconds a cluster's head may take to accept a connection (Ray's own client retries
a dead head without end)."""

SIMULATION_PROCESS = "flwr-simulation"
"""The Flower process that runs ``flwr run .``'s simulation (and calls ``ray.init()``)."""


class RayClusterUnreachable(ConfigError):
    """The Ray cluster a run was to attach to is not there (exit code 2, one line)."""


@dataclass(frozen=True)
class ClusterAddress:
    """A Ray cluster's address and where it came from (for the error that names both)."""

    address: str
    source: str


def cluster_record() -> Path:
    """Ray's record of the last cluster started with ``ray start`` on this machine (in Ray's
    temp folder: ``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``, then ``ray/``)."""
    return Path(RAY_ADDRESS_FILE.current()(None))


def requested_cluster(configured: str | None) -> ClusterAddress | None:
    """The cluster a run asks for, None for a local instance of its own: ``configured``
    (``backend.address``) unless null or ``auto``, then ``RAY_ADDRESS``, then (only for
    ``auto``) Ray's cluster record.

    Raises:
        RayClusterUnreachable: ``auto`` with no cluster named anywhere.
    """
    if configured not in (None, AUTO):
        return ClusterAddress(str(configured), "backend.address")
    variable = os.environ.get(ADDRESS_VARIABLE, "").strip()
    if variable and variable != LOCAL:
        return ClusterAddress(variable, f"the environment variable {ADDRESS_VARIABLE}")
    if configured is None or variable == LOCAL:
        return None
    record = cluster_record()
    recorded = record.read_text().strip() if record.is_file() else ""
    if not recorded:
        raise RayClusterUnreachable(
            f"backend=ray_cluster (backend.address=auto) found no Ray cluster: neither "
            f"{ADDRESS_VARIABLE} nor Ray's record {record} names one; start one with "
            "`ray start --head`, set backend.address=<head>:6379, or use backend=ray"
        )
    return ClusterAddress(recorded, f"Ray's cluster record {record}")


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` (also after ``ray://``); None if it has no port."""
    _, _, location = address.rpartition("://")
    host, _, port = location.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_reachable(cluster: ClusterAddress, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Return once ``cluster``'s head accepts a TCP connection; after ``timeout`` seconds raise
    `RayClusterUnreachable` naming the address and its source."""
    endpoint = _host_and_port(cluster.address)
    if endpoint is None:
        raise RayClusterUnreachable(
            f"Ray cluster address {cluster.address!r} (from {cluster.source}) is not host:port"
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(endpoint, timeout=max(0.1, min(2.0, timeout))):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RayClusterUnreachable(
                    f"no Ray cluster answers at {cluster.address} (from {cluster.source}) "
                    f"within {timeout:g} s ({error.strerror or error}): start it, or "
                    f"{_local_instead(cluster)}"
                ) from error
            time.sleep(0.5)


def _local_instead(cluster: ClusterAddress) -> str:
    """How to run on a local Ray instead of the unreachable ``cluster``."""
    if cluster.source.startswith("the environment"):
        return f"unset {ADDRESS_VARIABLE} for a local Ray of the run's own"
    if cluster.source.startswith("Ray's"):
        return (
            "use backend=ray for a local Ray of the run's own (a cluster that died without "
            f"`ray stop` leaves its record behind: `ray stop` or delete {cluster_record()})"
        )
    return "use backend=ray for a local Ray of the run's own"


def ray_address(configured: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """The address to give ``ray.init``: `LOCAL`, or a requested cluster's (see
    `requested_cluster`) once it answers (`check_reachable`)."""
    cluster = requested_cluster(configured)
    if cluster is None:
        return LOCAL
    check_reachable(cluster, timeout)
    return cluster.address


def local_ray_under_flwr_simulation() -> None:
    """In Flower's ``flwr-simulation`` process (``flwr run .``), make the ``ray.init()`` of
    Flower's Ray backend follow `ray_address` through ``RAY_ADDRESS``: a local instance
    unless ``RAY_ADDRESS`` names a cluster, which must answer within `CONNECT_TIMEOUT_S`.
    Elsewhere it does nothing: pflower's own simulations pass the address themselves.

    Called when pflower's ClientApp is imported, which Flower's engine does before it starts the
    Ray backend."""
    if Path(sys.argv[0]).name != SIMULATION_PROCESS:
        return
    os.environ[ADDRESS_VARIABLE] = ray_address(None)
