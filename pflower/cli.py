"""Command line: ``pflower [overrides]`` runs an experiment; subcommands inspect and report.

- ``pflower <hydra overrides>``: run the composed experiment as a Flower simulation (Ray backend);
  ``pflower -m <sweep overrides>`` runs a Hydra multirun sweep, one run directory per job.
- ``pflower partition <hydra overrides>``: print the partition's per-client sizes and class
  histograms and write a heatmap PNG, without training.
- ``pflower partition import pflib|leaf <path> [overrides]``: turn a PFLlib or LEAF dataset
  folder into a ``partition=from_file`` file that keeps each client's own train/test split
  ([`pflower.partition_import`][pflower.partition_import]).
- ``pflower report <sweep or run dirs>...``: compare methods over partitions and seeds
  ([`pflower.reporting.report`][pflower.reporting.report]); it takes paths, not Hydra overrides.
- ``pflower tune [methods] --suite cpu``: tune methods on validation with the same Optuna budget
  and run the chosen values with new seeds on test ([`pflower.tuning.cli`][pflower.tuning.cli]).
- ``pflower resume <run_dir> [rounds=N]``: continue a run from its last checkpoint (or extend
  it to N rounds); see `RESUME_HELP`.
- ``pflower --help`` (``help``, ``help <command>``), ``pflower --version`` and a mistyped command
  are answered before anything heavy is imported ([`pflower.commands`][pflower.commands], whose
  `SUBCOMMANDS` is the table `main` dispatches by);
  ``pflower --help-config`` is Hydra's help, every configuration group and key.
- ``pflower reproduce <run_dir>``: rerun a recorded run from its record and compare every metric
  to the last digit; ``--stored <folder> --suite <suite>`` does it for one stored run of each
  method whose recorded code differs, and records those that match
  ([`pflower.reproduce`][pflower.reproduce]).

A configuration error, a missing or corrupt dataset, or a tracker (``tracking=...``) that is not
installed ends a run or ``pflower partition`` with the message and exit code 2, before anything
starts; so does an ``output_dir`` that holds another run (without ``overwrite=true``) or that a
live run is writing (``pflower.results.ownership``), and a sweep with a value that does not
compose ([`pflower.precompose`][pflower.precompose]).

A run is handed on as one [`RunRecord`][pflower.config.record.RunRecord] (its overrides, run
directory and resume point), composed once here.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pflower.commands import HelpFormatter, answer, resolve, subcommand
from pflower.console import console, escape
from pflower.core.errors import ResultsNotWrittenError
from pflower.partition_import import partition_import
from pflower.precompose import check_overrides
from pflower.quickcheck import check_before_imports, hold_numerics_of
from pflower.registry import ConfigError
from pflower.results.ownership import (
    RunDirClaim,
    RunDirTakenError,
    claim_run_dir,
    refuse_another_run,
)
from pflower.runtime.logs import plain_flower_console_unless_tty

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pflower.config import ExperimentConfig


def __getattr__(name: str) -> type[Exception]:
    """``DatasetNotFoundError`` and ``CorruptDatasetError``, the dataset errors that end a
    command with exit code 2, imported on first use: they come with torch, which reporting a
    configuration error does not need ([`pflower.quickcheck`][pflower.quickcheck])."""
    if name == "DatasetNotFoundError":
        from pflower.datasets.base import DatasetNotFoundError

        return DatasetNotFoundError
    if name == "CorruptDatasetError":
        from pflower.datasets.sources import CorruptDatasetError

        return CorruptDatasetError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task)


def _quiet_flower_console(progress: bool) -> None:
    """Flower logs to its own console handler (and to run.log); Hydra's root handler would
    print every line twice. With the live view on, the console shows only Flower's warnings."""
    from pflower.runtime.logs import quiet_flower_console

    quiet_flower_console(progress)


def _preflight(cfg: DictConfig, settings: ExperimentConfig) -> None:
    """Fail before the simulation starts, with the message and exit code 2: a tracker that is not
    installed, a dataset that is missing or corrupt, a partition that cannot be made (an unknown
    scheme or option, or one the data cannot satisfy). The federation is built here, or read from
    the cache when this machine built it before; the ServerApp, which runs in this process, then
    reads the cached copy. A cached federation was accepted by its scheme when it was stored, so
    a run that reads one never imports the schemes (with Flower Datasets, about 200 MB and 1-3 s
    of start-up)."""
    from pflower.core.experiment import Experiment
    from pflower.results.tracking import import_tracker

    import_tracker(settings.tracking.name)
    _ = Experiment.of(cfg).federation


def _run_dir(cfg: DictConfig) -> Path:
    """Where a run (or ``pflower partition``) writes: ``output_dir``; else a sweep job's
    directory, or the ``hydra.run.dir`` given on the command line; else ``runs/<date>/<time>``.
    Hydra itself writes nothing there (``conf/config.yaml``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if cfg.output_dir:
        return Path(cfg.output_dir)
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    if HydraConfig.get().mode == RunMode.MULTIRUN or hydra_dir.resolve() != Path.cwd().resolve():
        return hydra_dir
    stamped = Path("runs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    # a run started in the same second as another gets a folder of its own
    later = (stamped.with_name(f"{stamped.name}-{n}") for n in itertools.count(2))
    return next(path for path in itertools.chain([stamped], later) if not path.exists())


class UnwritableRunDirError(ConfigError):
    """The run directory cannot be written (exit code 2, also in a sweep: no job could record
    anything there)."""


def _writable(run_dir: Path) -> None:
    """Refuse (exit code 2) a run directory that cannot be written, before anything starts."""
    from pflower.results.disk import check_writable

    try:
        check_writable(run_dir)
    except OSError as error:
        raise UnwritableRunDirError(
            f"cannot write results to {run_dir} ({error.strerror or error}): "
            "choose another output_dir"
        ) from error


def _simulate(cfg: DictConfig) -> None:
    """Run one experiment. In a multirun sweep a failed job is recorded in its run directory
    (``summary.json`` with ``"status": "failed"``, ``error.txt``) and the sweep goes on; a single
    run re-raises, so the exit code says it failed. SIGTERM or SIGINT record the run as failed
    (``interrupted by SIGTERM``) before the process ends."""

    run_dir = _run_dir(cfg)
    try:
        from pflower.compose import validate

        settings = validate(cfg, check_scheme=False)
        if not (settings.overwrite or settings.checkpoint.resume):
            refuse_another_run(run_dir)  # at once, not after the data are prepared
        _preflight(cfg, settings)
        _writable(run_dir)
    except Exception as error:
        _job_failed(run_dir, cfg, error)
        return
    with _claimed(run_dir, cfg):
        try:
            _quiet_flower_console(settings.progress)
            from pflower.config import RunRecord

            record = RunRecord.from_overrides(_task_overrides(), cfg, run_dir=run_dir.resolve())
            console.print(
                f"[bold]pflower[/] {settings.strategy.label()} on {cfg.dataset.name} / "
                f"{cfg.partition.name}, {settings.num_clients} clients, {settings.rounds} rounds "
                f"-> {run_dir}"
            )
            from pflower.results.failures import summary_on_signal
            from pflower.simulation import run_experiment

            with summary_on_signal(run_dir, cfg):
                run_experiment(settings, record)
        except Exception as error:
            _job_failed(run_dir, cfg, error)


def _claimed(run_dir: Path, cfg: DictConfig) -> RunDirClaim:
    """Claim ``run_dir`` for this run (``pflower.results.ownership``): refused (exit code 2)
    where it holds another run, unless ``overwrite=true`` or the run resumes it, or where a live
    run is writing it."""
    return claim_run_dir(
        run_dir, overwrite=bool(cfg.overwrite), resuming=bool(cfg.checkpoint.resume)
    )


def _job_failed(run_dir: Path, cfg: DictConfig, error: Exception) -> None:
    """Re-raise ``error`` in a single run. In a sweep, record it in the job's ``run_dir`` and go
    on, unless no job could record anything there: a folder that cannot be written, or that
    another run owns (then the sweep stops, exit code 2)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.get().mode != RunMode.MULTIRUN or isinstance(
        error, UnwritableRunDirError | RunDirTakenError
    ):
        raise error
    from pflower.results.failures import record_failure

    if not isinstance(error, ResultsNotWrittenError):  # that one recorded itself
        with _claimed(run_dir, cfg):
            record_failure(run_dir, cfg, error)
    console.print(
        f"[red]job failed:[/] {escape(str(error))}\n  recorded in {run_dir}; the sweep goes on"
    )


def _partition(cfg: DictConfig) -> None:
    from pflower.compose import validate

    validate(cfg)
    if cfg.split.get("evaluate_on") == "val":
        raise ConfigError(
            "pflower partition writes and reports the real test shares: drop "
            "split.evaluate_on=val (it only changes which shares a run evaluates on)"
        )
    from pflower.core.experiment import Experiment
    from pflower.datasets.partitioners.from_file import write_federation
    from pflower.datasets.report import report_partition

    out_dir = _run_dir(cfg)
    _writable(out_dir)
    federation = Experiment.of(cfg).federation
    title = f"{cfg.dataset.name}, partition={cfg.partition.name}, {cfg.num_clients} clients"
    written = report_partition(federation, out_dir, console, title=title)
    console.print(f"partition report written to {written}")
    indices = write_federation(
        out_dir / "partition_indices.json",
        federation,
        cfg.split.pool,
        own_tests=cfg.split.client_test == "file",
    )
    console.print(f"client index lists (partition=from_file) written to {indices}")


PARTITION_HELP = """\
Split the dataset among the clients as a run with the same overrides would, without training:
print each client's number of samples and class histogram, and write into output_dir (default
runs/<date>/<time>) the heatmap, the histograms as CSV, a JSON summary and
partition_indices.json, the clients' index lists that partition=from_file reads back."""


def partition_parser() -> argparse.ArgumentParser:
    """The parser that describes ``pflower partition`` (its arguments are Hydra overrides,
    parsed by Hydra)."""
    parser = argparse.ArgumentParser(
        prog="pflower partition",
        description=PARTITION_HELP,
        epilog="pflower partition import pflib|leaf <folder> [overrides] turns a PFLlib or LEAF "
        "folder into a partition file that keeps each client's own test set (pflower partition "
        "import --help).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="Hydra overrides, as for a run: dataset=, partition=, partition.KEY=, "
        "num_clients=, seed=, output_dir=",
    )
    return parser


@dataclass(frozen=True)
class GuardedTask:
    """Hydra's task function: runs ``task`` and turns a configuration or dataset error into its
    message and exit code 2, and a run stopped by a write of its results that failed (recorded
    in its ``summary.json``) into its message and exit code 1.

    A module-level class rather than a closure, so that launchers which send the task function
    to other processes (``hydra/launcher=joblib``: loky pickles it with cloudpickle) pickle it by
    reference. A closure is pickled by value together with the globals it uses, among them this
    module's rich ``console``, whose lock cannot be pickled ("cannot pickle '_thread.RLock'").
    """

    task: Callable[[DictConfig], None]

    def __call__(self, cfg: DictConfig) -> None:
        from pflower.datasets.base import DatasetNotFoundError
        from pflower.datasets.sources import CorruptDatasetError

        try:
            self.task(cfg)
        except ConfigError as error:
            console.print(f"[red]configuration error:[/] {escape(str(error))}")
            sys.exit(2)
        except (DatasetNotFoundError, CorruptDatasetError) as error:
            console.print(f"[red]dataset error:[/] {escape(str(error))}")
            sys.exit(2)
        except ResultsNotWrittenError as error:
            console.print(f"[red]run failed:[/] {escape(str(error))}")
            sys.exit(1)


def _hydra_entry(task: Callable[[DictConfig], None]) -> Callable[[], None]:
    import hydra

    import pflower.compose  # noqa: F401  (stores every schema and algorithm in the ConfigStore)
    from pflower.config import conf_dir

    main = hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)
    entry: Callable[[], None] = main(GuardedTask(task))
    return entry


def _check_before_imports(arguments: Sequence[str]) -> None:
    """Report a wrong key, value type or option name in a run's (or ``pflower partition``'s)
    overrides before torch, Flower and Ray are imported
    ([`pflower.quickcheck`][pflower.quickcheck]); the full
    check (`_check_overrides`) follows. A process that imported torch already (a run forked
    by `pflower tune`'s fork server) has nothing to gain from it: the full check comes at once,
    and the quick one would compose the run a second time (0.3 s of every trial)."""
    if "torch" in sys.modules or any(argument.startswith("-") for argument in arguments):
        return
    try:
        check_before_imports([a for a in arguments if not a.lstrip("+~").startswith("hydra")])
    except ConfigError as error:
        console.print(f"[red]configuration error:[/] {escape(str(error))}")
        sys.exit(2)


def _check_overrides(arguments: Sequence[str]) -> None:
    """Compose a run's overrides, or each value of a sweep's, before Hydra does
    ([`pflower.precompose.check_overrides`][pflower.precompose.check_overrides]): a wrong key,
    type or value ends with our message (naming what is allowed) and exit code 2."""
    try:
        check_overrides(arguments)
    except ConfigError as error:
        console.print(f"[red]configuration error:[/] {escape(str(error))}")
        sys.exit(2)


RESUME_HELP = """\
Continue a run from its last checkpoint (checkpoint.pkl in the run directory, written every
checkpoint.every rounds and after the last one), with its clients' state snapshots. The run goes
on with the overrides it was started with; pass rounds=N to extend it to N rounds. Only rounds
and how the run executes (output_dir, progress, checkpoint.*, client_state.*, tracking,
backend.*, timeouts) may differ from the checkpoint's configuration: anything else, a missing
or corrupt checkpoint, or a run directory changed since the checkpoint (any byte of metrics.jsonl
up to the checkpoint: the checkpoint holds its SHA-256 digest) is refused with the reason and
exit code 2, and nothing is written. A run that already completed its rounds is left as it is:
one line says so (exit code 0); pass rounds=N to extend it."""


def resume_parser() -> argparse.ArgumentParser:
    """The parser of ``pflower resume``."""
    parser = argparse.ArgumentParser(
        prog="pflower resume", description=RESUME_HELP, formatter_class=HelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="the run directory to continue")
    parser.add_argument("overrides", nargs="*", help="e.g. rounds=N to extend the run")
    return parser


def resume(argv: Sequence[str]) -> int:
    """``pflower resume <run_dir> [overrides]``: continue a run from its checkpoint."""
    args = resume_parser().parse_args(list(argv))
    from pflower.compose import compose_record, validate
    from pflower.core.checkpoint import completed, load_checkpoint
    from pflower.datasets.base import DatasetNotFoundError
    from pflower.datasets.sources import CorruptDatasetError
    from pflower.server.app import resumable_checkpoint

    run_dir: Path = args.run_dir.resolve()
    try:
        checkpoint = load_checkpoint(run_dir)
        record = compose_record(
            [*checkpoint.overrides, *args.overrides], run_dir=run_dir, resume=True
        )
        cfg = record.composed
        settings = validate(cfg, check_scheme=False)
        resumable_checkpoint(cfg, run_dir)
        if completed(checkpoint, run_dir, settings.rounds):
            console.print(
                f"nothing to resume: {escape(str(run_dir))} completed its {checkpoint.round} "
                "rounds (summary.json); pass rounds=N to extend it"
            )
            return 0
        _preflight(cfg, settings)
        _writable(run_dir)
        claim = _claimed(run_dir, cfg)
    except (ConfigError, DatasetNotFoundError, CorruptDatasetError) as error:
        console.print(f"[red]cannot resume:[/] {escape(str(error))}")
        return 2
    _quiet_flower_console(settings.progress)
    console.print(
        f"[bold]pflower[/] resuming {run_dir} after round {checkpoint.round} of {settings.rounds}"
    )
    from pflower.results.failures import summary_on_signal
    from pflower.simulation import run_experiment

    with claim, summary_on_signal(run_dir, cfg):
        try:
            run_experiment(settings, record)
        except ResultsNotWrittenError as error:
            console.print(f"[red]run failed:[/] {escape(str(error))}")
            return 1
    return 0


def _load_plugins() -> None:
    """Register pflower's algorithms and the plugins ([`pflower.plugins`][pflower.plugins]); a
    plugin that fails to load ends the command with its one-line message and exit code 2."""
    from pflower.plugins import PluginError

    try:
        import pflower.strategies  # noqa: F401  (loads the plugins after pflower's own)
    except PluginError as error:
        console.print(f"[red]plugin error:[/] {escape(str(error))}")
        sys.exit(2)


def main() -> None:
    """Console entry point: answer a question about the command line (help, version, a
    mistyped command: [`pflower.commands`][pflower.commands]), run a subcommand
    (`SUBCOMMANDS`), else run an experiment.
    ``--help-config`` is Hydra's ``--help``: every configuration group and key.

    Ctrl-C that reaches no handler of the command's own (while torch, Flower or Hydra are still
    being imported, or in a command that keeps nothing) ends it with one line on stderr and
    exit code 130, the shell's code for SIGINT, instead of a traceback: the stop is the
    user's. A run records its own stop (`summary_on_signal`), ``pflower tune`` says what it
    kept."""
    try:
        _dispatch()
    except KeyboardInterrupt:
        print("pflower: stopped by Ctrl-C.", file=sys.stderr)
        sys.exit(130)


def _dispatch() -> None:
    """`main`'s work: the command line's answer, a subcommand, or an experiment."""
    if sys.argv[1:3] == ["partition", "import"]:  # its own arguments, help included
        hold_numerics_of(sys.argv[3:])
        _load_plugins()
        sys.exit(partition_import(sys.argv[3:]))
    code = answer(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    hold_numerics_of(sys.argv[1:])
    command = subcommand(sys.argv[1]) if len(sys.argv) > 1 else None
    if command is not None and not command.hydra_task:
        _load_plugins()
        if command.runs_flower:
            plain_flower_console_unless_tty()
        sys.exit(resolve(command.main)(sys.argv[2:]))
    task: Callable[[DictConfig], None] = _simulate
    if command is not None:
        task = resolve(command.main)
        del sys.argv[1]
    sys.argv = ["--help" if argument == "--help-config" else argument for argument in sys.argv]
    _check_before_imports(sys.argv[1:])
    _load_plugins()
    plain_flower_console_unless_tty()
    _check_overrides(sys.argv[1:])
    _hydra_entry(task)()


if __name__ == "__main__":
    main()
