"""The algorithms: one module each, registered by config name in :data:`ALGORITHMS`.

The modules are imported on first use (:func:`load_algorithms`), which keeps this package
importable from the client and experiment code that the algorithms themselves build on.
"""

from pflower.strategies.registry import (
    ALGORITHMS,
    AlgorithmOptions,
    build_algorithm,
    load_algorithms,
)

__all__ = ["ALGORITHMS", "AlgorithmOptions", "build_algorithm", "load_algorithms"]
