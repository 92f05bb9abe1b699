"""Every config key is declared once, in a dataclass (issue: "every key once").

- The blocks of the ``dataset``, ``partition`` and ``model`` groups (:mod:`pflower.blocks`) have
  exactly the keys and defaults of the factories registered under the same names.
- No YAML value under ``conf/`` restates what its file would get without it: each file's body is
  removed, the same option composed again from a copy of the tree, and every value the body set
  compared with what the rest (the group's dataclass, the preset's defaults list) gives.
- Every group option (the ConfigStore's and the YAML presets) is listed by ``pflower --help``.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, OmegaConf

from pflower.blocks import BLOCK_GROUPS, blocks
from pflower.compose import group_options
from pflower.config import conf_dir
from pflower.datasets.loaders import DATASETS
from pflower.datasets.partitioners.base import PARTITIONERS
from pflower.models import MODELS

FACTORIES = {"dataset": DATASETS, "partition": PARTITIONERS, "model": MODELS}
CONTEXT = {
    "dataset": (),
    "partition": ("num_partitions", "seed"),
    "model": ("input_shape", "num_classes", "vocab_size"),
}


@pytest.mark.parametrize("group", BLOCK_GROUPS)
def test_blocks_have_the_factories_keys_and_defaults(group: str) -> None:
    registry = FACTORIES[group]
    assert sorted(blocks(group)) == registry.names
    for name, cls in blocks(group).items():
        parameters = {
            key: p
            for key, p in inspect.signature(registry.get(name)).parameters.items()
            if key not in CONTEXT[group]
        }
        block = OmegaConf.to_container(OmegaConf.structured(cls(name=name)), enum_to_str=True)
        assert isinstance(block, dict) and block.pop("name") == name
        assert sorted(block) == sorted(parameters), name
        for key, value in block.items():
            default = parameters[key].default
            if value == MISSING:  # required in config (e.g. from_file's path)
                continue
            assert value == (list(default) if isinstance(default, tuple) else default), (name, key)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


NOT_GROUPS = {"suite"}
"""Folders of ``conf/`` that Hydra does not compose (``pflower tune``'s benchmark suites)."""
YAML_FILES = sorted(
    path.relative_to(conf_dir())
    for path in conf_dir().glob("*/*.yaml")
    if path.parent.name not in NOT_GROUPS
)


def _swept_groups(name: str) -> set[str]:
    """The config groups that the sweeps of experiment ``name``, or of an experiment extending
    it, vary: a value the experiment sets inside such a group applies to every option swept, so
    it is no restatement even where it equals the default option's value."""
    swept: set[str] = set()
    for path in (conf_dir() / "experiment").glob("*.yaml"):
        if path.stem == name or name in _ancestors(path.stem):
            loaded = yaml.safe_load(path.read_text())
            params = loaded.get("hydra", {}).get("sweeper", {}).get("params", {})
            swept |= {key for key in params if "." not in key}
    return swept


def _ancestors(name: str) -> set[str]:
    loaded = yaml.safe_load((conf_dir() / "experiment" / f"{name}.yaml").read_text())
    parents = {
        entry
        for entry in loaded.get("defaults", [])
        if isinstance(entry, str) and entry != "_self_"
    }
    return parents.union(*(_ancestors(parent) for parent in parents))


def _composed(tree: Path, override: str, group: str) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(tree), version_base=None):
        cfg = compose(config_name="config", overrides=[override])
    node = cfg if group == "experiment" else cfg[group]
    container = OmegaConf.to_container(node, resolve=False, enum_to_str=True)
    assert isinstance(container, dict)
    return _flat(container)


@pytest.mark.parametrize("relative", YAML_FILES, ids=str)
def test_no_yaml_value_restates_what_it_would_get_anyway(relative: Path, tmp_path: Path) -> None:
    group, name = relative.parent.name, relative.stem
    text = (conf_dir() / relative).read_text()
    body = {k: v for k, v in (yaml.safe_load(text) or {}).items() if k not in ("defaults", "hydra")}
    if not body:
        return
    tree = tmp_path / "conf"
    shutil.copytree(conf_dir(), tree)
    kept = {k: v for k, v in yaml.safe_load(text).items() if k in ("defaults", "hydra")}
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("# @package"))
    (tree / relative).write_text(header + yaml.safe_dump(kept))
    override = f"+experiment={name}" if group == "experiment" else f"{group}={name}"
    without = _composed(tree, override, group)
    swept = _swept_groups(name) if group == "experiment" else set()
    restated = {
        key: value
        for key, value in _flat(body).items()
        if key in without and without[key] == value and key.split(".")[0] not in swept
    }
    assert not restated, (
        f"conf/{relative} restates values it gets anyway (from the dataclass or its defaults "
        f"list): {restated}; delete them"
    )


def test_group_yaml_files_are_presets_of_stored_nodes() -> None:
    """A group's YAML file extends a ConfigStore node (or another preset): it never declares a
    block's keys from scratch."""
    for relative in YAML_FILES:
        if relative.parent.name == "experiment":
            continue
        loaded = yaml.safe_load((conf_dir() / relative).read_text())
        assert loaded.get("defaults"), f"conf/{relative} has no defaults list"


def test_help_lists_every_option_of_every_group() -> None:
    """Hydra's help (``pflower --help-config``; ``--help`` lists the commands) names every option
    of every configuration group."""
    result = subprocess.run(
        [sys.executable, "-m", "pflower", "--help-config"],
        capture_output=True,
        text=True,
        check=True,
    )
    for group in ("dataset", "partition", "model", "split", "backend", "strategy", "tracking"):
        options = group_options(group)
        assert options, group
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"{group}:"))
        assert line.split(":", 1)[1].replace(",", " ").split() == options, group


def test_runs_recorded_before_the_blocks_group_with_runs_recorded_after(tmp_path: Path) -> None:
    """A run recorded when the YAML restated every key (and ResNet-18 still had FedMPR's
    regularization keys, at 0) is the same experiment as one recorded from the dataclasses."""
    from pflower.compose import compose_config
    from pflower.reporting.groups import experiment_key
    from pflower.results.runs import RunResult

    now = OmegaConf.to_container(
        compose_config(["strategy=fedavg", "model=resnet18", "split=fedmpr"]), resolve=True
    )
    assert isinstance(now, dict)
    earlier = {**now, "model": {**now["model"], "dropout": 0.0, "noise_sigma": 0.0}}
    earlier["model"]["noise_mode"] = "weight_relative"
    earlier["model"]["reg_stages"] = [1, 2, 3, 4]
    earlier["split"] = {k: v for k, v in now["split"].items() if k != "test_fraction"}
    earlier["dataset"] = {k: v for k, v in now["dataset"].items() if k != "verify"}

    def key(config: dict[str, Any]) -> Any:
        return experiment_key(RunResult(path=tmp_path, config=config, status="completed"))

    assert key(earlier) == key(now)
    changed = {**earlier, "model": {**earlier["model"], "dropout": 0.2}}
    assert key(changed) != key(now)
