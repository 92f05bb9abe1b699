"""A simulation backend of forked worker processes (``backend=fork``, the default), beside Flower's
Ray backend (``backend=ray``).

Flower 1.39's simulation engine hands each message to a backend worker that runs the ClientApp;
its one backend runs the workers as Ray actors. On the 2-core development machine a run pays
about 6-9 s for ``ray.init`` and 10-16 s more before the first round's clients train: every actor
is a new Python process that imports Ray, Flower, torch and pflower and then loads the dataset
and builds the federation (``benchmarks/results/README.md``, start-up split). Each actor also
holds its own copy of the dataset.

Here the driver does that work once: [`forked_workers`][pflower.runtime.forkbackend.forked_workers]
composes the experiment the ClientApps
will see, builds its federation and shared model in the driver's caches (the ``prepare`` it is
given: [`pflower.client.app.prepare_ahead`][pflower.client.app.prepare_ahead]) and then forks the
    workers, before the ServerApp
thread starts, while the driver has no other thread but pflower's signal watcher
([`pflower.runtime.signals`][pflower.runtime.signals], which a forked child forgets). The workers
begin with everything
imported and built, and share the driver's memory pages until they write to them (one dataset per
machine).
[`ForkBackend`][pflower.runtime.forkbackend.ForkBackend] is the engine's backend over these workers:
like Flower's ``RayBackend`` it
runs one message at a time per worker, and the ClientApp gets the message and the node's context and
returns the reply and the updated context, pickled through a pipe; an exception in the ClientApp
becomes Flower's ``ClientAppException``, which the engine turns into an error reply, as it does for
Ray's actors.

Limits, stated where the backend is chosen (``conf/backend/fork.yaml``): one machine, no Ray
cluster; no per-client resource scheduling, every worker trains on ``train.device`` (one GPU
is shared by all workers); a worker that dies (killed, out of memory) fails the message it held
and is not replaced: the run goes on with the others, and a message fails once none is left.
A process that has used CUDA cannot fork workers that use it, and the driver evaluates stage G
on ``train.device``; so a run on a GPU runs in a process of its own forked from the driver
([`run_in_forked_process`][pflower.runtime.forkbackend.run_in_forked_process]), and the driver
itself never uses CUDA: the next job of a Hydra
sweep (or a resumed run) forks its workers as the first did.

Every process forked here dies with the process it was forked from, whatever ends that one
([`pflower.runtime.processes.die_with_parent`][pflower.runtime.processes.die_with_parent]): a driver
ended by ``kill -9`` leaves no
worker behind.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import queue
import signal
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from pflower.registry import ConfigError
from pflower.runtime.fence import RAY_BACKEND, START_VCE
from pflower.runtime.processes import die_with_parent

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

RAY_BACKEND_MODULE = RAY_BACKEND.module
"""The module from which Flower 1.39's ``start_vce`` imports the one backend it builds
(`pflower.runtime.fence.START_VCE`)."""

NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""The environment variable with which torch checks for CUDA without initializing it (set by
[`pflower.simulation.run_experiment`][pflower.simulation.run_experiment] before it forks
workers; each worker drops it: `_serve`)."""

WORKER_STOP_S = 5.0
"""How long [`ForkWorkers.close`][pflower.runtime.forkbackend.ForkWorkers.close] waits for a worker
to end before it is killed (and
[`run_in_forked_process`][pflower.runtime.forkbackend.run_in_forked_process] for the run process,
after its result, before it is terminated)."""


@dataclass(frozen=True)
class _Failure:
    """What a worker sends back when the ClientApp raised: the exception, as text."""

    text: str


@dataclass(frozen=True)
class _Worker:
    process: BaseProcess
    connection: Connection


def _serve(app: ClientApp, connection: Connection, parent_pid: int | None) -> None:
    """A worker's loop: run ``app`` on each (message, context) received, send back the reply
    and the updated context (or a `_Failure`); end on ``None`` or a closed pipe (the
    driver ended, even while this worker trained), and be killed when the driver ``parent_pid``
    ends ([`die_with_parent`][pflower.runtime.forkbackend.die_with_parent]; None: not forked, as in
    a test).

    SIGTERM and SIGINT are the driver's to handle, so a worker ignores them: ``kill`` or
    ``timeout`` sends SIGTERM to a run's whole process group, and a worker that died of it
    would fail its message, which could end the run as failed before the driver records it as
    interrupted. The driver records the run, ends, and its workers die with it; ``close`` kills
    a worker that does not end when asked."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
        # torch's NVML-based CUDA check lets the driver fork workers that can use CUDA; a
        # worker forks nothing, and with it every optimizer step asked NVML (torch's
        # graph-capture health check): a third of a small model's training time on a CPU.
        os.environ.pop(NVML_CUDA_CHECK, None)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        message, context = job
        try:
            outcome: _Failure | tuple[Message, Context] = (
                app(message=message, context=context),
                context,
            )
        except Exception as error:  # reported to the engine, as a Ray actor reports it
            outcome = _Failure(f"{error!r}\n{traceback.format_exc()}")
        try:
            connection.send(outcome)
        except OSError:  # a broken pipe: nobody waits for the reply
            return


class ForkWorkers:
    """``count`` worker processes forked from this one, each running ``app`` on the messages it
    is given (see the module docstring); thread-safe, one message per worker at a time."""

    def __init__(self, app: ClientApp, count: int) -> None:
        if count < 1:
            raise ValueError(f"a fork backend needs at least one worker, got {count}")
        context = multiprocessing.get_context("fork")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: list[_Worker] = []
        # The children's garbage collector leaves the objects they inherit alone (it would
        # write to their pages, and so copy them); this process collects as before. No full
        # collection first: it took 0.3 s of every run's start, and what it would free is
        # only kept in the children's shared pages.
        gc.freeze()
        try:
            for _ in range(count):
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=_serve,
                    args=(app, child_end, os.getpid()),
                    name="pflower-fork-worker",
                    daemon=True,
                )
                process.start()
                child_end.close()
                worker = _Worker(process, parent_end)
                self._workers.append(worker)
                self._idle.put(worker)
        finally:
            gc.unfreeze()

    @property
    def count(self) -> int:
        """How many workers there are (dead ones included: the engine's worker threads)."""
        return len(self._workers)

    def _alive(self) -> bool:
        return any(worker.process.is_alive() for worker in self._workers)

    def _take(self) -> _Worker:
        """An idle worker; waits while all are busy, fails once none is alive."""
        while True:
            try:
                return self._idle.get(timeout=1.0)
            except queue.Empty:
                if not self._alive():
                    raise RuntimeError(
                        "every fork worker has ended; none can run the message"
                    ) from None

    def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        """The ClientApp's reply to ``message`` and the node's updated context, from a worker."""
        from flwr.clientapp.client_app import ClientAppException

        worker = self._take()
        try:
            worker.connection.send((message, context))
            outcome = worker.connection.recv()
        except (EOFError, OSError) as error:  # a broken pipe included
            worker.process.join(timeout=1.0)
            raise RuntimeError(
                f"fork worker {worker.process.pid} ended (exit code {worker.process.exitcode}) "
                "while running a message; it is not replaced"
            ) from error
        self._idle.put(worker)
        if isinstance(outcome, _Failure):
            raise ClientAppException(outcome.text)
        reply: tuple[Message, Context] = outcome
        return reply

    def close(self) -> None:
        """Ask every worker to end, wait
        [`WORKER_STOP_S`][pflower.runtime.forkbackend.WORKER_STOP_S], kill the rest (a worker
        ignores
        SIGTERM: see `_serve`)."""
        for worker in self._workers:
            with contextlib.suppress(OSError):
                worker.connection.send(None)
        for worker in self._workers:
            worker.process.join(timeout=WORKER_STOP_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.connection.close()


class ForkBackend:
    """Flower's simulation ``Backend`` (duck-typed: the engine only calls these members) over
    the [`ForkWorkers`][pflower.runtime.forkbackend.ForkWorkers] of the enclosing
    [`forked_workers`][pflower.runtime.forkbackend.forked_workers]."""

    workers: ForkWorkers | None = None
    """Set by [`forked_workers`][pflower.runtime.forkbackend.forked_workers] for the engine's call
    of the constructor."""

    def __init__(self, backend_config: dict[str, object]) -> None:
        if ForkBackend.workers is None:
            raise RuntimeError(
                "backend=fork runs inside pflower.runtime.forkbackend.forked_workers"
            )
        self._workers = ForkBackend.workers

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        """Nothing to build: the workers were forked with the ClientApp before the engine
        started."""

    @property
    def num_workers(self) -> int:
        return self._workers.count

    def is_worker_idle(self) -> bool:
        return True

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        return self._workers.run(message, context)

    def terminate(self) -> None:
        """The workers end with [`forked_workers`][pflower.runtime.forkbackend.forked_workers]."""


def _run_and_report(task: Callable[[], None], connection: Connection, parent_pid: int) -> None:
    """The forked run process: run ``task``, send back ``None`` or what it raised; killed when
    ``parent_pid`` ends (and with it, its own workers)."""
    die_with_parent(parent_pid)
    try:
        task()
    except BaseException as error:
        error.add_note(f"raised in the forked run process {os.getpid()}:\n{traceback.format_exc()}")
        try:
            connection.send(error)
        except Exception:  # an exception that cannot be pickled: its type and text
            connection.send(RuntimeError(f"{error!r}\n{traceback.format_exc()}"))
    else:
        connection.send(None)


def run_in_forked_process(task: Callable[[], None]) -> None:
    """Run ``task`` in a process forked from this one and wait for it to end; what it raises is
    raised here (the same exception, with the child's traceback as a note).

    For a run that uses CUDA: its process initializes CUDA (stage G on the GPU), after which it
    could not fork workers again; this process stays free of CUDA for the next run.

    Raises:
        RuntimeError: the process ended without a result (killed, out of memory).
    """
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    # Not a daemon: it forks the run's workers, and daemonic processes may have no children.
    process = context.Process(
        target=_run_and_report, args=(task, sender, os.getpid()), name="pflower-run"
    )
    process.start()
    sender.close()
    try:
        outcome = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(
            f"the run's forked process {process.pid} ended with exit code {process.exitcode} "
            "and no result (killed, or out of memory?)"
        ) from None
    finally:
        receiver.close()
        process.join(timeout=WORKER_STOP_S)
        if process.is_alive():  # Ctrl-C here, or a process that hangs after its result
            process.terminate()
            process.join()
    if outcome is not None:
        raise outcome


def default_worker_count(cpus_per_client: float) -> int:
    """As many workers as this process may use CPUs for ``cpus_per_client`` each (at least 1),
    the count Ray's actor pool gives on a local machine."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, int((usable or 1) // cpus_per_client))


@contextlib.contextmanager
def forked_workers(app: ClientApp, prepare: Callable[[], None], count: int) -> Iterator[None]:
    """While active, Flower's simulation engine runs its ClientApps on ``count`` workers forked
    from this process, after ``prepare()`` built what they share (the run config's experiment:
    [`pflower.client.app.prepare_ahead`][pflower.client.app.prepare_ahead]).

    Flower's ``start_vce`` imports ``RayBackend`` from
    [`RAY_BACKEND_MODULE`][pflower.runtime.forkbackend.RAY_BACKEND_MODULE] when it starts
    the engine; while this is active that module is one whose ``RayBackend`` is
    [`ForkBackend`][pflower.runtime.forkbackend.ForkBackend] (so Ray is not even imported), and the
    real module comes back after."""
    import torch

    if torch.cuda.is_initialized():  # children of this process could not use CUDA
        raise ConfigError(
            "backend=fork cannot fork workers from a process that has already used CUDA: "
            "start the run with pflower.simulation.run_experiment (which runs a GPU run in a "
            "process of its own), or use backend=ray"
        )
    prepare()
    workers = ForkWorkers(app, count)
    ForkBackend.workers = workers
    try:
        with RAY_BACKEND.module_stands_in(ForkBackend, imported_by=START_VCE):
            yield
    finally:
        ForkBackend.workers = None
        workers.close()
