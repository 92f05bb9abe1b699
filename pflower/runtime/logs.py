"""Flower's console logging, as pflower wants it: no duplicate lines under Hydra, only warnings
beside the live view, and colour codes only on a terminal.

Flower's console handler (``flwr.supercore.logger.ConsoleHandler``, Flower 1.39) colours every
line unconditionally, so piped output (CI logs, ``| tee``) would be full of escape codes.
[`plain_flower_console_unless_tty`][pflower.runtime.logs.plain_flower_console_unless_tty] switches
the colours off unless the handler's stream is
a terminal (and ``NO_COLOR`` is unset: https://no-color.org); every pflower process calls it
when it starts (the command line, the ServerApp and the ClientApp).
"""

from __future__ import annotations

import logging
import os

from pflower.runtime.fence import CONSOLE_HANDLER, CONSOLE_HANDLER_CLASS


def plain_flower_console_unless_tty() -> None:
    """Colour Flower's console log lines only where their stream is a terminal (the
    ``colored`` attribute of Flower's ``ConsoleHandler``:
    `CONSOLE_HANDLER_CLASS`)."""
    from flwr.supercore.logger import LOGGER_NAME

    handler_class = CONSOLE_HANDLER_CLASS.current()
    for handler in logging.getLogger(LOGGER_NAME).handlers:
        if isinstance(handler, handler_class):
            stream = getattr(handler, "stream", None)
            is_tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
            handler.colored = is_tty and "NO_COLOR" not in os.environ


def quiet_flower_console(progress: bool) -> None:
    """Flower logs to its own console handler (and to run.log); Hydra's root handler would
    print every line twice, so Flower's logger does not propagate. With the live view on
    (``progress``), the console shows only Flower's warnings
    (`CONSOLE_HANDLER`)."""
    from flwr.supercore.logger import LOGGER_NAME

    logging.getLogger(LOGGER_NAME).propagate = False
    if progress:
        CONSOLE_HANDLER.current()(level=logging.WARNING)
