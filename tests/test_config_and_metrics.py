"""Configuration composition and validation, and the per-stage statistics of a round."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from pflower.compose import compose_config, config_from_run_config
from pflower.config import RUN_CONFIG_KEY, overrides_to_string
from pflower.registry import ConfigError
from pflower.results.statistics import bottom_fraction_mean, rho, summarize_stage


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fraction=1.5", "fraction must be in (0, 1], got 1.5"),
        ("num_clients=0", "num_clients must be an integer >= 1"),
        ("rounds=0", "rounds must be an integer >= 1"),
        ("rounds=ten", "Value 'ten' of type 'str' could not be converted to Integer"),
        ("train.optimizer=rmsprop", "Invalid value 'rmsprop', expected one of [sgd, adam]"),
        ("train.lr=-1", "train.lr must be > 0"),
        ("min_clients=20", "min_clients must be between 1 and num_clients=10"),
        ("eval.every=0", "eval.every must be >= 1"),
        ("backend.num_cpus_per_client=0", "backend.num_cpus_per_client must be > 0"),
        ("train.lrr=0.1", "Allowed keys: local_epochs, local_steps, batch_size, optimizer, lr"),
        ("model.widht=8", "Key 'widht' not in 'SmallCnn' (did you mean 'width'?)"),
        ("partition.clases_per_client=3", "Allowed keys: name, classes_per_client, assignment"),
        (
            "+dataset.size=3",
            "dataset 'digits' does not take 'size'. Allowed keys: mean, std, image_size",
        ),
    ],
)
def test_impossible_values_are_rejected_with_what_is_allowed(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        compose_config([override])
    assert message in str(error.value)


def test_unknown_strategy_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError) as error:
        compose_config(["strategy=fedavgg"])
    message = str(error.value)
    assert "Could not find 'strategy/fedavgg' (did you mean 'fedavg'" in message
    assert "\n" not in message
    names = message.split("Available options in 'strategy': ")[1].split(", ")
    for name in ("fedavg", "fedavg_ft", "fedprox", "fliu", "local", "fliu10", "clt"):
        assert name in names


def test_strategy_options_are_checked_while_composing() -> None:
    """Keys, types, allowed values and ranges come from the options dataclass alone."""
    with pytest.raises(ConfigError, match=r"Key 'gama' not in 'FLIUOptions'(.|\n)*Allowed keys: "):
        compose_config(["strategy=fliu", "strategy.gama=0.3"])
    with pytest.raises(ConfigError, match=r"does not take 'gama'\. Allowed keys: .*gamma"):
        compose_config(["strategy=fliu", "+strategy.gama=0.3"])
    with pytest.raises(
        ConfigError, match=r"Invalid value 'fix', expected one of \[adaptive, fixed\]"
    ):
        compose_config(["strategy=fliu", "strategy.gamma_mode=fix"])
    with pytest.raises(ConfigError, match=r"strategy.gamma must be in \[0, 1\], got 1.5"):
        compose_config(["strategy=fliu", "strategy.gamma=1.5"])
    with pytest.raises(ConfigError, match=r"strategy.mu must be >= 0, got -1.0"):
        compose_config(["strategy=fedprox", "strategy.mu=-1"])
    with pytest.raises(ConfigError, match=r"strategy 'fedavg' does not take 'gamma', 'gamma_mode'"):
        compose_config(["strategy=fliu", "strategy.name=fedavg"])


def test_defaults_are_declared_once_in_the_dataclasses() -> None:
    """conf/ holds no run-level value and no YAML for a registered algorithm: the dataclasses
    are the only place a default is written."""
    from pflower.config import ExperimentConfig, conf_dir
    from pflower.core.algorithm import ALGORITHMS

    assert not any((conf_dir() / "strategy" / f"{name}.yaml").exists() for name in ALGORITHMS)
    config_yaml = yaml.safe_load((conf_dir() / "config.yaml").read_text())
    assert set(config_yaml) == {"defaults", "hydra"}
    cfg = compose_config(["strategy=fliu10"])
    assert cfg.rounds == ExperimentConfig.rounds
    assert (cfg.strategy.gamma_mode, cfg.strategy.gamma, cfg.strategy.aggregation) == (
        "fixed",
        0.1,
        "uniform",
    )


@pytest.mark.slow
def test_flwr_run_config_composes_the_same_experiment_as_the_cli() -> None:
    overrides = ["strategy=fedavg", "rounds=3", "train.lr=0.02", "partition=iid"]
    cli = subprocess.run(
        [sys.executable, "-m", "pflower", "--cfg", "job", *overrides],
        check=True,
        capture_output=True,
        text=True,
    )
    from_cli = yaml.safe_load(cli.stdout)
    from_app = OmegaConf.to_container(
        config_from_run_config({RUN_CONFIG_KEY: overrides_to_string(overrides)}), resolve=True
    )
    assert from_cli == from_app
    assert from_app["strategy"]["name"] == "fedavg" and from_app["rounds"] == 3


def test_run_config_overrides_keep_shell_quoting() -> None:
    overrides = ["strategy=fliu", "output_dir='/tmp/a dir/run'"]
    cfg = config_from_run_config({RUN_CONFIG_KEY: overrides_to_string(overrides)})
    assert cfg.output_dir == "/tmp/a dir/run"


def test_stage_summary_matches_hand_computed_values() -> None:
    rows = [
        {
            "client": 0,
            "acc_local": 0.9,
            "loss_local": 0.2,
            "acc_global": 0.5,
            "loss_global": 1.0,
            "num_test": 10,
        },
        {
            "client": 1,
            "acc_local": 0.6,
            "loss_local": 0.8,
            "acc_global": 0.4,
            "loss_global": 1.2,
            "num_test": 30,
        },
        {
            "client": 2,
            "acc_local": 0.95,
            "loss_local": 0.1,
            "acc_global": 0.6,
            "loss_global": 0.9,
            "num_test": 60,
        },
    ]
    summary = summarize_stage(rows, thresholds=[0.5, 0.8, 0.9])
    acc = summary["acc_local"]
    assert acc["mean"] == pytest.approx((0.9 + 0.6 + 0.95) / 3)
    assert acc["weighted_mean"] == pytest.approx((0.9 * 10 + 0.6 * 30 + 0.95 * 60) / 100)
    mean = (0.9 + 0.6 + 0.95) / 3
    assert acc["std"] == pytest.approx(
        math.sqrt(sum((v - mean) ** 2 for v in (0.9, 0.6, 0.95)) / 3)
    )
    assert acc["min"] == 0.6 and acc["bottom10_mean"] == 0.6
    assert (summary["rho_0.5"], summary["rho_0.8"], summary["rho_0.9"]) == (3, 2, 1)
    losses = [0.2, 0.8, 0.1]
    loss_mean = sum(losses) / 3
    assert summary["fairness_loss_var"] == pytest.approx(
        sum((v - loss_mean) ** 2 for v in losses) / 3
    )


def test_bottom_fraction_and_rho_edges() -> None:
    values = list(range(1, 21))  # 20 clients: the worst 10% are the 2 lowest
    assert bottom_fraction_mean([v / 20 for v in values]) == pytest.approx(1.5 / 20)
    assert rho([0.9, 0.9000001], [0.9]) == {"rho_0.9": 1}  # strictly above the threshold
