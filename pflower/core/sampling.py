"""Which clients a round uses: seeded per-round random streams, the seeded sample, and the clients
held out of training.

Every draw comes from a stream of its own (seed, phase, round), so changing how often clients are
evaluated never changes which clients train, and a resumed run draws what the uninterrupted run
drew.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np

from pflower.config import ExperimentConfig, L2Clients

T = TypeVar("T")


class Phase(IntEnum):
    """What a random stream is used for; each phase has its own stream per round."""

    FIT_SAMPLING = 1
    EVALUATE_SAMPLING = 2
    HOLD_OUT = 3


def round_rng(seed: int, phase: Phase, server_round: int) -> np.random.Generator:
    """The random stream of ``phase`` in ``server_round``.

    Every (seed, phase, round) has its own stream, independent of every other, so changing how
    often clients are evaluated never changes which clients train, and a resumed run draws exactly
    what the uninterrupted run drew.
    """
    return np.random.default_rng([seed, int(phase), server_round])


def sample_size(available: int, fraction: float, minimum: int) -> int:
    """How many of ``available`` clients `choose` draws: a share ``fraction``, at least
    ``minimum``, at most all of them."""
    return min(available, max(int(available * fraction), min(minimum, available)))


def choose(
    candidates: Sequence[T], fraction: float, minimum: int, rng: np.random.Generator
) -> list[T]:
    """A share ``fraction`` of ``candidates`` (at least ``minimum``), drawn from ``rng``, in the
    candidates' order; all of them when the share covers them."""
    count = sample_size(len(candidates), fraction, minimum)
    if count >= len(candidates):
        return list(candidates)
    chosen = rng.choice(len(candidates), size=count, replace=False)
    return [candidates[i] for i in sorted(chosen)]


def unseen_clients(settings: ExperimentConfig, malicious: frozenset[int]) -> frozenset[int]:
    """The clients ``eval.unseen_fraction`` holds out of training: ``settings.num_unseen`` of the
    benign partition ids, drawn from the run's seed in a stream of their own (round 0)."""
    count = settings.num_unseen
    if count == 0:
        return frozenset()
    benign = [pid for pid in range(settings.num_clients) if pid not in malicious]
    if count >= len(benign):
        raise ValueError(
            f"eval.unseen_fraction={settings.eval.unseen_fraction} holds out {count} clients, but "
            f"only {len(benign)} of {settings.num_clients} are benign (attack.fraction="
            f"{settings.attack.fraction}): at least one benign client must train"
        )
    rng = round_rng(settings.seed, Phase.HOLD_OUT, 0)
    return frozenset(benign[i] for i in rng.choice(len(benign), size=count, replace=False))


class ClientSampler:
    """Draws each round's clients from the reachable ones: the training sample, the evaluation
    sample, and the clients that measure stage L2 (``eval.l2_clients``).

    Parameters
    ----------
    settings:
        The run's configuration (``seed``, ``fraction``, ``eval.fraction``, ``min_clients``).
    unseen:
        Partition ids held out of training (``eval.unseen_fraction``): never sampled here.
    partition:
        The partition id of a client proxy
        ([`pflower.core.roster.NodeRoster.partition`][pflower.core.roster.NodeRoster.partition]).
    """

    def __init__(
        self,
        settings: ExperimentConfig,
        unseen: frozenset[int],
        partition: Callable[[Any], int],
    ) -> None:
        self.settings = settings
        self.unseen = unseen
        self.partition = partition

    def trainable(self, proxies: Sequence[T]) -> list[T]:
        """``proxies`` without the clients held out of training (``eval.unseen_fraction``)."""
        return [p for p in proxies if self.partition(p) not in self.unseen]

    def draw(self, proxies: Sequence[T], phase: Phase, server_round: int) -> list[T]:
        """The share of ``proxies`` that ``phase`` uses in ``server_round`` (``fraction`` for
        training, ``eval.fraction`` for evaluation; at least ``min_clients``)."""
        fraction = (
            self.settings.fraction if phase == Phase.FIT_SAMPLING else self.settings.eval.fraction
        )
        rng = round_rng(self.settings.seed, phase, server_round)
        return choose(proxies, fraction, self.settings.min_clients, rng)

    def evaluated(
        self, reachable: Sequence[T], server_round: int, unscored: frozenset[int]
    ) -> list[T]:
        """The clients evaluated in ``server_round``: the seeded evaluation sample of the
        trainable ``reachable`` ones without the ``unscored`` partitions (malicious clients,
        ``attack``, are never scored), then every held-out one (always scored, stage U)."""
        sample = self.draw(self.trainable(reachable), Phase.EVALUATE_SAMPLING, server_round)
        held_out = [p for p in reachable if self.partition(p) in self.unseen]
        return [p for p in sample if self.partition(p) not in unscored] + held_out

    def l2_partitions(self, server_round: int, trainable: Sequence[T]) -> set[int] | None:
        """The partitions that measure stage L2 in ``server_round`` (None: every one that trains;
        none without L2 in ``eval.stages``).

        With ``eval.l2_clients=evaluated`` these are the clients of the round's evaluation sample:
        the draw the evaluation phase makes from its own stream, made here from the trainable
        clients reachable now (the same draw unless nodes come or go between fit and evaluate).
        """
        if not self.settings.is_eval_round(server_round):
            return None
        if "L2" not in self.settings.eval.stages:
            return set()
        if self.settings.eval.l2_clients != L2Clients.evaluated:
            return None
        chosen = self.draw(trainable, Phase.EVALUATE_SAMPLING, server_round)
        return {self.partition(p) for p in chosen}
