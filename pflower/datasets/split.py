"""The ``split`` config block, and the index lists that make a federation (what is cached).

Both are light (numpy only): a process that finds its federation in the cache builds it from
[`Shares`][pflower.datasets.split.Shares] without importing the partition schemes
([`pflower.datasets.builder`][pflower.datasets.builder], which
computes them, imports Flower Datasets, Hugging Face ``datasets``, pandas and seaborn: about 3 s
and 200 MB per process).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from pflower.registry import ConfigError


@dataclass(frozen=True)
class ClientSplit:
    """One client's sample indices into `Federation.pool`."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray


@dataclass(frozen=True)
class Shares:
    """Every client's index lists, the global test indices and the per-client input-noise stds of
    a quality-skew scheme (``None`` for other schemes): a federation, less its dataset.

    Computed by [`pflower.datasets.builder.share_out`][pflower.datasets.builder.share_out], which
    checks them with
    [`check_no_leak`][pflower.datasets.split.check_no_leak] before they are returned or stored;
    stored by the federation cache as
    the flat arrays of [`to_arrays`][pflower.datasets.split.Shares.to_arrays].
    """

    clients: tuple[ClientSplit, ...]
    global_test: np.ndarray
    noise_std: tuple[float, ...] | None = None
    fixed_noise: bool = False

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat arrays: each share kind concatenated over clients, with per-client sizes."""
        arrays = {"global_test": np.asarray(self.global_test, dtype=np.int64)}
        for kind in _SHARE_KINDS:
            shares = [getattr(client, kind) for client in self.clients]
            arrays[kind] = np.concatenate(shares).astype(np.int64)
            arrays[f"{kind}_sizes"] = np.array([len(share) for share in shares], dtype=np.int64)
        if self.noise_std is not None:
            arrays["noise_std"] = np.asarray(self.noise_std, dtype=np.float64)
            arrays["fixed_noise"] = np.asarray(self.fixed_noise)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Shares:
        """The inverse of [`to_arrays`][pflower.datasets.split.Shares.to_arrays], checked with
        [`check_no_leak`][pflower.datasets.split.check_no_leak].

        Raises:
            KeyError, ValueError: arrays missing or inconsistent (a damaged cache entry).
            RuntimeError: a held-out sample is also trained on.
        """
        parts = {}
        for kind in _SHARE_KINDS:
            flat, sizes = np.asarray(arrays[kind]), np.asarray(arrays[f"{kind}_sizes"])
            if (sizes < 0).any() or int(sizes.sum()) != len(flat):
                raise ValueError(f"{kind}: sizes sum to {int(sizes.sum())}, not {len(flat)}")
            parts[kind] = np.split(flat, np.cumsum(sizes)[:-1])
        clients = tuple(ClientSplit(*shares) for shares in zip(*parts.values(), strict=True))
        global_test = np.asarray(arrays["global_test"])
        check_no_leak(clients, global_test)
        if "noise_std" not in arrays:
            return cls(clients, global_test)
        noise_std = tuple(float(std) for std in arrays["noise_std"])
        if len(noise_std) != len(clients):
            raise ValueError(f"{len(noise_std)} noise stds for {len(clients)} clients")
        return cls(clients, global_test, noise_std, bool(arrays["fixed_noise"]))


_SHARE_KINDS = ("train", "test", "val")
"""The fields of [`ClientSplit`][pflower.datasets.split.ClientSplit], in order."""


def check_no_leak(clients: tuple[ClientSplit, ...], global_test: np.ndarray) -> None:
    """Refuse a federation in which a held-out sample is also trained on.

    No client's test sample and no global test sample may be in any client's train or validation
    share, and no validation sample in any client's train share. The builder guarantees this by
    construction; the check keeps it true for schemes added later.

    Raises:
        RuntimeError: the index of the first leaked sample and which shares hold it.
    """
    trained = np.concatenate([client.train for client in clients])
    validated = np.concatenate([client.val for client in clients])
    tested = np.concatenate([client.test for client in clients] + [global_test])
    for held, used, what in (
        (tested, np.concatenate([trained, validated]), "test sample is also a train/validation"),
        (validated, trained, "validation sample is also a training"),
    ):
        leaked = np.intersect1d(held, used)
        if len(leaked):
            raise RuntimeError(
                f"{len(leaked)} held-out samples leak (pool index {int(leaked[0])}: a {what} "
                "sample); a partition scheme that gives one sample to several clients must "
                "declare it (SampleSharingScheme.shares_samples) so the builder reserves "
                "held-out samples first"
            )


_CHOICES: dict[str, tuple[str, ...]] = {
    "pool": ("train", "all"),
    "client_test": ("holdout", "mirror", "partitioner", "file"),
    "global_test": ("union", "official"),
    "evaluate_on": ("test", "val"),
}


@dataclass
class SplitConfig:
    """The ``split`` group's schema (``split=<preset>``, presets in ``conf/split/*.yaml``): where
    client test/validation shares come from.

    Attributes:
        pool: ``train`` shares the official train split; ``all`` shares train and test merged.
        subsample_fraction: stratified fraction of the shared samples (and of the official test
            split where it is used) kept before partitioning, for quick runs; 1.0 keeps all.
        client_test: ``holdout``, ``mirror``, ``partitioner`` or ``file`` (each client's own test
            share listed in the ``partition=from_file`` file: ``tests``), see
            [`pflower.datasets.federation`][pflower.datasets.federation].
        test_fraction: ``holdout`` only: share of each client's samples held out for its test.
        stratify: ``holdout`` and validation: keep the client's class proportions in both parts.
        val_fraction: share of each client's train share carved out for validation (0 = none).
        global_test: ``union`` of client test shares, or the ``official`` test split.
        evaluate_on: ``test``, or ``val`` to tune hyperparameters: the validation shares (and
            their union) replace the client tests (and the global test) in every evaluation.
    """

    pool: str = "train"
    subsample_fraction: float = 1.0
    client_test: str = "holdout"
    test_fraction: float = 0.25
    stratify: bool = True
    val_fraction: float = 0.0
    global_test: str = "union"
    evaluate_on: str = "test"

    @classmethod
    def from_mapping(cls, split: Mapping[str, Any]) -> SplitConfig:
        """Validate a split block; unknown keys and bad values fail with what is allowed."""
        allowed = [field.name for field in fields(cls)]
        unknown = sorted(set(split) - set(allowed))
        if unknown:
            raise ConfigError(
                f"split does not take {', '.join(map(repr, unknown))}. "
                f"Allowed keys: {', '.join(allowed)}"
            )
        if isinstance(split, SplitConfig):
            return split
        return cls(**dict(split))

    def __post_init__(self) -> None:
        if not isinstance(self.stratify, bool):
            raise ConfigError(f"split.stratify must be true or false, got {self.stratify!r}")
        for key in ("subsample_fraction", "test_fraction", "val_fraction"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"split.{key} must be a number, got {value!r}")
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(
                    f"split.{key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}"
                )
        if not 0.0 < self.subsample_fraction <= 1.0:
            raise ConfigError(
                f"split.subsample_fraction must be in (0, 1], got {self.subsample_fraction}"
            )
        for key in ("test_fraction", "val_fraction"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"split.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.evaluate_on == "val" and self.val_fraction == 0.0:
            raise ConfigError(
                "split.evaluate_on=val scores the clients' validation shares: set "
                "split.val_fraction > 0 (e.g. 0.2)"
            )
        if self.client_test == "holdout" and self.test_fraction == 0.0:
            raise ConfigError("split.test_fraction must be > 0 with client_test=holdout")
        if self.pool == "all" and (
            self.client_test not in ("holdout", "file") or self.global_test == "official"
        ):
            raise ConfigError(
                "split.pool=all shares the official test split among clients, so it cannot also "
                "supply client tests (client_test=mirror|partitioner) or the global test "
                "(global_test=official); use pool=train or client_test=holdout, global_test=union"
            )
        if self.client_test == "file" and self.pool != "all":
            raise ConfigError(
                "split.client_test=file reads client test shares as indices into the whole pool "
                "(official train followed by official test): set split.pool=all (split=file)"
            )
