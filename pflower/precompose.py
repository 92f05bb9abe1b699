"""Compose a command line's overrides in full before Hydra runs them (``pflower``,
``pflower -m``, ``pflower partition``).

[`pflower.quickcheck`][pflower.quickcheck] reports a wrong key or value type before torch,
Flower and Ray are imported; this check follows it, once they are: every value that a run or a
sweep would compose is composed, and a sweep's folder is claimed, before Hydra writes anything.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from pflower.quickcheck import write_schema_cache
from pflower.registry import ConfigError
from pflower.results.ownership import RunDirTakenError, claim_run_dir

MULTIRUN_FLAGS = ("-m", "--multirun")


def check_overrides(arguments: Sequence[str]) -> None:
    """Compose a single run's overrides before Hydra does, so that a wrong key, type or value
    is reported with our message (naming what is allowed). A sweep (``-m``) is checked the
    same way, each value of each swept key composed once (`_sweep_variants`), before Hydra
    makes the sweep's folder, which is claimed (`_claim_sweep_dir`). Hydra's other flags are
    left to Hydra, which reports such errors itself.

    Raises:
        ConfigError: what is wrong (``pflower`` ends with it and exit code 2, nothing written).
    """
    sweep = any(argument in MULTIRUN_FLAGS for argument in arguments)
    arguments = [a for a in arguments if a not in MULTIRUN_FLAGS]
    if any(argument.startswith("-") for argument in arguments):
        return
    overrides = [a for a in arguments if not a.lstrip("+~").startswith("hydra")]
    write_schema_cache()  # for the check before imports, next time
    if sweep:
        from pflower.compose import compose_config

        for variant in _sweep_variants(overrides):
            compose_config(variant, check_scheme=False)
        _claim_sweep_dir(arguments)
    else:
        _compose_run(overrides)


def _compose_run(overrides: Sequence[str]) -> None:
    """Compose a single run's overrides. Where they name the run's folder (``output_dir``) and
    do not resume, as its run record will give them to its apps (the folder resolved, and last:
    [`compose_record`][pflower.compose.compose_record]), into the process's cache, where the
    run's ServerApp and forked workers then find them composed (a composition costs 0.2-0.3 s;
    a tuning trial ran it twice); otherwise as given."""
    from pflower.compose import compose_config, compose_record

    folder = _given_folder(overrides)
    if folder is None:
        compose_config(overrides, check_scheme=False)
    else:
        compose_record(overrides, run_dir=folder.resolve())


def _given_folder(overrides: Sequence[str]) -> Path | None:
    """The ``output_dir`` that ``overrides`` set (the last, unquoted as Hydra reads it), or None:
    none given, ``null``, an interpolation, a run that resumes, or overrides that Hydra cannot
    parse (the full composition reports those)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None
    values = {override.key_or_group: override.value() for override in parsed}
    folder = values.get("output_dir")
    if "checkpoint.resume" in values or not isinstance(folder, str) or not folder:
        return None
    if "${" in folder:  # an interpolation: what it names is Hydra's to resolve
        return None
    return Path(folder)


def _claim_sweep_dir(arguments: Sequence[str]) -> None:
    """A sweep into the folder of an earlier sweep (``hydra.sweep.dir``, holding its
    ``multirun.yaml``) is refused, before Hydra writes its own there, unless ``overwrite=true``:
    then the earlier sweep's job folders are deleted, each under its claim (refused while a
    live run writes it), so that none of its jobs mixes with the new sweep's."""
    given = [a.split("=", 1)[1] for a in arguments if a.startswith("hydra.sweep.dir=")]
    if not given or not (sweep_dir := Path(given[-1])).joinpath("multirun.yaml").is_file():
        return
    if "overwrite=true" not in arguments:
        raise RunDirTakenError(
            f"{sweep_dir} holds another sweep (multirun.yaml): choose another "
            "hydra.sweep.dir, or pass overwrite=true to replace its runs"
        )
    for job in sweep_dir.iterdir():
        if job.name.isdigit() and job.is_dir():
            with claim_run_dir(job, overwrite=True, resuming=False):
                shutil.rmtree(job)


def _sweep_variants(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of a sweep's first job, and for each further value of each swept key the
    same with that value: every value is composed once (not every combination, which Hydra
    composes again before it launches the jobs). None for a sweep over ``glob(...)`` choices or
    a range that is not discrete (another sweeper's), which only Hydra can expand.

    Raises:
        ConfigError: an override that does not parse.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if any("glob(" in override for override in overrides):
        return []
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        raise ConfigError(f"{error}".strip()) from error
    by_key: dict[str, list[str]] = {}  # a key given twice: the last one counts, as in Hydra
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            by_key[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            by_key[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            return []
    choices = list(by_key.values())
    first = [values[0] for values in choices]
    return [first] + [
        [*first[:index], value, *first[index + 1 :]]
        for index, values in enumerate(choices)
        for value in values[1:]
    ]
