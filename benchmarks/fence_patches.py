"""What each patch of pflower's runtime fence (``pflower/runtime/fence.py``) saves, measured side
by side with Flower's own behaviour: each scenario runs Flower's function as it is and as pflower
changes it, alternating, ``--pairs`` times; printed are the medians and their ratio.

- ``delivery``: one pass of the simulation engine's delivery loop (Flower's
  ``vce_api.add_messages_to_queue`` against ``pflower.runtime.engine.deliver_pending_messages``)
  over Flower's own ``InMemoryLinkState.get_message_ins`` at 10,000 nodes with a round's 100
  messages stored (the link state holds only its store and lock here);
- publishing the node-to-partition map (``vce_api._register_nodes``) is not a scenario here:
  without it the server asks every node for its partition, one message each, before the first
  round, which whole runs show (docs/guide/runtime.md);
- ``object-pull``: Flower's ``pull_objects`` of an array that is stored 0.1 s after the first ask,
  with Flower's backoff defaults and with ``prompt_object_pulls``';
- ``reply-poll``: ``HttpGrid.send_and_receive`` against ``PromptGrid``'s, for a reply that arrives
  0.1 s after the push;
- ``supernode-poll``: Flower's SuperNode waiting for its ClientApp's reply
  (``start_client_internal._push_messages``) that is ready 0.1 s after it started to look, with the
  module's ``time`` and with the launcher's capped one (0.1 s);
- ``fab-install``: Flower's ``install_from_fab`` of pflower's own FAB, already installed, against
  ``install_fabs_once``'s;
- ``serverapp-fab-install``: the same through Flower's ServerApp runtime (``flwr-serverapp``
  installs the run's FAB at the start of every run), against ``install_serverapp_fabs_once``'s;
- ``app-import``: a fork server's child that forgets the server's import of pflower's ClientApp and
  imports it again, against one that keeps it (``keep_app_if_unchanged``);
- ``serverapp-import``: the same for pflower's ServerApp (a ServerApp fork server's child);
- ``console``: bytes of colour escapes that Flower's console handler writes into a log that is no
  terminal, per 100 lines (pflower switches the colours off there);
- ``ray`` (``--ray``, about a minute): ``RayBackend.init_ray`` in a fresh process with Ray's head
  as it is and with ``lean_ray_head``, and whether the process's SIGTERM handler survives it
  (``ray_keeps_signal_handlers``).

    python benchmarks/fence_patches.py [--pairs 3] [--ray] [--only delivery object-pull ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from queue import Queue
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class OnePass(threading.Event):
    """A stop event that lets a delivery loop run exactly one pass."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > 1

    def wait(self, timeout: float | None = None) -> bool:
        return True


def _link_state(nodes: int, messages: int) -> Any:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    state = InMemoryLinkState.__new__(InMemoryLinkState)
    state.lock = threading.RLock()
    state.message_ins_store = {
        f"m{i}": SimpleNamespace(
            metadata=SimpleNamespace(dst_node_id=i * (nodes // messages), run_id=1, delivered_at="")
        )
        for i in range(messages)
    }
    state._check_stored_messages = lambda ids: None  # TTL checks: Flower's loop pays them too
    return state


def delivery() -> tuple[float, float]:
    from flwr.server.superlink.fleet.vce import vce_api

    from pflower.runtime.engine import deliver_pending_messages

    nodes = 10_000
    mapping = {node: node for node in range(nodes)}
    times = []
    for loop in (vce_api.add_messages_to_queue, deliver_pending_messages):
        state = _link_state(nodes, 100)
        for message in state.message_ins_store.values():
            message.metadata.delivered_at = "earlier"  # between deliveries: nothing to hand on
        began = time.perf_counter()
        loop(state, Queue(), mapping, OnePass())
        times.append(time.perf_counter() - began)
    return times[0], times[1]


def object_pull() -> tuple[float, float]:
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from pflower.runtime.polling import prompt_object_pulls

    def timed() -> float:
        began = time.perf_counter()

        def pull(object_id: str) -> bytes:
            if time.perf_counter() - began < 0.1:
                raise ObjectUnavailableError(object_id)
            return b"array"

        inflatable_utils.pull_objects(["a"], pull)
        return time.perf_counter() - began

    flower = timed()
    restore = prompt_object_pulls()
    try:
        prompt = timed()
    finally:
        restore()
    return flower, prompt


def reply_poll() -> tuple[float, float]:
    from flwr.superlink.grid import HttpGrid

    from pflower.runtime.polling import PromptGrid

    class Grid(HttpGrid):
        def __init__(self) -> None:
            super().__init__(insecure=True, token="t")
            self.pushed_at = 0.0

        def push_messages(self, messages: Iterable[Any]) -> Iterable[str]:
            self.pushed_at = time.perf_counter()
            return ["m"]

        def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Any]:
            if time.perf_counter() - self.pushed_at < 0.1:
                return []
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id="m"))]

    times = []
    for grid in (Grid(), PromptGrid(Grid())):
        began = time.perf_counter()
        assert len(list(grid.send_and_receive(["message"]))) == 1  # type: ignore[list-item]
        times.append(time.perf_counter() - began)
    return times[0], times[1]


class _Sent(Exception):
    """Ends Flower's ``_push_messages`` once it has a reply to send."""


class _Reply:
    """A reply whose first use (its metadata, for the log line) ends ``_push_messages``."""

    @property
    def metadata(self) -> Any:
        raise _Sent


def supernode_poll() -> tuple[float, float]:
    from flwr.supernode import start_client_internal

    from pflower.runtime.launcher import POLLING, CappedSleepTime

    def timed() -> float:
        began = time.perf_counter()
        state = SimpleNamespace(
            get_messages=lambda is_reply: [_Reply()] if time.perf_counter() - began >= 0.1 else []
        )
        with contextlib.suppress(_Sent):
            start_client_internal._push_messages(state, None, None, None)  # type: ignore[arg-type]
        return time.perf_counter() - began

    flower = timed()
    module_time = start_client_internal.time
    start_client_internal.time = CappedSleepTime(POLLING.supernode_s)  # type: ignore[assignment]
    try:
        capped = timed()
    finally:
        start_client_internal.time = module_time
    return flower, capped


def _fab_install(runtime: Any, patch: Callable[[], None]) -> tuple[float, float]:
    """Flower's ``install_from_fab`` as ``runtime`` (a module of Flower's app runtimes) calls
    it, of pflower's own FAB installed already, against the same call after ``patch``."""
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(ROOT)
    flower = runtime.install_from_fab
    with tempfile.TemporaryDirectory(prefix="fab-") as home:
        os.environ["FLWR_HOME"] = home
        flower(fab, skip_prompt=True)  # installed once, as by a node's first task
        patch()
        try:
            runtime.install_from_fab(fab, skip_prompt=True)  # marked
            times = []
            for install in (flower, runtime.install_from_fab):
                began = time.perf_counter()
                install(fab, skip_prompt=True)
                times.append(time.perf_counter() - began)
        finally:
            runtime.install_from_fab = flower
    return times[0], times[1]


def fab_install() -> tuple[float, float]:
    from flwr.supernode.runtime import run_clientapp

    from pflower.runtime.forkapp import install_fabs_once

    return _fab_install(run_clientapp, install_fabs_once)


def serverapp_fab_install() -> tuple[float, float]:
    import importlib

    from pflower.runtime.forkapp import install_serverapp_fabs_once

    # the package re-exports its function run_serverapp under the module's name
    runtime = importlib.import_module("flwr.superlink.runtime.run_serverapp")
    return _fab_install(runtime, install_serverapp_fabs_once)


def _in_child(work: Callable[[], None]) -> float:
    """Seconds ``work`` takes in a child forked from this process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        began = time.perf_counter()
        work()
        os.write(write, f"{time.perf_counter() - began}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seconds = float(pipe.read())
    os.waitpid(pid, 0)
    return seconds


def _app_import(module: str) -> tuple[float, float]:
    """A fork server's child that forgets the server's import of ``module`` (pflower's
    ClientApp or ServerApp) and imports it again, against one that keeps it."""
    import importlib

    from pflower.runtime.forkapp import forget

    importlib.import_module(module)  # what the launcher's fork server preloads

    def again() -> None:
        forget()
        importlib.import_module(module)

    return _in_child(again), _in_child(lambda: importlib.import_module(module))


def app_import() -> tuple[float, float]:
    return _app_import("pflower.client.app")


def serverapp_import() -> tuple[float, float]:
    return _app_import("pflower.server.app")


def console() -> tuple[float, float]:
    from flwr.supercore.logger import ConsoleHandler

    written = []
    for colored in (True, False):
        stream = io.StringIO()
        handler = ConsoleHandler(timestamps=False, json=False, colored=colored, stream=stream)
        logger = logging.getLogger(f"fence-console-{colored}")
        logger.propagate = False
        logger.addHandler(handler)
        for line in range(100):
            logger.warning("round %d done", line)
        logger.removeHandler(handler)
        written.append(stream.getvalue())
    plain = len(written[1].encode())
    return float(len(written[0].encode()) - plain), float(len(written[1].encode()) - plain)


RAY_PROBE = """
import signal, sys, time
from types import SimpleNamespace
from pflower.runtime import engine
from pflower.runtime.fence import RAY_INIT
import ray

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, mine)
lean = sys.argv[1] == "lean"
with engine.lean_ray_head() if lean else engine.contextlib.nullcontext():
    with engine.ray_keeps_signal_handlers() if lean else engine.contextlib.nullcontext():
        began = time.perf_counter()
        backend = SimpleNamespace(init_args_key="init_args")
        RAY_INIT.current()(backend, {"init_args": {"num_cpus": 1}})
        seconds = time.perf_counter() - began
print(seconds, signal.getsignal(signal.SIGTERM) is mine)
ray.shutdown()
"""


def ray_start(kind: str) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(
        [sys.executable, "-c", RAY_PROBE, kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    seconds, kept = result.stdout.split()[-2:]
    return float(seconds), kept == "True"


def ray() -> tuple[float, float]:
    flower, kept_flower = ray_start("flower")
    lean, kept_lean = ray_start("lean")
    print(f"    SIGTERM handler kept by ray.init: Flower's {kept_flower}, pflower's {kept_lean}")
    return flower, lean


SCENARIOS: dict[str, tuple[Callable[[], tuple[float, float]], str]] = {
    "delivery": (delivery, "s per pass"),
    "object-pull": (object_pull, "s"),
    "reply-poll": (reply_poll, "s"),
    "supernode-poll": (supernode_poll, "s"),
    "fab-install": (fab_install, "s"),
    "serverapp-fab-install": (serverapp_fab_install, "s"),
    "app-import": (app_import, "s"),
    "serverapp-import": (serverapp_import, "s"),
    "console": (console, "escape bytes per 100 lines"),
    "ray": (ray, "s"),
}


def main() -> None:
    logging.getLogger("flwr").setLevel(logging.WARNING)  # Flower's INFO lines of the scenarios
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also time Ray's head (a minute)")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=None)
    args = parser.parse_args()
    chosen = args.only or [name for name in SCENARIOS if name != "ray" or args.ray]
    load = os.getloadavg()[0]
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPUs, load {load:.1f}")
    print("| patch | Flower's | pflower's | ratio | unit |")
    print("|---|---|---|---|---|")
    for name in chosen:
        measure, unit = SCENARIOS[name]
        pairs = [measure() for _ in range(args.pairs)]
        flower = statistics.median(p[0] for p in pairs)
        ours = statistics.median(p[1] for p in pairs)
        ratio = f"{flower / ours:.1f}x" if ours > 0 else "-"
        shown = ", ".join(f"{a:.3g}/{b:.3g}" for a, b in pairs)
        print(f"| {name} | {flower:.3g} | {ours:.3g} | {ratio} | {unit} (pairs: {shown}) |")


if __name__ == "__main__":
    main()
