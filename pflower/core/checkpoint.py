"""Checkpoints: what a run needs to continue after a crash, exactly as if it had not stopped.

Server side, ``checkpoint.pkl`` in the run directory holds, after round ``t``: the strategy's
state (the global model, the per-client model store, control variates, affinity matrices, and
whatever else the algorithm learned: the attributes it declares ``checkpointed``, see
`PersonalizedStrategy.checkpoint_state`), the server process's global random generators,
the number of ``metrics.jsonl`` rows written by the end of round ``t`` with the length and the
SHA-256 digest of the file's bytes up to there (the recorder's position), the elapsed wall time,
the Hydra overrides and the resolved configuration. Client sampling needs no saved generator:
every round draws from its own stream (`round_rng`), so a resumed run draws what the
uninterrupted run drew.

Client side, every client keeps snapshots of its ``context.state`` in ``client_state.dir``
(one folder per partition, on the machine that runs the client: a SuperNode's own disk in a
deployment), written after each message it handles and named by round and by the server run
that wrote it (``state-attempt``, new each time a server starts: the snapshots a crashed attempt
wrote after the checkpoint it is resumed from are never read). The server tells clients the last
round it checkpointed (``checkpoint-round``); a client keeps its newest snapshot and the one a
resume from that checkpoint needs, and deletes the others. In a resumed run the server sends
``resume-round``: a client whose state is empty (its process or node started afresh) first
restores its newest snapshot from a round no later than that, or a newer one of this attempt.

With ``client_state.store=disk`` the same snapshots are the state itself: a client loads its
snapshot for every message and empties ``context.state`` afterwards, so the clients' personal
state lives on disk, not in the memory of the process that holds the nodes' contexts (a
simulation of 10,000 clients keeps only the sampled clients' state in memory).

Every file is written to a temporary name and renamed, so a crash while writing leaves the
previous file. A checkpoint is refused, with the reason, when it is missing, corrupt (its
checksum does not match, or it cannot be read), of another format version, or written by a run
with another configuration (only the keys in
[`MAY_DIFFER_ON_RESUME`][pflower.core.checkpoint.MAY_DIFFER_ON_RESUME] may change); and a run
directory whose ``metrics.jsonl`` changed since the checkpoint (any byte up to the checkpoint's
position edited, removed or inserted: its digest differs) is refused too. A run that completed
is not resumed again (``pflower resume`` says so and writes nothing) unless ``rounds`` extends it.
Checkpoints are pickles: resume only run directories you trust.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from pflower.config import EXECUTION_KEYS, run_level_defaults
from pflower.registry import ConfigError
from pflower.results.disk import write_atomic
from pflower.results.rundir import RecorderPosition, metrics_changed

FORMAT_VERSION = 1
"""Version of the checkpoint layout; a checkpoint of another version is refused."""

CHECKPOINT_FILE = "checkpoint.pkl"

CHECKPOINT_ROUND = "checkpoint-round"
"""Config key of fit/evaluate instructions: the last round the server checkpointed."""

RESUME_ROUND = "resume-round"
"""Config key of fit/evaluate instructions in a resumed run: the round it resumed from."""

ATTEMPT = "state-attempt"
"""Config key of fit/evaluate instructions: the id of this server run (new at every start, fresh
or resumed), which names the client snapshots written in it."""

MAY_DIFFER_ON_RESUME = ("rounds", *EXECUTION_KEYS)
"""Top-level config keys a resumed run may change: how it executes, and ``rounds``, which may
grow to extend the run."""


class CheckpointError(ConfigError):
    """A checkpoint cannot be used: missing, corrupt, or of another configuration."""


@dataclass(frozen=True)
class ServerCheckpoint:
    """The server's side of a run after round ``round`` (see the module docstring)."""

    round: int
    config: dict[str, Any]
    overrides: list[str]
    strategy: dict[str, Any]
    rows: int
    elapsed_s: float
    rng: dict[str, Any]
    metrics_size: int = 0
    """Length of ``metrics.jsonl`` after ``rows`` rows (0 in checkpoints written before it was
    stored: those are checked by row count only)."""
    metrics_sha256: str = ""
    """SHA-256 digest of ``metrics.jsonl``'s first ``metrics_size`` bytes."""

    @property
    def position(self) -> RecorderPosition:
        """Where the resumed run's recorder continues."""
        return RecorderPosition(self.rows, self.elapsed_s, self.metrics_size, self.metrics_sha256)


def random_state() -> dict[str, Any]:
    """The state of this process's global random generators (Python, NumPy, torch)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_random_state(state: Mapping[str, Any]) -> None:
    """Restore what [`random_state`][pflower.core.checkpoint.random_state] returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, checkpoint: ServerCheckpoint) -> Path:
    """Write ``checkpoint`` into ``run_dir`` (atomically, with a checksum of its contents)."""
    payload = pickle.dumps(checkpoint, protocol=pickle.HIGHEST_PROTOCOL)
    envelope = {
        "format": FORMAT_VERSION,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": payload,
    }
    path = run_dir / CHECKPOINT_FILE
    write_atomic(path, pickle.dumps(envelope, protocol=pickle.HIGHEST_PROTOCOL))
    return path


def load_checkpoint(run_dir: Path) -> ServerCheckpoint:
    """The checkpoint in ``run_dir``; [`CheckpointError`][pflower.core.checkpoint.CheckpointError]
    says why when it is unusable."""
    path = run_dir / CHECKPOINT_FILE
    if not path.is_file():
        hint = (
            "the run was started with checkpoint.every=0, or stopped before its first checkpoint"
            if (run_dir / "config.yaml").is_file()
            else "this is not a run directory"
        )
        raise CheckpointError(f"no checkpoint to resume from: {path} does not exist ({hint})")
    try:
        envelope = pickle.loads(path.read_bytes())
        payload = envelope["payload"]
        digest, version = envelope["sha256"], envelope["format"]
    except Exception as error:  # any damage to the file ends here, with the reason
        raise CheckpointError(
            f"corrupt checkpoint {path}: it cannot be read ({type(error).__name__}: {error})"
        ) from error
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version}; this pflower reads version "
            f"{FORMAT_VERSION}"
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"corrupt checkpoint {path}: its contents do not match its checksum")
    checkpoint = pickle.loads(payload)
    if not isinstance(checkpoint, ServerCheckpoint):
        raise CheckpointError(f"corrupt checkpoint {path}: it holds {type(checkpoint).__name__}")
    return checkpoint


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened configuration, with the run-level keys it lacks at their defaults (a
    checkpoint written before a key existed), without the keys a resumed run may change."""
    flat = {**_flatten(run_level_defaults()), **_flatten(config)}
    return {
        key: value for key, value in flat.items() if key.split(".")[0] not in MAY_DIFFER_ON_RESUME
    }


def check_compatible(checkpoint: ServerCheckpoint, config: Mapping[str, Any], path: Path) -> None:
    """Refuse to resume a run whose configuration differs from the checkpoint's.

    ``config`` is the resumed run's resolved configuration; keys under
    [`MAY_DIFFER_ON_RESUME`][pflower.core.checkpoint.MAY_DIFFER_ON_RESUME] may differ, and
    ``rounds`` may not go below the checkpoint's
    round.
    """
    rounds = int(config["rounds"])
    if rounds < checkpoint.round:
        raise CheckpointError(
            f"rounds={rounds} is below the checkpoint's round {checkpoint.round} ({path}); "
            f"a run can be resumed or extended, not shortened"
        )
    before, now = _comparable(checkpoint.config), _comparable(config)
    absent = "<absent>"
    changed = [
        f"{key}: {before.get(key, absent)!r} in the checkpoint, {now.get(key, absent)!r} now"
        for key in sorted(set(before) | set(now))
        if before.get(key, absent) != now.get(key, absent)
    ]
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was written by a run with another configuration; only "
            f"{', '.join(MAY_DIFFER_ON_RESUME)} may change on resume. Differences:\n  "
            + "\n  ".join(changed)
        )


def check_metrics_unchanged(checkpoint: ServerCheckpoint, run_dir: Path) -> None:
    """Refuse to resume ``run_dir`` when its ``metrics.jsonl`` changed since ``checkpoint``."""
    if problem := metrics_changed(run_dir, checkpoint.position):
        raise CheckpointError(
            f"{problem}: the run directory was changed since the checkpoint "
            f"{run_dir / CHECKPOINT_FILE} was written. Restore the file, or start a new run"
        )


def completed(checkpoint: ServerCheckpoint, run_dir: Path, rounds: int) -> bool:
    """Whether the run in ``run_dir`` already completed the ``rounds`` a resume asks for: its
    checkpoint is of that round and its ``summary.json`` says ``completed``."""
    summary = run_dir / "summary.json"
    if checkpoint.round < rounds or not summary.is_file():
        return False
    try:
        return bool(json.loads(summary.read_text()).get("status") == "completed")
    except (OSError, ValueError):
        return False


# ------------------------------------------------------------------------------- client side
_SNAPSHOT = re.compile(r"round_(\d+)(?:\.(\w+))?\.npz")


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file: the state after ``round``, written by server run ``attempt``."""

    round: int
    attempt: str
    path: Path


class ClientStateFiles:
    """Snapshots of one client's ``context.state`` in ``directory``, one file per round and
    server run. Run ``attempt``, resumed from round ``resumed`` (0: a fresh run), sees the
    snapshots up to that round and its own: the others are what a crashed run wrote after its
    last checkpoint, or what an earlier run in the same folder left."""

    def __init__(
        self, directory: Path, partition_id: int, attempt: str = "", resumed: int = 0
    ) -> None:
        self.directory = directory / f"partition_{partition_id}"
        self.attempt = attempt
        self.resumed = resumed

    def snapshots(self) -> list[Snapshot]:
        """This run's view: the snapshots it may read, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            if match := _SNAPSHOT.fullmatch(path.name):
                snapshot = Snapshot(int(match.group(1)), match.group(2) or "", path)
                if snapshot.round <= self.resumed or snapshot.attempt == self.attempt:
                    found.append(snapshot)
        return sorted(
            found, key=lambda snapshot: (snapshot.round, snapshot.attempt == self.attempt)
        )

    def rounds(self) -> list[int]:
        """Rounds with a snapshot this run may read, ascending."""
        return [snapshot.round for snapshot in self.snapshots()]

    def path(self, server_round: int) -> Path:
        suffix = f".{self.attempt}" if self.attempt else ""
        return self.directory / f"round_{server_round:06d}{suffix}.npz"

    def save(self, records: RecordDict, server_round: int, checkpointed: int) -> None:
        """Snapshot ``records`` as the state after ``server_round``; then keep only this
        snapshot and the newest one from a round up to ``checkpointed`` (what a resume from the
        server's last checkpoint restores): older ones and those this run may not read go."""
        arrays: dict[str, np.ndarray] = {}
        layout: dict[str, Any] = {"arrays": {}, "scalars": {}}
        for index, (key, record) in enumerate(records.items()):
            if isinstance(record, ArrayRecord):
                values = record.to_numpy_ndarrays()
                layout["arrays"][key] = [f"a{index}_{i}" for i in range(len(values))]
                arrays.update(zip(layout["arrays"][key], values, strict=True))
            elif isinstance(record, ConfigRecord):
                layout["scalars"][key] = dict(record)
            else:
                raise TypeError(f"client state '{key}' holds {type(record).__name__}")
        arrays["layout"] = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
        snapshot = io.BytesIO()
        np.savez(snapshot, **arrays)  # type: ignore[arg-type]  # stub: ** may hold allow_pickle
        written = self.path(server_round)
        try:
            write_atomic(written, snapshot.getvalue())
        except OSError as error:
            raise OSError(
                f"cannot keep this client's state in {self.directory} ({error}): give the node a "
                "writable folder (node config client-state-dir, or client_state.dir), or turn "
                "checkpoints off with checkpoint.every=0 (and client_state.store=memory)"
            ) from error
        readable = self.snapshots()
        needed = [s.path for s in readable if s.round <= checkpointed and s.path != written][-1:]
        keep = {written, *needed}
        for path in self.directory.iterdir():
            if _SNAPSHOT.fullmatch(path.name) and path not in keep:
                path.unlink(missing_ok=True)

    def restore(self, records: RecordDict, up_to_round: int | None = None) -> int | None:
        """Load the newest snapshot this run may read (from a round no later than
        ``up_to_round``, if given) into ``records``; returns its round (None if there is none)."""
        candidates = [s for s in self.snapshots() if up_to_round is None or s.round <= up_to_round]
        if not candidates:
            return None
        with np.load(candidates[-1].path, allow_pickle=False) as stored:
            layout = json.loads(stored["layout"].tobytes().decode())
            for key, names in layout["arrays"].items():
                records[key] = ArrayRecord([stored[name] for name in names])
        for key, values in layout["scalars"].items():
            records[key] = ConfigRecord(values)
        return candidates[-1].round


def _replaced(records: RecordDict, before: dict[str, Any]) -> bool:
    """Whether ``records`` holds other record objects than ``before`` (a shallow copy taken
    earlier, which keeps the old records alive, so no new record can reuse their identity)."""
    return records.keys() != before.keys() or any(records[k] is not v for k, v in before.items())


class PersistentClient(NumPyClient):
    """A client whose state survives a crash, or lives on disk: it wraps the algorithm's client,
    restores the state from [`ClientStateFiles`][pflower.core.checkpoint.ClientStateFiles] when it
    reaches the client empty in a
    resumed run (or always, with ``evict``), snapshots it after every fit and after an evaluate
    that changed it, and with ``evict`` then empties it (``client_state.store=disk``).

    An evaluate changed the state if a record was added, removed or replaced: algorithms write
    state only through [`ClientState`][pflower.core.state.ClientState], whose ``put_*`` replace the
    record
    and whose ``get_*`` return copies, so a record left in place holds what it held. An unchanged
    state is already in the newest snapshot, which a resume restores just the same."""

    def __init__(
        self,
        client: NumPyClient,
        records: RecordDict,
        directory: Path,
        partition_id: int,
        evict: bool = False,
    ) -> None:
        self.client = client
        self.records = records
        self.directory = directory
        self.partition_id = partition_id
        self.evict = evict

    def _files(self, config: dict[str, Scalar]) -> ClientStateFiles:
        """The snapshots as the server run that sent ``config`` sees them."""
        return ClientStateFiles(
            self.directory,
            self.partition_id,
            attempt=str(config.get(ATTEMPT, "")),
            resumed=int(config.get(RESUME_ROUND, 0)),
        )

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.client.get_properties(config)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        self._restore(config)
        result = self.client.fit(parameters, config)
        self._save(config)
        return result

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        self._restore(config)
        before = dict(self.records)
        result = self.client.evaluate(parameters, config)
        self._save(config, changed=_replaced(self.records, before))
        return result

    def _restore(self, config: dict[str, Scalar]) -> None:
        if not self.records and (self.evict or RESUME_ROUND in config):
            self._files(config).restore(self.records)

    def _save(self, config: dict[str, Scalar], changed: bool = True) -> None:
        if self.records and changed:
            checkpointed = int(config.get(CHECKPOINT_ROUND, 0))
            self._files(config).save(self.records, int(config["server-round"]), checkpointed)
        if self.evict:
            for key in list(self.records):
                del self.records[key]
