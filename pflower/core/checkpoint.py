"""Checkpoints: what a run needs to continue after a crash, exactly as if it had not stopped.

Server side, ``checkpoint.pkl`` in the run directory holds, after round ``t``: the strategy's
state (the global model, the per-client model store, control variates, affinity matrices, and
whatever else the algorithm learned: every attribute that its configuration does not fix, see
:meth:`PersonalizedStrategy.checkpoint_state`), the server process's global random generators,
the number of ``metrics.jsonl`` rows written by the end of round ``t`` (the recorder's position),
the elapsed wall time, the Hydra overrides and the resolved configuration. Client sampling needs
no saved generator: every round draws from its own stream (:func:`round_rng`), so a resumed run
draws what the uninterrupted run drew.

Client side, every client keeps snapshots of its ``context.state`` in ``client_state.dir``
(one folder per partition, on the machine that runs the client: a SuperNode's own disk in a
deployment), written after each message it handles. The server tells clients the last round it
checkpointed (``checkpoint-round``); a client keeps its newest snapshot and the one a resume from
that checkpoint needs, and deletes the others. In a resumed run the server sends
``resume-round``: a client whose state is empty (its process or node started afresh) first
restores its newest snapshot from a round no later than that.

Every file is written to a temporary name and renamed, so a crash while writing leaves the
previous file. A checkpoint is refused, with the reason, when it is missing, corrupt (its
checksum does not match, or it cannot be read), of another format version, or written by a run
with another configuration (only the keys in :data:`MAY_DIFFER_ON_RESUME` may change).
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

from pflower.config import EXECUTION_KEYS
from pflower.registry import ConfigError
from pflower.results.rundir import write_atomic

FORMAT_VERSION = 1
"""Version of the checkpoint layout; a checkpoint of another version is refused."""

CHECKPOINT_FILE = "checkpoint.pkl"

CHECKPOINT_ROUND = "checkpoint-round"
"""Config key of fit/evaluate instructions: the last round the server checkpointed."""

RESUME_ROUND = "resume-round"
"""Config key of fit/evaluate instructions in a resumed run: the round it resumed from."""

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


def random_state() -> dict[str, Any]:
    """The state of this process's global random generators (Python, NumPy, torch)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_random_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`random_state` returned."""
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
    """The checkpoint in ``run_dir``; :class:`CheckpointError` says why when it is unusable."""
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
    """The flattened configuration without the keys a resumed run may change."""
    return {
        key: value
        for key, value in _flatten(config).items()
        if key.split(".")[0] not in MAY_DIFFER_ON_RESUME
    }


def check_compatible(checkpoint: ServerCheckpoint, config: Mapping[str, Any], path: Path) -> None:
    """Refuse to resume a run whose configuration differs from the checkpoint's.

    ``config`` is the resumed run's resolved configuration; keys under
    :data:`MAY_DIFFER_ON_RESUME` may differ, and ``rounds`` may not go below the checkpoint's
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


# ------------------------------------------------------------------------------- client side
_SNAPSHOT = re.compile(r"round_(\d+)\.npz")


class ClientStateFiles:
    """Snapshots of one client's ``context.state``, one file per round, in ``directory``."""

    def __init__(self, directory: Path, partition_id: int) -> None:
        self.directory = directory / f"partition_{partition_id}"

    def rounds(self) -> list[int]:
        """Rounds with a snapshot, ascending."""
        if not self.directory.is_dir():
            return []
        found = (_SNAPSHOT.fullmatch(p.name) for p in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in found if match)

    def path(self, server_round: int) -> Path:
        return self.directory / f"round_{server_round:06d}.npz"

    def save(self, records: RecordDict, server_round: int, checkpointed: int) -> None:
        """Snapshot ``records`` as the state after ``server_round``; then keep only this
        snapshot and the newest one from a round up to ``checkpointed`` (what a resume from the
        server's last checkpoint restores)."""
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
        np.savez(snapshot, **arrays)
        try:
            write_atomic(self.path(server_round), snapshot.getvalue())
        except OSError as error:
            raise OSError(
                f"cannot keep this client's state in {self.directory} ({error}): give the node a "
                "writable folder (node config client-state-dir, or client_state.dir), or turn "
                "checkpoints off with checkpoint.every=0"
            ) from error
        older = [r for r in self.rounds() if r < server_round]
        needed = max((r for r in older if r <= checkpointed), default=None)
        for stale in older:
            if stale != needed:
                self.path(stale).unlink(missing_ok=True)

    def restore(self, records: RecordDict, up_to_round: int) -> int | None:
        """Load the newest snapshot from a round no later than ``up_to_round`` into ``records``;
        returns its round (None if there is none)."""
        candidates = [r for r in self.rounds() if r <= up_to_round]
        if not candidates:
            return None
        with np.load(self.path(candidates[-1]), allow_pickle=False) as stored:
            layout = json.loads(stored["layout"].tobytes().decode())
            for key, names in layout["arrays"].items():
                records[key] = ArrayRecord([stored[name] for name in names])
        for key, values in layout["scalars"].items():
            records[key] = ConfigRecord(values)
        return candidates[-1]


class PersistentClient(NumPyClient):
    """A client whose state survives a crash: it wraps the algorithm's client, restores the
    state from :class:`ClientStateFiles` when a resumed run first reaches it with an empty
    state, and snapshots the state after every fit and evaluate."""

    def __init__(self, client: NumPyClient, records: RecordDict, files: ClientStateFiles) -> None:
        self.client = client
        self.records = records
        self.files = files

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
        result = self.client.evaluate(parameters, config)
        self._save(config)
        return result

    def _restore(self, config: dict[str, Scalar]) -> None:
        if RESUME_ROUND in config and not self.records:
            self.files.restore(self.records, int(config[RESUME_ROUND]))

    def _save(self, config: dict[str, Scalar]) -> None:
        if self.records:
            checkpointed = int(config.get(CHECKPOINT_ROUND, 0))
            self.files.save(self.records, int(config["server-round"]), checkpointed)
