"""Flower's console logging, as pflower's command line wants it."""

from __future__ import annotations

import logging

from pflower.runtime.fence import CONSOLE_HANDLER


def quiet_flower_console(progress: bool) -> None:
    """Flower logs to its own console handler (and to run.log); Hydra's root handler would
    print every line twice, so Flower's logger does not propagate. With the live view on
    (``progress``), the console shows only Flower's warnings
    (:data:`~pflower.runtime.fence.CONSOLE_HANDLER`)."""
    from flwr.supercore.logger import LOGGER_NAME

    logging.getLogger(LOGGER_NAME).propagate = False
    if progress:
        CONSOLE_HANDLER.current()(level=logging.WARNING)
