"""``python -m pflower.deploy.launcher [--no-fork-server] {supernode,superexec} [--] ARGS``:
Flower's SuperNode or SuperExec with short polling and a ClientApp fork server.

The public entry point of [`pflower.runtime.launcher`][pflower.runtime.launcher], where the launcher
lives (it changes
parts of Flower's SuperNode that have no setting, so it is inside pflower's runtime fence). It
names the ClientApp that the fork server imports before it forks tasks
([`CLIENTAPP_PRELOAD`][pflower.deploy.launcher.CLIENTAPP_PRELOAD]): the runtime, a lower layer,
names no module of pflower's apps.
"""

from __future__ import annotations

from collections.abc import Sequence

from pflower.runtime import launcher
from pflower.runtime.launcher import POLLING, Polling, isolation_of, parse

__all__ = ["CLIENTAPP_PRELOAD", "POLLING", "Polling", "isolation_of", "main", "parse"]

CLIENTAPP_PRELOAD = ("pflower.client.app", "pflower.client.app:warm_up")
"""What a fork server imports (``module``) or calls (``module:function``) for pflower's ClientApp
before it serves: the app, and with it torch, Flower and Hydra, and Hydra's lazy imports of a
composition (``warm_up``)."""


def main(argv: Sequence[str] | None = None) -> None:
    """Run the SuperNode or SuperExec of ``argv`` (default: this process's arguments) with a
    fork server that preloads pflower's ClientApp."""
    launcher.main(argv, app=CLIENTAPP_PRELOAD)


if __name__ == "__main__":
    main()
