"""Plugins: the user's own methods, datasets, models and partitioners, loaded in every process.

A plugin is a Python module that registers things through [`pflower.api`][pflower.api] when it is
imported. pflower imports two kinds:

- the modules named in the environment variable `PLUGINS_ENV` (comma-separated module
  names importable from the Python path, e.g. ``PFLOWER_PLUGINS=my_method`` with
  ``PYTHONPATH=/path/to/my/code``);
- the entry points of the group `ENTRY_POINT_GROUP` of installed packages, e.g. in the
  plugin's ``pyproject.toml``::

      [project.entry-points."pflower.plugins"]
      my_method = "my_method"

`load_plugins` imports them once per process, after pflower's own algorithms
([`pflower.strategies`][pflower.strategies] calls it at the end of its import), so every process
that composes or runs a configuration has them: the command line, simulation workers (forked or Ray
actors), SuperNodes' ClientApps and the ServerApp, tuning trials and Ray tasks. Those processes
inherit the variable from the process that starts them; a node on another machine needs the plugin
installed (or on its ``PYTHONPATH``) and the variable set itself.

A plugin that cannot be imported, or that registers a name already taken, raises
`PluginError` naming the plugin (``pflower`` exits with code 2).

This module imports nothing of pflower but [`pflower.registry`][pflower.registry]: `fingerprint`
names the plugins' code without importing it, for the configuration check that runs before torch is
imported ([`pflower.quickcheck`][pflower.quickcheck]).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pflower.registry import ConfigError

PLUGINS_ENV = "PFLOWER_PLUGINS"
"""Comma-separated module names to import as plugins."""

ENTRY_POINT_GROUP = "pflower.plugins"
"""The entry point group of installed plugin packages."""


class PluginError(ConfigError):
    """A plugin could not be imported, or registered a name that is taken."""


@dataclass(frozen=True)
class Plugin:
    """One plugin: the module to import and where it was named."""

    module: str
    source: str
    """``PFLOWER_PLUGINS`` or ``entry point <name>``."""


def configured_plugins() -> list[Plugin]:
    """The plugins of this process: `PLUGINS_ENV`'s modules, then the entry points of
    `ENTRY_POINT_GROUP` (by name), each module once."""
    named = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    plugins = [Plugin(module, PLUGINS_ENV) for module in named]
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for entry_point in sorted(entry_points, key=lambda e: e.name):
        plugins.append(Plugin(entry_point.module, f"entry point {entry_point.name!r}"))
    unique: dict[str, Plugin] = {}
    for plugin in plugins:
        unique.setdefault(plugin.module, plugin)
    return list(unique.values())


def load_plugins() -> list[str]:
    """Import every configured plugin (once per process); returns their modules.

    Raises:
        PluginError: a plugin failed to import (it does not exist, raised, or registered a name
            that is already registered); the message names the plugin and the cause.
    """
    plugins = configured_plugins()
    for plugin in plugins:
        try:
            importlib.import_module(plugin.module)
        except Exception as error:
            sys.modules.pop(plugin.module, None)
            raise PluginError(
                f"plugin {plugin.module!r} (from {plugin.source}) failed to load: "
                f"{type(error).__name__}: {error}"
            ) from error
    return [plugin.module for plugin in plugins]


def fingerprint() -> str:
    """A short hash of the configured plugins and the bytes of their source files, without
    importing them ('' without plugins): a cache of what the plugins register is valid while
    it is unchanged. A plugin whose source cannot be found counts by its name alone."""
    plugins = configured_plugins()
    if not plugins:
        return ""
    digest = hashlib.sha256()
    for plugin in plugins:
        digest.update(plugin.module.encode() + b"\0")
        for path in _source_files(plugin.module):
            digest.update(path.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _source_files(module: str) -> list[Path]:
    """The ``.py`` files of ``module``'s top-level package (or the module's own file), found
    without importing it."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []
