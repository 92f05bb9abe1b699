"""The server's round loop: Flower's legacy ``Server`` loop, checkpointed and resumable.

[`CheckpointingServer`][pflower.server.loop.CheckpointingServer] runs the rounds as
``flwr.server.Server.fit`` does (fit round, stage
G on the server, evaluate round) and after every ``checkpoint.every``-th round and the last one
writes a [`ServerCheckpoint`][pflower.core.checkpoint.ServerCheckpoint]. One difference: stage G,
the
server's own evaluation of the global model, is computed on a thread of its own while the
clients work, the initial model's (round 0) during round 1's fit phase and round ``r``'s during
round ``r``'s evaluate phase, and recorded before that phase's results are aggregated; so
``metrics.jsonl`` holds the same rows in the same order, and the server's evaluation no longer
adds to the round's time where a CPU (or the GPU) is free for it. Started with a
checkpoint, it restores the strategy, the server's random generators and the global model, skips
what the checkpoint already covers (the initial evaluation and rounds up to the checkpoint's) and
goes on from the next round.

In a deployment and in a simulation a round's messages go out in one push
([`fit_at_once`][pflower.runtime.polling.fit_at_once]
and [`evaluate_at_once`][pflower.runtime.polling.evaluate_at_once]); elsewhere (in-process
tests) each client is reached by Flower's ``fit_clients``/``evaluate_clients``.
"""

from __future__ import annotations

import contextlib
import timeit
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.common import Parameters, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.history import History

from pflower.core.checkpoint import (
    ATTEMPT,
    CHECKPOINT_ROUND,
    RESUME_ROUND,
    ServerCheckpoint,
    random_state,
    save_checkpoint,
    set_random_state,
)
from pflower.core.errors import ResultsNotWrittenError
from pflower.core.strategy import GlobalEvaluation, PersonalizedStrategy
from pflower.results.disk import is_write_failure, write_failure
from pflower.results.failures import summary_on_signal
from pflower.results.ownership import RunDirClaim
from pflower.results.rundir import RunRecorder
from pflower.results.summary import resolved_config
from pflower.runtime.polling import (
    EvaluateResultsAndFailures,
    FitResultsAndFailures,
    evaluate_at_once,
    evaluate_clients,
    fit_at_once,
    fit_clients,
    round_grid,
)


class GlobalStage:
    """Stage G computed on ``executor`` beside the clients' work:
    [`start`][pflower.server.loop.GlobalStage.start] one evaluation,
    [`finish`][pflower.server.loop.GlobalStage.finish] waits for it and records it (row and
    ``history``) on the caller's thread."""

    def __init__(self, executor: ThreadPoolExecutor, history: History) -> None:
        self._executor = executor
        self._history = history
        self._pending: tuple[GlobalEvaluation, Future[dict[str, float]]] | None = None

    def start(self, evaluation: GlobalEvaluation | None) -> None:
        """Compute ``evaluation`` in the background (after finishing the one before)."""
        self.finish()
        if evaluation is not None:
            self._pending = (evaluation, self._executor.submit(evaluation.compute))

    def finish(self) -> None:
        """Wait for the pending evaluation, if any, and record it."""
        if self._pending is None:
            return
        evaluation, computing = self._pending
        self._pending = None
        loss, metrics = evaluation.record(computing.result())
        self._history.add_loss_centralized(server_round=evaluation.server_round, loss=loss)
        self._history.add_metrics_centralized(server_round=evaluation.server_round, metrics=metrics)


class CheckpointingServer(Server):
    """Flower's legacy server loop with checkpoints (see the module docstring)."""

    def __init__(
        self,
        *,
        client_manager: ClientManager,
        strategy: PersonalizedStrategy,
        run_dir: Path,
        overrides: list[str],
        every: int,
        resume_from: ServerCheckpoint | None = None,
        claim: RunDirClaim | None = None,
    ) -> None:
        super().__init__(client_manager=client_manager, strategy=strategy)
        self.personalized = strategy
        self.run_dir = run_dir
        self.overrides = overrides
        self.resume_from = resume_from
        self.every = every
        """Checkpoint after every ``every``-th round and the last one; 0: never."""
        self.claim = claim
        """The claim on ``run_dir`` (``pflower.results.ownership``), released when
        ``fit`` ends."""

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        """Run the rounds after the checkpoint (all of them in a new run)."""
        history = History()
        with (
            self.claim or contextlib.nullcontext(),
            self._summary_on_signal(),
            self._write_failures_end_the_run(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="pflower-stage-g") as executor,
        ):
            stage_g = GlobalStage(executor, history)
            first_round = self._start(timeout, stage_g)
            if first_round > num_rounds:
                # A resume from the last round's checkpoint: the run stopped after it, before
                # its end was recorded (or an interruption recorded it as failed). Its rows are
                # complete: record the end the last round would have.
                self.personalized.recorder.finish()
            start_time = timeit.default_timer()
            for current_round in range(first_round, num_rounds + 1):
                log(INFO, "")
                log(INFO, "[ROUND %s]", current_round)
                res_fit = self.fit_round(current_round, timeout, before_aggregate=stage_g.finish)
                stage_g.finish()
                if res_fit is not None and res_fit[0] is not None:
                    self.parameters = res_fit[0]
                stage_g.start(self.personalized.global_evaluation(current_round, self.parameters))
                res_fed = self.evaluate_round(
                    current_round, timeout, before_aggregate=stage_g.finish
                )
                stage_g.finish()
                if res_fed is not None and res_fed[0] is not None:
                    history.add_loss_distributed(server_round=current_round, loss=res_fed[0])
                if self.every and (current_round % self.every == 0 or current_round == num_rounds):
                    self._checkpoint(current_round)
        return history, timeit.default_timer() - start_time

    @contextlib.contextmanager
    def _write_failures_end_the_run(self) -> Iterator[None]:
        """A write of the run's results (rows, checkpoint, summary, plots) that fails for lack
        of space, a file-size limit or permissions (``is_write_failure``) ends the run as
        failed, with the reason in ``summary.json`` (``Recorder.write_failed``), raised as
        ``ResultsNotWrittenError``; either way the recorder is closed when the run ends."""
        recorder = self.personalized.recorder
        try:
            yield
        except OSError as error:
            if not is_write_failure(error):
                raise
            try:
                reason = recorder.write_failed(error)
            except OSError as unrecorded:
                reason = f"{write_failure(error)}; summary.json not written ({unrecorded})"
            log(ERROR, "%s", reason)
            raise ResultsNotWrittenError(reason) from error
        finally:
            recorder.close()

    def _summary_on_signal(self) -> contextlib.AbstractContextManager[None]:
        """SIGTERM/SIGINT record the run as failed ("interrupted") before the process ends:
        in a deployment's ServerApp process (e.g. ``pflower deploy down`` while it runs), whose
        main thread runs this loop. In a simulation the loop runs on a thread, and ``pflower``
        does the same on its main thread."""
        recorder = self.personalized.recorder
        if not isinstance(recorder, RunRecorder):
            return contextlib.nullcontext()
        return summary_on_signal(recorder.run_dir, recorder.cfg)

    def fit_round(
        self,
        server_round: int,
        timeout: float | None,
        before_aggregate: Callable[[], None] = lambda: None,
    ) -> tuple[Parameters | None, dict[str, Scalar], FitResultsAndFailures] | None:
        """Flower's ``Server.fit_round``, the clients reached as `_round` says."""
        strategy = self.strategy
        return self._round(
            "fit",
            strategy.configure_fit,
            (fit_at_once, fit_clients),
            strategy.aggregate_fit,
            server_round,
            timeout,
            before_aggregate,
        )

    def evaluate_round(
        self,
        server_round: int,
        timeout: float | None,
        before_aggregate: Callable[[], None] = lambda: None,
    ) -> tuple[float | None, dict[str, Scalar], EvaluateResultsAndFailures] | None:
        """Flower's ``Server.evaluate_round``, the clients reached as `_round` says."""
        strategy = self.strategy
        return self._round(
            "evaluate",
            strategy.configure_evaluate,
            (evaluate_at_once, evaluate_clients),
            strategy.aggregate_evaluate,
            server_round,
            timeout,
            before_aggregate,
        )

    def _round(
        self,
        phase: str,
        configure: Callable[..., list[tuple[ClientProxy, Any]]],
        senders: tuple[Callable[..., Any], Callable[..., Any]],
        aggregate: Callable[..., tuple[Any, dict[str, Scalar]]],
        server_round: int,
        timeout: float | None,
        before_aggregate: Callable[[], None],
    ) -> Any:
        """One ``phase`` ("fit" or "evaluate") of a round, logged as in Flower's loop: configure,
        send, ``before_aggregate()``, aggregate; ``(aggregate, metrics, (results, failures))``, or
        None if no client was selected. Over a deployment's or a simulation's grid the round's
        messages go in one push (the first of ``senders``), elsewhere Flower's function reaches
        each client (the second)."""
        instructions = configure(
            server_round=server_round,
            parameters=self.parameters,
            client_manager=self._client_manager,
        )
        if not instructions:
            log(INFO, "configure_%s: no clients selected, skipping it", phase)
            return None
        available = self._client_manager.num_available()
        log(
            INFO,
            "configure_%s: strategy sampled %s clients (out of %s)",
            phase,
            len(instructions),
            available,
        )
        at_once, per_client = senders
        grid = round_grid(proxy for proxy, _ in instructions)
        if grid is not None:
            results, failures = at_once(grid, instructions, timeout, server_round)
        else:
            results, failures = per_client(instructions, self.max_workers, timeout, server_round)
        log(
            INFO,
            "aggregate_%s: received %s results and %s failures",
            phase,
            len(results),
            len(failures),
        )
        before_aggregate()
        aggregated, metrics = aggregate(server_round, results, failures)
        return aggregated, metrics, (results, failures)

    def _start(self, timeout: float | None, stage_g: GlobalStage) -> int:
        """Initialize a new run (global model; stage G of round 0 started on ``stage_g``) or
        restore a checkpoint; returns the first round to run."""
        checkpoint = self.resume_from
        self.personalized.message_keys = {
            **self.personalized.message_keys,
            ATTEMPT: uuid.uuid4().hex[:12],
        }
        if checkpoint is None:
            log(INFO, "[INIT]")
            self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
            stage_g.start(self.personalized.global_evaluation(0, self.parameters))
            return 1
        self.personalized.restore_state(checkpoint.strategy)
        set_random_state(checkpoint.rng)
        self.parameters = ndarrays_to_parameters(self.personalized.global_weights)
        self.personalized.message_keys = {
            **self.personalized.message_keys,
            CHECKPOINT_ROUND: checkpoint.round,
            RESUME_ROUND: checkpoint.round,
        }
        log(INFO, "[RESUME] from the checkpoint of round %s in %s", checkpoint.round, self.run_dir)
        return checkpoint.round + 1

    def _checkpoint(self, server_round: int) -> None:
        recorder = self.personalized.recorder
        if not isinstance(recorder, RunRecorder):
            return  # nothing is written for this run, so nothing could resume it
        position = recorder.position
        save_checkpoint(
            self.run_dir,
            ServerCheckpoint(
                round=server_round,
                config=resolved_config(recorder.cfg),
                overrides=self.overrides,
                strategy=self.personalized.checkpoint_state(),
                rows=position.rows,
                elapsed_s=position.elapsed_s,
                rng=random_state(),
                metrics_size=position.size,
                metrics_sha256=position.sha256,
            ),
        )
        self.personalized.message_keys = {
            **self.personalized.message_keys,
            CHECKPOINT_ROUND: server_round,
        }
        log(INFO, "round %s: checkpoint written to %s", server_round, self.run_dir)
