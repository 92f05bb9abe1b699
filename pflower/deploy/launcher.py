"""``python -m pflower.deploy.launcher [--no-fork-server] {supernode,superexec,superlink} [--]
ARGS``: Flower's SuperNode or SuperExec with short polling and a ClientApp fork server, or its
SuperLink with a ServerApp fork server.

The public entry point of [`pflower.runtime.launcher`][pflower.runtime.launcher], where the launcher
lives (it changes
parts of Flower's SuperNode that have no setting, so it is inside pflower's runtime fence). It
names the apps that the fork servers import before they fork tasks
([`CLIENTAPP_PRELOAD`][pflower.deploy.launcher.CLIENTAPP_PRELOAD],
[`SERVERAPP_PRELOAD`][pflower.deploy.launcher.SERVERAPP_PRELOAD]): the runtime, a lower layer,
names no module of pflower's apps.
"""

from __future__ import annotations

from collections.abc import Sequence

from pflower.runtime import launcher
from pflower.runtime.launcher import POLLING, Polling, isolation_of, parse

__all__ = [
    "CLIENTAPP_PRELOAD",
    "POLLING",
    "SERVERAPP_PRELOAD",
    "Polling",
    "isolation_of",
    "main",
    "parse",
]

CLIENTAPP_PRELOAD = ("pflower.client.app", "pflower.client.app:warm_up")
"""What a fork server imports (``module``) or calls (``module:function``) for pflower's ClientApp
before it serves: the app, and with it torch, Flower and Hydra, and Hydra's lazy imports of a
composition (``warm_up``)."""

SERVERAPP_PRELOAD = (
    "pflower.server.app",
    "pflower.datasets.builder",
    "pflower.compose:compose_config",
)
"""What a SuperLink's fork server imports or calls for pflower's ServerApp before it serves:
what a new ``flwr-serverapp`` process of a run imports before its first round, no more (the
ServerApp with torch, Flower, Hydra and every algorithm; the partitioners, which build the
run's federation; Hydra's lazy imports of a composition, by composing the default
configuration). A SuperLink's first run so costs the machine what it did, but its imports are
done while the SuperNodes start; every later run starts at once."""


def main(argv: Sequence[str] | None = None) -> None:
    """Run the SuperNode, SuperExec or SuperLink of ``argv`` (default: this process's arguments)
    with a fork server that preloads pflower's ClientApp (ServerApp, for a SuperLink)."""
    launcher.main(argv, app=CLIENTAPP_PRELOAD, server_app=SERVERAPP_PRELOAD)


if __name__ == "__main__":
    main()
