"""``backend=fork`` (pflower.runtime.forkbackend): forked workers that run the ClientApp on one
message at a time, report its exceptions as Flower's ClientAppException, survive a dead sibling,
and end."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from flwr.clientapp.client_app import ClientAppException

from pflower.config import BackendConfig, RunRecord
from pflower.registry import ConfigError
from pflower.runtime import forkbackend
from pflower.runtime.forkbackend import (
    RAY_BACKEND_MODULE,
    ForkBackend,
    ForkWorkers,
    _serve,
    default_worker_count,
    forked_workers,
    run_in_forked_process,
)


class EchoApp:
    """Stands in for a ClientApp: replies (its pid, the message) and counts calls in the context
    (a dict, as the node's state would change)."""

    def __call__(self, message: object, context: dict[str, int]) -> tuple[int, object]:
        if message == "fail":
            raise ValueError("the app failed")
        if message == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if message == "hang":
            time.sleep(600)
        context["calls"] = context.get("calls", 0) + 1
        return os.getpid(), message


def test_workers_reply_with_the_updated_context_from_forked_processes() -> None:
    workers = ForkWorkers(EchoApp(), 2)  # type: ignore[arg-type]
    try:
        assert workers.count == 2
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(lambda i: workers.run(i, {"calls": i}), range(8)))  # type: ignore[arg-type]
        pids = {pid for (pid, _), _ in outcomes}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
        assert [message for (_, message), _ in outcomes] == list(range(8))
        assert [context["calls"] for _, context in outcomes] == [i + 1 for i in range(8)]
    finally:
        workers.close()
    assert not any(worker.process.is_alive() for worker in workers._workers)


def test_an_app_exception_is_a_client_app_exception_and_the_worker_goes_on() -> None:
    workers = ForkWorkers(EchoApp(), 1)  # type: ignore[arg-type]
    try:
        with pytest.raises(ClientAppException, match="the app failed"):
            workers.run("fail", {})  # type: ignore[arg-type]
        (_pid, message), context = workers.run("next", {})  # type: ignore[arg-type,misc]
        assert (message, context) == ("next", {"calls": 1})
    finally:
        workers.close()


def test_a_dead_worker_fails_its_message_and_the_others_go_on() -> None:
    workers = ForkWorkers(EchoApp(), 2)  # type: ignore[arg-type]
    try:
        with pytest.raises(RuntimeError, match=r"fork worker \d+ ended \(exit code -9\)"):
            workers.run("die", {})  # type: ignore[arg-type]
        survivors = {workers.run(i, {})[0][0] for i in range(4)}  # type: ignore[index]
        assert len(survivors) == 1
        with pytest.raises(RuntimeError, match="ended"):
            workers.run("die", {})  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="every fork worker has ended"):
            workers.run("after", {})  # type: ignore[arg-type]
    finally:
        workers.close()


def test_a_worker_leaves_sigterm_and_sigint_to_the_driver() -> None:
    """``kill``/``timeout`` send SIGTERM to the run's whole process group: a worker that died of
    it would fail its message (and could fail the run before the driver records it as
    interrupted). Sent to a worker alone, neither signal ends it."""
    workers = ForkWorkers(EchoApp(), 1)  # type: ignore[arg-type]
    try:
        (pid, _), _ = workers.run("first", {})  # type: ignore[arg-type,misc]
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(pid, sig)
        time.sleep(0.2)
        (again, message), _ = workers.run("after", {})  # type: ignore[arg-type,misc]
        assert (again, message) == (pid, "after")
    finally:
        workers.close()
    assert workers._workers[0].process.exitcode == 0  # ended when asked


def test_close_kills_a_worker_that_does_not_end_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker busy with a message cannot read the request to end: after
    ``WORKER_STOP_S`` it is killed (SIGTERM would be ignored)."""
    monkeypatch.setattr(forkbackend, "WORKER_STOP_S", 0.5)
    workers = ForkWorkers(EchoApp(), 1)  # type: ignore[arg-type]
    with ThreadPoolExecutor(max_workers=1) as pool:
        busy = pool.submit(workers.run, "hang", {})  # type: ignore[arg-type]
        time.sleep(0.5)
        started = time.monotonic()
        workers.close()
        assert time.monotonic() - started < 60
        with pytest.raises(RuntimeError, match="ended"):
            busy.result(timeout=60)
    assert workers._workers[0].process.exitcode == -signal.SIGKILL


def test_a_worker_whose_driver_went_away_mid_message_ends_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's end of the pipe closes while the worker runs a message (the driver was
    killed): the worker ends when it finds nobody to reply to, without a broken-pipe traceback."""
    import multiprocessing

    monkeypatch.setattr(signal, "signal", lambda *_: None)  # _serve runs in this process here
    driver_end, worker_end = multiprocessing.Pipe()
    calls: list[object] = []

    def app(message: object, context: dict) -> str:
        calls.append(message)
        driver_end.close()  # the driver is gone before the reply
        return "reply"

    driver_end.send(("train", {}))
    _serve(app, worker_end, None)  # type: ignore[arg-type]
    assert calls == ["train"]


def test_no_workers_are_forked_from_a_process_that_used_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After CUDA is initialized in a process, children forked from it could not use it: the
    run stops with a configuration error before preparing or forking."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    prepared: list[object] = []
    with (
        pytest.raises(ConfigError, match=r"already used CUDA.*backend=ray"),
        forked_workers(EchoApp(), lambda: prepared.append("prepared"), 1),  # type: ignore[arg-type]
    ):
        pass
    assert prepared == []


def test_flower_builds_the_fork_backend_only_inside_forked_workers() -> None:
    """While active, the module Flower's engine imports its backend from yields ForkBackend over
    the workers (Ray untouched); afterwards the module is what it was."""
    prepared: list[str] = []
    before = sys.modules.get(RAY_BACKEND_MODULE)
    with forked_workers(EchoApp(), lambda: prepared.append("prepared"), 2):  # type: ignore[arg-type]
        from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

        backend = RayBackend({})
        assert isinstance(backend, ForkBackend) and backend.num_workers == 2
        reply, _ = backend.process_message("hello", {})  # type: ignore[arg-type]
        assert reply[1] == "hello"  # type: ignore[index]
    assert prepared == ["prepared"]
    assert sys.modules.get(RAY_BACKEND_MODULE) is before
    with pytest.raises(RuntimeError, match="forked_workers"):
        ForkBackend({})


def test_fork_backend_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert BackendConfig().name == "fork", "forked workers are the default simulation backend"
    assert default_worker_count(1.0) >= 1
    assert default_worker_count(1000.0) == 1
    with pytest.raises(ConfigError, match=r"backend\.name must be 'ray' or 'fork', got 'dask'"):
        BackendConfig(name="dask")
    with pytest.raises(ConfigError, match=r"backend\.workers must be >= 1"):
        BackendConfig(name="fork", workers=0)
    with pytest.raises(ConfigError, match=r"backend\.address attaches to a Ray cluster"):
        BackendConfig(name="fork", address="auto")
    with pytest.raises(ConfigError, match="num_gpus_per_client shares GPUs among Ray actors"):
        BackendConfig(name="fork", num_gpus_per_client=0.5)
    BackendConfig(name="ray", num_gpus_per_client=0.5, address="auto")
    monkeypatch.delattr(os, "fork")  # Windows
    with pytest.raises(ConfigError, match="this platform cannot: use backend=ray"):
        BackendConfig(name="fork")
    BackendConfig(name="ray")


def _write_pid(path: Path) -> None:
    path.write_text(str(os.getpid()))


def _raise_config_error() -> None:
    raise ConfigError("the child's own message")


class _Unpicklable(Exception):
    def __reduce__(self) -> object:
        raise TypeError("cannot pickle this")


def _raise_unpicklable() -> None:
    raise _Unpicklable("lost in the pipe")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_forked_run_process_runs_the_task_and_raises_what_it_raised(tmp_path: Path) -> None:
    """The task runs in another process; its exception comes back as itself (so that a sweep
    records a ConfigError as one) with the child's traceback as a note; one that cannot be
    pickled comes back as its text; a child that dies is reported with its exit code."""
    marker = tmp_path / "pid"
    run_in_forked_process(functools.partial(_write_pid, marker))
    assert int(marker.read_text()) != os.getpid()
    with pytest.raises(ConfigError, match="the child's own message") as raised:
        run_in_forked_process(_raise_config_error)
    assert "raised in the forked run process" in "".join(raised.value.__notes__)
    assert "_raise_config_error" in "".join(raised.value.__notes__)
    with pytest.raises(RuntimeError, match=r"_Unpicklable\('lost in the pipe'\)"):
        run_in_forked_process(_raise_unpicklable)
    with pytest.raises(RuntimeError, match=r"ended with exit code -9 and no result"):
        run_in_forked_process(_die)


@pytest.mark.parametrize(
    ("backend", "device", "in_child"),
    [("fork", "cuda", True), ("fork", "cpu", False), ("ray", "cuda", False)],
)
def test_only_gpu_runs_on_forked_workers_get_a_process_of_their_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, device: str, in_child: bool
) -> None:
    """A GPU run on forked workers runs in a child, so that the driver never initializes CUDA
    and a sweep's next job can fork workers that use it; other runs stay in the driver."""
    import torch

    import pflower.core.training
    import pflower.runtime.forkbackend
    import pflower.simulation
    from pflower.compose import compose_config, validate

    ran: list[str] = []
    monkeypatch.setattr(pflower.core.training, "resolve_device", lambda _: torch.device(device))
    monkeypatch.setattr(pflower.simulation, "_simulate", lambda *_: ran.append("simulated"))
    monkeypatch.setattr(
        pflower.runtime.forkbackend,
        "run_in_forked_process",
        lambda task: ran.append("child") or task(),
    )
    settings = validate(compose_config([f"backend={backend}"], check_scheme=False))
    pflower.simulation.run_experiment(settings, RunRecord((), tmp_path))
    assert ran == (["child", "simulated"] if in_child else ["simulated"])
