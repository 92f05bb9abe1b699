"""The algorithms: one module each, registered by config name in :data:`ALGORITHMS`."""

from pflower.strategies import fedavg, fedavg_ft, fedprox, fliu, local
from pflower.strategies.registry import ALGORITHMS, AlgorithmOptions, build_algorithm

__all__ = [
    "ALGORITHMS",
    "AlgorithmOptions",
    "build_algorithm",
    "fedavg",
    "fedavg_ft",
    "fedprox",
    "fliu",
    "local",
]
