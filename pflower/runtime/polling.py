"""The ServerApp's messages: a round's messages in one push, and short polls for the replies
instead of Flower's 3 s steps (a deployment) or 0.1 s steps (a simulation).

Flower's legacy server loop sends each client its ``train``/``evaluate`` message through a
``GridClientProxy``, which calls ``grid.send_and_receive``. In a deployment the grid is Flower's
``HttpGrid``, which pushes the message, asks the SuperLink for the reply, and then asks again
every 3 s: a reply that arrives just after a look waits 3 s, twice a round.

[`PromptClientManager`][pflower.runtime.polling.PromptClientManager] (the ServerApp's client
manager) gives every proxy that talks to
an ``HttpGrid`` a [`PromptGrid`][pflower.runtime.polling.PromptGrid] around it: the same push, the
same pulls and the same
end conditions (all replies, or ``timeout``), with pauses that start at
`PromptGrid.first_s` and grow by half up to `PromptGrid.longest_s`, so a reply waits
at most ``longest_s`` and a long round costs the SuperLink a pull every ``longest_s``.
A simulation's rounds go through its ``InMemoryGrid`` as a
[`SimulationGrid`][pflower.runtime.polling.SimulationGrid]: sent at once as well, and its replies
looked for every `SIMULATION_POLL_S` (a look reads this process's memory) where each
client's proxy looked for its own every 0.1 s.

A round's messages also go out together: [`fit_at_once`][pflower.runtime.polling.fit_at_once] and
[`evaluate_at_once`][pflower.runtime.polling.evaluate_at_once] push all
of a round's ``train`` (or ``evaluate``) messages in one request and wait for all replies, where
Flower's legacy loop gives each client a thread that pushes its own message and waits for its
reply. The SuperLink then registers every message's objects before any of them is pushed, so
before any node can have received its message (and the SuperLink deleted what only that message
used), and it stores the arrays the messages share (the global model) once. With one push per
client, the SuperLink of Flower 1.39 sometimes dropped a shared array while another client's push
still needed it, and that client failed with ``ObjectPushError``. One push also removes the legacy
loop's thread limit (``min(32, cores + 4)`` clients in flight). Only timing changes: the
messages, and so every result, are the same. The messages' arrays travel packed, each
``ArrayRecord`` as one array ([`pflower.runtime.packing`][pflower.runtime.packing]): 5 objects per
``train`` message to
move instead of 19 for an 8-tensor model. The roster's questions for the nodes' partitions go in
one push too ([`ask_properties_at_once`][pflower.runtime.polling.ask_properties_at_once]).

[`prompt_object_pulls`][pflower.runtime.polling.prompt_object_pulls] shortens a wait that every
Flower process pulling a message's arrays
can hit: a message is announced before its arrays are all stored (the SuperNode stores the
message, and so starts its ClientApp, before it has pulled the arrays from the SuperLink; a reply
is pushed before its arrays), and Flower retries an array it cannot have yet after 1 s, then
2 s, 4 s, ... (``pull_objects``' ``initial_backoff``). The ServerApp (for its replies), the
SuperNode and its ClientApps ([`pflower.runtime.launcher`][pflower.runtime.launcher],
[`pflower.runtime.forkserver`][pflower.runtime.forkserver])
retry after [`OBJECT_PULL_FIRST_S`][pflower.runtime.polling.OBJECT_PULL_FIRST_S] instead, doubling
up to [`OBJECT_PULL_LONGEST_S`][pflower.runtime.polling.OBJECT_PULL_LONGEST_S].

Elsewhere (the in-process test proxies, which talk through no grid) the rounds go through
Flower's legacy ``fit_clients``/``evaluate_clients`` (`FIT_CLIENTS`), which this module hands on
with their result types (`fit_clients`, `evaluate_clients`). Flower internals used here
([`pflower.runtime.fence`][pflower.runtime.fence]): ``HttpGrid.send_and_receive``'s
contract, ``GridClientProxy``'s grid, the defaults of ``pull_objects`` and
``pull_and_inflate_object_from_tree``, and the legacy message conversions of
``flwr.compat.common.recorddict_compat``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from logging import WARNING
from typing import Any, TypeVar

from flwr.app import Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    MessageTypeLegacy,
    Scalar,
)
from flwr.common.logger import log
from flwr.compat.common import recorddict_compat as compat
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.server import (
    EvaluateResultsAndFailures,
    FitResultsAndFailures,
    evaluate_clients,
    fit_clients,
)
from flwr.serverapp.grid import Grid
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError
from flwr.supercore.run import Run
from flwr.superlink.grid import HttpGrid

from pflower.runtime.engine import is_in_memory_grid
from pflower.runtime.fence import PULL_AND_INFLATE, PULL_OBJECTS
from pflower.runtime.packing import PackedArrays, pack, unpack

__all__ = [
    "EvaluateResultsAndFailures",
    "FitResultsAndFailures",
    "PromptClientManager",
    "PromptGrid",
    "SimulationGrid",
    "ask_properties_at_once",
    "evaluate_at_once",
    "evaluate_clients",
    "fit_at_once",
    "fit_clients",
    "prompt_object_pulls",
    "round_grid",
]

OBJECT_PULL_FIRST_S = 0.02
"""First pause before pulling again an array that is not there yet (Flower: 1 s)."""

OBJECT_PULL_LONGEST_S = 1.0
"""Longest such pause (Flower: 10 s)."""


def prompt_object_pulls(
    first_s: float = OBJECT_PULL_FIRST_S, longest_s: float = OBJECT_PULL_LONGEST_S
) -> Callable[[], None]:
    """Make this process retry an array that is not there yet after ``first_s``, doubling up
    to ``longest_s`` (see the module docstring); returns what puts Flower's defaults back.

    Replaces the ``initial_backoff``/``backoff_cap`` keyword defaults (``__kwdefaults__``) of
    Flower 1.39's ``inflatable_utils.pull_objects`` and ``pull_and_inflate_object_from_tree``
    (`PULL_OBJECTS`, `PULL_AND_INFLATE`),
    which every pull of a message's arrays goes through and which have no other setting. The
    processes that call it (a deployment's ServerApp, a SuperNode started by pflower's launcher,
    a fork server) keep it for their life. Fails
    ([`FlowerChanged`][pflower.runtime.internal.FlowerChanged])
    if Flower's functions no longer have these parameters."""
    saved: list[tuple[Any, dict[str, Any]]] = []
    for internal in (PULL_OBJECTS, PULL_AND_INFLATE):
        internal.check()
        function = internal.current()
        defaults = function.__kwdefaults__
        saved.append((function, dict(defaults)))
        defaults.update(initial_backoff=first_s, backoff_cap=longest_s)

    def restore() -> None:
        for function, defaults in saved:
            function.__kwdefaults__ = defaults

    return restore


class PromptGrid(Grid):
    """``grid`` with a ``send_and_receive`` that polls for replies with growing pauses (and this
    process's object pulls made prompt:
    [`prompt_object_pulls`][pflower.runtime.polling.prompt_object_pulls])."""

    first_s = 0.02
    longest_s = 0.2

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        prompt_object_pulls()

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages``, then pull their replies until all arrived or ``timeout`` passed
        (``HttpGrid.send_and_receive``'s contract, with shorter pauses)."""
        replies: list[Message] = []
        self.stream(messages, replies.extend, timeout=timeout)
        return replies

    def stream(
        self,
        messages: Iterable[Message],
        received: Callable[[list[Message]], None],
        *,
        timeout: float | None = None,
    ) -> None:
        """[`send_and_receive`][pflower.runtime.polling.PromptGrid.send_and_receive], handing
        each pull's replies to ``received`` as they arrive."""
        pending = set(self.push_messages(messages))
        end_time = time.time() + (timeout if timeout is not None else 0.0)
        pause = self.first_s
        while timeout is None or time.time() < end_time:
            replies = list(self.pull_messages(pending))
            if replies:
                received(replies)
            pending.difference_update(m.metadata.reply_to_message_id for m in replies)
            if not pending:
                break
            time.sleep(pause)
            pause = min(pause * 1.5, self.longest_s)


SIMULATION_POLL_S = 0.005
"""Pause between two looks for a simulation round's replies
([`SimulationGrid`][pflower.runtime.polling.SimulationGrid])."""


class SimulationGrid(PromptGrid):
    """A simulation's ``InMemoryGrid`` for one round sent at once: its replies are looked for
    every [`SIMULATION_POLL_S`][pflower.runtime.polling.SIMULATION_POLL_S], by one thread.

    Flower's proxies each look for their own reply every 0.1 s (``InMemoryGrid.pull_interval``),
    so a round's last reply waited 0.05 s on average, twice a round. A look at the in-memory
    link state costs microseconds, and there are no objects to pull (so this process's object
    pulls are left as they are)."""

    first_s = SIMULATION_POLL_S
    longest_s = SIMULATION_POLL_S

    def __init__(self, grid: Grid) -> None:  # no super().__init__: nothing is pulled
        self.grid = grid


class PromptClientManager(SimpleClientManager):
    """Flower's ``SimpleClientManager`` whose proxies over an ``HttpGrid`` wait promptly."""

    def register(self, client: ClientProxy) -> bool:
        if isinstance(client, GridClientProxy) and isinstance(client.grid, HttpGrid):
            client.grid = PromptGrid(client.grid)
        return super().register(client)


def round_grid(proxies: Iterable[ClientProxy]) -> PromptGrid | None:
    """The grid through which a round reaches all ``proxies`` at once: the deployment's
    [`PromptGrid`][pflower.runtime.polling.PromptGrid] that
    [`PromptClientManager`][pflower.runtime.polling.PromptClientManager] gave them, or a
    [`SimulationGrid`][pflower.runtime.polling.SimulationGrid] over the ``InMemoryGrid`` they all
    share; None otherwise (the in-process test proxies talk through no grid at all)."""
    grids = [getattr(proxy, "grid", None) for proxy in proxies]
    if not grids:
        return None
    if all(isinstance(grid, PromptGrid) for grid in grids):
        return grids[0]
    first = grids[0]
    if isinstance(first, Grid) and is_in_memory_grid(first) and all(g is first for g in grids):
        return SimulationGrid(first)
    return None


Res = TypeVar("Res", FitRes, EvaluateRes)


Answered = Callable[[ClientProxy, RecordDict | Exception], None]
"""What [`exchange`][pflower.runtime.polling.exchange] hands each node's answer to as it comes."""


def exchange(
    grid: PromptGrid,
    requests: Sequence[tuple[ClientProxy, RecordDict]],
    message_type: str,
    timeout: float | None,
    group_id: int,
    answered: Answered | None = None,
) -> list[tuple[ClientProxy, RecordDict | Exception]]:
    """Send each proxy its content in one push; each proxy's reply content, or why it has none.

    The messages are those ``GridClientProxy`` builds, with their arrays packed
    ([`pflower.runtime.packing`][pflower.runtime.packing]: the ClientApp unpacks them; the replies
    are unpacked here).
    Replies are matched to their messages (``reply_to_message_id``; a reply the SuperLink made for
    a node, such as its "Node Unavailable" error for a node whose heartbeats stopped, comes from
    the SuperLink, not from the node). A node that did not reply within ``timeout`` or whose
    reply is an error gets an exception, as from ``GridClientProxy``. Each answer also goes to
    ``answered`` as soon as it is known.
    """
    shared: PackedArrays = {}  # the round's global model: packed once for all messages
    messages = [
        Message(
            content=pack(content, shared),
            message_type=message_type,
            dst_node_id=int(proxy.cid),
            group_id=str(group_id) if group_id else "",
            ttl=timeout,
        )
        for proxy, content in requests
    ]
    proxy_of: dict[str, ClientProxy] = {}  # message id -> proxy: the ids are set by the push
    answers: dict[str, RecordDict | Exception] = {}

    def take(proxy: ClientProxy, answer: RecordDict | Exception) -> None:
        answers[proxy.cid] = answer
        if answered is not None:
            answered(proxy, answer)

    def received(replies: list[Message]) -> None:
        if not proxy_of:
            pushed = zip(messages, requests, strict=True)
            proxy_of.update((m.metadata.message_id, proxy) for m, (proxy, _) in pushed)
        for reply in replies:  # unpacked one by one: each packed reply's bytes go at once
            proxy = proxy_of[reply.metadata.reply_to_message_id]
            if not reply.has_error():
                take(proxy, unpack(reply.content))
            elif reply.metadata.src_node_id == int(proxy.cid):
                take(proxy, ValueError(f"the node replied with an error: {reply.error.reason}"))
            else:
                take(proxy, ValueError(f"the SuperLink replied for the node: {reply.error.reason}"))

    grid.stream(messages, received, timeout=timeout)
    for proxy, _ in requests:
        if proxy.cid not in answers:
            take(proxy, TimeoutError(f"node {proxy.cid} did not reply in time"))
    return [(proxy, answers[proxy.cid]) for proxy, _ in requests]


def _at_once(
    grid: PromptGrid,
    requests: Sequence[tuple[ClientProxy, RecordDict]],
    message_type: str,
    to_res: Callable[[RecordDict], Res],
    timeout: float | None,
    group_id: int,
) -> tuple[list[tuple[ClientProxy, Res]], list[tuple[ClientProxy, Res] | BaseException]]:
    """[`exchange`][pflower.runtime.polling.exchange], sorted into Flower's results and failures (as
    ``fit_clients`` does)."""
    results: list[tuple[ClientProxy, Res]] = []
    failures: list[tuple[ClientProxy, Res] | BaseException] = []
    for proxy, answer in exchange(grid, requests, message_type, timeout, group_id):
        if isinstance(answer, Exception):
            failures.append(answer)
            continue
        res = to_res(answer)
        (results if res.status.code == Code.OK else failures).append((proxy, res))
    return results, failures


def fit_at_once(
    grid: PromptGrid,
    instructions: Sequence[tuple[ClientProxy, FitIns]],
    timeout: float | None,
    group_id: int,
) -> FitResultsAndFailures:
    """Flower's ``fit_clients`` with all ``train`` messages in one push (module docstring)."""
    requests = [(p, compat.fitins_to_recorddict(ins, keep_input=True)) for p, ins in instructions]
    return _at_once(
        grid,
        requests,
        MessageType.TRAIN,
        lambda content: compat.recorddict_to_fitres(content, keep_input=False),
        timeout,
        group_id,
    )


def evaluate_at_once(
    grid: PromptGrid,
    instructions: Sequence[tuple[ClientProxy, EvaluateIns]],
    timeout: float | None,
    group_id: int,
) -> EvaluateResultsAndFailures:
    """Flower's ``evaluate_clients`` with all ``evaluate`` messages in one push."""
    requests = [
        (p, compat.evaluateins_to_recorddict(ins, keep_input=True)) for p, ins in instructions
    ]
    return _at_once(
        grid, requests, MessageType.EVALUATE, compat.recorddict_to_evaluateres, timeout, group_id
    )


PUSH_ATTEMPTS = 3
"""How often [`ask_properties_at_once`][pflower.runtime.polling.ask_properties_at_once] pushes its
questions when the SuperLink refuses to store them."""


def ask_properties_at_once(
    grid: PromptGrid,
    proxies: Sequence[ClientProxy],
    timeout: float | None,
    answered: Callable[[ClientProxy, dict[str, Scalar] | Exception], None],
) -> None:
    """Ask every proxy's node for its properties (``GetPropertiesIns({})``, the roster's question
    for its partition) in one push, handing each node's properties, or why it has none, to
    ``answered`` as they come; returns when all answered or ``timeout`` passed.

    One push for all, for the reason a round's messages go in one (module docstring): the
    questions share their content, and with one push per node the SuperLink of Flower 1.39
    sometimes refused a node's push (``ObjectPushError``: "the push session may have expired or
    been replaced"; seen in the compose stack under CI load), which left that node out of round 1.
    A push refused all the same (``ObjectPushError`` before any answer came) is pushed again,
    [`PUSH_ATTEMPTS`][pflower.runtime.polling.PUSH_ATTEMPTS] times in all: a node that got a
    question twice answers twice the same, and only the answers to the last push are read.
    """
    requests = [
        (proxy, compat.getpropertiesins_to_recorddict(GetPropertiesIns({}))) for proxy in proxies
    ]

    def properties(proxy: ClientProxy, answer: RecordDict | Exception) -> None:
        if isinstance(answer, Exception):
            answered(proxy, answer)
            return
        res = compat.recorddict_to_getpropertiesres(answer)
        if res.status.code != Code.OK:
            answered(proxy, ValueError(f"status {res.status.code.name}: {res.status.message}"))
        else:
            answered(proxy, res.properties)

    for attempt in range(1, PUSH_ATTEMPTS + 1):
        try:
            exchange(grid, requests, MessageTypeLegacy.GET_PROPERTIES, timeout, 0, properties)
            return
        except ObjectPushError as error:
            if attempt == PUSH_ATTEMPTS:
                raise
            log(
                WARNING,
                "the SuperLink refused the nodes' questions for their partitions (%s); "
                "pushing them again (attempt %d of %d)",
                error,
                attempt + 1,
                PUSH_ATTEMPTS,
            )
