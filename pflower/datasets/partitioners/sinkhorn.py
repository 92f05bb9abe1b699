"""Sinkhorn-Knopp (iterative proportional fitting) to given row and column sums.

FLIU's label-skew environments (FLIU paper, Sec. IV-A3 and IV-A5) draw a random
``clients x classes`` matrix and rescale it so that row ``k`` sums to client ``k``'s size and
column ``l`` to class ``l``'s size. (The paper states normalized row sums "K/L" with column sums 1,
which cannot hold for K != L; working in sample counts avoids the slip.)
The result is the matrix closest in KL divergence to the draw under those marginals, so it keeps
the draw's label skew while fixing the client sizes.
"""

from __future__ import annotations

import warnings

import numpy as np

_FLOOR = 1e-12
"""Smallest entry kept: a Dirichlet draw with tiny concentration can underflow to exact zeros,
and a zero row or column can never be scaled up to its target."""


def sinkhorn(
    matrix: np.ndarray,
    row_targets: np.ndarray,
    column_targets: np.ndarray,
    tol: float = 1e-6,
    max_iter: int = 10_000,
) -> np.ndarray:
    """Scale the rows and columns of a positive ``matrix`` to the given sums.

    Alternates a row step and a column step (the Sinkhorn-Knopp algorithm of FLIU, Sec. IV-A3)
    until the largest relative row error is below ``tol``; column sums are exact after every
    column step. Warns if ``max_iter`` steps do not reach ``tol`` and returns the last iterate.

    Raises:
        ValueError: shapes disagree, a target is not positive, or the totals differ.
    """
    rows = np.asarray(row_targets, dtype=np.float64)
    columns = np.asarray(column_targets, dtype=np.float64)
    scaled = np.maximum(np.asarray(matrix, dtype=np.float64), _FLOOR)
    if scaled.shape != (len(rows), len(columns)):
        raise ValueError(f"matrix {scaled.shape} does not match {len(rows)}x{len(columns)}")
    if (rows <= 0).any() or (columns <= 0).any():
        raise ValueError("row and column targets must be positive")
    if not np.isclose(rows.sum(), columns.sum(), rtol=1e-9):
        raise ValueError(f"row targets sum to {rows.sum()}, column targets to {columns.sum()}")
    for _ in range(max_iter):
        scaled *= (rows / scaled.sum(axis=1))[:, None]
        scaled *= (columns / scaled.sum(axis=0))[None, :]
        if np.max(np.abs(scaled.sum(axis=1) - rows) / rows) < tol:
            return scaled
    warnings.warn(
        f"Sinkhorn did not reach relative row error {tol} in {max_iter} iterations",
        RuntimeWarning,
        stacklevel=2,
    )
    return scaled
