"""The bulk-service wait of a batched prefill instance (fleetplan/solver/bulk.py) against an independent
simulation of greedy batching, and its place in the capacity model (the smaller of it and the memoryless
form)."""

import numpy as np
import pytest

from fleetplan.profiler.latency import quantile_ms, quantile_params_array
from fleetplan.solver import bulk, capacity

B = 4


def _params(batch: int, spread: float = 1.15) -> np.ndarray:
    """(batch + 1, 4) quantile params of a prefill batch of k = 0..batch (row 0 unused): p50 20 + 15 k ms,
    p90 `spread` x p50, p99 spread^2 x p50."""
    p50 = 20.0 + 15.0 * np.arange(batch + 1)
    return quantile_params_array(p50, spread * p50, spread**2 * p50)


def _grid(params: np.ndarray) -> np.ndarray:
    out = quantile_ms(params[:, None, :], capacity._Z_BULK[None, :])
    out[0] = 0.0
    return out


def _simulated_waits(lam_per_ms: float, params: np.ndarray, batch: int, n: int, seed: int) -> np.ndarray:
    """Waits of Poisson arrivals at one server that, when idle with requests waiting, takes up to `batch` of
    them FIFO and serves them together for S(k) (a fresh standard normal draw per batch)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / lam_per_ms, n))
    waits = np.empty(n)
    i, free = 0, 0.0
    while i < n:
        start = max(free, arrivals[i])
        j = min(int(np.searchsorted(arrivals, start, side="right")), i + batch)
        waits[i:j] = start - arrivals[i:j]
        free = start + float(quantile_ms(params[j - i], rng.standard_normal()))
        i = j
    return waits[n // 10 :]


def _chain_quantiles(lam_per_ms: float, params: np.ndarray, batch: int, horizon: float, qs) -> np.ndarray:
    window = bulk.Window(np.array([horizon / capacity.WAIT_CELLS]), capacity.WAIT_CELLS, capacity._DAMP, 512)
    wait = bulk.wait_pmf(
        np.array([lam_per_ms]), _grid(params)[None], capacity._W_BULK, batch, np.array([1.0]), window
    )
    assert wait.covered[0]
    pmf = np.fft.irfft(wait.transform, window.length)[0, : window.cells + 1] / window.damp
    cdf = np.cumsum(pmf)
    return np.array([np.searchsorted(cdf, q) * window.cell[0] for q in qs])


def test_stationary_law_is_invariant_and_sums_to_one():
    params = _params(3)
    lam = np.array([0.02])  # 1.3 arrivals per full batch of 3
    arrivals = bulk.arrivals_pmf(lam, _grid(params)[None], capacity._W_BULK, 30)
    pi, covered = bulk.stationary(arrivals, 3, 60)
    assert covered[0]
    assert pi.sum() == pytest.approx(1.0)
    # one step of the chain by hand: from q, a batch of min(q, 3) leaves and a arrive (0 -> 1: idle spell)
    step = np.zeros(60)
    for q in range(1, 61):
        for a in range(30):
            step[min(max(q - min(q, 3) + a, 1), 60) - 1] += pi[0, q - 1] * arrivals[0, min(q, 3), a]
    assert step == pytest.approx(pi[0], abs=1e-12)


@pytest.mark.parametrize("load", [0.3, 0.6, 0.85])
def test_bulk_wait_matches_a_simulation_of_greedy_batching(load):
    """At 30-85% of full-batch capacity the chain's p90, p95 and p99 waits lie between 2% below the
    simulated ones (sampling) and 15% + 3 ms above (its roundings err long)."""
    params = _params(B)
    full = B / (_grid(params)[B] @ capacity._W_BULK)  # requests per ms at full batches
    lam = load * full
    qs = (0.9, 0.95, 0.99)
    simulated = np.quantile(_simulated_waits(lam, params, B, 200_000, seed=1), qs)
    chain = _chain_quantiles(lam, params, B, horizon=float(12 * _grid(params)[B].max()), qs=qs)
    assert np.all(chain >= 0.98 * simulated - 0.5), (chain, simulated)
    assert np.all(chain <= 1.15 * simulated + 3.0), (chain, simulated)


def test_memoryless_form_overstates_a_moderately_loaded_batch_wait():
    """Why the chain is there: at 55% of full-batch capacity the memoryless form's p95 wait (zero or
    exponential of mean r_b / (1 - rho_b), the instance busy throughout) is several times the simulated
    one, which the chain follows."""
    params = _params(B)
    grid = _grid(params)
    mean = grid @ capacity._W_BULK
    lam = 0.55 * B / mean[B]
    simulated = np.quantile(_simulated_waits(lam, params, B, 200_000, seed=2), 0.95)
    chain = _chain_quantiles(lam, params, B, horizon=float(12 * grid[B].max()), qs=(0.95,))[0]
    residual = (grid[B] ** 2 @ capacity._W_BULK) / (2 * mean[B])
    memoryless = residual / (1 - 0.55) * np.log(1 / 0.05)
    assert memoryless > 3 * simulated
    assert chain == pytest.approx(simulated, rel=0.15, abs=3.0)


def test_a_chain_too_long_for_its_window_is_not_covered():
    params = _params(B)
    window = bulk.Window(np.array([1e6]), capacity.WAIT_CELLS, capacity._DAMP, 512)
    wait = bulk.wait_pmf(np.array([0.05]), _grid(params)[None], capacity._W_BULK, B, np.array([1.0]), window)
    assert not wait.covered[0]


def test_batched_prefill_admits_at_least_the_memoryless_load(monkeypatch):
    """The capacity model takes the smaller tail of the chain and the memoryless form: a batch-4 prefill
    use is admitted at least as much as with the memoryless form alone, and more where the SLO leaves
    room for a few batch waits."""
    from test_capacity import PREFILL_FULL, batching_curves, rates_of

    slos = [120.0, 150.0, 250.0]
    kwargs = {"curves": batching_curves(len(slos)), "batch": 4.0, "rate": PREFILL_FULL, "ttft_slo": slos}
    both = rates_of(**kwargs)
    monkeypatch.setattr(capacity, "bulk_state", lambda *args, **kw: None)
    memoryless = rates_of(**kwargs)
    assert np.all(both >= memoryless)
    assert np.any(both > memoryless)
