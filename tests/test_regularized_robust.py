"""Byzantine attacks and robust aggregation (FLAME paper, Zhu et al., Sec. VI-B3): the shared
malicious-set function, the attack vectors, Multi-Krum / trimmed mean / median on hand-built
updates with known outliers, and in-process runs where malicious clients are never scored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pflower.compose import compose_config, config_from_run_config, settings_of
from pflower.config import AttackConfig, AttackKind, RobustConfig, RobustKind
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import PersonalizedStrategy
from pflower.robust.aggregators import multi_krum, robust_average
from pflower.robust.attacks import (
    malicious_ids,
    malicious_set,
    poisoned_labels,
    poisoned_upload,
)
from pflower.strategies import flame
from tests.helpers import REGULARIZED_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_arrays_close,
    stage_rows,
)
from tests.inprocess import run_inprocess


def test_malicious_ids_is_a_pure_function_of_seed_clients_fraction() -> None:
    assert malicious_ids(3, 50, 0.2) == malicious_ids(3, 50, 0.2)
    assert len(malicious_ids(3, 50, 0.2)) == 10
    assert len(malicious_ids(3, 10, 0.05)) == 1  # at least one attacker when the attack is on
    assert malicious_ids(3, 10, 0.0) == frozenset()
    assert all(0 <= i < 50 for i in malicious_ids(4, 50, 0.4))
    assert malicious_ids(3, 50, 0.2) != malicious_ids(4, 50, 0.2)
    assert malicious_set(AttackConfig(AttackKind.none, 0.5), 3, 10) == frozenset()


def test_multi_krum_drops_the_outlier_and_averages_the_rest() -> None:
    """Scores with n = 5, f = 1 (2 nearest): a, b, c, d score 2, e scores 162 + 181 = 343;
    the n − f = 4 lowest (a, b, c, d) are averaged with their weights."""
    vectors = [[np.array(v, dtype=np.float32)] for v in ([0, 0], [1, 0], [0, 1], [1, 1], [10, 10])]
    np.testing.assert_allclose(multi_krum(vectors, [1, 1, 1, 1, 1], 1)[0], [0.5, 0.5])
    np.testing.assert_allclose(multi_krum(vectors, [1, 1, 1, 3, 1], 1)[0], [4 / 6, 4 / 6])
    config = RobustConfig(RobustKind.multi_krum)
    (combined,) = robust_average(config, vectors, [1, 1, 1, 1, 1], num_malicious=1)
    assert combined.dtype == np.float32
    np.testing.assert_allclose(combined, [0.5, 0.5])


def test_trimmed_mean_and_median_are_coordinatewise() -> None:
    values = [[np.array([v, -v], dtype=np.float32)] for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    trimmed = robust_average(
        RobustConfig(RobustKind.trimmed_mean, trim_fraction=0.2), values, [1] * 5, 1
    )
    np.testing.assert_allclose(trimmed[0], [3.0, -3.0])  # cut one value at each end
    median = robust_average(RobustConfig(RobustKind.median), values, [1] * 5, 1)
    np.testing.assert_allclose(median[0], [3.0, -3.0])
    plain = np.mean([v[0] for v in values], axis=0)
    assert abs(plain[0] - 3.0) > 10  # the outlier would dominate the plain mean


def test_attack_vectors() -> None:
    received = [np.linspace(-1, 1, 2000, dtype=np.float32).reshape(40, 50), np.ones(3, np.float32)]
    same = poisoned_upload(AttackConfig(AttackKind.same_value, 0.2, 0.5), received, 0, 2, 1)
    assert len({float(x) for a in same for x in a.ravel()}) == 1
    flipped = poisoned_upload(AttackConfig(AttackKind.sign_flip, 0.2, 0.5), received, 0, 2, 1)
    ratio = flipped[1][0] / received[1][0]
    assert ratio < 0
    np.testing.assert_allclose(flipped[0], ratio * received[0], rtol=1e-6)
    noise = poisoned_upload(AttackConfig(AttackKind.gaussian, 0.2, 0.5), received, 0, 2, 1)
    assert noise[0].std() == pytest.approx(0.5, rel=0.1) and noise[0].dtype == np.float32
    again = poisoned_upload(AttackConfig(AttackKind.gaussian, 0.2, 0.5), received, 0, 2, 1)
    assert_arrays_close(noise, again, rtol=0, atol=0)  # redrawn per round, reproducible per seed
    other = poisoned_upload(AttackConfig(AttackKind.gaussian, 0.2, 0.5), received, 0, 3, 1)
    assert not np.array_equal(noise[0], other[0])
    labels = poisoned_labels(np.zeros(500, dtype=np.int64), 10, 0, 1)
    assert set(np.unique(labels)) == set(range(10))


def test_attack_and_robust_groups_compose_and_validate() -> None:
    settings = settings_of(
        compose_config(["attack=sign_flip", "attack.fraction=0.3", "robust=median"])
    )
    assert settings.attack.name == AttackKind.sign_flip and settings.attack.fraction == 0.3
    assert settings.robust.name == RobustKind.median
    with pytest.raises(Exception, match=r"attack\.fraction"):
        settings_of(compose_config(["attack=gaussian", "attack.fraction=1.5"]))


def test_multi_krum_run_excludes_the_gaussian_attacker(tmp_path: Path) -> None:
    """FedAvg, 4 clients, one Gaussian attacker, Multi-Krum with f = 1: each round's global
    model is the Multi-Krum aggregate of the uploads, the attacker's upload is not among the
    averaged ones, and the attacker is never scored."""
    overrides = [
        *BASE,
        "strategy=fedavg",
        "rounds=2",
        "attack=gaussian",
        "attack.fraction=0.25",
        "robust=multi_krum",
    ]
    log = StateLog(())
    strategies: list[PersonalizedStrategy] = []
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    (bad,) = strategy.malicious
    settings = Experiment.of(config_from_run_config(contexts[0].run_config)).settings
    assert strategy.malicious == malicious_ids(settings.seed, 4, 0.25)
    uploads = [log.uploaded[1, pid] for pid in range(4)]
    sizes = [
        len(Experiment.of(config_from_run_config(contexts[0].run_config)).client_data(p).train)
        for p in range(4)
    ]
    expected = multi_krum(uploads, sizes, 1)
    assert_arrays_close(log.received[2, 0], expected, rtol=1e-6, atol=1e-7)
    benign = [p for p in range(4) if p != bad]
    benign_mean = [
        sum(sizes[p] * log.uploaded[1, p][i].astype(np.float64) for p in benign)
        / sum(sizes[p] for p in benign)
        for i in range(len(uploads[0]))
    ]
    assert_arrays_close(expected, benign_mean, rtol=1e-5, atol=1e-6)
    for stage in ("L1", "L2"):
        assert {r["client"] for r in stage_rows(rows, stage)} == set(benign)
    stage_g = stage_rows(rows, "G")
    assert stage_g[-1]["acc"] > stage_g[0]["acc"] + 0.2


def test_flame_model_poisoning_client_keeps_no_state(tmp_path: Path) -> None:
    overrides = [*BASE, "strategy=flame", "rounds=2", "attack=same_value", "attack.fraction=0.25"]
    strategies: list[PersonalizedStrategy] = []
    rows, contexts = run_inprocess(overrides, tmp_path, strategies=strategies)
    (bad,) = strategies[0].malicious
    for pid, context in enumerate(contexts):
        assert ClientState(context.state).has(flame.THETA) == (pid != bad)
    assert bad not in {r["client"] for r in rows if r["stage"] in ("L1", "L2")}
    assert len(strategies[0].uploads) == 4  # the attacker's vector enters FLAME's average


def test_label_poisoning_changes_only_the_attackers_training_labels(tmp_path: Path) -> None:
    clean = Experiment(compose_config([*BASE, "strategy=fedavg"]))
    poisoned = Experiment(
        compose_config([*BASE, "strategy=fedavg", "attack=label_flip", "attack.fraction=0.25"])
    )
    (bad,) = malicious_ids(0, 4, 0.25)
    for pid in range(4):
        before, after = clean.client_data(pid), poisoned.client_data(pid)
        same = np.array_equal(before.train.labels.numpy(), after.train.labels.numpy())
        assert same == (pid != bad)
        assert np.array_equal(before.test.labels.numpy(), after.test.labels.numpy())
