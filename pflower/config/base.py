"""Where the app and its config tree are, how the run config carries the overrides, and the
one check every config section uses ([`require`][pflower.config.base.require])."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pflower.registry import ConfigError

EXECUTION_KEYS = (
    "output_dir",
    "overwrite",
    "progress",
    "plots",
    "checkpoint",
    "client_state",
    "tracking",
    "backend",
    "connect_timeout",
    "connect_log_every",
    "round_timeout",
)
"""Top-level keys that say how and where a run executes, not what it computes: runs that differ
only in them are the same experiment (reports group them; a resumed run may change them)."""

RUN_CONFIG_KEY = "overrides"
"""The run-config key (``[tool.flwr.app.config]``) that carries the Hydra overrides."""

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def app_dir() -> Path:
    """The Flower app directory: the one holding ``pyproject.toml`` and ``conf/``.

    In a source checkout (editable install) that is the repository root; a wheel install carries a
    copy of both under ``pflower/_app``.
    """
    for candidate in (_PACKAGE_DIR.parent, _PACKAGE_DIR / "_app"):
        if (candidate / "pyproject.toml").is_file() and (candidate / "conf").is_dir():
            return candidate
    raise FileNotFoundError(
        f"No pflower app directory (pyproject.toml + conf/) near {_PACKAGE_DIR}"
    )


def conf_dir() -> Path:
    """The Hydra config tree."""
    return app_dir() / "conf"


def overrides_to_string(overrides: Sequence[str]) -> str:
    """Pack Hydra overrides into the single run-config string (shell quoting preserved)."""
    return shlex.join(overrides)


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """Unpack the Hydra overrides that a Flower run config carries."""
    return shlex.split(str(run_config.get(RUN_CONFIG_KEY, "")))


def require(condition: bool, message: str) -> None:
    """Raise [`ConfigError`][pflower.config.base.ConfigError] with ``message`` unless ``condition``
    holds."""
    if not condition:
        raise ConfigError(message)
