"""The latency distribution a profile row stands for: one function from (p50, p90, p99) to a distribution.

A profiled latency is a random variable known by three percentiles. Everything that needs more than the
percentiles (the simulator drawing samples, the capacity model integrating a tail) uses this one model:

    latency = exp(piecewise-linear(z)),  z standard normal, clipped to [-Z_CLIP, Z_CLIP],

through (0, log p50), (Z90, log p90), (Z99, log p99). It reproduces the three percentiles exactly, is
lognormal with sigma = the p50->p90 slope below p90, and continues the p90->p99 slope in the tail. Missing
percentiles degrade gracefully: no p90 -> the p50->p99 slope; no p99 -> the p50->p90 slope; p50 only ->
deterministic. docs/simulation.md ("Sampling") is the reference.
"""

import math

import numpy as np

Z90 = 1.2815515655446004  # standard normal quantiles of 0.90 and 0.99
Z99 = 2.3263478740408408
Z_CLIP = 5.0  # |z| beyond this is clipped: guards against absurd tails from a steep p90->p99 segment

Params = tuple[float, float, float, float]


def quantile_params(p50: float, p90: float, p99: float) -> Params:
    """(log p50, slope below p90, log p90, slope above p90) in log-seconds per unit z, from ms percentiles."""
    l50 = math.log(p50 / 1e3)
    has90, has99 = np.isfinite(p90), np.isfinite(p99)
    if has90:
        l90 = math.log(p90 / 1e3)
        s_lo = (l90 - l50) / Z90
        s_hi = (math.log(p99 / 1e3) - l90) / (Z99 - Z90) if has99 else s_lo
    elif has99:
        s_lo = s_hi = (math.log(p99 / 1e3) - l50) / Z99
        l90 = l50 + s_lo * Z90
    else:
        s_lo = s_hi = 0.0
        l90 = l50
    return (l50, max(s_lo, 0.0), l90, max(s_hi, 0.0))


def sample_ms(params: Params, z: float) -> float:
    """One latency (ms) at standard-normal draw z; z = 0 gives p50."""
    l50, s_lo, l90, s_hi = params
    return 1e3 * (math.exp(l50 + s_lo * z) if z <= Z90 else math.exp(l90 + s_hi * (z - Z90)))


def quantile_params_array(p50: np.ndarray, p90: np.ndarray, p99: np.ndarray) -> np.ndarray:
    """`quantile_params` over arrays (ms in): shape (..., 4) = (log p50, s_lo, log p90, s_hi)."""
    p50, p90, p99 = (np.asarray(a, float) for a in (p50, p90, p99))
    l50 = np.log(p50 / 1e3)
    has90, has99 = np.isfinite(p90), np.isfinite(p99)
    with np.errstate(invalid="ignore", divide="ignore"):
        l90_given = np.log(np.where(has90, p90, 1.0) / 1e3)
        l99_given = np.log(np.where(has99, p99, 1.0) / 1e3)
        s_90 = (l90_given - l50) / Z90
        s_hi_given = (l99_given - l90_given) / (Z99 - Z90)
        s_50_99 = (l99_given - l50) / Z99
    s_lo = np.where(has90, s_90, np.where(has99, s_50_99, 0.0))
    s_hi = np.where(has90, np.where(has99, s_hi_given, s_90), np.where(has99, s_50_99, 0.0))
    l90 = np.where(has90, l90_given, l50 + s_lo * Z90)
    return np.stack([l50, np.maximum(s_lo, 0.0), l90, np.maximum(s_hi, 0.0)], axis=-1)


def quantile_ms(params: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Latency (ms) at standard-normal quantile(s) z, broadcast over params (..., 4) and z."""
    params = np.asarray(params, float)
    z = np.clip(np.asarray(z, float), -Z_CLIP, Z_CLIP)
    l50, s_lo, l90, s_hi = (params[..., i] for i in range(4))
    log_s = np.where(z <= Z90, _log_below(l50, s_lo, z), _log_above(l90, s_hi, z))
    return 1e3 * np.exp(log_s)


def quantile_grid_ms(params: np.ndarray, z: np.ndarray) -> np.ndarray:
    """`quantile_ms` of every row of params (n, 4) at every point of one ascending grid z (G,): (n, G),
    the same values, each point computed on its own side of Z90 only (the capacity model's service grids,
    the hot path of candidate building)."""
    params = np.asarray(params, float)
    z = np.clip(np.asarray(z, float), -Z_CLIP, Z_CLIP)
    split = int(np.searchsorted(z, Z90, side="right"))  # z[:split] <= Z90 < z[split:]
    out = np.empty((params.shape[0], len(z)))
    l50, s_lo, l90, s_hi = (params[:, i, None] for i in range(4))
    out[:, :split] = _log_below(l50, s_lo, z[None, :split])
    out[:, split:] = _log_above(l90, s_hi, z[None, split:])
    np.exp(out, out=out)
    out *= 1e3
    return out


def _log_below(l50, s_lo, z):
    """log latency (log-seconds) at z <= Z90: the lognormal through p50 and p90."""
    return l50 + s_lo * z


def _log_above(l90, s_hi, z):
    """log latency (log-seconds) at z > Z90: the p90 -> p99 slope continued."""
    return l90 + s_hi * (z - Z90)
