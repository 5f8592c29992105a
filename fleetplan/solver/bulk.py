"""The wait of a batched prefill instance as the bulk-service queue it is (docs/formulation.md, "Batched
prefill waits").

An idle prefill instance with requests waiting takes up to b of them, FIFO, at once, and the batch takes
S(k) for the k it took (the simulator's `start_prefill`; no batching timeout). Watched at the starts of its
batches, the number waiting q is a Markov chain: a batch of k = min(q, b) runs, A requests arrive during it
(Poisson of mean lambda S(k), S(k) drawn from its profile), and the next batch starts with q - k + A
waiting, or with 1 after an idle spell when that is 0. Its stationary law (`stationary`) gives what an
arrival finds (Poisson arrivals see time averages): with probability `idle` an idle instance; else a batch
of k in service since t, with r = q - k left waiting when it started and N(t) Poisson arrivals since. The
arrival then waits the batch's residual S(k) - t and then M = floor((r + N(t)) / b) full batches ahead of
its own. `wait_pmf` returns that wait's distribution on a window of cells.

Exact for one instance up to roundings that err long: the time into the batch is taken in BULK_T cells
with the residual at each cell's upper end, every mass sits at its window cell's upper end, the law of M
is read off a grid of MU_POINTS Poisson means (linear between them), and M beyond what fits the window
(AHEAD_SLACK times the full batches that fit it at their mean, at most AHEAD_CAP) counts as waiting past
it. The chain is truncated at a queue length past that; rows whose chain holds more than TRUNCATION_MASS in
its top states (or that need more than QUEUE_MAX states) are reported as not covered.
"""

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

BULK_T = 8  # cells of a batch's service over which an arrival's time into it is taken
QUEUE_MAX = 640  # the largest chain solved (states); a batch size whose window needs more is not covered
TRUNCATION_MASS = 1e-5  # stationary mass allowed in the chain's top states (where truncation bends it)
AHEAD_SLACK = 1.25
NEGLIGIBLE = 1e-12  # arrival probability of m full batches ahead below which m is not convolved
AHEAD_CAP = 16  # most full batches ahead convolved (an arrival that meets more counts as waiting too long)
MU_POINTS = 32  # Poisson means at which the law of M is computed (per row, up to the longest batch's)


@dataclass(frozen=True)
class Window:
    """Where a distribution is kept: `cells` cells of `cell` ms (n,) each, mass k in ((k - 1) cell, k cell],
    damped by `damp` (cells + 1,) before a real FFT of `length` (as capacity.py's exact prefill wait)."""

    cell: np.ndarray
    cells: int
    damp: np.ndarray
    length: int


@dataclass(frozen=True)
class BulkWait:
    """Per row: the wait's transform on its Window (damped, rfft of length `window.length`), and whether
    the chain covers it (`covered` false: use another form)."""

    transform: np.ndarray
    covered: np.ndarray


def poisson_pmf(mean: np.ndarray, count: int) -> np.ndarray:
    """P(A = a), a = 0..count - 1, for A Poisson of each `mean` (any shape; a last axis is added)."""
    a = np.arange(count, dtype=float)
    m = np.maximum(np.asarray(mean, dtype=float), 1e-300)[..., None]
    return np.exp(a * np.log(m) - m - gammaln(a + 1.0))


def arrivals_pmf(lam: np.ndarray, service: np.ndarray, weights: np.ndarray, count: int) -> np.ndarray:
    """(n, b + 1, count): arrivals during a batch of k = 0..b (index 0 unused), a mixed Poisson over the
    batch's service grid (`service` (n, b + 1, G) ms, `weights` (G,)); `lam` per ms."""
    return np.einsum("nkga,g->nka", poisson_pmf(lam[:, None, None] * service, count), weights)


def stationary(arrivals: np.ndarray, batch: int, states: int) -> tuple[np.ndarray, np.ndarray]:
    """(pi, covered): the chain's stationary law over q = 1..states (index q - 1) at batch starts, and
    whether the truncation at `states` (transitions past it land on it) held at most TRUNCATION_MASS in the
    top batch + len(arrivals) states. `arrivals` (n, b + 1, A) as arrivals_pmf's."""
    n, _, count = arrivals.shape
    q = np.arange(1, states + 1)
    k = np.minimum(q, batch)
    nxt = np.clip(q[:, None] - k[:, None] + np.arange(count)[None, :], 1, states)  # (Q, A)
    flat = (np.arange(n)[:, None, None] * states + (q - 1)[None, :, None]) * states + (nxt - 1)[None, :, :]
    probs = arrivals[:, k, :]  # (n, Q, A)
    matrix = np.bincount(flat.ravel(), probs.ravel(), n * states * states).reshape(n, states, states)
    system = np.swapaxes(matrix, 1, 2) - np.eye(states)[None]
    system[:, -1, :] = 1.0
    rhs = np.zeros((n, states, 1))
    rhs[:, -1, 0] = 1.0
    pi = np.clip(np.linalg.solve(system, rhs)[..., 0], 0.0, None)
    pi /= pi.sum(axis=1, keepdims=True)
    top = pi[:, max(states - batch - count, 0) :].sum(axis=1)
    return pi, np.isfinite(pi).all(axis=1) & (top <= TRUNCATION_MASS)


def wait_pmf(
    lam: np.ndarray,
    service: np.ndarray,
    weights: np.ndarray,
    batch: int,
    share: np.ndarray,
    window: Window,
) -> BulkWait:
    """The wait of an arrival at one instance of batch size `batch` (> 1), rows of that batch size.

    lam: (n,) requests per ms. service: (n, b + 1, G) ms, the prefill time of a batch of k = 1..b at the
    quantiles whose probabilities are `weights` (index 0 unused). share: (n,) >= 1, how much longer the
    longest class that may be ahead is (its residual and full batches are scaled by it; the queue's
    dynamics are the class's own).

    Each row's chain is sized by the row alone (`_sizes`), and rows are solved together only with rows of
    the same sizes, so a row's answer does not depend on which others are evaluated with it."""
    n, b = len(lam), batch
    transform = np.zeros((n, window.length // 2 + 1), dtype=complex)
    covered = np.zeros(n, dtype=bool)
    ahead, count, fits = _sizes(lam, service, weights, b, share, window)
    for key in {(a, c) for a, c, f in zip(ahead, count, fits, strict=True) if f}:
        rows = np.flatnonzero(fits & (ahead == key[0]) & (count == key[1]))
        part = _rows_window(window, rows)
        out = _group_wait(lam[rows], service[rows], weights, b, share[rows], part, *key)
        transform[rows], covered[rows] = out.transform, out.covered
    return BulkWait(transform, covered)


def _rows_window(window: Window, rows: np.ndarray) -> Window:
    """The window of the given rows."""
    return Window(window.cell[rows], window.cells, window.damp, window.length)


def _sizes(lam, service, weights, b: int, share, window: Window) -> tuple:
    """Per row: the full batches ahead that may still fit the window (AHEAD_SLACK times what fits at the
    mean; at most AHEAD_CAP), the arrivals per batch tabulated (a power of two past the longest batch's
    mean + 8 sigma), and whether its chain fits QUEUE_MAX and is stable (fewer than b arrivals per full
    batch on average)."""
    full = np.maximum(service[:, b] @ weights, 1e-9)
    reach = window.cell * window.cells
    ahead = np.minimum(np.ceil(AHEAD_SLACK * reach / (share * full)).astype(np.int64) + 1, AHEAD_CAP)
    longest = lam * service[:, b, -1]
    count = 2 ** np.ceil(np.log2(np.maximum(longest + 8.0 * np.sqrt(longest) + 8.0, 8.0))).astype(np.int64)
    fits = (b * (ahead + 2) + count <= QUEUE_MAX) & (lam * full < b)
    return ahead, count, fits


def _group_wait(lam, service, weights, b: int, share, window: Window, ahead: int, count: int) -> BulkWait:
    """wait_pmf on rows that share their sizes (`_sizes`)."""
    n = len(lam)
    mean = service @ weights  # (n, b + 1)
    states = b * (ahead + 2) + count
    arrivals = arrivals_pmf(lam, service, weights, count)
    pi, covered = stationary(arrivals, b, states)
    q = np.arange(1, states + 1)
    k_of = np.minimum(q, b)
    empty = np.where(q <= b, arrivals[:, k_of, 0], 0.0)  # the batch leaves none waiting: an idle spell
    total = (pi * (lam[:, None] * mean[:, k_of] + empty)).sum(axis=1)
    idle = (pi * empty).sum(axis=1) / total
    # the batch in service: k < b (started with q = k waiting, so r = 0) or k = b (r = q - b behind it)
    left = pi[:, b - 1 :]  # q = b + r, r = 0..
    start = np.concatenate([pi[:, : b - 1], left.sum(axis=1, keepdims=True)], axis=1)  # (n, b)
    tables, top = _ahead_tables(
        lam, service, b, ahead, left / np.maximum(left.sum(axis=1, keepdims=True), 1e-300)
    )
    # the most full batches ahead any arrival meets with more than NEGLIGIBLE probability (the longest
    # batch's arrivals on the longest queue); the mass of more (below that, or past `ahead`) is dropped: it
    # counts as waiting past the window, which errs long
    beyond = 1.0 - tables[:, 1, -1, :]  # (n, M + 1): P(M > m) at the worst point
    last = np.argmax(np.append(beyond, np.zeros((n, 1)), axis=1) <= NEGLIGIBLE, axis=1)
    keep = min(int(last.max(initial=0)) + 1, tables.shape[-1])
    p_m = np.diff(_ahead_read(tables[..., :keep], top, lam, service, b), axis=-1, prepend=0.0)
    # each batch of k in service takes arrivals in proportion to its time: pi(k) lam S / T
    arriving = start[:, :, None] * weights[None, None, :] * lam[:, None, None] * service[:, 1:, :]
    mass = ((arriving / (BULK_T * total[:, None, None]))[..., None, None] * p_m).reshape(n, -1, keep)
    upper = 1.0 - np.arange(BULK_T) / BULK_T  # the residual at its time cell's upper end, in services
    residual = (share[:, None, None, None] * service[:, 1:, :, None] * upper).reshape(n, -1)
    batches = _binned(share[:, None] * service[:, b], np.broadcast_to(weights, (n, len(weights))), window)
    return BulkWait(_transform(idle, residual, mass, batches, window), covered)


def _transform(idle, residual, mass, batches, window: Window) -> np.ndarray:
    """The damped transform of the wait: none w.p. `idle`, else residual[c] plus m full batches (each of
    law `batches` on the window) w.p. mass[c, m]."""
    full = np.fft.rfft(batches * window.damp, window.length)
    transform = np.zeros((len(idle), window.length // 2 + 1), dtype=complex) + idle[:, None]
    power = np.ones_like(transform)
    for m in range(mass.shape[2]):
        if m:
            power *= full
        transform += (
            np.fft.rfft(_binned(residual, mass[:, :, m], window) * window.damp, window.length) * power
        )
    return transform


def _ahead_tables(lam, service, b: int, ahead: int, behind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((n, 2, MU, M + 1), top): P(M <= m), M = floor((r + N) / b), N Poisson of each of MU_POINTS means
    from 0 to `top` (n,) (the arrivals during the longest batch), for r = 0 (table 0: the batch in service
    took everyone) and r of law `behind` (n, R) (table 1: a full batch left r behind it)."""
    limits = (np.arange(ahead + 1) + 1) * b - 1  # M <= m iff r + N <= (m + 1) b - 1
    top = np.maximum(lam * service[:, 1:, -1].max(axis=1), 1e-9)  # (n,)
    mu = top[:, None] * np.linspace(0.0, 1.0, MU_POINTS)[None, :]  # (n, MU)
    span = int(limits[-1]) + 1
    cdf_n = np.cumsum(poisson_pmf(mu, span), axis=-1)  # (n, MU, span): P(N <= x)
    size = 1 << int(np.ceil(np.log2(2 * span)))
    # P(r + N <= x) = sum_r P(r) P(N <= x - r): a convolution along x
    queued = np.fft.irfft(np.fft.rfft(cdf_n, size) * np.fft.rfft(behind[:, :span], size)[:, None, :], size)
    return np.clip(np.stack([cdf_n[..., limits], queued[..., limits]], axis=1), 0.0, 1.0), top


def _ahead_read(tables, top, lam, service, b: int) -> np.ndarray:
    """(n, b, G, T, M + 1): `_ahead_tables` read at an arrival's time cell t of a batch of k (= 1..b) at
    service quantile g (N's mean lam S t), linearly between the tabulated means; k = b reads table 1."""
    t = (np.arange(BULK_T) + 0.5) / BULK_T
    arrived = lam[:, None, None, None] * service[:, 1:, :, None] * t  # (n, b, G, T)
    pos = np.clip(arrived / top[:, None, None, None], 0.0, 1.0) * (MU_POINTS - 1)
    lo = np.minimum(np.floor(pos).astype(np.int64), MU_POINTS - 2)
    frac = (pos - lo)[..., None]
    rows = np.arange(len(lam))[:, None, None, None]
    which = (np.arange(b) == b - 1).astype(np.int64)[None, :, None, None]
    return (1 - frac) * tables[rows, which, lo] + frac * tables[rows, which, lo + 1]


def _binned(values: np.ndarray, masses: np.ndarray, window: Window) -> np.ndarray:
    """(n, cells + 1): each row's masses at the upper end of the window cell holding its value (beyond the
    window: dropped)."""
    n, size = len(values), window.cells + 1
    at = np.ceil(values / window.cell[:, None] - 1e-9).astype(np.int64)
    inside = at <= window.cells
    flat = ((np.arange(n) * size)[:, None] + np.clip(at, 0, window.cells))[inside]
    return np.bincount(flat, masses[inside], n * size).reshape(n, size)


__all__ = ["BULK_T", "BulkWait", "Window", "arrivals_pmf", "poisson_pmf", "stationary", "wait_pmf"]
