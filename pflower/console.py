"""The console that pflower's commands print to: rich's, made on first use."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def _rich_console() -> Console:
    """rich's console, made on first use: importing rich takes 0.05-0.25 s on a 2-core VM,
    which ``pflower --help`` does not pay ([`pflower.commands`][pflower.commands]). Piped to a
    file or a CI log, tables are laid out 160 columns wide and a message stays on one line
    however long its paths are (soft wrap), so that scripts can read it back."""
    from rich.console import Console

    piped = not sys.stdout.isatty()
    return Console(width=160 if piped else None, soft_wrap=piped)


class _FirstUseConsole:
    """Stands for `_rich_console` until first used."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_rich_console(), name)


console = cast("Console", _FirstUseConsole())


def escape(text: str) -> str:
    """``text`` with rich's markup escaped (`rich.markup.escape`, imported on first use
    like the console)."""
    from rich.markup import escape as escape_markup

    return escape_markup(text)
