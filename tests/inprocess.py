"""Drive the real ServerApp/ClientApp functions in one process, without Ray, for fast tests.

``run_inprocess`` builds the server (pflower's checkpointing loop) and the strategy with
``server_fn`` and one context per client, then runs the rounds over in-process client proxies
that call ``client_fn`` for every message, exactly as the simulation engine does (a fresh client
object per message, state only in ``context.state``). Clients run one at a time because they
share the per-process model instance, as clients of one Ray worker do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.client import Client
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
)
from flwr.common.typing import DisconnectRes
from flwr.server.client_proxy import ClientProxy

from pflower.client.app import client_fn
from pflower.config import RUN_CONFIG_KEY, overrides_to_string
from pflower.core.strategy import PersonalizedStrategy
from pflower.server.app import server_fn

ClientFn = Callable[[Context], Client]


def forgetful_client_fn(context: Context) -> Client:
    """``client_fn`` whose client never sees what an earlier message stored: a fresh
    ``context.state`` for every message, as on a node that keeps nothing."""
    context.state = RecordDict()
    return client_fn(context)


class InProcessProxy(ClientProxy):
    """A ClientProxy that builds the client from its context for every call."""

    def __init__(self, cid: str, context: Context, make_client: ClientFn) -> None:
        super().__init__(cid)
        self.context = context
        self.make_client = make_client

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        return self.make_client(self.context).get_properties(ins)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        return self.make_client(self.context).get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        return self.make_client(self.context).fit(ins)

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        return self.make_client(self.context).evaluate(ins)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        return DisconnectRes(reason="")


def run_inprocess(
    overrides: Sequence[str],
    run_dir: Path,
    make_client: ClientFn = client_fn,
    strategies: list[PersonalizedStrategy] | None = None,
) -> tuple[list[dict[str, Any]], list[Context]]:
    """Run an experiment in-process; returns the metrics.jsonl rows and the client contexts.

    If ``strategies`` is given, the server's strategy is appended to it (for its final state).
    No plots are drawn unless ``overrides`` say ``plots=true``.
    """
    overrides = ["plots=false", *overrides, f"output_dir={run_dir}", "progress=false"]
    run_config = {RUN_CONFIG_KEY: overrides_to_string(overrides)}
    server_context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    components = server_fn(server_context)
    server, config = components.server, components.config
    assert server is not None and config is not None
    strategy = server.strategy
    assert isinstance(strategy, PersonalizedStrategy)
    if strategies is not None:
        strategies.append(strategy)
    num_clients = strategy.settings.num_clients
    contexts = [
        Context(
            run_id=1,
            node_id=1000 + pid,
            node_config={"partition-id": pid, "num-partitions": num_clients},
            state=RecordDict(),
            run_config=run_config,
        )
        for pid in range(num_clients)
    ]
    # Node ids deliberately do not follow partition order: the strategy must key by partition.
    for pid in reversed(range(num_clients)):
        server.client_manager().register(
            InProcessProxy(str(7919 * (pid + 3)), contexts[pid], make_client)
        )
    server.set_max_workers(1)
    server.fit(config.num_rounds, timeout=None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, contexts
