"""Configuration errors before imports (:mod:`pflower.quickcheck`).

The option shapes cached from the real dataclasses rebuild into plain dataclasses with the same
keys, types and defaults; with a cache for this code, a wrong key, a value of the wrong type and
an unknown option name end ``pflower`` with exit code 2 before torch, Flower or Ray is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import pflower.strategies  # noqa: F401  (registers every algorithm)
from pflower.core.algorithm import ALGORITHMS
from pflower.quickcheck import describe_options, light_options, write_schema_cache


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_cached_shape_rebuilds_the_options_keys_types_and_defaults(name: str) -> None:
    options = ALGORITHMS[name].options
    light = light_options(name, describe_options(options, name))
    real_node = OmegaConf.structured(options(name=name))
    light_node = OmegaConf.structured(light(name=name))
    assert OmegaConf.to_container(light_node, enum_to_str=True) == OmegaConf.to_container(
        real_node, enum_to_str=True
    )
    assert light.__name__ == options.__name__


PROBE = """
import sys
from pflower.cli import main
sys.argv = ["pflower", *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    heavy = [m for m in ("torch", "flwr", "ray") if m in sys.modules]
    print("EXIT", exit.code, "HEAVY", ",".join(heavy) or "none")
"""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "strategy.gama=0.3",
            "Key 'gama' not in 'FLIUOptions' (did you mean 'gamma'?). Allowed keys: name,",
        ),
        ("rounds=ten", "Value 'ten' of type 'str' could not be converted to Integer"),
        (
            "strategy=fedav",
            "Could not find 'strategy/fedav' (did you mean 'fedavg', "
            "'fedavg_c' or 'fedcac'?). Available options in 'strategy': apfl, apple,",
        ),
        (
            "partition=lsq",
            "Could not find 'partition/lsq' (did you mean 'lsqs' or 'ls'?). "
            "Available options in 'partition': attribute_groups, class_groups,",
        ),
    ],
)
def test_errors_are_reported_in_one_line_before_torch_flower_and_ray(
    override: str, message: str, tmp_path: Path
) -> None:
    """Exit code 2 and one line, naming the nearest keys or options to a mistyped one."""
    env = {**os.environ, "PFLOWER_SCHEMA_CACHE": str(tmp_path)}
    write_schema_cache_in(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, override],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    error, verdict = result.stdout.splitlines()
    assert verdict == "EXIT 2 HEAVY none", result.stdout + result.stderr
    assert error.startswith("configuration error: ") and message in error


def write_schema_cache_in(folder: Path) -> None:
    previous = os.environ.get("PFLOWER_SCHEMA_CACHE")
    os.environ["PFLOWER_SCHEMA_CACHE"] = str(folder)
    try:
        write_schema_cache()
    finally:
        if previous is None:
            del os.environ["PFLOWER_SCHEMA_CACHE"]
        else:
            os.environ["PFLOWER_SCHEMA_CACHE"] = previous
    assert list(folder.glob("options-*.json"))


def test_without_a_cache_the_full_check_reports_and_writes_one(tmp_path: Path) -> None:
    env = {**os.environ, "PFLOWER_SCHEMA_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "strategy.gama=0.3"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert "EXIT 2 HEAVY" in result.stdout and "Key 'gama' not in" in result.stdout
    assert list(tmp_path.glob("options-*.json"))
