"""The ServerApp's wait for client replies in a deployment: short polls instead of 3 s steps.

Flower's legacy server loop sends each client its ``train``/``evaluate`` message through a
``GridClientProxy``, which calls ``grid.send_and_receive``. In a deployment the grid is Flower's
``HttpGrid``, which pushes the message, asks the SuperLink for the reply, and then asks again
every 3 s: a reply that arrives just after a look waits 3 s, twice a round.

:class:`PromptClientManager` (the ServerApp's client manager) gives every proxy that talks to
an ``HttpGrid`` a :class:`PromptGrid` around it: the same push, the same pulls and the same
end conditions (all replies, or ``timeout``), with pauses that start at
:attr:`PromptGrid.first_s` and grow by half up to :attr:`PromptGrid.longest_s`, so a reply waits
at most ``longest_s`` and a long round costs the SuperLink a pull every ``longest_s``. The
simulation's ``InMemoryGrid`` (0.1 s pulls already) is left alone. Only timing changes: the
messages, and so every result, are the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run
from flwr.superlink.grid import HttpGrid


class PromptGrid(Grid):
    """``grid`` with a ``send_and_receive`` that polls for replies with growing pauses."""

    first_s = 0.02
    longest_s = 0.2

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

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
        pending = set(self.push_messages(messages))
        end_time = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        pause = self.first_s
        while timeout is None or time.time() < end_time:
            received = list(self.pull_messages(pending))
            replies.extend(received)
            pending.difference_update(m.metadata.reply_to_message_id for m in received)
            if not pending:
                break
            time.sleep(pause)
            pause = min(pause * 1.5, self.longest_s)
        return replies


class PromptClientManager(SimpleClientManager):
    """Flower's ``SimpleClientManager`` whose proxies over an ``HttpGrid`` wait promptly."""

    def register(self, client: ClientProxy) -> bool:
        if isinstance(client, GridClientProxy) and isinstance(client.grid, HttpGrid):
            client.grid = PromptGrid(client.grid)
        return super().register(client)
