"""Multi-node deployment: one SuperLink and N SuperNodes, as local processes or as containers.

A deployment runs the same ServerApp and ClientApp as a simulation. The SuperNodes talk to the
SuperLink's Fleet API over gRPC (port 9092); ``flwr run`` and the ServerApp executor use its HTTP
Control/runtime API (port 8000); each SuperNode serves its ClientApp executor on its own runtime
API port (9094 + i). Node ``i`` carries the node config ``partition-id=i num-partitions=N``, and
its client's personalized state (``context.state``) lives in that SuperNode for the whole run.

One description of the topology ([`topology`][pflower.deploy.topology]) serves two targets, so that
they cannot drift apart:

- ``pflower deploy up|status|down`` starts, inspects and stops the topology as processes on this
  machine (no Docker, [`local`][pflower.deploy.local]), with one log file per process in
  ``<dir>/logs`` and the process table in ``<dir>/deployment.json``; ``pflower deploy run
  <overrides>`` submits an experiment to it;
- ``pflower deploy compose --num-clients N`` writes ``docker/compose.yml`` and its overlays
  (TLS plus SuperNode authentication, GPUs) for N clients ([`compose`][pflower.deploy.compose]).

Every process started here carries a tag in its environment, which Flower's own child processes
inherit; stopping a deployment ends exactly the processes that carry its tag, and no others
([`processes`][pflower.deploy.processes]). The command line is [`cli`][pflower.deploy.cli].
"""

from pflower.deploy.cli import main
from pflower.deploy.compose import COMPOSE_FILES, render_compose
from pflower.deploy.local import Deployment
from pflower.deploy.processes import executable, launch, tagged_pids, terminate, wait_for_port
from pflower.deploy.topology import Endpoints, Security

__all__ = [
    "COMPOSE_FILES",
    "Deployment",
    "Endpoints",
    "Security",
    "executable",
    "launch",
    "main",
    "render_compose",
    "tagged_pids",
    "terminate",
    "wait_for_port",
]
