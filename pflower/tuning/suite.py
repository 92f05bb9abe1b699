"""A benchmark suite: the settings, the methods and the tuning budget, read from ``conf/suite``.

A suite file (``conf/suite/cpu.yaml``, or any path) holds::

    name: cpu
    budget: "..."              # what it costs, in words (trials, rounds, seeds, hours)
    trials: 12                 # trials per method and setting (the same for every method)
    tune_seed: 0               # the seed of the first study's tuning runs
    studies: 3                 # independent studies per method and setting (default 1)
    final_seeds: [1, 2, 3]     # the final runs' seeds (new: none may be the tuning seed)
    val_fraction: 0.2          # each client's validation share (split.val_fraction)
    train_knobs: [lr]          # the shared train.* options searched for every method
    space: {train.lr: {low: 1e-4, high: 1e-2}}   # narrower ranges for this suite (optional)
    search:                    # how a study spends its budget (optional; pflower.tuning.schedule)
      sampler: qmc             # quasi-random draws (default tpe)
      scheduler: halving       # successive halving (default median; none)
      budget_runs: 8           # compute per study in full runs (default: `trials` trials)
    methods: [fedavg, fedprox, ...]
    settings:
      - name: fmnist_dir01
        overrides: [+experiment=diversifed_table2_cpu, rounds=50]
        space: {train.lr: {low: 1e-4, high: 1e-2}}   # per setting (optional)
        train_knobs: [lr]                              # per setting (optional)
        methods: [fedavg, fedprox]                     # per setting (optional; default: all)
        per_method:                                    # (optional) where a method cannot run
          scaffold:                                    # the setting as it is
            overrides: [train.optimizer=sgd]
            space: {train.lr: {low: 1e-3, high: 0.3}}
            reason: "SCAFFOLD's control variates assume SGD"

Each method is tuned in ``studies`` independent studies (`Suite.study_ids`): study ``k``
draws its configurations and seeds its tuning runs with ``tune_seed + STUDY_SEED_STRIDE * k``
(`Suite.study_seed`), chooses its own values and runs them with every final seed, so the
leaderboard sees how much of a method's result is the search's luck (MLCommons' AlgoPerf, the
external tuning ruleset: several studies per submission "to estimate study variance and to rule
out lucky studies"). A suite of one study keeps the layout suites had before studies.

Every run of a setting is ``pflower <overrides> strategy=<method> ...``: composed from the same
``conf/`` tree as any other run. ``per_method`` adds overrides (and narrower or other ranges) for a
method that the setting's configuration refuses, for example SGD for SCAFFOLD in a setting that
trains with Adam; the leaderboard prints each such change with its reason, so a reader sees which
methods did not run exactly the setting's configuration. A method the setting refuses without a
``per_method`` entry is reported as not run, with the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

import pflower.strategies  # noqa: F401  (importing registers every algorithm)
from pflower.config import TrainConfig, conf_dir
from pflower.core.algorithm import ALGORITHMS, get_algorithm
from pflower.registry import ConfigError
from pflower.searchspace import Param, declared_space
from pflower.tuning.schedule import SearchPlan

STUDY_SEED_STRIDE = 1000
"""Study ``k``'s tuning seed is the suite's ``tune_seed`` + this x ``k``: far from the small final
seeds, which must differ from every tuning seed."""


@dataclass(frozen=True)
class Setting:
    """One comparison setting: a name and the Hydra overrides that compose it."""

    name: str
    overrides: tuple[str, ...]
    space: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    train_knobs: tuple[str, ...] | None = None
    """The shared ``train.*`` knobs tuned here (None: the suite's)."""
    per_method: Mapping[str, MethodChange] = field(default_factory=dict)
    """Changes for single methods (see the module docstring)."""
    methods: tuple[str, ...] | None = None
    """The methods compared here (None: the suite's)."""
    extra: tuple[str, ...] = ()
    """Overrides given on the command line (``pflower tune ... rounds=3``): applied last."""

    def own_overrides(self, method: str) -> tuple[str, ...]:
        """``method``'s own changes to the setting (its ``per_method`` overrides; none: ())."""
        change = self.per_method.get(method)
        return change.overrides if change else ()

    def rounds(self, method: str) -> int:
        """The rounds of ``method``'s runs here (composing them: a refused method raises
        `ConfigError`)."""
        from pflower.compose import compose_config

        overrides = self.overrides_for(method, [f"strategy={method}"])
        return int(compose_config(list(overrides), check_scheme=False).rounds)

    def overrides_for(self, method: str, then: Sequence[str] = ()) -> tuple[str, ...]:
        """The overrides of ``method``'s runs here: the setting's, the method's own changes,
        ``then`` (the run's own: strategy, seed, values) and the command line's, last."""
        return (*self.overrides, *self.own_overrides(method), *then, *self.extra)


@dataclass(frozen=True)
class MethodChange:
    """How one method's runs differ from the setting's configuration, and why."""

    overrides: tuple[str, ...] = ()
    space: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True)
class Suite:
    """A suite file, validated (see the module docstring)."""

    name: str
    methods: tuple[str, ...]
    settings: tuple[Setting, ...]
    trials: int = 12
    tune_seed: int = 0
    final_seeds: tuple[int, ...] = (1, 2, 3)
    val_fraction: float = 0.2
    train_knobs: tuple[str, ...] = ("lr",)
    space: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    search: SearchPlan = field(default_factory=SearchPlan)
    studies: int = 1
    budget: str = ""
    source: str = ""

    def study_ids(self) -> list[int | None]:
        """The studies of each method and setting: ``[None]`` for a suite of one (the layout
        of suites before studies: ``chosen/<method>.yaml``), else ``0 .. studies - 1``."""
        return [None] if self.studies == 1 else list(range(self.studies))

    def study_seed(self, study: int | None) -> int:
        """The tuning seed of ``study``: it seeds the study's draws and its tuning runs."""
        return self.tune_seed + STUDY_SEED_STRIDE * (study or 0)

    @property
    def tune_seeds(self) -> list[int]:
        return [self.study_seed(study) for study in self.study_ids()]

    def methods_of(self, setting: Setting) -> tuple[str, ...]:
        """The methods compared in ``setting``: its own list, else the suite's."""
        return self.methods if setting.methods is None else setting.methods

    def setting(self, name: str) -> Setting:
        for setting in self.settings:
            if setting.name == name:
                return setting
        names = ", ".join(s.name for s in self.settings)
        raise ConfigError(f"suite {self.name!r} has no setting {name!r}; it has {names}")

    def space_for(self, method: str, setting: Setting | None = None) -> dict[str, Param]:
        """The search space of ``method`` here: the suite's shared ``train.*`` knobs, then the
        method's own declared options, with the suite's, the setting's and the setting's
        ``per_method`` ranges."""
        shared = declared_space(TrainConfig, "train")
        knobs = (
            self.train_knobs
            if setting is None or setting.train_knobs is None
            else (setting.train_knobs)
        )
        space = {f"train.{knob}": shared[f"train.{knob}"] for knob in knobs}
        space.update(declared_space(get_algorithm(method).options, "strategy"))
        own = setting.per_method.get(method) if setting else None
        for changes in (self.space, setting.space if setting else {}, own.space if own else {}):
            for key, change in changes.items():
                if key in space:
                    space[key] = space[key].with_bounds(change)
        return space


def _tuple(value: Any, what: str) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"suite key {what} must be a list, got {value!r}")
    return tuple(value)


def resolve_suite_path(name_or_path: str) -> Path:
    """``cpu`` -> ``conf/suite/cpu.yaml``; a path is taken as it is."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = conf_dir() / "suite" / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in (conf_dir() / "suite").glob("*.yaml"))
    raise ConfigError(f"no suite {name_or_path!r}: give a YAML path or one of {', '.join(known)}")


def _method_change(where: str, data: Any) -> MethodChange:
    if not isinstance(data, Mapping) or set(data) - {"overrides", "space", "reason"}:
        raise ConfigError(f"{where}: expected a mapping of overrides, space and reason")
    if not data.get("reason"):
        raise ConfigError(f"{where}: say why this method's runs differ (reason: ...)")
    return MethodChange(
        tuple(str(o) for o in _tuple(data.get("overrides", []), "overrides")),
        dict(data.get("space") or {}),
        str(data["reason"]),
    )


def load_suite(name_or_path: str) -> Suite:
    """Read and check a suite file (unknown keys, methods or shared knobs fail with the fix)."""
    path = resolve_suite_path(name_or_path)
    data = yaml.safe_load(path.read_text()) or {}
    allowed = {f for f in Suite.__dataclass_fields__ if f != "source"} | {"pruner"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    settings = tuple(
        Setting(
            str(s["name"]),
            tuple(str(o) for o in _tuple(s.get("overrides", []), "overrides")),
            dict(s.get("space") or {}),
            None if s.get("train_knobs") is None else tuple(s["train_knobs"]),
            {
                str(method): _method_change(f"{path}: {s['name']}.per_method.{method}", change)
                for method, change in (s.get("per_method") or {}).items()
            },
            None if s.get("methods") is None else tuple(str(m) for m in s["methods"]),
        )
        for s in data.get("settings", [])
    )
    if not settings:
        raise ConfigError(f"{path}: a suite needs at least one entry under settings")
    suite = Suite(
        name=str(data.get("name", path.stem)),
        methods=tuple(str(m) for m in _tuple(data.get("methods", []), "methods")),
        settings=settings,
        trials=int(data.get("trials", 12)),
        tune_seed=int(data.get("tune_seed", 0)),
        final_seeds=tuple(int(s) for s in _tuple(data.get("final_seeds", [1, 2, 3]), "seeds")),
        val_fraction=float(data.get("val_fraction", 0.2)),
        train_knobs=tuple(str(k) for k in _tuple(data.get("train_knobs", ["lr"]), "knobs")),
        space=dict(data.get("space") or {}),
        search=SearchPlan.from_suite(data.get("search") or {}, data.get("pruner") or {}),
        studies=int(data.get("studies", 1)),
        budget=str(data.get("budget", "")),
        source=str(path),
    )
    check_suite(suite)
    _check_per_method(suite)
    return suite


def _check_per_method(suite: Suite) -> None:
    """A setting's ``methods`` and ``per_method`` name methods of the suite, and a change's
    ranges name keys of that method's space there."""
    for setting in suite.settings:
        where = f"suite {suite.name}: setting {setting.name}"
        strays = sorted(set(setting.methods or ()) - set(suite.methods))
        if strays:
            raise ConfigError(f"{where} compares methods {strays} that the suite does not list")
        strays = sorted(set(setting.per_method) - set(suite.methods))
        if strays:
            raise ConfigError(f"{where} changes methods {strays} that the suite does not list")
        for method, change in setting.per_method.items():
            known = suite.space_for(method, replace(setting, per_method={}))
            unknown = sorted(set(change.space) - set(known))
            if unknown:
                raise ConfigError(
                    f"{where}: per_method.{method}.space names {unknown}, which {method} does "
                    f"not search here; it searches {', '.join(known)}"
                )


def check_suite(suite: Suite) -> None:
    """Reject what would make the comparison unfair or impossible, before anything runs."""
    unknown = sorted(set(suite.methods) - set(ALGORITHMS))
    if unknown:
        raise ConfigError(f"suite {suite.name}: unknown methods {unknown}")
    shared = declared_space(TrainConfig, "train")
    knobs = [*suite.train_knobs, *(k for s in suite.settings for k in s.train_knobs or ())]
    bad = sorted({k for k in knobs if f"train.{k}" not in shared})
    if bad:
        names = ", ".join(k.removeprefix("train.") for k in shared)
        raise ConfigError(
            f"suite {suite.name}: train_knobs {bad} are not tunable; tunable: {names}"
        )
    if set(suite.tune_seeds) & set(suite.final_seeds):
        raise ConfigError(
            f"suite {suite.name}: final_seeds {list(suite.final_seeds)} must be new seeds, "
            f"not the tuning seeds {suite.tune_seeds}"
        )
    if suite.trials < 1 or suite.studies < 1 or not 0.0 < suite.val_fraction < 1.0:
        raise ConfigError(
            f"suite {suite.name}: need trials >= 1, studies >= 1 and 0 < val_fraction < 1"
        )
