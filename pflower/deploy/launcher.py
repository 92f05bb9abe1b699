"""``python -m pflower.deploy.launcher [--no-fork-server] {supernode,superexec} [--] ARGS``:
Flower's SuperNode or SuperExec with short polling and a ClientApp fork server.

The public entry point of [`pflower.runtime.launcher`][pflower.runtime.launcher], where the launcher
lives (it changes
parts of Flower's SuperNode that have no setting, so it is inside pflower's runtime fence).
"""

from __future__ import annotations

from pflower.runtime.launcher import POLLING, Polling, isolation_of, main, parse

__all__ = ["POLLING", "Polling", "isolation_of", "main", "parse"]

if __name__ == "__main__":
    main()
