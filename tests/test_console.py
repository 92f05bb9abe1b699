"""Console colour: Flower's log lines carry ANSI codes only on a terminal
(:mod:`pflower.runtime.logs`), so piped output (CI logs, ``| tee``) is plain text."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.supercore.logger import LOGGER_NAME, ConsoleHandler

from pflower.runtime.logs import plain_flower_console_unless_tty

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _handler() -> ConsoleHandler:
    return next(h for h in logging.getLogger(LOGGER_NAME).handlers if isinstance(h, ConsoleHandler))


@pytest.mark.parametrize(
    "stream,no_color,colored",
    [(io.StringIO(), False, False), (_Terminal(), False, True), (_Terminal(), True, False)],
)
def test_flower_colours_only_a_terminal(stream, no_color, colored, monkeypatch) -> None:
    handler = _handler()
    old_stream, old_colored = handler.stream, handler.colored
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    try:
        handler.setStream(stream)
        handler.colored = not colored
        plain_flower_console_unless_tty()
        assert handler.colored is colored
        logging.getLogger(LOGGER_NAME).warning("a line")
        assert ("\x1b[" in stream.getvalue()) is colored
    finally:
        handler.setStream(old_stream)
        handler.colored = old_colored


@pytest.mark.slow
def test_a_piped_run_prints_no_colour_codes(tmp_path: Path) -> None:
    """A run whose output is a pipe, with Flower's INFO lines on (``progress=false``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FORCE_COLOR", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "rounds=1",
            "num_clients=5",
            "progress=false",
            f"output_dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Starting Flower ServerApp" in output  # Flower's own log lines are there
    assert "\x1b[" not in output
