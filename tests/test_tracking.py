"""Tracking sinks (``tracking=tensorboard|mlflow``): what they hold equals ``metrics.jsonl``.

Each sink test runs a tiny in-process experiment with the sink on, reads the tracker's own store
back with the tracker's own reader (TensorBoard's EventAccumulator, MLflow's client on the SQLite
store), and compares every scalar of every round with the mean over that round's rows of
``metrics.jsonl``, and the logged parameters with the resolved configuration in ``config.yaml``.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.config import TrackingKind
from pflower.registry import ConfigError
from pflower.results.tracking import (
    Tracker,
    flat_params,
    import_tracker,
    open_sink,
    param_text,
    round_metrics,
)
from tests.helpers import (
    tiny,
)
from tests.inprocess import run_inprocess

BASE = tiny(clients=3)
IDENTIFIERS = {"round", "stage", "client", "num_test"}


def expected_scalars(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """tag -> round -> value, computed independently from the metrics.jsonl rows: for each stage
    (G, L1, L2, server) and round, the mean over that stage's rows of every numeric metric."""
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["stage"] in ("failure", "time"):
            continue
        for key, value in row.items():
            if key not in IDENTIFIERS and isinstance(value, int | float):
                values[f"{row['stage']}/{key}"][row["round"]].append(float(value))
    return {
        tag: {r: sum(v) / len(v) for r, v in by_round.items()} for tag, by_round in values.items()
    }


def check_against_rows(
    rows: list[dict[str, Any]], logged: dict[str, dict[int, float]], rel: float
) -> None:
    expected = expected_scalars(rows)
    # The run evaluates every stage in both rounds (and G once more at round 0).
    for tag in ("G/acc", "G/loss", "L1/acc_local", "L1/acc_global", "L2/acc_local"):
        assert tag in expected
    assert set(expected["G/acc"]) == {0, 1, 2}
    assert set(expected["L1/acc_local"]) == {1, 2}
    assert set(logged) == set(expected)
    for tag, by_round in expected.items():
        assert set(logged[tag]) == set(by_round), tag
        for server_round, value in by_round.items():
            assert logged[tag][server_round] == pytest.approx(value, rel=rel, abs=1e-7), (
                tag,
                server_round,
            )
    # Spot-check one value by hand: the round-2 L1 mean of Acc(L) over the 3 clients.
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 3
    assert logged["L1/acc_local"][2] == pytest.approx(sum(l1) / 3, rel=rel)


def resolved_config(run_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


# --------------------------------------------------------------------------------- unit level
def test_round_metrics_means_each_stage_and_skips_identifiers() -> None:
    rows = [
        {"round": 1, "stage": "L1", "client": 0, "acc_local": 0.5, "num_test": 10, "flag": True},
        {"round": 1, "stage": "L1", "client": 1, "acc_local": 0.7, "num_test": 30, "flag": False},
        {"round": 1, "stage": "G", "acc": 0.25, "loss": 2.0, "model": "global"},
        {"round": 1, "stage": "failure", "phase": "fit", "client": 2, "error": "boom"},
        {"round": 1, "stage": "time", "fit_done_unix_s": 1.0e9},
        {"round": 1, "stage": "server", "client_store_bytes": 4096},
        {"round": 2, "stage": "L1", "client": 0, "acc_local": 0.9},
    ]
    assert round_metrics(rows, 1) == {
        "L1/acc_local": pytest.approx(0.6),
        "L1/flag": 0.5,
        "G/acc": 0.25,
        "G/loss": 2.0,
        "server/client_store_bytes": 4096.0,
    }
    assert round_metrics(rows, 2) == {"L1/acc_local": 0.9}


def test_flat_params_dotted_keys_numbers_kept_others_as_text() -> None:
    config = {"seed": 3, "train": {"lr": 0.05, "local_steps": None}, "progress": False}
    config["eval"] = {"rho_thresholds": [0.5, 0.8]}
    config["strategy"] = {"name": "fliu"}
    assert flat_params(config) == {
        "seed": 3,
        "train.lr": 0.05,
        "train.local_steps": "null",
        "progress": "false",
        "eval.rho_thresholds": "[0.5, 0.8]",
        "strategy.name": "fliu",
    }


class RecordingSink:
    def __init__(self, fail_on_round: int | None = None) -> None:
        self.fail_on_round = fail_on_round
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed: bool | None = None

    def log_params(self, params: Any) -> None:
        pass

    def log_metrics(self, step: int, metrics: Any) -> None:
        if step == self.fail_on_round:
            raise OSError("disk full")
        self.logged.append((step, dict(metrics)))

    def close(self, completed: bool) -> None:
        self.closed = completed


def test_tracker_sends_each_round_once_and_the_rest_at_close() -> None:
    sink = RecordingSink()
    tracker = Tracker(sink)
    rows: list[dict[str, Any]] = [{"round": 0, "stage": "G", "acc": 0.1}]
    rows += [{"round": 1, "stage": "G", "acc": 0.2}, {"round": 1, "stage": "time", "t": 1.0}]
    tracker.round_done(rows, 1)
    rows += [{"round": 2, "stage": "server", "bytes": 5}]  # a round without round_done
    tracker.round_done(rows, 1)  # nothing new is due
    rows += [{"round": 3, "stage": "G", "acc": 0.4}]
    tracker.close(rows, completed=False)
    assert sink.logged == [
        (0, {"G/acc": 0.1}),
        (1, {"G/acc": 0.2}),
        (2, {"server/bytes": 5.0}),
        (3, {"G/acc": 0.4}),
    ]
    assert sink.closed is False


def test_tracker_skips_rows_recorded_before_a_resume() -> None:
    sink = RecordingSink()
    rows: list[dict[str, Any]] = [{"round": 1, "stage": "G", "acc": 0.2}]
    tracker = Tracker(sink, already_recorded=1)
    rows.append({"round": 2, "stage": "G", "acc": 0.3})
    tracker.close(rows, completed=True)
    assert sink.logged == [(2, {"G/acc": 0.3})]


def test_a_failing_sink_is_switched_off_with_a_warning() -> None:
    sink = RecordingSink(fail_on_round=2)
    warnings: list[str] = []
    tracker = Tracker(sink, warn=warnings.append)
    rows = [{"round": r, "stage": "G", "acc": r / 10} for r in (1, 2, 3)]
    tracker.round_done(rows[:1], 1)
    tracker.round_done(rows[:2], 2)
    tracker.close(rows, completed=True)
    assert sink.logged == [(1, {"G/acc": 0.1})]
    assert sink.closed is None  # switched off before the end
    assert len(warnings) == 1 and "disk full" in warnings[0] and "metrics.jsonl" in warnings[0]


def test_a_sink_failing_mid_run_loses_no_metrics_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    from pflower.results import tracking

    def broken(self: Any, step: int, metrics: Any) -> None:
        raise OSError("the tracker went away")

    monkeypatch.setattr(tracking.TensorBoardSink, "log_metrics", broken)
    rows, _ = run_inprocess([*BASE, "tracking=tensorboard"], tmp_path / "run")
    reference, _ = run_inprocess(BASE, tmp_path / "reference")
    assert [(r["round"], r["stage"]) for r in rows] == [(r["round"], r["stage"]) for r in reference]
    assert (tmp_path / "run" / "summary.json").exists()


# ------------------------------------------------------------------------------ TensorBoard
def test_tensorboard_holds_the_metrics_rows_and_the_config(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run_dir = tmp_path / "run"
    rows, _ = run_inprocess([*BASE, "tracking=tensorboard"], run_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {
        tag: {event.step: event.value for event in events.Scalars(tag)}
        for tag in events.Tags()["scalars"]
    }
    check_against_rows(rows, logged, rel=1e-6)  # TensorBoard stores float32

    content = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = {
        key: value.string_value if value.HasField("string_value") else value.number_value
        for key, value in start.session_start_info.hparams.items()
    }
    expected = flat_params(resolved_config(run_dir))
    assert hparams == expected
    assert hparams["tracking.name"] == "tensorboard"
    assert hparams["num_clients"] == 3 and hparams["strategy.name"] == "fliu"


# ----------------------------------------------------------------------------------- MLflow
def test_mlflow_holds_the_metrics_rows_and_the_config(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    rows, _ = run_inprocess([*BASE, "tracking=mlflow", "tracking.experiment=tiny"], run_dir)
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == str(run_dir)
    assert run.data.tags["pflower.run_dir"] == str(run_dir)
    logged = {
        tag: {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag)}
        for tag in run.data.metrics
    }
    check_against_rows(rows, logged, rel=1e-12)

    config = resolved_config(run_dir)
    expected = {key: param_text(value) for key, value in flat_params(config).items()}
    assert run.data.params == expected
    assert run.data.params["train.lr"] == str(config["train"]["lr"])
    assert run.data.params["tracking.name"] == "mlflow"


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path) -> None:
    """A run killed after round 2 (its MLflow run left RUNNING) and resumed with more rounds:
    one MLflow run, every round once, the first ``rounds`` kept and the new one as a tag."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    config: dict[str, Any] = {"tracking": {"name": "mlflow"}, "rounds": 2, "seed": 0}
    rows = [{"round": r, "stage": "G", "acc": r / 10} for r in (1, 2)]
    first = Tracker.open(config, tmp_path)
    first.round_done(rows, 2)  # ... then the process dies: no close
    rows.append({"round": 3, "stage": "G", "acc": 0.3})
    resumed = Tracker.open({**config, "rounds": 3}, tmp_path, already_recorded=2)
    resumed.close(rows, completed=True)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("pflower")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "G/acc")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert run.data.params["rounds"] == "2"
    assert run.data.tags["pflower.resumed.rounds"] == "3"


# --------------------------------------------------------------------------- not installed
@pytest.mark.parametrize(
    ("kind", "module"),
    [(TrackingKind.tensorboard, "tensorboard"), (TrackingKind.mlflow, "mlflow")],
)
def test_a_tracker_that_is_not_installed_names_the_extra(
    kind: TrackingKind, module: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now fails
    with pytest.raises(ConfigError, match=rf'pip install -e "\.\[{kind.value}\]"'):
        import_tracker(kind)
    with pytest.raises(ConfigError, match=f"tracking={kind.value} needs the '{module}' package"):
        open_sink({"name": kind.value}, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_the_command_line_ends_with_the_message_and_exit_code_2(tmp_path: Path) -> None:
    """``pflower tracking=mlflow`` without the package: message, exit code 2, no traceback."""
    script = (
        "import sys; sys.modules['mlflow'] = None; "
        "sys.argv = ['pflower', 'tracking=mlflow', 'num_clients=3', 'rounds=1', "
        f"'output_dir={tmp_path / 'run'}']; "
        "from pflower.cli import main; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "configuration error" in output
    assert 'pip install -e ".[mlflow]"' in " ".join(output.split())
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_tracking_none_opens_nothing(tmp_path: Path) -> None:
    assert open_sink({"name": "none"}, tmp_path) is None
    tracker = Tracker.open({"tracking": {"name": "none"}, "seed": 0}, tmp_path)
    tracker.round_done([{"round": 1, "stage": "G", "acc": 1.0}], 1)
    tracker.close([], completed=True)
    assert not any(tmp_path.iterdir())
