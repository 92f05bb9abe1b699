"""Configuration errors before imports: a bad key, value type or option name in under a second.

``pflower <overrides>`` needs torch, Flower and Ray to run, but not to tell a user that
``strategy.gama`` is no key, ``rounds=ten`` no integer or ``strategy=nope`` no algorithm. Every
schema but one is light: the run-level dataclasses ([`pflower.config`][pflower.config]) and the
blocks ([`pflower.blocks`][pflower.blocks]) import nothing heavy. The algorithms' options
dataclasses live in their algorithm modules, which import torch; their *shape* (field names, types,
defaults, enum members) is cached here, keyed by
`pflower.provenance.CODE_FINGERPRINT` (a hash of every source
file of pflower) and by [`pflower.plugins.fingerprint`][pflower.plugins.fingerprint] (the plugins
named and the bytes of their source files, read without importing them), so a cache never describes
other code than the code that runs. The cache also holds the shapes of the plugins' dataset, model
and partition blocks, so that a plugin's names and options are checked here too
([`pflower.plugins`][pflower.plugins]).

[`check_before_imports`][pflower.quickcheck.check_before_imports] composes the overrides with Hydra
against the light schemas and the
cached option shapes, rebuilt as plain dataclasses, and reports what Hydra refuses: an unknown
key, a value of the wrong type, an unknown group option. What it cannot check without the real
classes (value ranges in ``__post_init__``, compose-time compatibility) is left to the full
check that follows, after the imports. When no cache matches the code (first run after a change),
it checks nothing; the full check then writes the cache
([`write_schema_cache`][pflower.quickcheck.write_schema_cache]).

The run's ``numerics`` (how torch's CPU kernels are held) must also be decided before torch is
imported: `hold_numerics_of` reads it from the overrides.

The cache is one JSON file per fingerprint in ``$PFLOWER_SCHEMA_CACHE`` (default
``~/.cache/pflower/schema``); a cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import functools
import json
import os
import types
from collections.abc import Sequence
from dataclasses import field, fields, make_dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from pflower.registry import ConfigError, did_you_mean

_FORMAT = 2
_SCALARS: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool}


def cache_file() -> Path:
    """The cache of the option shapes of this code and these plugins (by their fingerprints)."""
    from pflower.plugins import fingerprint
    from pflower.provenance import CODE_FINGERPRINT

    root = os.environ.get("PFLOWER_SCHEMA_CACHE") or Path.home() / ".cache" / "pflower" / "schema"
    plugins = fingerprint()
    return Path(root) / f"options-{CODE_FINGERPRINT}{'-' + plugins if plugins else ''}.json"


def _describe(annotation: Any) -> Any:
    """A JSON description of a field type that `_rebuild` turns back into one."""
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"enum": annotation.__name__, "members": {m.name: m.value for m in annotation}}
    if isinstance(annotation, type) and annotation.__name__ in _SCALARS:
        return annotation.__name__
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return {"optional": _describe(rest[0])}
    if origin is list:
        return {"list": _describe(args[0]) if args else "any"}
    if origin is dict:
        return {"dict": _describe(args[1]) if args else "any"}
    raise TypeError(f"no light description of {annotation!r}")


def _rebuild(description: Any) -> Any:
    if description == "any":
        return Any
    if isinstance(description, str):
        return _SCALARS[description]
    if "enum" in description:
        members = description["members"]
        base = StrEnum if all(isinstance(v, str) for v in members.values()) else Enum
        return base(description["enum"], members)  # type: ignore[call-arg]  # functional API
    if "optional" in description:
        return _rebuild(description["optional"]) | None
    if "list" in description:
        return list[_rebuild(description["list"])]  # type: ignore[misc]  # built at run time
    return dict[str, _rebuild(description["dict"])]  # type: ignore[misc]  # built at run time


def _default(value: Any) -> Any:
    if isinstance(value, Enum):
        return {"member": value.name}
    if isinstance(value, list | tuple):
        return [_default(item) for item in value]
    return value


def describe_options(options_class: type, name: str) -> dict[str, Any]:
    """The shape of one algorithm's options: each field's name, type and default."""
    hints = get_type_hints(options_class)
    instance = options_class(name=name)
    return {
        "class": options_class.__name__,
        "fields": [
            [f.name, _describe(hints[f.name]), _default(getattr(instance, f.name))]
            for f in fields(options_class)
        ],
    }


def light_options(name: str, shape: dict[str, Any]) -> type:
    """A plain dataclass with the cached shape of algorithm ``name``'s options."""
    specs = []
    for key, description, default in shape["fields"]:
        annotation = _rebuild(description)
        if isinstance(default, dict) and "member" in default:
            enum = get_args(annotation)[0] if get_origin(annotation) else annotation
            value: Any = field(default=enum[default["member"]])
        elif isinstance(default, list):
            value = field(default_factory=functools.partial(list, default))
        else:
            value = field(default=default)
        specs.append((key, annotation, value))
    return make_dataclass(str(shape.get("class", f"{name}_options")), specs)


def write_schema_cache() -> None:
    """Cache the option shapes of every algorithm and of the plugins' blocks, once per code and
    plugin fingerprint (imports the algorithms and the plugins); never fails."""
    try:
        path = cache_file()
        if path.exists():
            return
        import pflower.strategies  # noqa: F401  (registers every algorithm)
        from pflower.blocks import BLOCK_GROUPS, blocks
        from pflower.core.algorithm import ALGORITHMS

        shapes = {
            name: describe_options(algorithm.options, name)
            for name, algorithm in ALGORITHMS.items()
        }
        plugin_blocks = {
            group: {
                name: describe_options(block, name)
                for name, block in blocks(group).items()
                if not block.__module__.startswith("pflower.")
            }
            for group in BLOCK_GROUPS
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        payload = {"format": _FORMAT, "options": shapes, "blocks": plugin_blocks}
        partial.write_text(json.dumps(payload))
        os.replace(partial, path)
    except Exception:
        return


def _cached_shapes() -> dict[str, Any] | None:
    """The cached payload: ``options`` (algorithm name -> shape) and ``blocks`` (group -> the
    plugins' block name -> shape); None without a usable cache."""
    try:
        payload = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return None
    if payload.get("format") != _FORMAT:
        return None
    if not isinstance(payload.get("options"), dict) or not isinstance(payload.get("blocks"), dict):
        return None
    return dict(payload)


def check_before_imports(overrides: list[str]) -> None:
    """Compose ``overrides`` against the light schemas and the cached option shapes.

    Does nothing without a cache for this code, or when Hydra accepts the overrides.

    Raises:
        ConfigError: Hydra's refusal of a wrong key, type or option name, in one line
            (`explain_composition_error`).
    """
    cached = _cached_shapes()
    if cached is None:
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from pflower.blocks import store_blocks
    from pflower.config import conf_dir

    store = ConfigStore.instance()
    if "strategy" not in store.repo:
        store_blocks()
        shapes = [("strategy", name, shape) for name, shape in cached["options"].items()]
        shapes += [
            (g, n, shape) for g, found in cached["blocks"].items() for n, shape in found.items()
        ]
        for group, name, shape in shapes:
            try:
                node = light_options(name, shape)(name=name)
            except (KeyError, TypeError, ValueError):
                return  # a shape this code cannot rebuild: leave it to the full check
            store.store(group=group, name=name, node=node)
    if GlobalHydra.instance().is_initialized():
        return
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            compose(config_name="config", overrides=list(overrides))
    except HydraException as error:
        raise ConfigError(explain_composition_error(error)) from error


def hold_numerics_of(overrides: Sequence[str]) -> None:
    """Hold torch's CPU kernels as the last ``numerics=<avx2|native>`` of ``overrides`` says
    ([`pflower.provenance.hold_kernels`][pflower.provenance.hold_kernels]); without one (or with a
    sweep's list, left to each job's record) the process keeps what ``import pflower`` chose."""
    from pflower.provenance import hold_kernels

    values = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("numerics=")]
    if values and values[-1] in ("avx2", "native"):
        hold_kernels(values[-1])


def explain_composition_error(error: BaseException) -> str:
    """Hydra's refusal in one line, with the nearest names to a mistyped one.

    An unknown group option (``strategy=fedav``) names its group's options on one line; an
    unknown key (``strategy.gama=0.3``) the keys its block has; both say which allowed name is
    nearest ([`did_you_mean`][pflower.registry.did_you_mean]). Other refusals keep Hydra's first
    line and OmegaConf's reason, without the ``full_key``/``object_type`` lines."""
    from dataclasses import is_dataclass

    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(error, MissingConfigException) and error.options and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        return (
            f"Could not find '{error.missing_cfg_file}'{did_you_mean(name, error.options)}. "
            f"Available options in '{group}': {', '.join(error.options)}"
        )
    cause = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not isinstance(cause, OmegaConfBaseException):
        return "; ".join(lines)
    head = lines[0].rstrip(".")
    reason = str(cause).splitlines()[0]
    if "not in" not in reason or not is_dataclass(cause.object_type) or cause.key is None:
        return f"{head}: {reason}"
    allowed = [f.name for f in fields(cause.object_type)]
    return (
        f"{head}: {reason}{did_you_mean(str(cause.key), allowed)}. "
        f"Allowed keys: {', '.join(allowed)}"
    )
