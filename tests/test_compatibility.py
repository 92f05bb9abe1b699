"""Compose-time compatibility: a configuration that can only fail is refused while composing.

Every strategy (each algorithm and each preset) x model x dataset that the config offers is
composed and validated: each combination either passes :func:`pflower.compose.validate`
(including :func:`~pflower.compose.check_compatible`) or is refused there with a
:class:`ConfigError`; no other exception may escape. Which combinations are refused today: FedMPR
(and its presets with dropout or noise) with a model that is not a ResNet or lacks a stage of
``strategy.reg_stages`` (ResNet-8 has three), and models whose
poolings cannot take the 8x8 ``digits`` images (``fedavg_cnn``, ``flame_cnn1``).

Why not run every combination: 49 strategies x 11 models x 8 datasets are 4,312 runs, and six of
the eight datasets are files this test cannot assume. Composition is checked for all of them; a
first round runs, in-process and tiny (3 clients, one local step), for a representative sample
that is available offline: one algorithm of each family on ``digits``/``small_cnn`` (FedMPR on a
width-4 ResNet-18), and every image model with FedAvg on the smallest offline dataset it accepts
(the models of token ids run on LEAF text in ``tests/test_text_data.py``). The
refused combinations are shown, for two examples, through the command line: exit code 2 and one
line, before anything starts.

Composing 4,312 configurations with Hydra takes minutes on a loaded 2-core machine, so each
strategy and each (model, dataset) pair is composed and validated once (keys, types, ranges: the
blocks are independent of each other) and the typed settings are crossed, each cross checked by
:func:`~pflower.compose.check_compatible`, the only check that reads several blocks together.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from pflower.compose import check_compatible, compose_config, group_options, settings_of, validate
from pflower.models import MODELS as ZOO
from pflower.registry import ConfigError
from tests.inprocess import run_inprocess

STRATEGIES = group_options("strategy")
MODELS = group_options("model")
DATASETS = group_options("dataset")

REFUSED = {
    ("fedmpr", "small_cnn", "digits"),
    ("fedmpr", "mlp", "mnist"),
    ("fedmpr_noise02", "lenet_cnn", "cifar10"),
    ("fedavg", "fedavg_cnn", "digits"),
    ("fedavg", "flame_cnn1", "digits"),
}
"""Combinations that must be refused (spot checks of the rules above)."""
ACCEPTED = {
    ("fedmpr", "resnet18", "cifar10"),
    ("fedmpr_prune02", "small_cnn", "digits"),
    ("fedavg", "fedavg_cnn", "mnist"),
    ("scaffold", "mlp", "synthetic"),
}


def test_every_strategy_model_dataset_combination_composes_or_is_refused() -> None:
    strategies = {
        name: settings_of(compose_config([f"strategy={name}", "model=resnet18"])).strategy
        for name in STRATEGIES
    }
    outcome: dict[tuple[str, str, str], str] = {}
    for model in MODELS:
        for dataset in DATASETS:
            try:
                base = validate(compose_config([f"model={model}", f"dataset={dataset}"]))
            except ConfigError as error:
                for strategy in STRATEGIES:
                    outcome[strategy, model, dataset] = str(error)
                continue
            for strategy, options in strategies.items():
                crossed = copy.copy(base)
                crossed.strategy = options
                try:
                    check_compatible(crossed)
                    outcome[strategy, model, dataset] = "ok"
                except ConfigError as error:
                    outcome[strategy, model, dataset] = str(error)
    assert len(outcome) == len(STRATEGIES) * len(MODELS) * len(DATASETS)
    for combination in REFUSED:
        assert outcome[combination] != "ok", combination
    for combination in ACCEPTED:
        assert outcome[combination] == "ok", (combination, outcome[combination])
    refused_fedmpr = {
        m for (s, m, d), o in outcome.items() if s == "fedmpr" and d == "mnist" and o != "ok"
    }
    assert refused_fedmpr == set(MODELS) - {"resnet18"}  # resnet8 lacks stage 4 of reg_stages
    assert "stages 1..3" in outcome["fedmpr", "resnet8", "mnist"]


TINY = [
    "dataset=digits",
    "partition=iid",
    "num_clients=3",
    "rounds=1",
    "train.local_steps=1",
    "train.batch_size=16",
    "eval.global_test_max_samples=60",
]
FAMILY_SAMPLE = {
    "fedavg": [],
    "fliu": [],
    "fedprox": [],
    "scaffold": [],
    "fedrep": [],
    "ditto": [],
    "pfedme": [],
    "flame": [],
    "fedala": [],
    "diversifed": [],
    "fedamp": [],
    "centralized": [],
    "fedmpr": ["model=resnet18", "model.width=4"],
}
"""One algorithm of each family; FedMPR on the smallest ResNet."""


@pytest.mark.parametrize("strategy", sorted(FAMILY_SAMPLE))
def test_sampled_strategies_run_their_first_round(strategy: str, tmp_path: Path) -> None:
    overrides = [*TINY, f"strategy={strategy}", *FAMILY_SAMPLE[strategy]]
    if not FAMILY_SAMPLE[strategy]:
        overrides.append("model=small_cnn")
    validate(compose_config(overrides))
    rows, _ = run_inprocess(overrides, tmp_path)
    assert any(row.get("round") == 1 for row in rows)


READS_TOKENS = {model for model in MODELS if "vocab_size" in ZOO.accepted_keys(model)}
"""The models of token ids: no offline dataset here is text; they run on LEAF Shakespeare and
Sent140 files written by ``tests/test_text_data.py``."""

OFFLINE = {
    "digits": [],
    "synthetic": ["dataset.image_shape=[1,28,28]", "dataset.num_train=300", "dataset.num_test=60"],
}


@pytest.mark.parametrize("model", sorted(set(MODELS) - READS_TOKENS))
def test_every_model_runs_a_first_round_where_it_composes(model: str, tmp_path: Path) -> None:
    for dataset, options in OFFLINE.items():
        overrides = [*TINY, "strategy=fedavg", f"model={model}", f"dataset={dataset}", *options]
        try:
            validate(compose_config(overrides))
        except ConfigError:
            continue
        rows, _ = run_inprocess(overrides, tmp_path)
        assert any(row.get("round") == 1 for row in rows)
        return
    pytest.fail(f"model={model} composes with no offline dataset")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["strategy=fedmpr", "dataset=digits"], "ResNet"),
        (["model=fedavg_cnn", "dataset=digits"], "cannot take input"),
    ],
)
def test_refused_combinations_end_with_exit_2_and_one_line(
    overrides: list[str], needle: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pflower", *overrides, f"output_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output
    assert needle in output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
