"""DiversiFed's τ acts as the paper says: a larger τ strengthens both attraction and repulsion
(Sec. V-G, V-H). Pinned on hand-built distances for the default ``tau_scale`` (τ·d), through the
closed-form force coefficients and through autograd on model positions; ``divide`` (d/τ, the
earlier reconstruction) is pinned to the opposite direction, so a swap of the two is caught."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch

from pflower.strategies.diversifed import (
    DiversiFedOptions,
    TauScale,
    force_coefficients,
    mixing_matrix,
    pairwise_distances,
)

TAUS = (0.5, 1.0, 2.0, 5.0)


def spread_distances(low: float, high: float, neighbours: int) -> np.ndarray:
    """Client 0 at distances evenly spread in [low, high] from ``neighbours`` others (the other
    rows are irrelevant: only row 0 is read)."""
    count = neighbours + 1
    distances = np.full((count, count), (low + high) / 2)
    np.fill_diagonal(distances, 0.0)
    distances[0, 1:] = distances[1:, 0] = np.linspace(low, high, neighbours)
    return distances


def attraction_and_repulsion(distances: np.ndarray, tau: float, scale: TauScale):
    """Client 0's total attraction (positive c_0j) and total repulsion (|negative c_0j|)."""
    row = force_coefficients(distances, tau, scale)[0, 1:]
    return float(row[row > 0].sum()), float(-row[row < 0].sum())


def test_the_default_multiplies_the_distance_by_tau() -> None:
    assert DiversiFedOptions(name="diversifed").tau_scale == TauScale.multiply


@pytest.mark.parametrize(("low", "high", "neighbours"), [(20.0, 40.0, 39), (0.5, 2.0, 5)])
def test_default_forces_grow_with_tau(low: float, high: float, neighbours: int) -> None:
    distances = spread_distances(low, high, neighbours)
    forces = [attraction_and_repulsion(distances, tau, TauScale.multiply) for tau in TAUS]
    attraction = [a for a, _ in forces]
    repulsion = [r for _, r in forces]
    assert all(b > a for a, b in pairwise(attraction)), attraction
    assert all(b > a for a, b in pairwise(repulsion)), repulsion
    # each neighbour's force: the nearest is pulled harder, the farthest pushed harder
    rows = [force_coefficients(distances, tau)[0, 1:] for tau in TAUS]
    nearest = [row[0] for row in rows]
    farthest = [row[-1] for row in rows]
    assert all(v > 0 for v in nearest) and all(v < 0 for v in farthest)
    assert all(b > a for a, b in pairwise(nearest)), nearest
    assert all(b < a for a, b in pairwise(farthest)), farthest


def test_divide_forces_fall_with_tau() -> None:
    """The earlier reconstruction, d/τ: total attraction 68.8, 31.3, 13.2, 3.3 at τ = 0.5, 1,
    2, 5 for distances spread over 20-40 from 39 neighbours."""
    distances = spread_distances(20.0, 40.0, 39)
    attraction = [attraction_and_repulsion(distances, t, TauScale.divide)[0] for t in TAUS]
    np.testing.assert_allclose(attraction, [68.8, 31.3, 13.2, 3.3], atol=0.1)


def test_gradient_on_positions_grows_with_tau() -> None:
    """Autograd of L_M(w_0) = Σ_j log softmax_j(τ·‖w_0 − w_j‖) with respect to w_0: its norm,
    the force the server's step (Eq. 6) applies, grows with τ; the closed-form step agrees."""
    rng = np.random.default_rng(3)
    others = rng.normal(size=(6, 4)) * np.linspace(0.5, 3.0, 6)[:, None]
    w0 = np.zeros(4)
    norms = []
    for tau in TAUS:
        position = torch.tensor(w0, requires_grad=True)
        d = torch.linalg.norm(position - torch.tensor(others), dim=1)
        loss = torch.log_softmax(tau * d, dim=0).sum()
        (grad,) = torch.autograd.grad(loss, position)
        norms.append(float(grad.norm()))
        vectors = np.vstack([w0, others])
        xi = mixing_matrix(pairwise_distances(vectors), tau, eta=1.0)
        step = xi[0] @ vectors - w0  # u_0 - w_0 = -η ∇ L_M(w_0)
        np.testing.assert_allclose(step, -grad.numpy(), rtol=1e-8, atol=1e-12)
    assert all(b > a for a, b in pairwise(norms)), norms
