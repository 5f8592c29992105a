"""One judged window's scatter: how often a class's percentile over one 600 s window passes the level the
capacity model plans it at, as a count model (docs/formulation.md, "One window's scatter").

The promise is judged on one window per seed (../shared/design/capacity.md). Behind a loaded queue a
class's requests above a level come in congestion episodes, so their count X in one window scatters far
beyond a binomial count. X is taken as a negative binomial of mean p N (N the class's requests in the
window, p the planned tail) and index of dispersion D = Var X / E X, modelled from the queue's load
(`window_dispersion`); `window_margin` is the largest fraction of the class's tail that keeps
P(X > tail N) at most WINDOW_DELTA. bench/window_scatter.py measures the break rates, the index and the
margins on M/G/1, batched prefill and a decode slot queue; the capacity model applies the margin per use
(fleetplan/solver/capacity.py: window_epsilon, prefill_window_epsilon, decode_window_epsilon), and
fleetplan/solver/window.py on the plan.
"""

import numpy as np
from scipy.special import betainc

# A queue's requests above a level come in bursts, so their count in one window scatters far beyond a
# binomial count: a p99 class planned at p99.5 on one prefill instance fails a window 8-16% of the time
# (loads 0.5-0.9; bench/window_scatter.py). Once a plan says how many requests a class has in the window
# (fleetplan/solver/window.py), a prefill or decode use's planned tail is also held to what keeps that
# window's count above the SLO's tail at most WINDOW_DELTA likely (capacity.window_epsilon), the count a
# negative binomial of index of dispersion 1 + WINDOW_DISPERSION (1 + cv2) / (1 - load)^3 (the coefficient
# measured there; docs/formulation.md, "One window's scatter")
WINDOW_DELTA = 0.05
WINDOW_DISPERSION = 0.45
MARGIN_SCALES = 8  # window_margin's indices of dispersion: D and 1 + (D - 1) / 2^k below it
MARGIN_HALVINGS = 14  # window_margin's bisection: m to 2^-14


def window_dispersion(busy: np.ndarray, cv2: np.ndarray) -> np.ndarray:
    """Variance over mean of the count of one queue's requests above a high level in one window: 1 for
    independent exceedances; behind a FIFO server at busy fraction U they cluster into congestion episodes,
    1 + WINDOW_DISPERSION (1 + cv2) / (1 - U)^3 (the (1 + cv2) of the heavy-traffic variance; the power and
    the coefficient measured by bench/window_scatter.py on M/G/1 with the profiles' lognormal and with
    exponential service, U 0.47-0.75: within 25% of the measured index)."""
    gap = np.maximum(1.0 - np.asarray(busy, dtype=float), 1e-3)
    return 1.0 + WINDOW_DISPERSION * (1.0 + np.asarray(cv2, dtype=float)) / gap**3


def window_breaks(mean: np.ndarray, dispersion: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """P(count > allowed) for a negative binomial count of this mean and variance over mean (> 1):
    r = mean / (D - 1) successes at probability 1 / D, P(X > k) = I_{1 - 1/D}(k + 1, r)."""
    d = np.maximum(np.asarray(dispersion, dtype=float), 1.0 + 1e-9)
    r = np.maximum(np.asarray(mean, dtype=float), 1e-12) / (d - 1.0)
    return betainc(np.floor(allowed) + 1.0, r, 1.0 - 1.0 / d)


def window_margin(dispersion: np.ndarray, requests: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """The largest m in (0, 1] (to 2^-MARGIN_HALVINGS) with P(count > tail N) <= WINDOW_DELTA when N
    requests of a window see the level with probability m tail each, for the count `window_breaks`'s of mean
    m tail N at every index of dispersion from 1 up to `dispersion` (the least over 1 + (D - 1) / 2^k,
    k = 0..7, bisected together). At a very large index the negative binomial puts the count in rare huge
    bursts, and its margin grows again; the modelled index errs high at high loads
    (bench/window_scatter.py), so smaller ones are taken too."""
    allowed = np.asarray(tail, dtype=float) * np.asarray(requests, dtype=float)
    extra = np.asarray(dispersion, dtype=float) - 1.0
    allowed, extra = np.broadcast_arrays(allowed, extra)
    scales = 2.0 ** -np.arange(MARGIN_SCALES)  # every index at once: one bisection over (..., scales)
    allowed, index = allowed[..., None], 1.0 + extra[..., None] * scales
    lo, hi = np.zeros(index.shape), np.ones(index.shape)
    for _ in range(MARGIN_HALVINGS):
        mid = 0.5 * (lo + hi)
        ok = window_breaks(mid * allowed, index, allowed) <= WINDOW_DELTA
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo.min(axis=-1)
