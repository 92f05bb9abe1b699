"""The run record: one run, as it travels between pflower's parts.

A run is its experiment (the Hydra overrides of ``conf/config.yaml`` that compose it, and the
configuration they compose), the folder it writes (``output_dir``) and whether it continues
that folder's checkpoint (``checkpoint.resume``). The command line composes a
[`RunRecord`][pflower.config.record.RunRecord] once and hands it on: to the simulation, to a
deployment (``pflower deploy run``), to a tuning trial's process; the ServerApp reads it back
from Flower's run config.

Where a run crosses a process or Flower's run config it is written in one form, the Hydra
overrides of the experiment followed by ``output_dir=`` and ``checkpoint.resume=true``
([`to_overrides`][pflower.config.record.RunRecord.to_overrides] and
[`from_overrides`][pflower.config.record.RunRecord.from_overrides]): a process's command line
carries the list, Flower's run config one shell-quoted string of it under
[`RUN_CONFIG_KEY`][pflower.config.RUN_CONFIG_KEY]
([`to_run_config`][pflower.config.record.RunRecord.to_run_config] and
[`from_run_config`][pflower.config.record.RunRecord.from_run_config]), which is what ``flwr run
. --run-config 'overrides="..."'`` gives too. This module is the only code that reads or writes
those two keys in override strings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import BooleanNode, DictConfig
from omegaconf.errors import ValidationError

from pflower.config.base import RUN_CONFIG_KEY, overrides_from_run_config, overrides_to_string
from pflower.registry import ConfigError

RUN_DIR_KEY = "output_dir"
"""The key of the folder a run writes."""

RESUME_KEY = "checkpoint.resume"
"""The key that makes a run continue its folder's checkpoint."""

Composer = Callable[[Sequence[str]], DictConfig]
"""Composes Hydra overrides into the configuration (``pflower.compose`` passes its own)."""


@dataclass(frozen=True)
class RunRecord:
    """One run: its experiment, its folder, its resume point.

    Attributes:
        overrides: the Hydra overrides that compose the experiment, in the order given, without
            the run's folder and resume point. They are the run's provenance: a checkpoint
            stores them, and ``pflower resume`` composes the run again from them.
        run_dir: the folder the run writes (``output_dir``); None where none was given (a plain
            ``flwr run``: the ServerApp then picks ``runs/<date>/<time>``).
        resume: whether the run continues ``run_dir``'s checkpoint (``checkpoint.resume``).
        config: the configuration the overrides compose, where this process composed it; None
            in a record that another process composes (a tuning trial's command line).
    """

    overrides: tuple[str, ...]
    run_dir: Path | None = None
    resume: bool = False
    config: DictConfig | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for override in self.overrides:
            if _key(override) in (RUN_DIR_KEY, RESUME_KEY):
                raise ConfigError(
                    f"a run record's overrides hold the experiment only, not {override!r}: "
                    f"give the folder as run_dir and the resume point as resume "
                    "(RunRecord.from_overrides reads them out of a command line)"
                )
        if self.resume and self.run_dir is None:
            raise ConfigError(
                f"{RESUME_KEY}=true needs the folder to resume: set {RUN_DIR_KEY}=<run dir>"
            )

    @property
    def composed(self) -> DictConfig:
        """The composed configuration.

        Raises:
            ValueError: this record was not composed in this process.
        """
        if self.config is None:
            raise ValueError("this run record was not composed in this process")
        return self.config

    def with_config(self, config: DictConfig) -> RunRecord:
        """This record holding ``config``, the configuration its overrides compose."""
        return replace(self, config=config)

    def with_default(self, key: str, value: object) -> RunRecord:
        """This record with ``key=value`` before its overrides, unless they set ``key``
        (``pflower deploy run``'s ``num_clients``: the deployment's node count)."""
        if any(_key(override) == key for override in self.overrides):
            return self
        return replace(self, overrides=(f"{key}={value}", *self.overrides))

    def to_overrides(self) -> list[str]:
        """The run as Hydra overrides: the experiment's, then the folder and the resume point."""
        where = [] if self.run_dir is None else [f"{RUN_DIR_KEY}={self.run_dir}"]
        return [*self.overrides, *where, *([f"{RESUME_KEY}=true"] if self.resume else [])]

    @classmethod
    def from_overrides(
        cls,
        overrides: Sequence[str],
        config: DictConfig | None = None,
        *,
        run_dir: Path | None = None,
        resume: bool | None = None,
    ) -> RunRecord:
        """The run that Hydra ``overrides`` describe (and ``config`` holds, if composed).

        ``output_dir=`` and ``checkpoint.resume=`` are taken out of the overrides; the folder
        and the resume point are what ``config`` composed of them, or, in a record not composed
        here, what they say (the last of each counts, as in Hydra; ``output_dir=null`` names no
        folder). ``run_dir`` and ``resume``, where given, replace both: the caller decided them.

        Raises:
            ConfigError: a ``checkpoint.resume`` value that is not a boolean, or a run that
                resumes without a folder.
        """
        experiment = [o for o in overrides if _key(o) not in (RUN_DIR_KEY, RESUME_KEY)]
        if config is None:
            given_dir, given_resume = _written_run(overrides)
        else:
            given_dir = Path(config.output_dir) if config.output_dir else None
            given_resume = bool(config.checkpoint.resume)
        return cls(
            tuple(experiment),
            given_dir if run_dir is None else run_dir,
            given_resume if resume is None else resume,
            config,
        )

    def to_run_config(self) -> dict[str, str]:
        """Flower's run config for this run (``override_config`` of a simulation, the
        ``--run-config`` file of ``flwr run``)."""
        return {RUN_CONFIG_KEY: overrides_to_string(self.to_overrides())}

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], compose: Composer) -> RunRecord:
        """The run that Flower's ``run_config`` carries, composed with ``compose``."""
        overrides = overrides_from_run_config(run_config)
        return cls.from_overrides(overrides, compose(overrides))


def _key(override: str) -> str:
    """The key an override sets (``+key=`` and ``++key=`` set ``key``)."""
    return override.partition("=")[0].lstrip("+")


def _written_run(overrides: Sequence[str]) -> tuple[Path | None, bool]:
    """The folder and the resume point that ``overrides`` write (the last of each counts)."""
    run_dir: Path | None = None
    resume = False
    for override in overrides:
        key, _, value = override.partition("=")
        if _key(override) == RUN_DIR_KEY:
            run_dir = None if value in ("", "null") else Path(value)
        elif _key(override) == RESUME_KEY:
            resume = _boolean(key, value)
    return run_dir, resume


def _boolean(key: str, value: str) -> bool:
    """``value`` read as Hydra reads a boolean (true/false, yes/no, on/off, 1/0)."""
    try:
        return bool(BooleanNode().validate_and_convert(value))
    except ValidationError:
        raise ConfigError(f"{key} must be true or false, got {value!r}") from None
