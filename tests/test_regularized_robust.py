"""Byzantine attacks and robust aggregation (FLAME paper, Zhu et al., Sec. VI-B3): the shared
malicious-set function, the attack vectors, Multi-Krum / trimmed mean / median / norm clipping on
hand-built updates with known outliers, the refusal of aggregators that cannot act, and
in-process runs where malicious clients are never scored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pflower.compose import compose_config, config_from_run_config, settings_of
from pflower.config import AttackConfig, AttackKind, RobustConfig, RobustKind
from pflower.core.aggregation import weighted_mean
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import PersonalizedStrategy
from pflower.registry import ConfigError
from pflower.robust.aggregators import (
    clip_update_norms,
    idle,
    multi_krum,
    robust_average,
    robust_average_partial,
)
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


def test_robust_aggregation_of_partial_uploads_keeps_what_no_client_sent() -> None:
    """A body every client sends, a head none sends (kept: the current one), a layer only
    clients 0 and 1 send (aggregated over them): the median of each over its senders."""
    empty = np.zeros(0, np.float32)
    current = [np.zeros(2, np.float32), np.full(3, 7, np.float32), np.full(1, 5, np.float32)]
    uploads = [
        [np.array([1, 2], np.float32), empty, np.array([1], np.float32)],
        [np.array([3, 4], np.float32), empty, np.array([3], np.float32)],
        [np.array([100, -100], np.float32), empty, empty],
    ]
    config = RobustConfig(RobustKind.median)
    body, head, layer = robust_average_partial(config, uploads, [1, 1, 1], 0, current)
    np.testing.assert_allclose(body, [3, 2])
    np.testing.assert_array_equal(head, current[1])
    np.testing.assert_allclose(layer, [2])
    assert head is not current[1] and body.dtype == np.float32


def _vector(x: float, y: float, count: int) -> list[np.ndarray]:
    """A model as the server sees it: two float arrays (the norm spans both), a BatchNorm-like
    integer counter and an empty array (a personal array the client kept)."""
    return [
        np.array([x], np.float32),
        np.array([y], np.float32),
        np.array(count, np.int64),
        np.zeros(0, np.float32),
    ]


def test_norm_clip_moves_updates_above_the_median_norm_back_to_it() -> None:
    """Reference x = (1, 1); updates (3, 4), (0, 1), (1, 0), (0, 2), (1e30, 0) have norms
    5, 1, 1, 2, 1e30, median 2. With c = 1 the bound is 2: (3, 4) becomes (1.2, 1.6) and
    (1e30, 0) becomes (2, 0), the others stay; their uniform mean is x + (4.2, 4.6) / 5. With
    c = 3 the bound is 6: only the 1e30 update is clipped, to (6, 0)."""
    reference = _vector(1, 1, 7)
    reference[3] = np.zeros(2, np.float32)  # the global array the clients kept to themselves
    updates = [(3, 4), (0, 1), (1, 0), (0, 2), (1e30, 0)]
    vectors = [_vector(1 + dx, 1 + dy, 9) for dx, dy in updates]

    clipped = clip_update_norms(vectors, reference, 1.0)
    expected = [(2.2, 2.6), (1, 2), (2, 1), (1, 3), (3, 1)]
    for got, (x, y), original in zip(clipped, expected, vectors, strict=True):
        np.testing.assert_allclose([got[0][0], got[1][0]], [x, y], rtol=1e-6)
        assert [a.dtype for a in got] == [a.dtype for a in original]
        assert int(got[2]) == 9 and got[3].size == 0  # counters and kept arrays untouched
    for index in (1, 2, 3):  # within the bound: the very arrays, bit for bit
        assert all(a is b for a, b in zip(clipped[index], vectors[index], strict=True))
    mean = weighted_mean([v[:2] for v in clipped], np.ones(5))
    np.testing.assert_allclose([mean[0][0], mean[1][0]], [1 + 4.2 / 5, 1 + 4.6 / 5], rtol=1e-6)

    loose = clip_update_norms(vectors, reference, 3.0)
    np.testing.assert_allclose([loose[4][0][0], loose[4][1][0]], [7, 1], rtol=1e-6)
    np.testing.assert_allclose([loose[0][0][0], loose[0][1][0]], [4, 5])


def test_a_round_without_outliers_is_fedavg_under_norm_clip() -> None:
    vectors = [_vector(v, -v, 1)[:2] for v in (0.5, 1.0, 1.5)]
    reference = _vector(1.0, -1.0, 0)[:2]
    clipped = clip_update_norms(vectors, reference, 1.0)  # norms 0.71, 0, 0.71: median 0.71
    for got, sent in zip(clipped, vectors, strict=True):
        assert all(a is b for a, b in zip(got, sent, strict=True))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["num_clients=4", "robust=trimmed_mean"],
            r"int\(0\.2 x 4\) = 0 .* the 4 clients of every round: .*trim_fraction >= 0\.25",
        ),
        (
            ["num_clients=10", "fraction=0.4", "robust=trimmed_mean"],
            r"int\(0\.2 x 4\) = 0 .* 4 clients sampled per round \(fraction=0\.4 of 10",
        ),
        (
            ["num_clients=2", "robust=trimmed_mean", "robust.trim_fraction=0.45"],
            r"int\(0\.45 x 2\) = 0 .* at least 3 clients per round",
        ),
        (["num_clients=2", "robust=median"], r"robust=median over the 2 clients .* mean"),
        (["num_clients=2", "robust=norm_clip"], r"robust=norm_clip over the 2 clients"),
        (
            ["strategy=fedamp", "robust=median"],
            r"robust=median changes nothing with strategy=fedamp",
        ),
        (["strategy=fedselect", "robust=norm_clip"], r"changes nothing with strategy=fedselect"),
        (
            ["num_clients=4", "robust=multi_krum", "robust.num_malicious=0"],
            r"f = 0 \(robust\.num_malicious=0\) keeps all n - f = 4 of the 4 clients",
        ),
    ],
)
def test_a_robust_aggregator_that_cannot_act_is_refused_with_the_numbers(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        compose_config(["dataset=digits", *overrides])


@pytest.mark.parametrize(
    "overrides",
    [
        ["num_clients=10", "robust=trimmed_mean"],  # cuts 2 at each end
        ["num_clients=4", "robust=trimmed_mean", "robust.trim_fraction=0.25"],
        ["num_clients=3", "robust=median"],
        ["num_clients=4", "robust=multi_krum", "robust.num_malicious=1"],
        ["num_clients=4", "robust=multi_krum", "attack=gaussian"],  # f = 1 from the attack
        # FLAME's robust aggregate runs over all m = 10 cached z_i, not the 2 sampled.
        ["num_clients=10", "fraction=0.2", "robust=trimmed_mean", "strategy=flame"],
    ],
)
def test_a_robust_aggregator_that_can_act_composes(overrides: list[str]) -> None:
    asked = next(o.split("=")[1] for o in overrides if o.startswith("robust="))
    settings = settings_of(compose_config(["dataset=digits", *overrides]))
    assert settings.robust.name is RobustKind(asked)


def test_multi_krum_with_f_from_an_attack_free_configuration_is_only_warned_about() -> None:
    """The attack-free point of a robustness study: f = 0 is what Multi-Krum prescribes."""
    settings = settings_of(compose_config(["dataset=digits", "num_clients=4", "robust=multi_krum"]))
    warning = idle(settings.robust, 4, 0, "the 4 clients of every round")
    assert warning is not None and not warning.refused
    assert "f = 0" in warning.reason and "robust.num_malicious" in warning.reason
    assert idle(settings.robust, 4, 1, "the 4 clients of every round") is None


def test_norm_clip_and_its_factor_compose_and_validate() -> None:
    settings = settings_of(compose_config(["robust=norm_clip", "robust.clip_factor=2.5"]))
    assert settings.robust.name == RobustKind.norm_clip and settings.robust.clip_factor == 2.5
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ConfigError, match=r"robust\.clip_factor must be a finite number > 0"):
            settings_of(compose_config(["robust=norm_clip", f"robust.clip_factor={bad}"]))


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
