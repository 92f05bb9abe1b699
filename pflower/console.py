"""Console colour: Flower's log lines carry ANSI colour codes only when they go to a terminal.

Flower's console handler (``flwr.supercore.logger.ConsoleHandler``, Flower 1.39) colours every
line unconditionally, so piped output (CI logs, ``| tee``) would be full of escape codes.
:func:`plain_flower_console_unless_tty` switches the colours off unless the handler's stream is
a terminal (and ``NO_COLOR`` is unset: https://no-color.org); every pflower process calls it
when it starts (the command line, the ServerApp and the ClientApp).
"""

from __future__ import annotations

import logging
import os


def plain_flower_console_unless_tty() -> None:
    """Colour Flower's console log lines only where their stream is a terminal."""
    from flwr.supercore.logger import LOGGER_NAME, ConsoleHandler

    for handler in logging.getLogger(LOGGER_NAME).handlers:
        if isinstance(handler, ConsoleHandler):
            stream = getattr(handler, "stream", None)
            is_tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
            handler.colored = is_tty and "NO_COLOR" not in os.environ
