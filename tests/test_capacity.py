"""The queueing capacity model (fleetplan/solver/capacity.py; docs/formulation.md, "Capacity model").

Every expected value here is computed independently in the test: Erlang C from its explicit sum, the M/D/1
mean wait, normal-distribution masses from scipy.stats, the sum of two exponentials by numerical
convolution, Monte Carlo with a fixed seed, and the admissible rates of single-server cases by root-finding
on the closed-form tail (scipy brentq) rather than by the module's bisection. Structural properties
(monotonicity in the SLO, the percentile, the FIFO share) run `capacity.rates` on small hand-built
UseTable/Curves. The end-to-end tests plan tiny requests with the default queueing model and replay them in
the simulator: the promise is that every served class meets its SLO percentile on seeds 0-2.
"""

import dataclasses
import math
from collections.abc import Callable

import msgspec
import numpy as np
import pandas as pd
import pytest
from scipy import integrate, optimize, stats

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.fleet import Link
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.workload import Slo, Workload
from fleetplan.profiler.latency import Z90, Z99
from fleetplan.simulator import simulate
from fleetplan.solver import capacity, plan
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.headroom import _kv_share, _share
from fleetplan.solver.pipeline import resolve_profiles

HALF_BIN = 0.0625  # the capacity grid's z points are k / 8; bins end halfway between them


# --- independent references ----------------------------------------------------------------------------


def erlang_c_ref(c: int, a: float) -> float:
    """P(wait) in M/M/c with offered load a < c: the explicit sum (not the Erlang B recursion)."""
    head = sum(a**k / math.factorial(k) for k in range(c))
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (head + top)


def md_c_factor_ref(rho: float, c: int, hold_ms: float, epsilon: float) -> float:
    """A deterministic hold's slot wait mean over M/M/c's: Cosmetatos's M/D/c ratio (at most 1), or 1 where
    the judged window holds fewer than WINDOW_EPISODES spells of the queue, epsilon x window over the
    relaxation time H / (c (1 - rho)^2)."""
    if epsilon * capacity.WINDOW_MS * c * (1 - rho) ** 2 / hold_ms < capacity.WINDOW_EPISODES:
        return 1.0
    return min(0.5 * (1 + (1 - rho) * (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * rho * c)), 1.0)


def md1_mean_wait(u: float, service_ms: float) -> float:
    """Pollaczek-Khinchine mean wait of M/D/1 at utilization u."""
    return u * (service_ms / 2.0) / (1.0 - u)


def md1_cap_ref(service_ms: float, allowance_ms: float) -> float:
    """u with md1_mean_wait(u, D) = allowance, solved by root-finding."""
    return optimize.brentq(
        lambda u: md1_mean_wait(u, service_ms) - allowance_ms, 0.0, 1.0 - 1e-15, xtol=1e-15
    )


def sum_of_exponentials_sf(r: float, m1: float, m2: float) -> float:
    """P(E1 + E2 > r), E_i exponential of mean m_i, by numerical convolution:
    P(E1 > r) + integral_0^r f1(x) P(E2 > r - x) dx."""
    inner, _ = integrate.quad(
        lambda x: math.exp(-x / m1) / m1 * math.exp(-(r - x) / m2), 0.0, r, epsabs=1e-13
    )
    return math.exp(-r / m1) + inner


def md1_wait_cdf(t: float, rho: float, service_ms: float) -> float:
    """P(W <= t) of M/D/1 at load rho (Erlang's formula):
    (1 - rho) sum_{k <= t / D} (lambda (k D - t))^k / k! exp(-lambda (k D - t)), lambda = rho / D."""
    if t < 0:
        return 0.0
    lam = rho / service_ms
    total = sum(
        (lam * (k * service_ms - t)) ** k / math.factorial(k) * math.exp(-lam * (k * service_ms - t))
        for k in range(int(t // service_ms) + 1)
    )
    return (1.0 - rho) * total


def md1_plus_exponential_sf(r: float, rho: float, service_ms: float, p: float, m: float) -> float:
    """P(W + V > r), W the M/D/1 wait, V independent: 0 w.p. 1 - p, else exponential of mean m. By parts,
    P(W + E > r) = 1 - (1 / m) integral_0^r F_W(w) exp(-(r - w) / m) dw (quad between F_W's kinks)."""
    if r < 0:
        return 1.0
    kinks = [k * service_ms for k in range(1, int(r // service_ms) + 1)]
    inner, _ = integrate.quad(
        lambda w: md1_wait_cdf(w, rho, service_ms) * math.exp(-(r - w) / m),
        0.0,
        r,
        points=kinks or None,
        epsabs=1e-13,
        limit=200,
    )
    with_v = 1.0 - inner / m
    return (1 - p) * (1.0 - md1_wait_cdf(r, rho, service_ms)) + p * with_v


def lognormal_percentiles(p50: float, sigma: float) -> list[float]:
    """p50/p90/p99 of a lognormal with median p50 and log-sd sigma (one slope through all three)."""
    return [p50, p50 * math.exp(sigma * Z90), p50 * math.exp(sigma * Z99)]


def flat(value: float) -> list[float]:
    """p50 = p90 = p99: a deterministic service time."""
    return [value, value, value]


def curves(
    batches: list[float], ttft: list[list[float]], tbt: list[list[float]], n: int = 1
) -> capacity.Curves:
    """n identical uses with the given profiled batches and per-batch p50/p90/p99."""
    return capacity.Curves(
        np.tile(np.asarray(batches, float), (n, 1)),
        np.tile(np.asarray(ttft, float)[None], (n, 1, 1)),
        np.tile(np.asarray(tbt, float)[None], (n, 1, 1)),
    )


def use_table(n: int = 1, **fields) -> capacity.UseTable:
    """A UseTable of n uses; every field a scalar (broadcast) or a length-n sequence."""
    defaults = {
        "w": 0,
        "role": "prefill",
        "batch": 1.0,
        "rate": 100.0,
        "ttft_q": 10.0,
        "tbt_q": 5.0,
        "ttft_slo": 100.0,
        "tbt_slo": 50.0,
        "epsilon": 0.05,
        "steps": 0.0,
        "t_kv": 0.0,
        "own_bw": np.inf,
        "min_bw": np.inf,
        "kv_slack_ms": 0.0,
        "share": 1.0,
        "kv_share": 1.0,
        "kv_links": 1.0,
    }
    unknown = set(fields) - set(defaults)
    assert not unknown, unknown
    values = {**defaults, **fields}
    out = {}
    for name, value in values.items():
        array = np.asarray(value)
        if array.ndim == 0:
            array = np.full(n, value)
        if name == "role":
            array = array.astype(object)
        elif name == "w":
            array = array.astype(np.int64)
        else:
            array = array.astype(float)
        assert len(array) == n, name
        out[name] = array
    return capacity.UseTable(**out)


def rates_of(**fields) -> np.ndarray:
    """capacity.rates for uses given as fields (lists = one use each) on a `curves` keyword."""
    cv = fields.pop("curves")
    n = len(cv.batches)
    return capacity.rates(use_table(n, **fields), cv)


# --- Erlang C and M/D/1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("a", [0.01, 0.3, 0.7, 0.99])
def test_erlang_c_one_server_waits_with_probability_a(a):
    assert capacity.erlang_c(np.array([1]), np.array([a]))[0] == pytest.approx(a, abs=1e-12)


def test_erlang_c_two_servers_load_one_is_one_third():
    assert capacity.erlang_c(np.array([2]), np.array([1.0]))[0] == pytest.approx(1.0 / 3.0, abs=1e-12)


def test_erlang_c_matches_the_explicit_sum_on_a_grid():
    servers, loads, expected = [], [], []
    for c in range(1, 17):
        for frac in (0.02, 0.25, 0.5, 0.8, 0.95, 0.999):
            servers.append(c)
            loads.append(frac * c)
            expected.append(erlang_c_ref(c, frac * c))
    # one vectorized call with mixed server counts: each element must stop its recursion at its own c
    got = capacity.erlang_c(np.array(servers, dtype=np.int64), np.array(loads))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)


def test_md1_cap_mean_wait_at_the_cap_equals_the_allowance():
    service = np.array([0.5, 2.0, 10.0, 10.0, 80.0, 300.0])
    allowance = np.array([0.01, 3.0, 1.0, 40.0, 25.0, 1e4])
    u = capacity.md1_cap(service, allowance)
    assert np.all((u > 0) & (u < 1))
    for ui, d, a in zip(u, service, allowance, strict=True):
        assert md1_mean_wait(ui, d) == pytest.approx(a, rel=1e-9)
        assert ui == pytest.approx(md1_cap_ref(d, a), abs=1e-12)


def test_md1_cap_edges_and_monotonicity():
    # no service time: the server never queues anyone, any utilization is fine
    assert capacity.md1_cap(np.array([0.0]), np.array([5.0]))[0] == 1.0
    # no allowance for a wait at all: nothing may arrive
    assert capacity.md1_cap(np.array([4.0]), np.array([0.0]))[0] == 0.0
    allowance = np.linspace(0.1, 100.0, 50)
    u = capacity.md1_cap(np.full(50, 8.0), allowance)
    assert np.all(np.diff(u) > 0)
    longer = capacity.md1_cap(np.full(50, 16.0), allowance)
    assert np.all(longer < u)


# --- the service grid ------------------------------------------------------------------------------------


def test_deterministic_service_grid_moments():
    grid = capacity.service_grid(np.array([flat(12.5), flat(40.0)]))
    np.testing.assert_allclose(grid, np.array([[12.5], [40.0]]) * np.ones_like(grid), rtol=1e-12)
    mean, residual = capacity.moments(grid)
    np.testing.assert_allclose(mean, [12.5, 40.0], rtol=1e-12)
    np.testing.assert_allclose(residual, [6.25, 20.0], rtol=1e-12)  # D / 2


@pytest.mark.parametrize("sigma", [0.05, 0.2, 0.4])
def test_lognormal_service_grid_moments(sigma):
    """The grid is a midpoint rule on z bins of width 1/8 (error ~ h^2 sigma^2 / 24 relative, < 1e-4 for
    sigma <= 0.4) with the |z| > 5 tails folded onto the end points (mass 6e-7): 1e-3 covers both."""
    p50 = 30.0
    mean, residual = capacity.moments(capacity.service_grid(np.array([lognormal_percentiles(p50, sigma)])))
    mu = math.log(p50)
    assert mean[0] == pytest.approx(math.exp(mu + sigma**2 / 2), rel=1e-3)
    assert residual[0] == pytest.approx(math.exp(mu + 1.5 * sigma**2) / 2, rel=1e-3)


def test_curves_interpolate_linearly_between_profiled_batches():
    ttft = [[10.0, 11.0, 12.0], [30.0, 33.0, 36.0], [70.0, 80.0, 95.0]]
    cv = curves([1.0, 4.0, 8.0], ttft, ttft, n=6)
    n = np.array([0.5, 1.0, 2.5, 4.0, 7.0, 8.0])
    got = cv.at("ttft", n)
    for j in range(3):
        expected = np.interp(n, [1.0, 4.0, 8.0], [row[j] for row in ttft])  # clamps below the first batch
        np.testing.assert_allclose(got[:, j], expected, rtol=1e-12)


# --- tail() ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("z_cut", [-2.0625, -0.5625, 0.0625, 0.9375, 1.1875])
def test_tail_without_waits_is_the_service_mass_above_the_limit(z_cut):
    """A limit on a bin boundary (z = k/8 + 1/16) splits the grid exactly: P(S > limit) = 1 - Phi(z)."""
    p50, sigma = 20.0, 0.3
    grid = capacity.service_grid(np.array([lognormal_percentiles(p50, sigma)]))
    limit = np.array([p50 * math.exp(sigma * z_cut)])
    got = capacity.tail(grid, limit, np.zeros(1), np.ones(1))
    assert got[0] == pytest.approx(stats.norm.sf(z_cut), abs=1e-12)
    assert z_cut % 0.125 == pytest.approx(HALF_BIN)


def test_tail_limit_outside_the_service_range():
    grid = capacity.service_grid(np.array([lognormal_percentiles(20.0, 0.3)] * 2))
    got = capacity.tail(grid, np.array([1.0, 1e5]), np.zeros(2), np.ones(2))
    assert got[0] == pytest.approx(1.0, abs=1e-12)
    assert got[1] == pytest.approx(0.0, abs=1e-12)


def test_tail_deterministic_service_exponential_wait_closed_form():
    s = 15.0
    cases = [(0.3, 5.0, 20.0), (0.9, 40.0, 100.0), (0.05, 1.0, 15.5), (1.0, 10.0, 60.0), (0.7, 8.0, 12.0)]
    p, m, limit = (np.array(column) for column in zip(*cases, strict=True))
    grid = capacity.service_grid(np.array([flat(s)] * len(cases)))
    got = capacity.tail(grid, limit, p, m)
    expected = [1.0 if lim < s else pi * math.exp(-(lim - s) / mi) for pi, mi, lim in cases]
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)


def test_tail_two_waits_deterministic_service_matches_the_convolution():
    s = 10.0
    cases = [  # (p1, m1, p2, m2, limit)
        (0.5, 8.0, 0.9, 20.0, 60.0),
        (1.0, 3.0, 1.0, 30.0, 40.0),
        (0.2, 50.0, 0.6, 4.0, 25.0),
        (0.8, 12.0, 0.3, 12.0, 50.0),  # equal means: the Erlang-2 limit of the hypoexponential form
        (0.8, 12.0, 0.3, 12.0 * (1 + 1e-10), 50.0),
        (0.4, 6.0, 0.7, 9.0, s),  # limit == service: P(W + V > 0)
    ]
    p1, m1, p2, m2, limit = (np.array(column) for column in zip(*cases, strict=True))
    grid = capacity.service_grid(np.array([flat(s)] * len(cases)))
    limit[-1] = grid[-1, 0]  # the grid's own value (exp(log) may round 10 ms by an ulp)
    got = capacity.tail(grid, limit, p1, m1, p2, m2)
    for value, (a, ma, b, mb, lim) in zip(got, cases, strict=True):
        r = lim - s
        both = sum_of_exponentials_sf(r, ma, mb)
        expected = (1 - a) * b * math.exp(-r / mb) + a * (1 - b) * math.exp(-r / ma) + a * b * both
        if r == 0:
            expected = 1 - (1 - a) * (1 - b)
        # the code nudges equal means apart by 1e-6 relative: its error there is of that order
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-12), (a, ma, b, mb, lim)


def test_tail_two_waits_lognormal_service_matches_monte_carlo():
    """P(S + W + V > t) for lognormal S, W and V zero-or-exponential, against 10^6 seeded draws.

    The limit sits on a grid bin boundary (z = 1/16), so the jump of the integrand where S crosses the
    limit costs the grid nothing; the smooth rest has midpoint-rule error below 1e-4. Monte Carlo standard
    error is sqrt(p (1 - p) / N) <= 5e-4; the tolerance is 5 standard errors plus 1e-4."""
    p50, sigma = 20.0, 0.25
    z_cut = 0.5 + HALF_BIN
    limit = p50 * math.exp(sigma * z_cut) + 30.0  # 30 ms of room for the waits at the median service
    p1, m1, p2, m2 = 0.6, 15.0, 0.8, 9.0
    grid = capacity.service_grid(np.array([lognormal_percentiles(p50, sigma)]))
    got = capacity.tail(
        grid, np.array([limit]), np.array([p1]), np.array([m1]), np.array([p2]), np.array([m2])
    )
    rng = np.random.default_rng(20240601)
    n = 1_000_000
    service = p50 * np.exp(sigma * rng.standard_normal(n))
    wait = np.where(rng.random(n) < p1, rng.exponential(m1, n), 0.0)
    kv = np.where(rng.random(n) < p2, rng.exponential(m2, n), 0.0)
    estimate = np.mean(service + wait + kv > limit)
    se = math.sqrt(estimate * (1 - estimate) / n)
    assert 0.05 < estimate < 0.95  # a tail probability that the tolerance can actually tell apart
    assert got[0] == pytest.approx(estimate, abs=5 * se + 1e-4)


# --- queue_tail(): the M/G/1 wait in Benes's form ----------------------------------------------------------


def _md1_wait(rho, grid, scale=1.0) -> capacity.QueueWait:
    """The M/G/1 wait of the service on `grid` at load rho (the exact form: not memoryless)."""
    n = len(grid)
    return capacity.QueueWait(
        np.full(n, rho), np.full(n, 1.0 / (1.0 - rho)), np.full(n, scale), np.zeros(n, bool)
    )


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_queue_tail_of_deterministic_service_is_the_md1_wait(rho, scale):
    """b = 1, deterministic D: the waiting time is M/D/1's (service scale x D for a shared pool), against
    Erlang's formula, at waits of 0 to 5 services. Never below it (the cells round every mass up), and above
    it by at most what rounding up each residual of a wait of t (about 2 t / D of them, of mean D / 2) by
    one cell, and the limit down by one, shifts."""
    d = 20.0
    waits = np.array([0.0, 5.0, 10.0, 20.0, 22.4, 40.0, 60.0, 100.0]) * scale
    grid = capacity.service_grid(np.array([flat(d)] * len(waits)))
    got = capacity.queue_tail(grid, d + waits, _md1_wait(rho, grid, scale))
    for value, t in zip(got, waits, strict=True):
        exact = 1.0 - md1_wait_cdf(t, rho, scale * d)
        cells = 2 + 2 * t / (scale * d)
        shifted = 1.0 - md1_wait_cdf(t - cells * (d + t) / capacity.WAIT_CELLS, rho, scale * d)
        assert exact - 1e-9 <= value <= shifted + 1e-6, (t, value, exact, shifted)


@pytest.mark.parametrize(("rho", "p", "m", "room"), [(0.3, 0.5, 8.0, 30.0), (0.7, 0.9, 20.0, 60.0)])
def test_queue_tail_adds_an_exponential_wait_by_convolution(rho, p, m, room):
    """TTFT = D + W + V, V zero-or-exponential (the KV queues): against the convolution by quad."""
    d = 10.0
    grid = capacity.service_grid(np.array([flat(d)]))
    wait = _md1_wait(rho, grid)
    got = capacity.queue_tail(grid, np.array([d + room]), wait, (np.array([p]), np.array([m])))[0]
    exact = md1_plus_exponential_sf(room, rho, d, p, m)
    shifted = md1_plus_exponential_sf(room - 4 * (d + room) / capacity.WAIT_CELLS, rho, d, p, m)
    assert exact - 1e-9 <= got <= shifted + 1e-6


def test_queue_tail_lognormal_service_matches_a_lindley_simulation():
    """M/G/1 with lognormal service: P(S + W > t) against 300,000 customers of the Lindley recursion
    W' = max(0, W + S - A) (seeded), S the customer's own service. Tolerance: 5 standard errors plus the
    service grid's and the cells' discretization (2e-3)."""
    p50, sigma, rho = 20.0, 0.4, 0.6
    percentiles = lognormal_percentiles(p50, sigma)
    grid = capacity.service_grid(np.array([percentiles] * 3))
    mean = p50 * math.exp(sigma**2 / 2)
    limits = np.array([40.0, 70.0, 110.0])
    got = capacity.queue_tail(grid, limits, _md1_wait(rho, grid))
    rng = np.random.default_rng(7)
    n = 300_000
    service = p50 * np.exp(sigma * rng.standard_normal(n))
    gaps = rng.exponential(mean / rho, n)
    wait = np.empty(n)
    w = 0.0
    for i in range(n):  # Lindley: the next customer's wait
        wait[i] = w
        w = max(0.0, w + service[i] - gaps[i])
    for value, limit in zip(got, limits, strict=True):
        estimate = float(np.mean(wait[1000:] + service[1000:] > limit))
        se = math.sqrt(estimate * (1 - estimate) / n) * 3  # waits are correlated: a wider band
        assert 0.005 < estimate < 0.6
        assert value == pytest.approx(estimate, abs=5 * se + 2e-3), (limit, value, estimate)


def test_queue_tail_of_exponential_service_is_the_zero_or_exponential_wait():
    """For exponential S the residual is S itself and a geometric sum of exponentials is exponential: the
    wait is zero w.p. prob, else exponential of mean E[S] stretch (the form `tail` computes). On a grid of
    exponential quantiles (the capacity grid's z points mapped through the exponential's quantile)."""
    mean, prob, stretch = 10.0, 0.7, 3.0
    z = np.arange(-5.0, 5.0 + 1e-9, 0.125)
    grid = np.tile(-mean * np.log(stats.norm.sf(z)), (3, 1))
    limits = np.array([30.0, 60.0, 120.0])
    wait = capacity.QueueWait(np.full(3, prob), np.full(3, stretch), np.ones(3), np.zeros(3, bool))
    got = capacity.queue_tail(grid, limits, wait)
    reference = capacity.tail(
        grid, limits, np.full(3, prob), np.full(3, float(grid[0] @ capacity._W) * stretch)
    )
    # the grid's exponential (81 quantile points) is not quite one: equal within 3e-3, and not below it
    np.testing.assert_allclose(got, reference, atol=3e-3)
    assert (got >= reference - 1e-9).all()


# --- admissible rates against closed forms -----------------------------------------------------------------


def prefill_rate_ref(service_ms: float, limit_ms: float, epsilon: float, share: float) -> float:
    """One batch-1 instance of deterministic service D at load u = lambda D: its wait is M/D/1's with the
    residual of share x D (the longest class ahead), P(TTFT > L) = 1 - F_W(L - D) by Erlang's formula; the
    largest lambda (requests/s) with that <= epsilon."""

    def excess(u):
        return 1.0 - md1_wait_cdf(limit_ms - service_ms, u, share * service_ms) - epsilon

    return optimize.brentq(excess, 1e-12, 1.0 - 1e-12, xtol=1e-15) * 1e3 / service_ms


# The model's rates are never above the closed form's (its tail is never below) and below it by at most this
# (the cells of queue_tail's window: a wait of a few services is rounded up by a few cells of ~limit / 256).
CELL_TOLERANCE = 0.02


def assert_conservative(got: float, expected: float) -> None:
    assert expected * (1 - CELL_TOLERANCE) <= got <= expected * (1 + 1e-9), (got, expected)


@pytest.mark.parametrize(
    ("limit", "epsilon", "share"),
    [(30.0, 0.05, 1.0), (60.0, 0.05, 1.0), (60.0, 0.005, 1.0), (60.0, 0.05, 2.5), (400.0, 0.05, 1.0)],
)
def test_prefill_batch_one_deterministic_matches_the_closed_form(limit, epsilon, share):
    d = 20.0
    cv = curves([1.0], [flat(d)], [flat(5.0)])
    got = rates_of(curves=cv, rate=1e3 / d, ttft_q=d, ttft_slo=limit, epsilon=epsilon, share=share)
    assert_conservative(got[0], prefill_rate_ref(d, limit, epsilon, share))


def prefill_kv_rate_ref(service_ms, slo_ms, t_kv, slack_ms, kv_share, epsilon):
    """As prefill_rate_ref, with the KV cache moving afterwards: TTFT = W + D + t_kv + V <= slo - A, where
    A = slack / 3 is the link's part of the reserve (taken off the limit) and V is one zero-or-exponential
    term carrying the two NICs' M/D/1 waits at their caps: each NIC at the u with mean wait
    u (D_kv / 2) / (1 - u) = A, D_kv = t_kv kv_share; V waits if either NIC is busy (1 - (1 - u)^2) and its
    mean is the sum of the two mean waits, 2 A. W is M/D/1's wait (Erlang's formula), so P(W + V > r) is
    md1_plus_exponential_sf."""
    allowance = slack_ms / 3
    u = md1_cap_ref(t_kv * kv_share, allowance)
    kv_prob = 1 - (1 - u) ** 2
    kv_mean = 2 * allowance / kv_prob
    room = slo_ms - allowance - t_kv - service_ms

    def excess(busy):
        return md1_plus_exponential_sf(room, busy, service_ms, kv_prob, kv_mean) - epsilon

    return optimize.brentq(excess, 1e-12, 1.0 - 1e-12, xtol=1e-15) * 1e3 / service_ms


@pytest.mark.parametrize(("slo", "kv_share"), [(200.0, 1.0), (200.0, 2.0), (120.0, 1.0)])
def test_prefill_with_kv_queues_matches_the_closed_form(slo, kv_share):
    d, t_kv = 20.0, 10.0
    slack = capacity.KV_SHARE * (slo - d - t_kv)  # what with_kv_reserve gives a batch-1 deterministic use
    cv = curves([1.0], [flat(d)], [flat(5.0)])
    got = rates_of(
        curves=cv, rate=1e3 / d, ttft_q=d, ttft_slo=slo, t_kv=t_kv, kv_slack_ms=slack, kv_share=kv_share
    )
    assert_conservative(got[0], prefill_kv_rate_ref(d, slo, t_kv, slack, kv_share, 0.05))
    reserved = capacity.with_kv_reserve(
        use_table(1, ttft_q=d, ttft_slo=slo, t_kv=t_kv, kv_share=kv_share), cv
    )
    assert reserved.kv_slack_ms[0] == pytest.approx(slack, rel=1e-12)


def decode_load_ref(
    slots: int, tbt_ms: float, limit_ms: float, epsilon: float, share: float, steps: int
) -> float:
    """Offered load a (slot-holding Erlangs) where C(b, a) exp(-(L - tau) (b - a) / (share tau f)) = epsilon:
    with a deterministic step tau the per-token wait has mean f share tau / (b - a), whatever the length;
    f = md_c_factor_ref below the load where the window rule stops holding, 1 above it. The admissible set
    is every load up to the larger of the M/D/c root (capped by that load) and the M/M/b root."""

    def root(deterministic: bool) -> float:
        def excess(a):
            f = md_c_factor_ref(a / slots, slots, steps * tbt_ms, 1.0) if deterministic else 1.0
            wait_mean = f * share * tbt_ms / (slots - a)
            return erlang_c_ref(slots, a) * math.exp(-(limit_ms - tbt_ms) / wait_mean) - epsilon

        return optimize.brentq(excess, 1e-9, slots - 1e-12, xtol=1e-14)

    window = capacity.WINDOW_EPISODES * steps * tbt_ms / (epsilon * capacity.WINDOW_MS * slots)
    rule = slots * (1 - math.sqrt(window))
    return max(min(rule, root(True)), root(False))


@pytest.mark.parametrize(
    ("slots", "steps", "limit", "epsilon", "share"),
    [
        (1, 31, 12.0, 0.05, 1.0),
        (4, 31, 12.0, 0.05, 1.0),
        (8, 127, 10.5, 0.005, 1.0),
        (4, 15, 14.0, 0.05, 3.0),
    ],
)
def test_decode_deterministic_matches_the_erlang_c_closed_form(slots, steps, limit, epsilon, share):
    tau = 10.0
    cv = curves([float(slots)], [flat(50.0)], [flat(tau)])
    full = slots * 1e3 / ((steps + 1) * tau)  # rD = b / (o TBT)
    load = decode_load_ref(slots, tau, limit, epsilon, share, steps)
    expected = load / (steps * tau / 1e3)
    assert expected < full  # interior: the SLO, not the MILP's full rate, binds
    got = rates_of(
        curves=cv,
        role="decode",
        batch=slots,
        rate=full,
        tbt_q=tau,
        tbt_slo=limit,
        steps=steps,
        epsilon=epsilon,
        share=share,
    )
    assert got[0] == pytest.approx(expected, rel=1e-9)


def colocated_ttft_tail(lam, p_ms, tau_ms, steps, limit_ms, share):
    """One batch-1 colocated instance, deterministic prefill P and step tau, at lambda requests/s:
    stall u_p = lambda P, hold H = P + steps tau / (1 - u_p), slot load a = lambda H.
    TTFT = W + W_p + tau + P: W the slot wait (M/M/1: w.p. a, mean share H / (1 - a); colocated slots keep
    M/M/b's form), W_p the prefills ahead (M/D/1's wait at load u_p, residuals of share x P).
    Returns P(TTFT > limit)."""
    stall = lam * p_ms / 1e3
    hold = p_ms + steps * tau_ms / (1 - stall)
    a = lam * hold / 1e3
    slot_mean = share * hold / (1 - a)
    return md1_plus_exponential_sf(limit_ms - tau_ms - p_ms, stall, share * p_ms, a, slot_mean)


def colocated_rate_ref(p_ms, tau_ms, steps, ttft_slo, tbt_slo, epsilon, share, full):
    """The largest lambda with P(TTFT > slo) <= epsilon (colocated_ttft_tail), TPOT = tau / (1 - u_p) <=
    tbt_slo, and lambda <= full."""

    def hold(lam):
        return p_ms + steps * tau_ms / (1 - lam * p_ms / 1e3)

    def excess(lam):
        return colocated_ttft_tail(lam, p_ms, tau_ms, steps, ttft_slo, share) - epsilon

    saturated = optimize.brentq(lambda lam: lam * hold(lam) / 1e3 - 1.0, 1e-9, 1e3 / p_ms - 1e-9, xtol=1e-14)
    by_ttft = optimize.brentq(excess, 1e-9, saturated * (1 - 1e-12), xtol=1e-14)
    by_tbt = (1.0 - tau_ms / tbt_slo) * 1e3 / p_ms
    return min(by_ttft, by_tbt, full)


@pytest.mark.parametrize(
    ("ttft_slo", "tbt_slo", "share"),
    [(300.0, 50.0, 1.0), (150.0, 50.0, 1.0), (300.0, 50.0, 2.0), (3000.0, 5.3, 1.0)],
)
def test_colocated_batch_one_deterministic_matches_the_closed_form(ttft_slo, tbt_slo, share):
    p, tau, steps = 40.0, 5.0, 31
    cv = curves([1.0], [flat(p)], [flat(tau)])
    full = 1e3 / (p + steps * tau)
    got = rates_of(
        curves=cv,
        role="colocated",
        rate=full,
        ttft_q=p,
        tbt_q=tau,
        ttft_slo=ttft_slo,
        tbt_slo=tbt_slo,
        steps=steps,
        share=share,
    )
    expected = colocated_rate_ref(p, tau, steps, ttft_slo, tbt_slo, 0.05, share, full)
    assert expected < full * (1 - 1e-6)
    assert_conservative(got[0], expected)


def test_colocated_tbt_slo_binds_through_the_prefill_stall():
    # tau / tbt_slo = 0.94: prefill may take at most 6% of the instance's time, whatever the TTFT slack
    p, tau, steps = 40.0, 5.0, 31
    cv = curves([1.0], [flat(p)], [flat(tau)])
    got = rates_of(
        curves=cv,
        role="colocated",
        rate=1e3 / (p + steps * tau),
        ttft_q=p,
        tbt_q=tau,
        ttft_slo=5000.0,
        tbt_slo=tau / 0.94,
        steps=steps,
    )
    assert got[0] == pytest.approx(0.06 * 1e3 / p, rel=1e-9)


def test_colocated_slots_are_filled_by_holds_stretched_by_the_other_prefills():
    """capacity.cohort_hold: the holds that fill b slots take the request's own prefill and the b - 1
    others' besides its steps, b E[S] + (o - 1) E[TBT], never below the mean hold (which at b = 1, one
    slot, is the exact hold); at b > 1 the slot wait's probability is Erlang C at that load, so at least
    M/M/b's at the mean hold, while the admissible rate falls."""
    got = capacity.cohort_hold(
        np.array([111.0, 111.0, 40.0]),
        np.array([31.0, 31.0, 31.0]),
        np.array([12.4, 12.4, 5.0]),
        np.array([4, 4, 1]),
        np.array([556.0, 900.0, 40.0 + 31 * 5.0 / 0.9]),
    )
    np.testing.assert_allclose(got, [4 * 111.0 + 31 * 12.4, 900.0, 40.0 + 31 * 5.0 / 0.9], rtol=1e-12)
    p, tau, steps = 40.0, 5.0, 31
    cv = curves([1.0, 4.0], [flat(p), flat(p)], [flat(tau), flat(tau)])
    fields = {
        "role": "colocated",
        "ttft_q": p,
        "tbt_q": tau,
        "ttft_slo": 400.0,
        "tbt_slo": 50.0,
        "steps": steps,
    }
    t = use_table(1, batch=4.0, rate=4e3 / (p + steps * tau), **fields)
    rate = np.array([6.0])
    n = capacity.batch_fixed_point(rate, cv, t.batch, np.array([tau]))
    grid = capacity.service_grid(cv.at("ttft", n))
    hold = p + steps * tau / (1 - rate * p / (1e3 * n))
    means = (capacity.moments(grid)[0], np.array([tau]), hold)
    (prob, mean), _ = capacity._colocated_waits(t, cv, rate, grid, n, means, np.array([4]))
    at_mean_hold = capacity.erlang_c(np.array([4]), rate * hold / 1e3)
    assert prob[0] == pytest.approx(capacity.erlang_c(np.array([4]), rate * (4 * p + steps * tau) / 1e3)[0])
    assert prob[0] > at_mean_hold[0]
    assert mean[0] == pytest.approx(hold[0] / 4 / (1 - rate[0] * hold[0] / 4e3), rel=1e-9)


# --- structural properties of the admissible rates --------------------------------------------------------


def batching_curves(n: int) -> capacity.Curves:
    """A prefill that batches with some gain and a lognormal spread: S(1) ~ 20 ms, S(4) ~ 60 ms at p50."""
    return curves(
        [1.0, 4.0],
        [lognormal_percentiles(20.0, 0.1), lognormal_percentiles(60.0, 0.1)],
        [lognormal_percentiles(8.0, 0.05), lognormal_percentiles(9.0, 0.05)],
        n=n,
    )


PREFILL_FULL = 4e3 / lognormal_percentiles(60.0, 0.1)[1]  # rP = b / TTFT_p90(b)


def test_prefill_admissible_rate_structure():
    limits = [25.0, 30.0, 45.0, 70.0, 120.0, 250.0, 1000.0]  # p95 of S(1) is 23.6 ms
    cv = batching_curves(len(limits))
    got = rates_of(curves=cv, batch=4.0, rate=PREFILL_FULL, ttft_slo=limits)
    assert np.all(np.diff(got) > 0), got  # a looser SLO admits strictly more
    assert np.all(got > 0)
    assert np.all(got <= PREFILL_FULL)
    # a p99 SLO (planned at p99.5) admits less than a p90 one (planned at p95), at every limit
    tighter = rates_of(curves=cv, batch=4.0, rate=PREFILL_FULL, ttft_slo=limits, epsilon=0.005)
    below_full = got < PREFILL_FULL * (1 - 1e-9)  # at the full-batch rate every variant is capped there
    assert below_full[:-1].all()
    assert np.all(tighter[below_full] < got[below_full])
    assert np.all(tighter <= got)
    # a longer class in the same FIFO: whoever is ahead takes longer
    shared = rates_of(curves=cv, batch=4.0, rate=PREFILL_FULL, ttft_slo=limits, share=3.0)
    assert np.all(shared[below_full] < got[below_full])
    assert np.all(shared <= got)


def test_prefill_slo_below_the_bare_service_admits_nothing():
    cv = batching_curves(2)
    # below the median single-request prefill: more than half the requests miss even on an idle instance
    got = rates_of(curves=cv, batch=4.0, rate=PREFILL_FULL, ttft_slo=[15.0, 19.0])
    np.testing.assert_array_equal(got, [0.0, 0.0])


def test_prefill_kv_transfer_and_its_share_lower_the_admissible_rate():
    cv = batching_curves(4)
    got = rates_of(
        curves=cv,
        batch=4.0,
        rate=PREFILL_FULL,
        # at 150 ms the bulk-service wait admits the small reserve's use at the no-KV level of the 0.05 grid
        ttft_slo=120.0,
        t_kv=[0.0, 10.0, 10.0, 10.0],
        kv_slack_ms=[0.0, 24.0, 24.0, 12.0],
        kv_share=[1.0, 1.0, 3.0, 1.0],
    )
    no_kv, kv, kv_shared, kv_small_reserve = got
    assert kv < no_kv
    assert kv_shared < kv  # the NICs wait behind a 3x longer transfer
    # a smaller reserve takes less off the limit but caps the NICs lower: only bounded by the no-KV case
    assert 0 < kv_small_reserve < no_kv


def decode_curves(n: int, tau: float = 10.0) -> capacity.Curves:
    return curves([8.0], [flat(50.0)], [lognormal_percentiles(tau, 0.08)], n=n)


def test_decode_admissible_rate_structure():
    slos = [11.6, 12.0, 14.0, 20.0]  # p95 of one step is 11.4 ms
    steps = 63
    full = 8e3 / ((steps + 1) * lognormal_percentiles(10.0, 0.08)[1])
    cv = decode_curves(len(slos))
    kwargs = {"curves": cv, "role": "decode", "batch": 8.0, "rate": full, "tbt_q": 11.0, "steps": steps}
    got = rates_of(tbt_slo=slos, **kwargs)
    assert np.all(got > 0)
    assert np.all(got <= full)
    assert np.all(np.diff(got) > 0)  # tighter TBT SLO, lower admissible rate
    assert np.all(rates_of(tbt_slo=slos, epsilon=0.005, **kwargs) < got)
    assert np.all(rates_of(tbt_slo=slos, share=4.0, **kwargs) < got)


def test_decode_longer_outputs_admit_proportionally_fewer_requests():
    """The per-token wait has mean share TBT / (b - a), independent of the length, so the admissible
    slot load a = lambda (o - 1) E[TBT] is the same for every length: lambda scales as 1 / (o - 1)."""
    steps = np.array([15.0, 31.0, 127.0])
    tau = lognormal_percentiles(10.0, 0.08)
    cv = decode_curves(3)
    full = 8e3 / ((steps + 1) * tau[1])  # the bisection's upper end: its resolution is full * 2^-40
    got = rates_of(curves=cv, role="decode", batch=8.0, rate=full, tbt_q=tau[1], tbt_slo=11.6, steps=steps)
    assert np.all(got < full * 0.99)
    assert np.all(np.diff(got) < 0)
    np.testing.assert_allclose(got * steps, got[0] * steps[0], rtol=1e-9)


def test_decode_of_one_token_outputs_is_not_derated():
    cv = decode_curves(1)
    got = rates_of(curves=cv, role="decode", batch=8.0, rate=77.0, tbt_slo=1.0, steps=0.0)
    assert got[0] == 77.0


def test_colocated_admissible_rate_structure():
    cv = curves(
        [1.0, 4.0],
        [lognormal_percentiles(20.0, 0.1), lognormal_percentiles(60.0, 0.1)],
        [lognormal_percentiles(5.0, 0.05), lognormal_percentiles(5.5, 0.05)],
        n=4,
    )
    tbt_q = lognormal_percentiles(5.5, 0.05)[1]
    full = 4e3 / (lognormal_percentiles(60.0, 0.1)[1] + 31 * tbt_q)
    kwargs = {"curves": cv, "role": "colocated", "batch": 4.0, "rate": full, "tbt_q": tbt_q, "steps": 31}
    got = rates_of(ttft_slo=[40.0, 60.0, 120.0, 120.0], tbt_slo=[100.0, 100.0, 100.0, 6.0], **kwargs)
    assert np.all(got > 0)
    assert np.all(got <= full)
    assert got[0] < got[1] < got[2]  # TTFT SLO
    assert got[3] < got[2]  # TBT SLO: less room for prefill stalls
    shared = rates_of(ttft_slo=[40.0, 60.0, 120.0, 120.0], tbt_slo=100.0, share=3.0, **kwargs)
    assert np.all(shared[:3] < got[:3])


# --- a prefill instance that batches well -----------------------------------------------------------------


def greedy_batch_ttft(rate: float, slots: int, service_ms: Callable[[int], float], n: int, seed: int):
    """TTFTs (ms) of a greedy batch server without a timeout: when idle it takes up to `slots` waiting
    requests as one batch of deterministic duration service_ms(size). Poisson arrivals at `rate` per s."""
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1e3 / rate, n))
    ttft = np.empty(n)
    free_at, i = 0.0, 0
    while i < n:
        start = max(free_at, arrivals[i])
        j = i + 1
        while j < n and j - i < slots and arrivals[j] <= start:
            j += 1
        free_at = start + service_ms(j - i)
        ttft[i:j] = free_at - arrivals[i:j]
        i = j
    return ttft


def strong_batching(size: int) -> float:
    return 10.0 + 2.0 * (size - 1) / 3.0  # S(1) = 10 ms, S(4) = 12 ms


def test_greedy_batch_server_at_twice_the_batch_one_rate_keeps_a_100ms_p95():
    """The reference for the test below: at 200 requests/s (2 / S(1)), batches of ~2-3 form and p95
    TTFT stays near 25 ms, a quarter of a 100 ms SLO."""
    ttft = greedy_batch_ttft(200.0, 4, strong_batching, 60_000, seed=0)
    assert np.quantile(ttft[1000:], 0.95) < 40.0


def test_prefill_batching_gain_is_admissible():
    """Batches of n* in (1, b) keep the instance busy (U = 1) without a queue: the wait is the batch's
    residual, stretched only by the load against full-batch capacity (capacity.batch_wait)."""
    cv = curves([1.0, 4.0], [flat(10.0), flat(12.0)], [flat(5.0), flat(5.0)])
    got = rates_of(curves=cv, batch=4.0, rate=4e3 / 12.0, ttft_slo=100.0)
    assert got[0] >= 200.0


# --- KV transfer queues ------------------------------------------------------------------------------------


def test_nic_caps_md1_wait_at_the_cap_is_the_nic_share_of_the_reserve():
    t = use_table(
        4,
        t_kv=[8.0, 8.0, 8.0, 0.0],
        kv_slack_ms=[30.0, 30.0, 30.0, 30.0],
        kv_share=[1.0, 2.5, 1.0, 1.0],
        own_bw=[25.0, 25.0, 25.0, 25.0],
        min_bw=[25.0, 25.0, 25.0 / 3.0, 25.0],
    )
    cap, usable = capacity.nic_caps(t)
    allowance = 30.0 / (capacity.NIC_SERVERS + 1)
    assert md1_mean_wait(cap[0], 8.0) == pytest.approx(allowance, rel=1e-9)
    assert md1_mean_wait(cap[1], 8.0 * 2.5) == pytest.approx(allowance, rel=1e-9)
    assert cap[1] < cap[0]  # kv_share > 1: waits behind a longer transfer
    # traffic / own bandwidth: a transfer holds the NIC for kv / min_bw, 3x longer than at own_bw
    assert cap[2] == pytest.approx(cap[0] / 3.0, rel=1e-12)
    assert cap[3] == 1.0  # no transfer, no cap
    assert usable.all()


def test_nic_caps_unusable_below_the_floor():
    # allowance 0.5 ms against a 40 ms transfer: u = 0.5 / (0.5 + 20), far below NIC_FLOOR
    t = use_table(2, t_kv=[40.0, 40.0], kv_slack_ms=[1.5, 300.0], own_bw=25.0, min_bw=25.0)
    cap, usable = capacity.nic_caps(t)
    assert cap[0] == pytest.approx(0.5 / 20.5, rel=1e-12)
    assert cap[0] < capacity.NIC_FLOOR
    assert usable.tolist() == [False, True]


def test_kv_wait_mean_is_the_sum_of_both_nics_md1_waits():
    t = use_table(
        4, t_kv=[8.0, 8.0, 30.0, 0.0], kv_slack_ms=[30.0, 30.0, 6.0, 30.0], kv_share=[1.0, 2.0, 1.0, 1.0]
    )
    prob, mean, step = capacity.kv_wait(t)
    # behind a batch-mate: the longest transfer that may share the NIC
    assert step.tolist() == [8.0, 16.0, 30.0, 0.0]
    for i, (d, slack) in enumerate([(8.0, 30.0), (16.0, 30.0), (30.0, 6.0)]):
        u = md1_cap_ref(d, slack / (capacity.NIC_SERVERS + 1))
        assert prob[i] == pytest.approx(1 - (1 - u) ** 2, rel=1e-9)  # either NIC busy on arrival
        assert prob[i] * mean[i] == pytest.approx(2 * md1_mean_wait(u, d), rel=1e-9)
        assert prob[i] * mean[i] == pytest.approx(2 * slack / (capacity.NIC_SERVERS + 1), rel=1e-9)
    assert prob[3] == 0.0
    assert mean[3] == 0.0


@pytest.mark.parametrize("links", [0, 1, 2])
def test_kv_reserve_is_shared_by_the_servers_a_transfer_crosses(links):
    """Two NICs and `links` budgeted links share a prefill use's KV reserve in equal parts: each NIC's M/D/1
    mean wait at its cap is one part, and the TTFT limit gives up one part per link (none without one)."""
    slack, t_kv = 30.0, 8.0
    t = use_table(1, t_kv=t_kv, kv_slack_ms=slack, kv_links=float(links), own_bw=25.0, min_bw=25.0)
    part = slack / (2 + links)
    assert capacity.kv_servers(t)[0] == 2 + links
    assert md1_mean_wait(capacity.nic_caps(t)[0][0], t_kv) == pytest.approx(part, rel=1e-9)
    assert capacity.link_reserve(t)[0] == pytest.approx(links * part, rel=1e-12)


def test_a_transfer_that_crosses_no_budgeted_link_keeps_its_ttft_for_the_prefill_queue():
    """Without a link on its way a prefill use is admitted at least what it was with one (the same
    reserve: the NICs' part grows, nothing is held back from the limit), and strictly more here."""
    cv = curves([1.0], [flat(30.0)], [flat(5.0)], n=2)
    t = use_table(
        2,
        rate=1e3 / 30.0,
        ttft_q=30.0,
        ttft_slo=120.0,
        t_kv=8.0,
        kv_links=[0.0, 1.0],
        own_bw=25.0,
        min_bw=25.0,
    )
    t = capacity.with_kv_reserve(t, cv)
    assert t.kv_slack_ms[0] == pytest.approx(t.kv_slack_ms[1], rel=1e-12)
    free, linked = np.minimum(capacity.rates(t, cv), t.nic_u * 1e3 / t.t_kv)
    assert free > linked > 0


def test_kv_links_count_the_budgets_the_simulator_books():
    """A prefill use crosses its (source, target) link budget and, between device types, the fleet's
    kv_budget_gbps (simulator/kv.py books both); a decode use takes the most among its senders; without
    any budget nothing is crossed."""
    paper = read_request(fixtures.request_path("paper"))
    table = resolve_profiles(paper, None)
    assert not build_candidates(paper, table).uses["kv_links"].any()
    budgeted = msgspec.structs.replace(
        paper,
        links=[msgspec.convert({"source": "tpu-v5e", "target": "inf2", "gbps": 400.0}, type=Link)],
        kv_budget_gbps=400.0,
    )
    uses = build_candidates(budgeted, table).uses
    links = uses.groupby(["role", "device", "key"])["kv_links"].max()
    assert links["prefill", "tpu-v5e", "inf2"] == 2
    assert links["prefill", "tpu-v5e", "a6000ada"] == 1
    assert links["prefill", "tpu-v5e", "tpu-v5e"] == 0
    assert links["decode", "inf2", "inf2"] == 2
    assert (links["colocated"] == 0).all()


def _reserve_table(percentile: int) -> tuple[capacity.UseTable, capacity.Curves, float]:
    """Class 0: two prefill uses (t_kv 5 and 9 ms) and a decode use; class 1: one prefill use; a colocated
    use. Returns the table, its curves and the class-0 single-request prefill time at `percentile`."""
    single = [12.0, 15.0, 19.0]  # p50/p90/p99 at batch 1
    cv = curves([1.0, 4.0], [single, [40.0, 48.0, 55.0]], [flat(5.0), flat(6.0)], n=5)
    epsilon = capacity.TAIL_MARGIN * (1 - percentile / 100)
    t = use_table(
        5,
        w=[0, 0, 0, 1, 0],
        role=["prefill", "prefill", "decode", "prefill", "colocated"],
        ttft_slo=[200.0, 200.0, 200.0, 100.0, 200.0],
        epsilon=[epsilon, epsilon, epsilon, 0.05, epsilon],
        t_kv=[5.0, 9.0, 9.0, 5.0, 0.0],
    )
    return t, cv, single[{50: 0, 90: 1, 99: 2}[percentile]]


def _check_reserve(percentile: int) -> None:
    t, cv, single = _reserve_table(percentile)
    slack = capacity.with_kv_reserve(t, cv).kv_slack_ms
    expected = [capacity.KV_SHARE * (200.0 - single - 5.0), capacity.KV_SHARE * (200.0 - single - 9.0)]
    np.testing.assert_allclose(slack[:2], expected, rtol=1e-12)
    assert slack[2] == pytest.approx(min(expected), rel=1e-12)  # decode: its class's smallest prefill reserve
    assert slack[3] == pytest.approx(capacity.KV_SHARE * (100.0 - 15.0 - 5.0), rel=1e-12)  # class 1, p90
    assert slack[4] == 0.0  # colocated: no KV moves


@pytest.mark.parametrize("percentile", [90, 99])
def test_kv_reserve_is_a_quarter_of_the_single_request_slack(percentile):
    _check_reserve(percentile)


def test_kv_reserve_of_a_p50_class_uses_its_own_percentile():
    _check_reserve(50)


# --- predictions at a load ----------------------------------------------------------------------------------


def test_bisect_limit_finds_the_percentile_from_above_with_or_without_the_slo_bracket():
    """P(T > t) = exp(-t / 100) has its 95th percentile at 100 ln 20 ms. bisect_limit returns a limit that
    keeps the tail (never below the percentile) within LIMIT_PRECISION of it, whether the SLO bracket
    holds (it starts from [0, SLO]) or not (from [SLO, upper]); the bracket saves halvings."""
    exact = 100.0 * np.log(20.0)
    calls = []

    def tail_at(limit):
        calls.append(1)
        return np.exp(-limit / 100.0)

    epsilon, upper = np.array([0.05, 0.05]), np.array([5000.0, 5000.0])
    brackets = (None, np.array([400.0, 350.0]), np.array([400.0, 250.0]), np.array([250.0, 250.0]))
    for first in brackets:
        calls.clear()
        found = capacity.bisect_limit(tail_at, epsilon, upper, first)
        assert (found >= exact).all()
        assert (found <= exact * (1 + capacity.LIMIT_PRECISION) + 1e-12).all()
        assert len(calls) <= 40
        if first is not None and (first >= exact).all():
            assert len(calls) <= 33  # 1 probe, then about 31 halvings of [0, 400]
    # a limit no search reaches (the tail never falls to epsilon) stays at `upper`, as before
    never = capacity.bisect_limit(lambda lim: np.ones_like(lim), epsilon, upper, np.array([300.0, 300.0]))
    assert (never == upper).all()


def test_prefill_prediction_closed_form_and_consistency_with_the_admissible_rate():
    d, limit, share = 20.0, 80.0, 1.5
    cv = curves([1.0], [flat(d)], [flat(5.0)], n=3)
    fields = {"rate": 1e3 / d, "ttft_q": d, "ttft_slo": limit, "share": share}
    admissible = rates_of(curves=cv, **fields)[0]
    load = np.array([0.01, 0.5, 1.0]) * admissible
    ttft, tbt = capacity.predict(use_table(3, **fields), cv, load)
    assert np.isnan(tbt).all()
    for value, lam in zip(ttft, load, strict=True):
        u = lam * d / 1e3
        # p95 of D + W, W M/D/1's wait (residuals of share x D): Erlang's formula, by root-finding
        expected = d
        if u > 0.05:
            expected = d + optimize.brentq(lambda t, u=u: 0.95 - md1_wait_cdf(t, u, share * d), 0.0, 1e3)
        assert expected - 1e-6 <= value <= expected * (1 + CELL_TOLERANCE)
    # at its admissible load the class sits on its SLO (to the cells' rounding)
    assert limit * (1 - CELL_TOLERANCE) <= ttft[2] <= limit * (1 + 1e-8)


def test_decode_prediction_closed_form_at_the_admissible_rate():
    slots, steps, tau, limit = 4, 31, 10.0, 12.0
    cv = curves([float(slots)], [flat(50.0)], [flat(tau)], n=2)
    full = slots * 1e3 / ((steps + 1) * tau)
    fields = {"role": "decode", "batch": slots, "rate": full, "tbt_q": tau, "tbt_slo": limit, "steps": steps}
    admissible = rates_of(curves=cv, **fields)[0]
    load = np.array([0.5, 1.0]) * admissible
    _, tbt = capacity.predict(use_table(2, **fields), cv, load)
    for value, lam in zip(tbt, load, strict=True):
        a = lam * steps * tau / 1e3
        c = erlang_c_ref(slots, a)
        f = md_c_factor_ref(a / slots, slots, steps * tau, 0.05)
        expected = tau + f * (tau / (slots - a)) * math.log(c / 0.05) if c > 0.05 else tau
        assert value == pytest.approx(expected, rel=1e-8)
    assert tbt[1] == pytest.approx(limit, rel=1e-8)


def test_colocated_prediction_closed_form():
    p, tau, steps = 40.0, 5.0, 31
    cv = curves([1.0], [flat(p)], [flat(tau)], n=2)
    fields = {"role": "colocated", "rate": 1e3, "ttft_q": p, "tbt_q": tau, "ttft_slo": 300.0, "steps": steps}
    admissible = rates_of(curves=cv, tbt_slo=50.0, **fields)[0]
    load = np.array([0.5, 1.0]) * admissible
    ttft, tbt = capacity.predict(use_table(2, tbt_slo=50.0, **fields), cv, load)
    for t_value, b_value, lam in zip(ttft, tbt, load, strict=True):
        # the prediction is the p95 of TTFT: the closed-form tail there is the planning epsilon (or, the
        # model's tail being never below the closed form's, a little less)
        assert 0.05 * (1 - 0.2) <= colocated_ttft_tail(lam, p, tau, steps, t_value, 1.0) <= 0.05 * (1 + 1e-7)
        assert b_value == pytest.approx(tau / (1 - lam * p / 1e3), rel=1e-12)
    assert ttft[0] < ttft[1]
    assert 300.0 * (1 - CELL_TOLERANCE) <= ttft[1] <= 300.0 * (1 + 1e-8)


# --- how candidates.py feeds the model: the FIFO shares ---------------------------------------------------


def test_share_and_kv_share_are_longest_over_own_within_a_pool_shape():
    shape = {"owner": "m", "device": "gpu", "tp": 1, "batch": 4}
    uses = pd.DataFrame(
        [
            {**shape, "role": "prefill", "ttft_ms": 20.0, "tbt_ms": 5.0},
            {**shape, "role": "prefill", "ttft_ms": 80.0, "tbt_ms": 5.0},
            {**shape, "role": "decode", "ttft_ms": 20.0, "tbt_ms": 5.0},
            {**shape, "role": "decode", "ttft_ms": 80.0, "tbt_ms": 6.0},
            {**shape, "role": "colocated", "ttft_ms": 20.0, "tbt_ms": 5.0},
            {**shape, "role": "colocated", "ttft_ms": 80.0, "tbt_ms": 5.0},
            {**shape, "role": "prefill", "ttft_ms": 30.0, "tbt_ms": 5.0, "batch": 1},  # its own shape
        ]
    ).assign(w=range(7))  # a class per use
    classes = pd.DataFrame({"output_tokens": [33, 129, 33, 129, 33, 129, 33]})
    share = _share(uses, classes)
    expected = [80 / 20, 1.0, (128 * 6) / (32 * 5), 1.0, (80 + 128 * 5) / (20 + 32 * 5), 1.0, 1.0]
    np.testing.assert_allclose(share, expected, rtol=1e-12)
    t_kv = np.array([4.0, 16.0, 4.0, 16.0, 0.0, 0.0, 5.0])
    np.testing.assert_allclose(_kv_share(uses, t_kv), [4.0, 1.0, 4.0, 1.0, 1.0, 1.0, 1.0], rtol=1e-12)


def test_kv_share_leaves_out_the_classs_own_other_kv_level():
    """A class rides a pool at one KV level, so the transfer of its slower level (into a slower decode
    tier) never shares the NIC with its faster level's: only other classes' transfers lengthen the wait."""
    shape = {"owner": "m", "role": "prefill", "device": "gpu", "tp": 1, "batch": 4}
    uses = pd.DataFrame(
        [
            {**shape, "w": 0},  # class 0, fast tier: 4 ms
            {**shape, "w": 0},  # class 0, slow tier: 12 ms
            {**shape, "w": 1},  # class 1, one level: 8 ms
            {**shape, "batch": 1, "w": 2},  # class 2 alone on its shape, two levels: 5 and 15 ms
            {**shape, "batch": 1, "w": 2},
        ]
    )
    t_kv = np.array([4.0, 12.0, 8.0, 5.0, 15.0])
    share = _kv_share(uses, t_kv)
    np.testing.assert_allclose(share, [8.0 / 4.0, 1.0, 12.0 / 8.0, 1.0, 1.0], rtol=1e-12)
    # the longest transfer a use waits behind is never shorter than its own, nor longer than the shape's
    assert np.all(share * t_kv >= t_kv)
    assert np.all(share * t_kv <= [12.0, 12.0, 12.0, 15.0, 15.0])


def test_kv_share_counts_the_classs_flows_of_another_key():
    """Under a link budget a class's prefill flows are resolved by decode device (`key`), one prefill row
    per (class, pool, key): its flows of two keys may ride one pool, so each waits behind the other's
    transfers (a plan of generated request 35 broke its route's SLO in verification when they did not)."""
    shape = {"owner": "m", "role": "prefill", "device": "gpu", "tp": 1, "batch": 1, "w": 0}
    uses = pd.DataFrame(
        [
            {**shape, "key": "a6000ada"},  # fast decoders: 4 ms
            {**shape, "key": "inf2"},  # slow decoders: 12 ms
            {**shape, "key": "a6000ada"},  # the first key's flows at their slower level: 6 ms
        ]
    )
    np.testing.assert_allclose(_kv_share(uses, np.array([4.0, 12.0, 6.0])), [3.0, 1.0, 2.0], rtol=1e-12)


# --- end to end: the promise in the simulator ---------------------------------------------------------------

A6000 = {"name": "a6000ada", "count": 2, "kind": "gpu", "network_gbps": 25.0, "cost_per_hour": 1.0}
INF2 = {
    "name": "inf2",
    "count": 2,
    "kind": "inferentia",
    "network_gbps": 8.333333333333334,
    "cost_per_hour": 1.08,
}


def tiny_request(
    kind: str, capacity_model: str = "queueing", max_utilization: float | None = None
) -> PlanRequest:
    """Demand far above what the devices serve, so the plan fills its pools to the admissible load."""
    workloads = [
        {
            "name": "w",
            "model": "llama-3.2-1b",
            "prompt_tokens": 512,
            "output_tokens": 32,
            "rate_rps": 1000.0,
            "slo": {"ttft_ms": 300.0 if kind == "disaggregated" else 150.0, "tbt_ms": 30.0, "percentile": 90},
        }
    ]
    devices = [A6000, INF2] if kind == "disaggregated" else [A6000]
    options = {
        "capacity_model": capacity_model,
        "allow_colocated": kind != "disaggregated",
        "allow_disaggregated": kind == "disaggregated",
    }
    if (
        kind == "shared"
    ):  # two classes of one model in one colocated pool: the short one waits behind the long
        workloads = [
            {
                **workloads[0],
                "name": "short",
                "prompt_tokens": 128,
                "slo": {"ttft_ms": 100.0, "tbt_ms": 30.0, "percentile": 90},
            },
            {
                **workloads[0],
                "name": "long",
                "prompt_tokens": 1024,
                "slo": {"ttft_ms": 400.0, "tbt_ms": 30.0, "percentile": 99},
            },
        ]
        options["allow_disaggregated"] = False
        options["objective"] = "max_min_fraction"  # max goodput would serve only the cheap short class
    if max_utilization is not None:
        options["max_utilization"] = max_utilization
    body = {"devices": devices, "workloads": workloads, "profiles": {"set": "paper"}, "options": options}
    return msgspec.convert(body, PlanRequest)


KINDS = ["colocated", "disaggregated", "shared"]


@pytest.fixture(scope="module")
def planned() -> dict[str, tuple[PlanRequest, Plan]]:
    out = {}
    for kind in KINDS:
        request = tiny_request(kind)
        out[kind] = (request, plan(request, with_baselines=False))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_queueing_plan_keeps_every_served_class_slo_in_the_simulator(planned, kind):
    request, result = planned[kind]
    served = {w.name for w in result.workloads if w.served_rps > 0}
    assert served == {w.name for w in request.workloads}
    table = resolve_profiles(request)
    for seed in (0, 1, 2):
        report = simulate(request, result, table, duration_s=600.0, warmup_s=60.0, seed=seed)
        for metrics in report.classes:
            if metrics.name in served:
                assert metrics.completed > 1000, (kind, seed, metrics.name)  # a percentile worth judging
                assert metrics.slo_met, (kind, seed, metrics)


@pytest.mark.parametrize("kind", KINDS)
def test_queueing_plan_serves_at_least_a_30_percent_flat_plan(planned, kind):
    _, result = planned[kind]
    flat_plan = plan(tiny_request(kind, "flat", 0.3), with_baselines=False)
    queueing_rps = sum(w.served_rps for w in result.workloads)
    flat_rps = sum(w.served_rps for w in flat_plan.workloads)
    assert flat_rps > 0
    assert queueing_rps >= flat_rps * (1 - 1e-6), (queueing_rps, flat_rps)


@pytest.mark.parametrize("kind", KINDS)
def test_route_predictions_lie_between_the_bare_service_and_the_slo(planned, kind):
    """Each route's predicted latency was admitted (<= SLO) and includes at least the service alone: the
    single-request prefill at the class percentile (batches may be partial, so not the full-batch
    `prefill_ms`) plus the KV transfer, and the full-batch step time."""
    request, result = planned[kind]
    frame = resolve_profiles(request).frame
    for workload, outcome in zip(request.workloads, result.workloads, strict=True):
        q = workload.slo.percentile
        assert outcome.routes
        for route in outcome.routes:
            source = route.colocated or route.prefill
            rows = frame[
                (frame["model"] == workload.model)
                & (frame["device"] == source.device)
                & (frame["tp"] == source.tp)
                & (frame["batch"] == 1)
                & (frame["prompt_tokens"] == workload.prompt_tokens)  # profiled prompts: no interpolation
            ]
            assert len(rows) == 1
            single = float(rows[f"ttft_ms_p{q}"].iloc[0])
            assert single + route.kv_transfer_ms <= route.ttft_ms * (1 + 1e-9)
            assert route.ttft_ms <= workload.slo.ttft_ms * (1 + 1e-9)
            assert route.step_ms <= route.tbt_ms * (1 + 1e-9)
            assert route.tbt_ms <= workload.slo.tbt_ms * (1 + 1e-9)


# --- tail-aware caps: links and the NIC utilization of prefill uses ---------------------------------------


def test_link_cap_keeps_mean_wait_and_tail_beyond_the_allowance():
    hold = np.array([38.0, 38.0, 2.0, 38.0])
    allowance = np.array([12.5, 12.5, 12.5, 400.0])
    epsilon = np.array([0.05, 0.005, 0.005, 0.005])
    got = capacity.link_cap(hold, allowance, epsilon)
    for u, d, a, e in zip(got, hold, allowance, epsilon, strict=True):
        assert md1_mean_wait(u, d) <= a * (1 + 1e-9)
        beyond = u * math.exp(-a * (1 - u) / (d / 2))  # zero-or-exponential wait, mean matched
        assert beyond <= 0.5 * e * (1 + 1e-9)
        # the cap is the largest such u: one of the two bounds is tight
        tight_mean = math.isclose(md1_mean_wait(u, d), a, rel_tol=1e-6)
        tight_tail = math.isclose(beyond, 0.5 * e, rel_tol=1e-6)
        assert tight_mean or tight_tail
    assert got[1] < got[0]  # a p99 tail allows less than a p90 one on the same link
    assert got[1] < 0.05 * md1_cap_ref(38.0, 12.5)  # far below the mean-sized cap: 38 ms transfers ahead
    assert got[2] > got[1]  # short transfers queue less
    assert got[3] > got[1]  # more slack on the same link allows more
    # the mean-matched exponential's tail beyond the allowance is >= u / e at the mean-sized cap, so for
    # any percentile above p60 the tail is what binds
    assert got[3] < md1_cap_ref(38.0, 400.0)


def test_batch_wait_keeps_the_batching_gain():
    """Between 1 and b the instance is always busy, yet the wait is one batch residual, stretched only by
    the load against full-batch capacity: S(1) = 10 ms, S(4) = 12 ms, at 200 requests/s rho_b = 0.6."""
    cv = curves([1.0, 4.0], [flat(10.0), flat(12.0)], [flat(5.0), flat(5.0)])
    rate = np.array([200.0])
    n = capacity.batch_fixed_point(rate, cv, np.array([4.0]), np.zeros(1))
    grid = capacity.service_grid(cv.at("ttft", n))
    wait = capacity.batch_wait(rate, cv, np.array([4.0]), n, grid)
    service = 10.0 + 2.0 * (n[0] - 1) / 3.0  # linear between the profiled batches
    assert n[0] == pytest.approx(rate[0] * service / 1e3, rel=1e-6)  # the batch that forms during one
    assert wait.prob[0] == pytest.approx(1.0)
    # N residual batch times (each uniform on [0, S(n*)], mean S / 2), N of mean 1 / (1 - rho_b)
    assert wait.stretch[0] == pytest.approx(1.0 / (1.0 - 200.0 * 12.0 / 4e3), rel=1e-9)
    assert capacity.moments(grid)[1][0] * wait.stretch[0] == pytest.approx(
        (service / 2.0) / (1.0 - 200.0 * 12.0 / 4e3), rel=1e-6
    )
    # b > 1: the residual is memoryless, so the wait is zero-or-exponential of that mean (`tail`'s form), to
    # the cells' rounding and never below it
    assert wait.memoryless[0]
    limits = np.array([30.0, 45.0, 60.0])
    grids, waits = np.repeat(grid, 3, axis=0), capacity.take_rows(wait, np.zeros(3, dtype=int))
    exponential = capacity.tail(grids, limits, waits.prob, capacity.moments(grids)[1] * waits.stretch)
    got = capacity.queue_tail(grids, limits, waits)
    assert (got >= exponential - 1e-9).all()
    np.testing.assert_allclose(got, exponential, atol=5e-3)
    # beyond full-batch capacity no finite wait
    over = np.array([400.0])
    n_over = capacity.batch_fixed_point(over, cv, np.array([4.0]), np.zeros(1))
    wait_over = capacity.batch_wait(
        over, cv, np.array([4.0]), n_over, capacity.service_grid(cv.at("ttft", n_over))
    )
    assert np.isinf(wait_over.stretch[0])


def _kv_prefill(n: int, **fields) -> tuple[capacity.UseTable, capacity.Curves]:
    cv = curves([1.0], [flat(30.0)], [flat(5.0)], n=n)
    base = {
        "role": "prefill",
        "batch": 1.0,
        "rate": 1e3 / 30.0,
        "ttft_q": 30.0,
        "own_bw": 25.0,
        "min_bw": 25.0,
    }
    return use_table(n, **{**base, **fields}), cv


def test_nic_utilization_trades_nic_cap_for_prefill_load_at_p99():
    """A p99 use whose KV waits at the mean-sized NIC cap alone break its tail: the mean cap would admit it
    no prefill load; the chosen utilization carries more (and stays at or above NIC_FLOOR)."""
    t, cv = _kv_prefill(
        2, ttft_slo=[600.0, 600.0], epsilon=[0.005, 0.05], t_kv=[56.0, 56.0], kv_share=[2.0, 1.0]
    )
    t = capacity.with_kv_reserve(t, cv)
    mean_cap = capacity.md1_cap(t.t_kv * t.kv_share, t.kv_slack_ms / (capacity.NIC_SERVERS + 1))
    chosen = t.nic_u
    at_mean = dataclasses.replace(t, nic_u=mean_cap)
    rate_at_mean = capacity.rates(at_mean, cv)
    rate_chosen = capacity.rates(t, cv)
    carried_at_mean = np.minimum(rate_at_mean, mean_cap * 1e3 / t.t_kv)
    carried = np.minimum(rate_chosen, chosen * 1e3 / t.t_kv)
    assert rate_at_mean[0] == pytest.approx(0.0, abs=1e-6)  # the mean cap leaves the p99 use nothing
    assert chosen[0] < mean_cap[0]
    assert chosen[0] >= capacity.NIC_FLOOR
    assert carried[0] > 0.0
    assert np.all(carried >= carried_at_mean * (1 - 1e-9))  # never worse than the mean cap
    # the p90 use, whose KV waits fit at the mean cap, keeps it unless a lower one carries more
    assert chosen[1] <= mean_cap[1]


def test_a_prefill_use_falls_back_to_a_faster_decode_tier():
    """One p99 mistral-7b class with 1024-token prompts (TTFT SLO 600 ms) on the paper devices: sending its
    KV cache into Inferentia2's 8 Gbit/s NICs takes 129 ms, and with the KV waits behind such transfers no
    prefill load keeps p99.5 within the SLO. Into the 25 Gbit/s decoders (A6000, TPU v5e) it takes 43 ms:
    the prefill uses are admitted at that level (0) only, and the plan serves the class (with the slowest
    level alone it had no prefill use at all and served nothing)."""
    base = read_request(fixtures.request_path("paper"))
    counts = {"a6000ada": 2, "inf2": 4, "tpu-v5e": 5}
    devices = [msgspec.structs.replace(d, count=counts[d.name]) for d in base.devices]
    model = next(w.model for w in base.workloads if "mistral" in w.model)
    slo = Slo(ttft_ms=600.0, tbt_ms=60.0, percentile=99)
    workload = Workload(
        name="long", model=model, prompt_tokens=1024, output_tokens=128, rate_rps=9.25, slo=slo
    )
    request = msgspec.structs.replace(base, devices=devices, workloads=[workload])
    cand = build_candidates(request, resolve_profiles(request))
    prefill = cand.uses[cand.uses["role"] == "prefill"]
    assert len(prefill) > 0
    assert (prefill["level"] == 0).all()
    assert (prefill["decode_bw"] == 25.0).all()
    assert prefill["t_kv_ms"].max() < 50.0
    assert plan(request, with_baselines=False).slo_rps > 0.5


def test_a_pool_nic_cap_keeps_the_nic_time_within_every_carried_class_cap():
    """The NIC row bounds traffic (Gbit/s over the pool's NIC bandwidth) but each class's cap bounds the NIC's
    time, and a transfer at speed s (min_bw / own_bw) holds the NIC 1 / s times as long per Gbit. Two classes
    in one pool: a fast one (speed 1, time cap 0.34) and one sending into slower NICs (speed 0.25, time cap
    0.74). Whatever the split of the traffic the cap allows, the NIC's time stays within 0.34; the least of
    cap x speed (0.185) would let the slow class alone hold it 74% of the time."""
    from fleetplan.solver.headroom import _pool_nic_cap

    speed = np.array([1.0, 0.25])
    time_cap = np.array([0.34, 0.74])
    uses = pd.DataFrame({"pool": [0, 0], "nic_rho": time_cap * speed, "nic_speed": speed})
    cap = _pool_nic_cap(uses, ["pool"])
    assert cap[0] == cap[1] == pytest.approx(0.34 * 0.25)
    for share_slow in np.linspace(0.0, 1.0, 11):  # the fraction of the capped traffic the slow class sends
        nic_time = cap[0] * ((1 - share_slow) / speed[0] + share_slow / speed[1])
        assert nic_time <= time_cap.min() + 1e-12
    # the old cap, min(cap x speed), breaks the fast class's cap when the slow class sends it all
    assert (time_cap * speed).min() / speed[1] > time_cap.min()


def test_kv_levels_are_the_slowest_tier_and_the_slowest_at_least_twice_as_fast():
    """candidates._kv_levels on three uses' reachable tiers (tier 0 the fastest decoders): transfers of 10,
    10, 30, 60 and 120 ms keep tier 4 (120 ms) and tier 3 (60 ms, the slowest at least KV_LEVEL_STEP = 2
    times shorter); a use whose transfers all take as long (its own NIC is the slower end) keeps only its
    slowest tier, which reaches the most; a use without NICs (no transfer) likewise."""
    from fleetplan.solver.candidates import KV_LEVEL_STEP, KV_LEVELS, _kv_levels

    assert (KV_LEVEL_STEP, KV_LEVELS) == (2.0, 2)
    rows = [(0, tier, t) for tier, t in enumerate([10.0, 10.0, 30.0, 60.0, 120.0])]
    rows += [(1, tier, 50.0) for tier in range(3)] + [(2, tier, 0.0) for tier in range(2)]
    w, tier, t_kv = (np.array(c) for c in zip(*rows, strict=True))
    levels = pd.DataFrame(
        {
            "w": w,
            "device": "d",
            "tp": 1,
            "batch": 1,
            "key": "*",
            "tier": tier,
            "t_kv_ms": t_kv,
            "decode_bw": 1.0,
        }
    )
    kept = _kv_levels(levels.sample(frac=1.0, random_state=0))  # in any order
    assert sorted(map(tuple, kept[["w", "tier"]].to_numpy().tolist())) == [(0, 3), (0, 4), (1, 2), (2, 1)]


def test_a_headroom_level_carries_each_class_at_one_kv_level_and_faster_levels_run_higher():
    """generated request 28 (the fidelity set's): its mistral-7b prefill uses reach A6000 and TPU v5e
    decoders at 43 ms and Inferentia2 at 129 ms. Every pool carries a class at one KV level (the flow
    chain's one prefill row per class, pool and key), and a shape's pools that carry a class at its faster
    level run it at a higher headroom than those that carry it at its slower one."""
    from bench.fidelity import generated

    request = generated(28)
    cand = build_candidates(request, resolve_profiles(request))
    prefill = cand.uses[cand.uses["role"] == "prefill"].merge(
        cand.pools[["rho"]], left_on="pool", right_index=True, suffixes=("", "_pool")
    )
    assert not prefill.duplicated(["pool", "w", "key"]).any()
    shape = ["w", "key", "device", "tp", "batch", "mix"]
    by_level = prefill.groupby([*shape, "level"])["rho_pool"].max().reset_index()
    pairs = by_level.merge(by_level, on=shape, suffixes=("_fast", "_slow"))
    pairs = pairs[pairs["level_fast"] < pairs["level_slow"]]
    assert len(pairs) > 0  # some class is carried at two KV levels of one shape
    assert (pairs["rho_pool_fast"] > pairs["rho_pool_slow"]).all()


def test_a_faster_kv_level_is_kept_only_where_it_carries_more():
    """headroom.useful_levels on one prefill use per class at two KV levels (1 the slowest, 0 the faster):
    class 0's faster level admits 1.2x its slowest's load (kept), class 1's 1.05x (dropped: it reaches
    fewer decoders for next to no load), class 2's slowest admits nothing (only its faster level survived
    admission: kept, whatever its load). Decode uses are never touched."""
    from fleetplan.solver.headroom import KV_LEVEL_GAIN, useful_levels

    assert KV_LEVEL_GAIN == 1.1
    shape = {"owner": "m", "device": "d", "tp": 1, "batch": 1, "mix": 0, "key": "*"}
    rows = [
        ("prefill", 0, 1, 0.50),
        ("prefill", 0, 0, 0.60),
        ("prefill", 1, 1, 0.60),
        ("prefill", 1, 0, 0.63),
        ("prefill", 2, 0, 0.20),
        ("decode", 0, -1, 0.10),
    ]
    uses = pd.DataFrame([{**shape, "role": r, "w": w, "level": lv, "use_rho": rho} for r, w, lv, rho in rows])
    kept = useful_levels(uses)
    assert sorted(map(tuple, kept[["role", "w", "level"]].to_numpy().tolist())) == [
        ("decode", 0, -1),
        ("prefill", 0, 0),
        ("prefill", 0, 1),
        ("prefill", 1, 1),
        ("prefill", 2, 0),
    ]


def test_the_flat_model_keeps_one_kv_level_per_prefill_use():
    """capacity_model = "flat" is the v1 formulation: each prefill use at the slowest decode tier it reaches
    (without queues a faster level admits no more, and a second row would be a column v1 does not have).
    generated request 28 reaches two levels from its mistral-7b prefill uses under the queueing model."""
    from bench.fidelity import generated

    request = generated(28)
    flat = msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=0.8)
    )
    uses = build_candidates(flat, resolve_profiles(flat)).uses
    prefill = uses[uses["role"] == "prefill"]
    assert not prefill.duplicated(["w", "device", "tp", "batch", "key"]).any()
    queueing = build_candidates(request, resolve_profiles(request)).uses
    levels = queueing[queueing["role"] == "prefill"].groupby(["w", "device", "tp", "batch"])["level"]
    assert (levels.nunique() > 1).any()


def test_a_use_no_level_admits_moves_to_the_slowest_tier_of_its_shortest_transfer():
    """headroom._fastest_tier: a prefill use (own NIC 25 Gbit/s, 1 Gbit of KV) whose only level, Inferentia2's
    8 Gbit/s tier 2 (125 ms), admitted nothing moves where its transfer is shortest: 40 ms at tier 1
    (25 Gbit/s) and at tier 0 (100 Gbit/s, its own NIC the slower end); of those, tier 1, which reaches
    more decoders. A use with an admitted level does not move, and a use at its shortest already ends it."""
    from fleetplan.solver.headroom import _fastest_tier

    shape = {"owner": "m", "device": "d", "tp": 1, "batch": 1, "mix": 0, "key": "*", "kv_gbit": 1.0}
    decode = [
        {**shape, "role": "decode", "w": w, "tier": t, "bw_gbps": bw}
        for w in (0, 1)
        for t, bw in enumerate([100.0, 25.0, 8.0])
    ]

    def sender(w, level, t_kv, admitted):
        row = {"role": "prefill", "w": w, "tier": -1, "level": level, "t_kv_ms": t_kv, "admitted": admitted}
        return {**shape, **row, "bw_gbps": 25.0}

    prefill = [sender(0, 2, 125.0, False), sender(1, 2, 125.0, False), sender(1, 1, 40.0, True)]
    uses = pd.DataFrame(decode + prefill)
    uses["admitted"] = uses["admitted"].fillna(True).astype(bool)
    uses["level"] = uses["level"].fillna(-1).astype(int)
    uses["decode_bw"] = np.inf
    moved, rows = _fastest_tier(uses)
    assert list(rows) == [6]  # class 0's prefill use; class 1 has an admitted level
    assert moved.loc[6, ["level", "decode_bw", "t_kv_ms"]].tolist() == [1, 25.0, pytest.approx(40.0)]
    again = moved.assign(admitted=moved["admitted"] & (moved.index != 6))
    assert _fastest_tier(again) is None  # nothing shorter than 40 ms left


def prefill_ttft_p95(state: tuple, kv: capacity.KvWait) -> float:
    """The TTFT at tail probability 0.05 of a prefill_state with KV waits kv."""
    return capacity.bisect_limit(
        lambda lim: capacity.prefill_tail_at(state, lim, kv), np.array([0.05]), np.array([5000.0])
    )[0]


def test_a_batch_mates_kv_transfers_delay_a_request_by_its_place():
    """A prefill batch of k ends at once and its k transfers leave the NIC one after another: the j-th of k
    waits j - 1 transfers (KvWait.step), each place 1 / k likely; at a load where batches are mostly full,
    the TTFT at the percentile moves by more than nothing and less than the last place's (b - 1) steps; at
    b = 1 not at all."""
    step = 30.0
    for b in (4, 1):
        batches = [1.0, 2.0, 4.0] if b == 4 else [1.0]
        ttft = [[40.0, 40.0, 40.0], [50.0, 50.0, 50.0], [80.0, 80.0, 80.0]][: len(batches)]
        cv = capacity.Curves(np.array([batches]), np.array([ttft], float), np.full((1, len(batches), 3), 5.0))
        rate = np.array([0.9 * b * 1e3 / ttft[-1][0]])  # near full-batch capacity: batches are mostly full
        state = capacity.prefill_state(rate, cv, np.array([b]), 1.0, horizon=np.array([2000.0]))
        prob, mean = np.array([0.0]), np.array([0.0])
        without = capacity.KvWait(prob, mean)
        with_step = capacity.KvWait(prob, mean, np.array([step]))
        at = [prefill_ttft_p95(state, kv) for kv in (without, with_step)]
        if b == 1:
            assert at[1] == pytest.approx(at[0], abs=1e-6)
        else:
            assert at[0] + 0.5 * step < at[1] < at[0] + (b - 1) * step, at


def test_own_prefill_spreads_a_request_over_its_places_in_the_batch():
    """PLACE_GROUPS groups of places, each at its last place: exact for k <= 4, long beyond."""
    grid = np.array([[100.0, 200.0], [100.0, 200.0], [100.0, 200.0]])
    weights = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    size = np.array([[4.0, 4.0], [2.0, 2.0], [8.0, 8.0]])
    own = (np.arange(3), grid, weights, weights, size)
    kv = capacity.KvWait(np.zeros(3), np.zeros(3), np.full(3, 10.0))
    shifted, shares = capacity.own_prefill(own, np.arange(3), kv)
    assert shifted.shape == shares.shape == (3, 2 * capacity.PLACE_GROUPS)

    def places(row):  # shift, share, ... of the service point 100 ms, places with no share left out
        pts = zip(shifted[row, ::2] - 100.0, shares[row, ::2], strict=True)
        return [v for d, w in pts if w > 0 for v in (d, w)]

    assert places(0) == pytest.approx([0.0, 0.125, 10.0, 0.125, 20.0, 0.125, 30.0, 0.125])
    assert places(1) == pytest.approx([0.0, 0.25, 10.0, 0.25])  # a batch of two: first or second
    assert places(2) == pytest.approx([10.0, 0.125, 30.0, 0.125, 50.0, 0.125, 70.0, 0.125])
    assert shares.sum(axis=1) == pytest.approx(weights.sum(axis=1))
    # no step, or only zero steps: the grid as it was
    for none in (
        capacity.KvWait(np.zeros(3), np.zeros(3)),
        capacity.KvWait(np.zeros(3), np.zeros(3), np.zeros(3)),
    ):
        same, w = capacity.own_prefill(own, np.arange(3), none)
        assert same is grid or np.array_equal(same, grid)
        assert np.array_equal(w, weights)
