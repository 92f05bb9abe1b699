"""Runs -> experiments: which runs are seeds of one experiment, and what to call each experiment.

Two runs belong to the same experiment exactly when their resolved configurations agree on every
key except ``seed`` and ``output_dir``; only such runs are averaged. A run-level key that a run's
configuration lacks (it was recorded before the key existed) counts as its current default: a key
is only ever added with a default that keeps the earlier behaviour. Each experiment is then placed
in a report table by its configuration:

- the *method* (table row) is the label the algorithm's options give themselves (e.g. FedAvg,
  FLIU, FLIU25), plus any other strategy option that tells apart experiments which would
  otherwise share a label (e.g. ``FedAvg (aggregation=uniform)``); methods are ordered as their
  options order themselves ([`sort_key`][pflower.core.options.AlgorithmOptions.sort_key]);
- the *partition* (column block) names the ``partition.*`` block the same way (IID, PATH, LS ...);
- every other key that varies (``num_clients``, ``dataset.name``, ``train.lr`` ...) splits the
  report into *sections*, one per combination of values.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

import pflower.strategies  # noqa: F401  (importing registers every algorithm)
from pflower.blocks import BLOCK_GROUPS, blocks
from pflower.config import EXECUTION_KEYS, plain, run_level_defaults
from pflower.core.algorithm import options_from_block
from pflower.core.options import AlgorithmOptions
from pflower.datasets.split import SplitConfig
from pflower.registry import ConfigError
from pflower.results.runs import RunResult

NOT_GROUPED = ("seed", *EXECUTION_KEYS)
"""Top-level keys in which seeds of one experiment may differ: the seed, and how and where each
run executed (its directory, checkpoints, tracking, backend ...)."""

_PARTITION_NAMES = {"iid": "IID", "pathological": "PATH", "ls": "LS", "qs": "QS", "lsqs": "LSQS"}
_ABSENT = object()

Config = dict[str, Any]
Namer = Callable[[Config], tuple[str, frozenset[str]]]


@dataclass(frozen=True)
class Experiment:
    """Runs that differ only in seed, with their place in the report."""

    config: Config
    runs: tuple[RunResult, ...]
    method: str
    partition: str
    section: str
    section_order: tuple[Any, ...]
    method_order: tuple[Any, ...]
    partition_order: tuple[Any, ...]

    @property
    def order(self) -> tuple[Any, ...]:
        """Report order: section, then method, then partition."""
        return (self.section_order, self.method_order, self.partition_order)


def show(value: Any) -> str:
    """A configuration value as written in the report."""
    if value is _ABSENT:
        return "-"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def experiment_key(run: RunResult) -> tuple[tuple[str, Any], ...]:
    """The run's configuration, completed with
    [`run_level_defaults`][pflower.config.run_level_defaults], without
    the keys that seeds may differ in."""
    config = {
        **flatten(run_level_defaults()),
        **flatten(block_defaults(run.config)),
        **flatten(run.config),
    }
    config = {k: v for k, v in config.items() if RETIRED.get(k, _ABSENT) != v}
    return tuple(sorted((k, v) for k, v in config.items() if k.split(".")[0] not in NOT_GROUPED))


RETIRED: dict[str, Any] = {
    "model.dropout": 0.0,
    "model.noise_sigma": 0.0,
    "model.noise_mode": "weight_relative",
    "model.reg_stages": "[1, 2, 3, 4]",
}
"""Keys that runs recorded before they were removed, at the value that meant "off": ResNet-18's
FedMPR regularization, now only ``strategy.*`` of FedMPR (flattened, lists as JSON text)."""


def block_defaults(config: Mapping[str, Any]) -> Config:
    """The defaults of the ``split`` block and of the run's algorithm options, as nested plain
    values: a key added to them after a run was recorded counts as its default, as for the
    run-level keys (a key is only ever added with a default that keeps the earlier behaviour)."""
    defaults: Config = {"split": _plain_fields(SplitConfig())}
    for group in BLOCK_GROUPS:
        block = config.get(group)
        if isinstance(block, Mapping) and str(block.get("name")) in blocks(group):
            name = str(block.get("name"))
            defaults[group] = plain(asdict(blocks(group)[name](name=name)))
    strategy = config.get("strategy")
    if isinstance(strategy, Mapping):
        with contextlib.suppress(ConfigError):
            defaults["strategy"] = _plain_fields(options_from_block({"name": strategy.get("name")}))
    return defaults


def _plain_fields(instance: Any) -> Config:
    """A dataclass's init fields as YAML would read them back (enums as their values)."""
    return {
        field.name: _plain_value(getattr(instance, field.name))
        for field in fields(instance)
        if field.init
    }


def _plain_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain_value(item) for item in value]
    return value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Config:
    """Dotted keys to hashable leaf values; lists become their JSON text."""
    flat: Config = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{dotted}."))
        elif isinstance(value, list):
            flat[dotted] = json.dumps(value)
        else:
            flat[dotted] = value
    return flat


def _value_order(value: Any) -> tuple[int, float, str]:
    """Numbers before other values, numbers by size (so that 5 comes before 10)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, show(value))


def varying_keys(configs: Sequence[Config]) -> dict[str, list[str]]:
    """Keys whose value is not the same in every configuration, with their distinct values
    (a key missing from some configurations counts as the value ``-``)."""
    keys = sorted({key for config in configs for key in config})
    varying: dict[str, list[str]] = {}
    for key in keys:
        values = sorted({config.get(key, _ABSENT) for config in configs}, key=_value_order)
        shown = list(dict.fromkeys(show(value) for value in values))
        if len(shown) > 1:
            varying[key] = shown
    return varying


def _unflattened(value: Any) -> Any:
    """A leaf of [`flatten`][pflower.reporting.groups.flatten] as the configuration held it (lists
    are kept as JSON text)."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def options_of(config: Config) -> AlgorithmOptions | None:
    """The algorithm options a flattened run configuration holds (None if no longer known)."""
    block = {
        key.removeprefix("strategy."): _unflattened(value)
        for key, value in config.items()
        if key.startswith("strategy.")
    }
    try:
        return options_from_block(block)
    except ConfigError:
        return None


def method_name(config: Config) -> tuple[str, frozenset[str]]:
    """The method's label and the strategy keys that the label accounts for.

    Keys that differ between experiments sharing a label are added to it by `_labels`; a
    label that accounts for every option (FLIU25 names γ) needs none of them.
    """
    options = options_of(config)
    if options is None:
        return str(config.get("strategy.name")), frozenset({"strategy.name"})
    named = {"strategy.name", *(f"strategy.{key}" for key in options.label_keys())}
    return options.label(), frozenset(named)


def partition_name(config: Config) -> tuple[str, frozenset[str]]:
    """The partition's base name (the FLIU paper's abbreviations) and the keys it determines."""
    name = str(config.get("partition.name"))
    return _PARTITION_NAMES.get(name, name), frozenset({"partition.name"})


def _labels(configs: Sequence[Config], prefix: str, namer: Namer) -> list[str]:
    """Base names, extended by the ``prefix`` keys that differ among configs sharing a name."""
    named = [namer(config) for config in configs]
    sharing: dict[str, list[Config]] = defaultdict(list)
    for config, (name, _) in zip(configs, named, strict=True):
        sharing[name].append(config)
    labels = []
    for config, (name, determined) in zip(configs, named, strict=True):
        extras = [
            f"{key.removeprefix(prefix)}={show(config.get(key, _ABSENT))}"
            for key in varying_keys(sharing[name])
            if key.startswith(prefix) and key not in determined
        ]
        labels.append(f"{name} ({', '.join(extras)})" if extras else name)
    return labels


def _rank(value: Any, known: Iterable[str]) -> int:
    order = list(known)
    return order.index(value) if value in order else len(order)


def _method_order(config: Config, method: str) -> tuple[Any, ...]:
    """The order the algorithms' options give (baselines, the papers' methods, local), then the
    label; algorithms no longer known come last."""
    options = options_of(config)
    if options is None:
        return (1, (), method)
    return (0, options.sort_key(), method)


def _partition_order(config: Config, partition: str) -> tuple[Any, ...]:
    """The paper's partition order (IID, PATH, LS, QS, LSQS), then the label."""
    return (_rank(config.get("partition.name"), _PARTITION_NAMES), partition)


def group_runs(runs: Iterable[RunResult]) -> list[Experiment]:
    """Group runs into experiments, in report order."""
    by_key: dict[tuple[tuple[str, Any], ...], list[RunResult]] = defaultdict(list)
    for run in runs:
        by_key[experiment_key(run)].append(run)
    configs = [dict(key) for key in by_key]
    methods = _labels(configs, "strategy.", method_name)
    partitions = _labels(configs, "partition.", partition_name)
    section_keys = [
        key for key in varying_keys(configs) if not key.startswith(("strategy.", "partition."))
    ]
    experiments = []
    for config, group, method, partition in zip(
        configs, by_key.values(), methods, partitions, strict=True
    ):
        values = [config.get(key, _ABSENT) for key in section_keys]
        experiments.append(
            Experiment(
                config,
                tuple(group),
                method,
                partition,
                ", ".join(f"{k}={show(v)}" for k, v in zip(section_keys, values, strict=True)),
                tuple(_value_order(value) for value in values),
                _method_order(config, method),
                _partition_order(config, partition),
            )
        )
    return sorted(experiments, key=lambda experiment: experiment.order)
