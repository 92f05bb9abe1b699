"""Where the app and its config tree are, how the run config carries the overrides, and the
one check every config section uses ([`require`][pflower.config.base.require])."""

from __future__ import annotations

import shlex
import shutil
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


def app_files(package_dir: Path, conf: Path) -> list[tuple[str, Path]]:
    """What a Flower app of pflower consists of: the ``*.py`` of ``package_dir`` and the
    ``*.yaml`` of ``conf``, as (path in the app, file) sorted by path; byte caches and a wheel's
    ``_app`` copy left out. Flower's FAB build also drops ``test_*.py``, ``*_test.py`` and
    symbolic links, none of which the package holds (``tests/test_fab.py`` compares the two)."""
    files = []
    for root, folder, pattern in (
        (package_dir, package_dir.name, "*.py"),
        (conf, "conf", "*.yaml"),
    ):
        for path in root.rglob(pattern):
            relative = path.relative_to(root)
            if not {"__pycache__", "_app"} & set(relative.parts):
                files.append((f"{folder}/{relative.as_posix()}", path))
    return sorted(files)


def stage_app(destination: Path) -> Path:
    """Copy the Flower app ([`app_files`][pflower.config.base.app_files] and ``pyproject.toml``)
    into ``destination``, laid out as in a checkout; ``destination``.

    ``flwr run`` packs the directory it is given into a FAB (at most 10 MiB), keeping what the
    ``fab-include`` of ``[tool.flwr.app]`` names: the package and its config tree. A checkout also
    holds results and docs, and a wheel install keeps only the config tree beside its
    ``pyproject.toml`` (``pflower/_app``), where ``fab-include`` would name a missing folder.
    Staged, both give the same FAB, whose code is the installed pflower's, so a SuperNode's
    fork server keeps its import of pflower for it.
    """
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(app_dir() / "pyproject.toml", destination / "pyproject.toml")
    for relative, path in app_files(_PACKAGE_DIR, conf_dir()):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return destination


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
