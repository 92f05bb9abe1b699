"""Command line: ``pflower [overrides]`` runs an experiment; subcommands inspect and report.

- ``pflower <hydra overrides>``: run the composed experiment as a Flower simulation (Ray backend);
  ``pflower -m <sweep overrides>`` runs a Hydra multirun sweep, one run directory per job.
- ``pflower partition <hydra overrides>``: print the partition's per-client sizes and class
  histograms and write a heatmap PNG, without training.
- ``pflower report <sweep or run dirs>...``: compare methods over partitions and seeds
  (:mod:`pflower.report`); it takes paths, not Hydra overrides.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from pflower.config import (
    RUN_CONFIG_KEY,
    app_dir,
    conf_dir,
    overrides_to_string,
    validate,
)
from pflower.registry import ConfigError

# Tables stay readable when the output is piped to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 160)


def run_experiment(cfg: DictConfig, overrides: Sequence[str], run_dir: Path) -> Path:
    """Run one experiment as an in-process Flower simulation; returns its run directory.

    The apps receive the experiment exactly as ``flwr run`` delivers it: the Hydra overrides
    (plus the pinned run directory) in the run config, fused with the app's declared defaults.
    """
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.telemetry import EventType

    from pflower.client.app import app as client_app
    from pflower.server.app import app as server_app

    overrides = [*overrides, f"output_dir={run_dir.resolve()}"]
    run = Run.create_empty(run_id=cfg.seed + 1)
    run.override_config = {RUN_CONFIG_KEY: overrides_to_string(overrides)}
    run.primary_task_id = 1
    run.federation_id = NOOP_FEDERATION_ID
    run_config = get_fused_config_from_dir(app_dir(), run.override_config)
    server_context = Context(
        run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    # The public ``run_simulation`` of Flower 1.39 takes no run config; this is the call that
    # Flower's own simulation runtime (``flwr run``) makes, with the app directory for defaults.
    _run_simulation(
        num_supernodes=cfg.num_clients,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app=client_app,
        server_app=server_app,
        backend_name="ray",
        backend_config=ray_backend_config(cfg),
        server_app_context=server_context,
        app_dir=str(app_dir()),
        run=run,
        is_app=True,
    )
    return run_dir


def ray_backend_config(cfg: DictConfig) -> dict:
    """Flower's Ray backend settings from the ``backend`` config group."""
    init_args: dict = {"logging_level": logging.WARNING, "log_to_driver": True}
    if cfg.backend.address:
        init_args["address"] = cfg.backend.address
    return {
        "client_resources": {
            "num_cpus": cfg.backend.num_cpus_per_client,
            "num_gpus": cfg.backend.num_gpus_per_client,
        },
        "init_args": init_args,
    }


def _task_overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task)


def _quiet_flower_console(progress: bool) -> None:
    """Flower logs to its own console handler (and to run.log); Hydra's root handler would
    print every line twice. With the live view on, the console shows only Flower's warnings."""
    from flwr.supercore.logger import LOGGER_NAME, update_console_handler

    logging.getLogger(LOGGER_NAME).propagate = False
    if progress:
        update_console_handler(level=logging.WARNING)


def _simulate(cfg: DictConfig) -> None:
    """Run one experiment. In a multirun sweep a failed job is recorded in its run directory
    (``summary.json`` with ``"status": "failed"``, ``error.txt``) and the sweep goes on; a single
    run re-raises, so the exit code says it failed."""
    run_dir = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
    try:
        validate(cfg)
        _quiet_flower_console(cfg.progress)
        overrides = [o for o in _task_overrides() if not o.startswith("output_dir=")]
        console.print(
            f"[bold]pflower[/] {cfg.strategy.name} on {cfg.dataset.name} / {cfg.partition.name}, "
            f"{cfg.num_clients} clients, {cfg.rounds} rounds -> {run_dir}"
        )
        run_experiment(cfg, overrides, run_dir)
    except Exception as error:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        from pflower.reporting.runs import record_failure

        record_failure(run_dir, cfg, error)
        console.print(
            f"[red]job failed:[/] {escape(str(error))}\n  recorded in {run_dir}; the sweep goes on"
        )


def _partition(cfg: DictConfig) -> None:
    validate(cfg)
    from pflower.datasets.report import report_partition
    from pflower.experiment import Experiment

    out_dir = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
    written = report_partition(Experiment.of(cfg).federation, out_dir, console)
    console.print(f"partition report written to {written}")


def _hydra_entry(task: Callable[[DictConfig], None]) -> Callable[[], None]:
    def guarded(cfg: DictConfig) -> None:
        try:
            task(cfg)
        except ConfigError as error:
            console.print(f"[red]configuration error:[/] {error}")
            sys.exit(2)

    return hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(guarded)


SUBCOMMANDS: dict[str, Callable[[DictConfig], None]] = {"partition": _partition}


def main() -> None:
    """Console entry point: dispatch subcommands, else run an experiment."""
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        from pflower import report

        sys.exit(report.main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "deploy":
        from pflower import deploy

        sys.exit(deploy.main(sys.argv[2:]))
    task = _simulate
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        task = SUBCOMMANDS[sys.argv.pop(1)]
    _hydra_entry(task)()


if __name__ == "__main__":
    main()
