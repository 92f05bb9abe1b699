"""The rows of ``metrics.jsonl``: the evaluation stages, the row kinds that carry no accuracy,
a client's stage row, and reading the file back.

Every row has ``round`` and ``stage``; what each stage and kind holds is listed in
[`pflower.results.rundir`][pflower.results.rundir].
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

G, L1, L2, U = "G", "L1", "L2", "U"
"""The evaluation stages (U: stage L1 of clients that never train)."""
CLIENT_STAGES = (L1, L2, U)
STAGES = (G, L1, L2, U)
FAILURE, TIME, SERVER = "failure", "time", "server"
"""Row kinds that carry no accuracy."""

Row = dict[str, Any]


def client_row(server_round: int, stage: str, partition_id: int, metrics: Mapping[str, Any]) -> Row:
    """A client's stage row (``partition_id`` in the metrics is replaced by ``client``)."""
    values = {k: v for k, v in metrics.items() if k != "partition_id"}
    return {"round": server_round, "stage": stage, "client": partition_id, **values}


def read_rows(run_dir: Path) -> list[Row]:
    """Every row of ``metrics.jsonl`` (none if the file does not exist). A last line that does
    not parse is a row still being written (a live run, read by the tuner's pruner, or one
    killed mid-write) and is left out; a line before it that does not parse is an error."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    with contextlib.suppress(json.JSONDecodeError, IndexError):
        rows.append(json.loads(lines[-1]))
    return rows


ROUND_DONE_FILE = ".round_done"
"""The number of the last round whose rows are all in ``metrics.jsonl``, rewritten at the end of
every evaluated round
([`RunRecorder.round_done`][pflower.results.rundir.RunRecorder.round_done]): what a watcher of
a live run (``pflower tune``'s pruner) reads to act on a round as soon as it is complete, rather
than when the next round's rows appear."""


def last_round_done(run_dir: Path) -> int:
    """The last round whose rows are all written (`ROUND_DONE_FILE`); 0 before the first
    (and while the file is being rewritten)."""
    try:
        return int((run_dir / ROUND_DONE_FILE).read_text())
    except (OSError, ValueError):
        return 0
