"""The slot wait of near-deterministic holds (capacity.hold_factor) against an M/D/c simulation, and the
window rule that keeps M/M/b's form where one 600 s window holds few spells of the queue."""

import heapq
import math

import numpy as np
import pytest

from fleetplan.solver import capacity


def md_c_waits(c: int, rho: float, hold: float, n: int, seed: int) -> np.ndarray:
    """Waits of n FIFO customers of an M/D/c queue (Poisson arrivals at rho c / hold, service `hold`): each
    starts on the server that frees first. Independent of capacity.py: a plain event recursion."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(hold / (rho * c), n))
    free = [0.0] * c
    waits = np.empty(n)
    for i, t in enumerate(arrivals):
        first = heapq.heappop(free)
        start = max(t, first)
        waits[i] = start - t
        heapq.heappush(free, start + hold)
    return waits[n // 10 :]  # past the warm-up


def model_quantile(c: int, rho: float, hold: float, epsilon: float, factor: float) -> float:
    """The wait exceeded with probability epsilon when it is zero-or-exponential: Erlang C's probability of
    waiting, conditional mean factor x M/M/c's hold / (c (1 - rho))."""
    wait_prob = float(capacity.erlang_c(np.array([c]), np.array([rho * c]))[0])
    mean = factor * hold / (c * (1.0 - rho))
    return mean * math.log(wait_prob / epsilon) if wait_prob > epsilon else 0.0


@pytest.mark.parametrize(("c", "rho"), [(1, 0.7), (4, 0.7), (4, 0.85), (8, 0.7), (8, 0.85)])
def test_cosmetatos_wait_reaches_the_simulated_md_c_quantiles(c, rho):
    hold = 1.0
    waits = md_c_waits(c, rho, hold, 400_000, seed=c)
    factor = float(capacity.hold_factor(rho, c, 0.0, 1.0, hold))  # epsilon 1: the window rule is met
    for epsilon in (0.05, 0.01):
        simulated = float(np.quantile(waits, 1.0 - epsilon))
        planned = model_quantile(c, rho, hold, epsilon, factor)
        assert 0.9 * simulated <= planned <= 1.25 * simulated, (epsilon, planned, simulated)
        # M/M/c's exponential wait (factor 1) asks for far more room than the deterministic holds need
        assert model_quantile(c, rho, hold, epsilon, 1.0) >= 1.5 * simulated


def test_hold_factor_closed_forms():
    # one slot: M/D/1's mean wait is exactly half M/M/1's (Pollaczek-Khinchine), at any load
    assert capacity.hold_factor(np.array([0.3, 0.8]), 1, 0.0, 1.0, 1.0) == pytest.approx([0.5, 0.5])
    # exponential holds (cv2 = 1) are M/M/b's own
    assert capacity.hold_factor(0.8, 4, 1.0, 1.0, 1.0) == pytest.approx(1.0)
    # Cosmetatos at c = 4, rho = 0.5: (1 + 0.5 * 3 * (sqrt(24) - 2) / 32) / 2
    expected = 0.5 * (1 + 0.5 * 3 * (math.sqrt(24) - 2) / (16 * 0.5 * 4))
    assert capacity.hold_factor(0.5, 4, 0.0, 1.0, 1.0) == pytest.approx(expected, rel=1e-12)
    # in between, the M/G/c interpolation cv2 W(M/M/c) + (1 - cv2) W(M/D/c)
    assert capacity.hold_factor(0.5, 4, 0.25, 1.0, 1.0) == pytest.approx(0.25 + 0.75 * expected, rel=1e-12)


def test_window_rule_keeps_mm_b_for_p99_classes_and_queues_near_saturation():
    hold_ms, c = 600.0, 4
    p90, p99 = 0.5 * 0.1, 0.5 * 0.01  # planned tail probabilities (TAIL_MARGIN)
    rho = np.array([0.5, 0.7, 0.9, 0.97])
    relax = capacity.slot_relaxation_ms(rho, c, 0.0, hold_ms)
    assert relax == pytest.approx(hold_ms / (c * (1 - rho) ** 2))
    episodes = p90 * capacity.WINDOW_MS / relax
    f90 = capacity.hold_factor(rho, c, 0.0, p90, hold_ms)
    assert np.all((f90 < 1.0) == (episodes >= capacity.WINDOW_EPISODES))
    assert f90[0] < 1.0
    assert f90[-1] == 1.0  # near saturation a window holds few spells: M/M/b
    # a p99 class at a load where a p90 class would take the deterministic form keeps M/M/b's
    assert f90[1] < 1.0
    assert capacity.hold_factor(rho[1], c, 0.0, p99, hold_ms) == 1.0
