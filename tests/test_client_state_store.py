"""``client_state.store=disk``: the clients' personal state lives in their snapshot files, not in
``context.state``, and a run gives exactly the rows it gives with the state in memory; the
snapshots a server run may read (its own, and those up to the round it resumed from); a snapshot
is written after every fit and after an evaluate that changed the state, not after one that only
read it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.client import NumPyClient

from pflower.core.checkpoint import ATTEMPT, ClientStateFiles, PersistentClient, load_checkpoint
from pflower.core.state import ClientState
from pflower.registry import ConfigError
from tests.helpers import RESUME_TINY as BASE
from tests.helpers import (
    results,
    stopped_in_round,
    summary_without_clock,
)
from tests.inprocess import run_inprocess

DISK = "client_state.store=disk"


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy=fliu", "fraction=0.5", "checkpoint.every=0"],  # clients skip rounds
        ["strategy=flame", "checkpoint.every=0"],  # ADMM duals
    ],
    ids=["fliu", "flame"],
)
def test_state_on_disk_gives_the_rows_of_state_in_memory(
    tmp_path: Path, overrides: list[str]
) -> None:
    experiment = [*BASE, *overrides]
    in_memory, memory_contexts = run_inprocess(experiment, tmp_path / "memory")
    on_disk, disk_contexts = run_inprocess([*experiment, DISK], tmp_path / "disk")
    assert results(on_disk) == results(in_memory)
    assert all(context.state for context in memory_contexts)
    assert not any(context.state for context in disk_contexts), "evicted after every message"
    # what is on disk is what memory held at the end: the newest snapshot of every client
    for pid, context in enumerate(memory_contexts):
        folder = tmp_path / "disk" / "client_state"
        (snapshot,) = (folder / f"partition_{pid}").iterdir()  # the newest only: no checkpoints
        attempt = snapshot.name.split(".")[1]
        restored = RecordDict()
        ClientStateFiles(folder, pid, attempt=attempt).restore(restored)
        assert sorted(restored) == sorted(context.state)
        for key, record in context.state.items():
            if isinstance(record, ArrayRecord):
                for mine, theirs in zip(
                    restored[key].to_numpy_ndarrays(), record.to_numpy_ndarrays(), strict=True
                ):
                    np.testing.assert_array_equal(mine, theirs)


def test_state_on_disk_resumes_to_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after round 5's training (its clients wrote round-5 snapshots), resumed from the
    round-4 checkpoint: the resumed run reads round 4's state, never the crashed run's round 5."""
    experiment = [*BASE, "strategy=fliu", "fraction=0.5", DISK]
    reference, _ = run_inprocess(experiment, tmp_path / "reference")
    run_dir = tmp_path / "run"
    stopped_in_round(monkeypatch, experiment, run_dir, 5)
    assert load_checkpoint(run_dir).round == 4
    assert any((run_dir / "client_state").rglob("round_000005.*.npz"))
    resumed, contexts = run_inprocess([*experiment, "checkpoint.resume=true"], run_dir)
    assert results(resumed) == results(reference)
    assert summary_without_clock(run_dir) == summary_without_clock(tmp_path / "reference")
    assert not any(context.state for context in contexts)


def test_disk_store_without_a_folder_is_refused() -> None:
    from flwr.app import Context

    from pflower.client.app import client_fn
    from pflower.compose import compose_config
    from pflower.config import RUN_CONFIG_KEY, overrides_to_string

    overrides = ["dataset=digits", "model=small_cnn", "num_clients=2", DISK]
    compose_config(overrides)  # valid as configuration: a node may name its own folder
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config={RUN_CONFIG_KEY: overrides_to_string(overrides)},
    )
    with pytest.raises(ConfigError, match=r"client_state\.store=disk needs a folder"):
        client_fn(context)


# ------------------------------------------------------------------- what a server run may read
def state(value: int) -> RecordDict:
    return RecordDict({"w": ArrayRecord([np.full(3, value)]), "c": ConfigRecord({"v": value})})


def value(records: RecordDict) -> int:
    return int(records["w"].to_numpy_ndarrays()[0][0])


def test_a_resumed_run_ignores_what_the_crashed_run_wrote_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    crashed = ClientStateFiles(tmp_path, 0, attempt="a")
    for server_round in (1, 2, 3):
        crashed.save(state(server_round), server_round, checkpointed=2)
    assert crashed.rounds() == [2, 3]  # round 2 is what a resume from the checkpoint needs

    resumed = ClientStateFiles(tmp_path, 0, attempt="b", resumed=2)
    assert resumed.rounds() == [2]
    records = RecordDict()
    assert resumed.restore(records) == 2 and value(records) == 2
    resumed.save(state(30), 3, checkpointed=2)
    resumed.save(state(40), 4, checkpointed=2)
    records = RecordDict()
    assert resumed.restore(records) == 4 and value(records) == 40
    names = sorted(p.name for p in (tmp_path / "partition_0").iterdir())
    assert names == ["round_000002.a.npz", "round_000004.b.npz"], "stale round 3 of 'a' pruned"


def test_a_fresh_run_never_reads_snapshots_left_in_its_folder(tmp_path: Path) -> None:
    ClientStateFiles(tmp_path, 0, attempt="old").save(state(7), 7, checkpointed=7)
    fresh = ClientStateFiles(tmp_path, 0, attempt="new")
    assert fresh.restore(RecordDict()) is None
    fresh.save(state(1), 1, checkpointed=0)
    records = RecordDict()
    assert fresh.restore(records) == 1 and value(records) == 1
    assert [p.name for p in (tmp_path / "partition_0").iterdir()] == ["round_000001.new.npz"]


# --------------------------------------------------------------- when a snapshot is written
class Recorder(NumPyClient):
    """An algorithm's client: fit stores ``fitted``; evaluate stores ``evaluated`` if given,
    else only reads the state."""

    def __init__(self, records: RecordDict, evaluated: int | None = None) -> None:
        self.state = ClientState(records)
        self.evaluated = evaluated

    def fit(self, parameters, config):
        self.state.put_arrays("w", [np.full(3, 1)])
        return parameters, 1, {}

    def evaluate(self, parameters, config):
        self.state.get_arrays("w")
        if self.evaluated is not None:
            self.state.put_arrays("w", [np.full(3, self.evaluated)])
        return 0.0, 1, {}


def snapshot_names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "partition_0").iterdir())


@pytest.mark.parametrize("evict", [False, True], ids=["memory", "disk"])
def test_an_evaluate_that_leaves_the_state_alone_writes_no_snapshot(
    tmp_path: Path, evict: bool
) -> None:
    records = RecordDict()
    config = {ATTEMPT: "a", "server-round": 1}

    def client(evaluated: int | None = None) -> PersistentClient:
        return PersistentClient(Recorder(records, evaluated), records, tmp_path, 0, evict)

    client().fit([], config)
    assert snapshot_names(tmp_path) == ["round_000001.a.npz"]
    client().evaluate([], {**config, "server-round": 2})
    assert snapshot_names(tmp_path) == ["round_000001.a.npz"], "unchanged: nothing rewritten"
    assert bool(records) is not evict
    client(evaluated=5).evaluate([], {**config, "server-round": 3})
    assert snapshot_names(tmp_path) == ["round_000003.a.npz"], "changed: snapshot of round 3"
    restored = RecordDict()
    ClientStateFiles(tmp_path, 0, attempt="a").restore(restored)
    assert value(restored) == 5
