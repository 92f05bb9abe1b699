"""Checkpoint and resume: a run stopped after a checkpoint and resumed ends exactly as the
uninterrupted run on the same seed, for algorithms whose state lives on the clients (FLIU), in
server-side per-client stores (DiversiFed), in control variates on both sides (SCAFFOLD) and in
ADMM duals (FLAME); unusable checkpoints are refused and nothing is overwritten.

In-process tests stop a run by raising from the recorder while a round is under way (after some
clients already wrote that round's state), then resume it with fresh client contexts, as after a
crash. The slow test kills a real ``pflower`` simulation with SIGKILL and resumes it with
``pflower resume``.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from omegaconf import OmegaConf

from pflower.cli import resume
from pflower.compose import compose_config
from pflower.core.algorithm import ALGORITHMS
from pflower.core.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    ClientStateFiles,
    check_compatible,
    load_checkpoint,
)
from pflower.results.failures import record_interrupted
from pflower.results.rows import read_rows
from pflower.server.app import build_strategy
from tests.helpers import (
    RESUME_TINY,
    results,
    stopped_in_round,
    summary_without_clock,
)
from tests.inprocess import run_inprocess

BASE = RESUME_TINY


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy=fliu", "fraction=0.5"],  # client-only state, clients skip rounds
        ["strategy=diversifed"],  # server-side per-client model store
        # control variates on the server and on every client (plain SGD, as in the paper)
        ["strategy=scaffold", "train.lr=0.01", "train.momentum=0"],
        ["strategy=flame"],  # ADMM duals on the clients
    ],
    ids=["fliu", "diversifed", "scaffold", "flame"],
)
def test_stopped_and_resumed_run_equals_uninterrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    experiment = [*BASE, *overrides]
    reference, _ = run_inprocess(experiment, tmp_path / "reference")

    run_dir = tmp_path / "run"
    stopped_in_round(monkeypatch, experiment, run_dir, 5)
    assert load_checkpoint(run_dir).round == 4
    assert not (run_dir / "summary.json").exists()
    assert max(r["round"] for r in read_rows(run_dir)) == 5  # round 5 was partly recorded

    resumed, contexts = run_inprocess([*experiment, "checkpoint.resume=true"], run_dir)
    assert results(resumed) == results(reference)
    assert summary_without_clock(run_dir) == summary_without_clock(tmp_path / "reference")
    assert all(context.state for context in contexts)  # state was restored, then kept


def test_resume_without_restored_client_state_differs(tmp_path: Path, monkeypatch) -> None:
    """The comparison above can fail: delete the clients' snapshots and FLIU's resumed rounds
    differ from the uninterrupted run's (its clients' personal models are lost)."""
    experiment = [*BASE, "strategy=fliu"]
    reference, _ = run_inprocess(experiment, tmp_path / "reference")
    run_dir = tmp_path / "run"
    stopped_in_round(monkeypatch, experiment, run_dir, 5)
    for snapshot in (run_dir / "client_state").rglob("*.npz"):
        snapshot.unlink()
    resumed, _ = run_inprocess([*experiment, "checkpoint.resume=true"], run_dir)
    assert results(resumed, after=4) != results(reference, after=4)


def test_a_completed_run_extends_to_more_rounds(tmp_path: Path) -> None:
    experiment = [*BASE, "strategy=fliu", "rounds=3", "checkpoint.every=0"]
    reference, _ = run_inprocess([*experiment, "rounds=5"], tmp_path / "reference")
    run_dir = tmp_path / "run"
    run_inprocess([*BASE, "strategy=fliu", "rounds=3"], run_dir)
    assert load_checkpoint(run_dir).round == 3  # the last round is always checkpointed
    extended, _ = run_inprocess(
        [*BASE, "strategy=fliu", "rounds=5", "checkpoint.resume=true"], run_dir
    )
    # rounds 4-5 as in a 5-round run (round 3 was evaluated as the last one, which a 5-round run
    # with eval.every=1 does too)
    assert results(extended) == results(reference)
    assert json.loads((run_dir / "summary.json").read_text())["final_round"] == 5


# ------------------------------------------------------------------------ refused checkpoints
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    run_inprocess([*BASE, "strategy=fliu", "rounds=2", "checkpoint.every=1"], run_dir)
    return run_dir


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def refused(run_dir: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    before = files_of(run_dir)
    assert resume([str(run_dir), *overrides]) == 2
    assert files_of(run_dir) == before  # nothing written, nothing deleted
    return " ".join(capsys.readouterr().out.split())


def test_missing_checkpoint_is_refused(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    run_inprocess([*BASE, "strategy=fliu", "rounds=1", "checkpoint.every=0"], run_dir)
    message = refused(run_dir, capsys)
    assert "no checkpoint to resume from" in message and "checkpoint.every=0" in message


def test_corrupt_checkpoint_is_refused(stopped_run: Path, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(stopped_run), str(run_dir)], check=True)
    data = bytearray((run_dir / CHECKPOINT_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run_dir / CHECKPOINT_FILE).write_bytes(bytes(data))
    assert "corrupt checkpoint" in refused(run_dir, capsys)
    (run_dir / CHECKPOINT_FILE).write_bytes(bytes(data[:100]))  # truncated
    assert "corrupt checkpoint" in refused(run_dir, capsys)


def test_checkpoint_of_another_configuration_is_refused(stopped_run: Path, capsys) -> None:
    message = refused(stopped_run, capsys, "seed=7", "strategy.gamma_mode=fixed")
    assert "another configuration" in message
    assert "seed: 0 in the checkpoint, 7 now" in message
    assert "strategy.gamma_mode: 'adaptive' in the checkpoint, 'fixed' now" in message


def test_a_key_added_after_the_checkpoint_counts_as_its_default() -> None:
    """A checkpoint written before ``eval.unseen_fraction`` existed resumes under its default,
    and not under another value."""
    config = OmegaConf.to_container(compose_config(BASE), resolve=True)
    assert isinstance(config, dict)
    old = copy.deepcopy(config)
    del old["eval"]["unseen_fraction"]
    checkpoint = SimpleNamespace(round=2, config=old)
    check_compatible(checkpoint, config, Path("checkpoint.pkl"))  # type: ignore[arg-type]
    config["eval"]["unseen_fraction"] = 0.25
    with pytest.raises(CheckpointError, match=r"eval\.unseen_fraction: 0\.0 in the checkpoint"):
        check_compatible(checkpoint, config, Path("checkpoint.pkl"))  # type: ignore[arg-type]


def test_shortening_a_run_is_refused(stopped_run: Path, capsys) -> None:
    assert "not shortened" in refused(stopped_run, capsys, "rounds=1")


def test_run_directory_changed_since_the_checkpoint_is_refused(
    stopped_run: Path, tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(stopped_run), str(run_dir)], check=True)
    (run_dir / "metrics.jsonl").write_text("")
    assert "changed since" in refused(run_dir, capsys)


def edited_copy(stopped_run: Path, tmp_path: Path) -> Path:
    """A copy of ``stopped_run`` as if it had been killed after its last checkpoint (no
    ``summary.json``), with one digit of the first ``acc_local`` value changed: the file keeps
    its length and its number of rows, and stays valid JSON."""
    run_dir = tmp_path / "edited"
    subprocess.run(["cp", "-r", str(stopped_run), str(run_dir)], check=True)
    (run_dir / "summary.json").unlink()
    path = run_dir / "metrics.jsonl"
    data = bytearray(path.read_bytes())
    digit = data.index(b'"acc_local": ') + len(b'"acc_local": 0.')
    data[digit] = ord("1") if data[digit] != ord("1") else ord("2")
    path.write_bytes(bytes(data))
    rows = read_rows(run_dir)
    assert len(rows) == len(read_rows(stopped_run)) and rows != read_rows(stopped_run)
    return run_dir


def test_an_edited_metrics_value_is_refused(stopped_run: Path, tmp_path: Path, capsys) -> None:
    """Issue 37, item 3: not only a shorter ``metrics.jsonl``, any change to its bytes up to the
    checkpoint (the checkpoint stores their SHA-256 digest) is refused with exit code 2."""
    run_dir = edited_copy(stopped_run, tmp_path)
    message = refused(run_dir, capsys)
    assert "changed since the checkpoint" in message and "SHA-256" in message


def test_metrics_digest_covers_the_rows_up_to_the_checkpoint(stopped_run: Path) -> None:
    """The checkpoint's digest is that of the file's first ``metrics_size`` bytes, which end
    with a row; rows appended after the checkpoint (a run that went on) are not a change."""
    import hashlib

    from pflower.results.rundir import metrics_changed

    checkpoint = load_checkpoint(stopped_run)
    data = (stopped_run / "metrics.jsonl").read_bytes()
    kept = data[: checkpoint.metrics_size]
    assert hashlib.sha256(kept).hexdigest() == checkpoint.metrics_sha256
    assert kept.endswith(b"\n") and kept.count(b"\n") == checkpoint.rows
    assert metrics_changed(stopped_run, checkpoint.position) is None
    earlier = load_checkpoint(stopped_run).position
    shorter = type(earlier)(1, 0.0, len(data.splitlines(keepends=True)[0]), "")
    assert metrics_changed(stopped_run, shorter) is None  # an old checkpoint: rows only


def test_resuming_a_completed_run_changes_nothing(
    stopped_run: Path, tmp_path: Path, capsys
) -> None:
    """Issue 37, item 2: ``pflower resume`` on a run that completed its rounds says so in one
    line, exit code 0, and leaves every file as it was (summary.json included). One line however
    long the path: a piped console is 160 columns wide and must not wrap a message there."""
    run_dir = tmp_path / f"done-{'x' * 160}"
    subprocess.run(["cp", "-r", str(stopped_run), str(run_dir)], check=True)
    before = files_of(run_dir)
    assert json.loads(before["summary.json"])["status"] == "completed"
    assert resume([str(run_dir)]) == 0
    assert files_of(run_dir) == before
    output = capsys.readouterr().out
    assert len(output.strip().splitlines()) == 1, output
    assert "nothing to resume" in output and "rounds=N" in output


@pytest.mark.parametrize("end", ["missing", "interrupted"])
def test_a_run_stopped_after_its_last_checkpoint_resumes_to_its_completed_end(
    stopped_run: Path, tmp_path: Path, end: str
) -> None:
    """A run stopped after its last round's checkpoint but before its end was recorded (or a
    SIGTERM's handler recorded it as interrupted) has all its rows: resumed, it runs no round and
    writes the summary its last round would have, with the same results."""
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(stopped_run), str(run_dir)], check=True)
    completed = json.loads((run_dir / "summary.json").read_text())
    rows = read_rows(run_dir)
    (run_dir / "summary.json").unlink()
    if end == "interrupted":
        record_interrupted(run_dir, OmegaConf.create(completed["config"]), "interrupted by SIGTERM")
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert resume([str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert read_rows(run_dir) == rows
    assert summary["status"] == "completed" and summary["error"] is None
    for key in ("final_round", "final", "last10", "last10_rounds", "failures"):
        assert summary[key] == completed[key], key


# ------------------------------------------------------------------------------ client files
def test_client_snapshots_restore_exactly_and_keep_what_a_resume_needs(tmp_path: Path) -> None:
    files = ClientStateFiles(tmp_path, partition_id=3)
    records = RecordDict()
    for server_round in (1, 2, 3, 5):
        records["model"] = ArrayRecord([np.full((2, 3), server_round, np.float32), np.arange(4)])
        records["meta"] = ConfigRecord({"round": server_round, "name": "x", "on": True})
        files.save(records, server_round, checkpointed=2 if server_round < 5 else 4)
    # after round 5 with the last checkpoint at 4: round 3's snapshot is what resuming needs
    assert files.rounds() == [3, 5]
    restored = RecordDict()
    assert files.restore(restored, up_to_round=4) == 3
    arrays = restored["model"].to_numpy_ndarrays()
    assert arrays[0].dtype == np.float32 and (arrays[0] == 3).all()
    assert arrays[1].tolist() == [0, 1, 2, 3] and arrays[1].dtype == np.arange(4).dtype
    assert dict(restored["meta"]) == {"round": 3, "name": "x", "on": True}
    assert files.restore(RecordDict(), up_to_round=2) is None


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_state_can_be_checkpointed(tmp_path: Path, name: str) -> None:
    """Each strategy's checkpoint state pickles, and holds the global model and client store
    but nothing the configuration or the connected nodes fix."""
    import pickle

    extra = ["strategy.dropout=0", "strategy.noise_sigma=0"] if name == "fedmpr" else []
    cfg = compose_config(["dataset=digits", "model=small_cnn", f"strategy={name}", *extra])
    strategy = build_strategy(cfg, tmp_path / name)
    state = strategy.checkpoint_state()
    assert {"_global_weights", "client_models"} <= set(state)
    assert not {"settings", "options", "recorder", "_partition_of", "evaluate_global"} & set(state)
    pickle.loads(pickle.dumps(state))


# ---------------------------------------------------------------------- a real SIGKILL (Ray)
@pytest.mark.slow
def test_simulation_killed_with_sigkill_resumes_to_the_same_results(tmp_path: Path) -> None:
    experiment = [
        *BASE,
        "strategy=fliu",
        "checkpoint.every=1",
        "train.local_epochs=10",  # rounds long enough to kill one in the middle
        "progress=false",
    ]
    reference, _ = run_inprocess(experiment, tmp_path / "reference")
    run_dir = tmp_path / "run"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pflower", *experiment, f"output_dir={run_dir}"],
        env=environment,
        start_new_session=True,  # its own process group: Ray's workers die with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if (run_dir / CHECKPOINT_FILE).exists() and load_checkpoint(run_dir).round >= 3:
                break
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    checkpoint = load_checkpoint(run_dir)
    assert 3 <= checkpoint.round < 6 and not (run_dir / "summary.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "pflower", "resume", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert results(read_rows(run_dir)) == results(reference)
    assert summary_without_clock(run_dir) == summary_without_clock(tmp_path / "reference")
