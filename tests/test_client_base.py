"""The client base holds the shared protocol only; one paper's evaluation lives with its family."""

from __future__ import annotations

import pflower.strategies  # noqa: F401  (registers every algorithm)
from pflower.core.algorithm import ALGORITHMS
from pflower.core.client import PersonalClient
from pflower.strategies.moreau import PersonalAndGlobalClient


def test_the_hybrid_model_evaluation_lives_with_the_two_model_methods() -> None:
    assert not hasattr(PersonalClient, "hybrid_metrics")
    assert not hasattr(PersonalClient, "global_model_for_eval")
    assert hasattr(PersonalAndGlobalClient, "hybrid_metrics")
    for name in ("ditto", "pfedme", "flame", "apfl"):
        assert issubclass(ALGORITHMS[name].client, PersonalAndGlobalClient), name
