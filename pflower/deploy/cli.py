"""``pflower deploy``: the command line of the local deployment and the compose files.

``up|status|down`` start, inspect and stop a [`Deployment`][pflower.deploy.local.Deployment], whose
process table stays in the deployment directory between commands; ``run`` submits an
experiment to it; ``compose`` writes the docker-compose files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pflower.commands import CommandParser, HelpFormatter
from pflower.deploy.compose import render_compose
from pflower.deploy.control import (
    CONNECTION,
    FLWR_TIMEOUT_S,
    START_TIMEOUT_S,
    DeployTimeoutError,
    SuperLinkGoneError,
)
from pflower.deploy.local import DEFAULT_DIR, STATE_FILE, Deployment
from pflower.deploy.topology import Endpoints, Security
from pflower.registry import ConfigError

if TYPE_CHECKING:
    from pflower.config import RunRecord


def _security_from(args: argparse.Namespace) -> Security:
    """The TLS material named by ``--certificates``/``--node-keys``, as absolute paths."""
    certificates = Path(args.certificates).resolve() if args.certificates else None
    node_keys = Path(args.node_keys).resolve() if args.node_keys else None
    return Security(certificates, node_keys)


def _up(args: argparse.Namespace) -> int:
    """Start the SuperLink and the SuperNodes; on failure, stop whatever was started."""
    directory = Path(args.dir)
    if (directory / STATE_FILE).exists() and _any_alive(Deployment.load(directory)):
        print(f"a deployment is already running in {directory}; `pflower deploy down` first")
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    endpoints = Endpoints(args.host, args.fleet_port, args.control_port, args.node_port)
    deployment = Deployment(directory, args.num_clients, endpoints, _security_from(args))
    deployment.flwr_timeout = args.flwr_timeout
    try:
        deployment.start_superlink(args.timeout)
        if deployment.security.node_keys is not None:
            deployment.control.register_nodes()
        for index in range(args.num_clients):
            deployment.start_supernode(index)
        deployment.control.wait_for_nodes(args.num_clients, args.timeout)
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as error:
        deployment.stop_all()
        limits = (
            f" (waits are bounded by --timeout {args.timeout:g} s and --flwr-timeout "
            f"{args.flwr_timeout:g} s)"
            if isinstance(error, TimeoutError)
            else ""
        )
        print(f"deployment failed: {error}{limits}\nlogs: {deployment.logs}")
        return 1
    except BaseException:  # Ctrl-C or a bug: leave nothing running
        deployment.stop_all()
        raise
    _print_status(deployment)
    print(
        f"\nsubmit a run:  pflower deploy run --dir {args.dir} <hydra overrides>"
        f"\nor with flwr:   FLWR_HOME={deployment.cli_home} flwr run . {CONNECTION} "
        f"--run-config 'overrides=\"num_clients={args.num_clients} ...\"' --stream"
    )
    return 0


def _any_alive(deployment: Deployment) -> bool:
    """Whether any process of ``deployment`` still runs."""
    return any(deployment.alive(name) for name in deployment.processes)


def _print_status(deployment: Deployment) -> bool:
    """Print the endpoints and every process's state; whether all processes run."""
    all_alive = True
    print(f"deployment {deployment.tag} in {deployment.directory}")
    print(
        f"  Control API {deployment.endpoints.control_address}, "
        f"Fleet API {deployment.endpoints.fleet_address}, "
        f"TLS {'on' if deployment.security.ca else 'off'}, "
        f"SuperNode auth {'on' if deployment.security.node_keys else 'off'}"
    )
    for name, process in deployment.processes.items():
        alive = deployment.alive(name)
        all_alive &= alive
        print(
            f"  {name:14s} pid {process.pid:<8d} {'running' if alive else 'STOPPED':8s} "
            f"log {process.log}"
        )
    return all_alive


def _status(args: argparse.Namespace) -> int:
    """Show the deployment; exit code 1 if there is none or a process stopped."""
    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}")
        return 1
    deployment = Deployment.load(directory)
    return 0 if _print_status(deployment) else 1


def _down(args: argparse.Namespace) -> int:
    """Stop every process of the deployment and forget it (its logs stay)."""
    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}")
        return 0
    deployment = Deployment.load(directory)
    deployment.stop_all()
    (directory / STATE_FILE).unlink()
    print(f"stopped deployment {deployment.tag}; logs kept in {deployment.logs}")
    return 0


class NothingToResume(Exception):
    """The run to resume already completed the rounds asked for."""


def resume_record(run_dir: Path, extra: list[str]) -> RunRecord:
    """The run that continues ``run_dir`` from its checkpoint (the run's own overrides, then
    ``extra``, e.g. ``rounds=N``), checked against the checkpoint before anything runs;
    [`NothingToResume`][pflower.deploy.cli.NothingToResume] if the run already completed those
    rounds."""
    from pflower.compose import compose_record
    from pflower.core.checkpoint import completed, load_checkpoint
    from pflower.server.app import resumable_checkpoint

    checkpoint = load_checkpoint(run_dir)
    record = compose_record([*checkpoint.overrides, *extra], run_dir=run_dir, resume=True)
    resumable_checkpoint(record.composed, run_dir)
    if completed(checkpoint, run_dir, int(record.composed.rounds)):
        raise NothingToResume(
            f"nothing to resume: {run_dir} completed its {checkpoint.round} rounds "
            "(summary.json); pass rounds=N to extend it"
        )
    return record


def _run(args: argparse.Namespace) -> int:
    """Submit an experiment and follow its log until it ends; 0 if it completed.

    ``num_clients`` defaults to the deployment's node count and ``output_dir`` to
    ``runs/<date>/<time>`` under the current directory. ``--resume RUN_DIR`` continues that run
    from its checkpoint (the ServerApp runs on this machine in a local deployment), with its
    own overrides followed by the given ones.
    """
    from pflower.config import RunRecord

    directory = Path(args.dir)
    if not (directory / STATE_FILE).exists():
        print(f"no deployment in {directory}; `pflower deploy up` first")
        return 1
    deployment = Deployment.load(directory)
    deployment.flwr_timeout = args.flwr_timeout
    try:
        if args.resume:
            record = resume_record(Path(args.resume).resolve(), list(args.overrides))
        else:
            record = RunRecord.from_overrides(args.overrides)
    except ConfigError as error:
        print(f"{'cannot resume' if args.resume else 'configuration error'}: {error}")
        return 2
    except NothingToResume as done:
        print(done)
        return 0
    run_dir = record.run_dir or Path("runs").resolve() / time.strftime("%Y-%m-%d/%H-%M-%S")
    record = dataclasses.replace(
        record.with_default("num_clients", deployment.num_clients), run_dir=run_dir
    )
    try:
        run_id = deployment.control.submit(record)
    except DeployTimeoutError as error:
        print(f"error: {error}")
        return 1
    print(f"run {run_id} started; following its log (Ctrl-C stops following, not the run)")
    try:
        status = deployment.control.wait_for_run(run_id, timeout=None, to_terminal=True)
    except (SuperLinkGoneError, DeployTimeoutError) as error:
        print(f"\n{_interrupted(run_id, run_dir) or _gone(run_id, str(run_dir), error)}")
        return 1
    except KeyboardInterrupt:
        print(
            f"\nstopped following run {run_id}; it goes on. Stop it with: "
            f"FLWR_HOME={deployment.cli_home} flwr stop {run_id} {CONNECTION}"
        )
        return 130
    if status != "finished:completed" and (line := _interrupted(run_id, run_dir)):
        print(f"\n{line}")
        return 1
    print(f"run {run_id}: {status}")
    return 0 if status == "finished:completed" else 1


def _interrupted(run_id: str, run_dir: Path) -> str | None:
    """The follower's one line for a run whose ServerApp recorded an interruption (``pflower
    deploy down`` while it ran), None for any other run."""
    from pflower.results.failures import was_interrupted

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not was_interrupted(summary):
        return None
    from pflower.core.checkpoint import CHECKPOINT_FILE

    resume = (
        f", resume it with `pflower deploy run --resume {run_dir}`"
        if (run_dir / CHECKPOINT_FILE).exists()
        else ""
    )
    return (
        f"stopped following run {run_id}: {summary['error']} (the deployment was stopped: "
        f"`pflower deploy down`?); its results so far are in {run_dir}{resume}"
    )


def _gone(run_id: str, run_dir: str, error: Exception) -> str:
    """The follower's line for a run it lost sight of without its ServerApp saying why."""
    return (
        f"stopped following run {run_id}: {error}. The deployment was stopped "
        f"(`pflower deploy down`?) or cannot be reached; the run's results so far, and "
        f"summary.json saying how it ended, are in {run_dir}"
    )


def _compose(args: argparse.Namespace) -> int:
    """Write the docker-compose files for ``--num-clients`` nodes into ``--out``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_compose(args.num_clients).items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The parser of ``pflower deploy``; each subcommand sets its ``handler``."""
    parser = CommandParser(
        prog="pflower deploy",
        description="A SuperLink and N SuperNodes as local processes (up/status/run/down), "
        "or the docker-compose files for N nodes (compose).",
        formatter_class=HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        """Add the subcommand ``name``; its help formatted as every other pflower help's."""
        return commands.add_parser(
            name, help=summary, description=summary, formatter_class=HelpFormatter
        )

    def with_dir(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add ``--dir``, the deployment directory, to ``command``."""
        command.add_argument(
            "--dir",
            default=str(DEFAULT_DIR),
            help="deployment directory: logs, state, process table (default: "
            f"{str(DEFAULT_DIR).replace(str(Path.home()), '~', 1)})",
        )
        return command

    def with_flwr_timeout(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add ``--flwr-timeout``, the most seconds one ``flwr`` command may take."""
        command.add_argument(
            "--flwr-timeout",
            type=float,
            default=FLWR_TIMEOUT_S,
            metavar="SECONDS",
            help="the most seconds one `flwr` command (run, list, supernode ...) may take "
            f"(default: {FLWR_TIMEOUT_S:g}); the run itself is followed until it ends",
        )
        return command

    up = with_dir(command("up", "start the SuperLink and the SuperNodes"))
    up.add_argument(
        "-n", "--num-clients", type=int, default=3, help="SuperNodes to start (default: 3)"
    )
    up.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the SuperLink listens on and the SuperNodes dial",
    )
    up.add_argument(
        "--fleet-port",
        type=int,
        default=Endpoints.fleet_port,
        help="the SuperLink's Fleet API port, which the SuperNodes dial "
        f"(default: {Endpoints.fleet_port})",
    )
    up.add_argument(
        "--control-port",
        type=int,
        default=Endpoints.control_port,
        help="the SuperLink's Control API port (`flwr run`, `pflower deploy run`) and "
        f"runtime API port (the ServerApp) (default: {Endpoints.control_port})",
    )
    up.add_argument(
        "--node-port",
        type=int,
        default=Endpoints.node_port,
        help="runtime API port of SuperNode 0; node i listens on this port + i "
        f"(default: {Endpoints.node_port})",
    )
    up.add_argument(
        "--certificates",
        help="TLS: directory with ca.crt, server.pem, server.key (docker/certs.sh)",
    )
    up.add_argument(
        "--node-keys",
        help="SuperNode authentication: directory with "
        "supernode-<i>[.pub] keys (needs --certificates)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=START_TIMEOUT_S,
        help="seconds to wait for the SuperLink and for the SuperNodes to come online "
        f"(default: {START_TIMEOUT_S:g})",
    )
    with_flwr_timeout(up).set_defaults(handler=_up)
    with_dir(command("status", "show the processes")).set_defaults(handler=_status)
    with_dir(command("down", "stop every process")).set_defaults(handler=_down)
    run = with_dir(command("run", "run an experiment on the deployment"))
    run.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue this run from its checkpoint (pass rounds=N to extend it)",
    )
    with_flwr_timeout(run).set_defaults(handler=_run)
    compose = command("compose", "write the docker-compose files")
    compose.add_argument(
        "-n", "--num-clients", type=int, default=3, help="SuperNode services (default: 3)"
    )
    compose.add_argument("--out", default="docker", help="directory (default: docker)")
    compose.set_defaults(handler=_compose)
    return parser


def main(argv: list[str]) -> int:
    """``pflower deploy up|status|run|down|compose``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ValueError as error:
        print(f"error: {error}")
        return 2
    except DeployTimeoutError as error:  # every wait names the setting that bounds it
        print(f"error: {error}")
        return 1
