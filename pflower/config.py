"""Compose and validate the experiment configuration.

One Hydra tree (``conf/``) describes every experiment. ``pflower`` composes it with ``@hydra.main``;
the Flower apps compose the same tree from the Hydra overrides carried in Flower's run config under
the single key :data:`RUN_CONFIG_KEY`, so ``pflower ...``, ``flwr run .`` and a deployment all run
the same experiment.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from pflower.registry import ConfigError

RUN_CONFIG_KEY = "overrides"
"""The run-config key (``[tool.flwr.app.config]``) that carries the Hydra overrides."""

_PACKAGE_DIR = Path(__file__).resolve().parent


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


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra ``overrides`` and validate the result.

    Works both inside ``@hydra.main`` (Hydra already initialized on our tree) and in a fresh process
    such as a Ray worker or a SuperNode's ClientApp.
    """
    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config", overrides=list(overrides))
    else:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="config", overrides=list(overrides))
    validate(cfg)
    return cfg


def overrides_to_string(overrides: Sequence[str]) -> str:
    """Pack Hydra overrides into the single run-config string (shell quoting preserved)."""
    return shlex.join(overrides)


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """Unpack the Hydra overrides that a Flower run config carries."""
    return shlex.split(str(run_config.get(RUN_CONFIG_KEY, "")))


def config_from_run_config(run_config: Mapping[str, Any]) -> DictConfig:
    """The experiment configuration that a Flower run config describes (cached per process:
    Flower builds a client for every message, and composing takes tens of milliseconds)."""
    return _compose_cached(tuple(overrides_from_run_config(run_config)))


@lru_cache(maxsize=8)
def _compose_cached(overrides: tuple[str, ...]) -> DictConfig:
    cfg = compose_config(overrides)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Reject impossible run-level values with a message that says what is allowed.

    Options of datasets, partitions, models and strategies are checked where they are built
    (against the factory's signature, see :mod:`pflower.registry`).
    """
    _require(
        isinstance(cfg.num_clients, int) and cfg.num_clients >= 1,
        f"num_clients must be an integer >= 1, got {cfg.num_clients!r}",
    )
    _require(
        isinstance(cfg.rounds, int) and cfg.rounds >= 1,
        f"rounds must be an integer >= 1, got {cfg.rounds!r}",
    )
    _require(
        isinstance(cfg.seed, int) and cfg.seed >= 0,
        f"seed must be an integer >= 0, got {cfg.seed!r}",
    )
    _require(0.0 < cfg.fraction <= 1.0, f"fraction must be in (0, 1], got {cfg.fraction!r}")
    _require(
        1 <= cfg.min_clients <= cfg.num_clients,
        f"min_clients must be between 1 and num_clients={cfg.num_clients}, got {cfg.min_clients}",
    )
    train = cfg.train
    _require(
        train.optimizer in ("sgd", "adam"),
        f"train.optimizer must be 'sgd' or 'adam', got {train.optimizer!r}",
    )
    _require(train.lr > 0, f"train.lr must be > 0, got {train.lr!r}")
    _require(0 < train.lr_decay <= 1, f"train.lr_decay must be in (0, 1], got {train.lr_decay!r}")
    _require(train.batch_size >= 1, f"train.batch_size must be >= 1, got {train.batch_size!r}")
    _require(train.local_epochs >= 0, f"train.local_epochs must be >= 0, got {train.local_epochs}")
    _require(
        train.local_steps is None or train.local_steps >= 1,
        f"train.local_steps must be null or >= 1, got {train.local_steps!r}",
    )
    _require(train.momentum >= 0, f"train.momentum must be >= 0, got {train.momentum!r}")
    _require(train.threads >= 1, f"train.threads must be >= 1, got {train.threads!r}")
    _require(cfg.eval.every >= 1, f"eval.every must be >= 1, got {cfg.eval.every!r}")
    _require(
        0.0 < cfg.eval.fraction <= 1.0,
        f"eval.fraction must be in (0, 1], got {cfg.eval.fraction!r}",
    )
    _require(
        all(0.0 < t < 1.0 for t in cfg.eval.rho_thresholds),
        f"eval.rho_thresholds must lie in (0, 1), got {list(cfg.eval.rho_thresholds)}",
    )
    _require(
        0.0 <= cfg.failures.max_failed_fraction < 1.0,
        f"failures.max_failed_fraction must be in [0, 1), got {cfg.failures.max_failed_fraction}",
    )


def options_of(block: DictConfig) -> dict[str, Any]:
    """A config block's options: everything except its ``name``, as plain Python values."""
    options = OmegaConf.to_container(block, resolve=True)
    assert isinstance(options, dict)
    options.pop("name", None)
    return options
