"""The capacity model: how much load a pool, a NIC or a link may carry and still keep a class's SLO.

docs/formulation.md ("Capacity model") has the formulas; this module is their one implementation.

Under `options.capacity_model = "flat"` every pool, NIC and link carries at most `max_utilization` (v1).
Under `"queueing"` (the default) each (class, pool) use gets its own *admissible utilization* rho in
(0, 1]: the largest fraction of the pool's full-batch capacity (the MILP's per-instance rate r) at which the
class's SLO still holds at its percentile q, with the waits included:

- prefill (and the TTFT of a disaggregated request): one instance is a batch server without a batching
  timeout. Batches of n* requests form, where n* = clip(lambda S(n*), 1, b) (what arrives during one
  batch is the next batch); the instance is busy U = lambda E[S(n*)] / n*. Seen as an M/G/1 queue of
  batches, a request waits with probability U, and then N >= 1 residual batch times, N geometric of mean
  1 / (1 - rho_b) (`QueueWait`, `queue_tail`): at b = 1 exactly the M/G/1 waiting time (Benes), computed
  by FFT on the TTFT window; for b > 1 the smaller tail of two forms: the residual taken as memoryless
  (zero-or-exponential of mean r_b / (1 - rho_b), r_b = E[S^2] / (2 E[S])) and, for one instance, the
  bulk-service queue's own wait (fleetplan/solver/bulk.py: an embedded Markov chain at batch starts).
  TTFT = W + S + t_kv + W_kv must stay <= slo.ttft_ms with probability q, W_kv including the transfers of
  the batch-mates ahead of it (`KvWait`).
- decode: an instance has b slots held for (o - 1) steps of TBT(b): an M/G/b queue; a request waits for a
  slot with the Erlang C probability C(b, a) and then an exponential time of rate (b - a) / H, its mean
  shortened to M/D/c's where the holds are near-deterministic and the judged window holds enough of the
  queue's spells (`hold_factor`). The wait stretches its mean inter-token gap: TPOT = TBT + W / (o - 1)
  <= slo.tbt_ms with probability q.
- colocated: b slots held for a prefill plus (o - 1) decode steps stretched by prefill stalls; prefill-first
  scheduling stalls running decodes for a fraction u_p of the time, so TPOT = TBT / (1 - u_p), and a new
  request waits for a slot (Erlang C) and for the current step before its prefill.
- KV transfers: every NIC and link is a FIFO server held for the whole transfer (M/D/1). A quarter of the
  TTFT slack and of the tail probability is reserved for these queues, split evenly over the source NIC,
  the destination NIC and the link; the caps follow from the M/D/1 mean wait, and the two NIC waits join
  the TTFT tail as one zero-or-exponential term of their summed mean.

Tails are computed, not assumed: the service time is the profile's own distribution
(`fleetplan.profiler.latency`, the one the simulator samples), integrated on a fixed grid of standard
normal quantiles, and the admissible arrival rate is found by bisection, vectorized over every use.
One instance is one queue here (join-shortest-queue across a pool only helps), so the rates are
conservative for pools of several instances.
"""

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr

from fleetplan.profiler.latency import quantile_grid_ms, quantile_params_array
from fleetplan.solver import bulk
from fleetplan.solver.scatter import window_dispersion, window_margin

KV_SHARE = 0.25  # of the TTFT slack, reserved for the mean waits of the KV transfer queues
# The KV reserve is shared in equal parts by the FIFO servers a transfer crosses: its source and destination
# NICs and every budgeted link on its way (UseTable.kv_links; kv_servers)
NIC_SERVERS = 2
RHO_MIN = 0.02  # a use admissible below this utilization is not worth a pool
NIC_FLOOR = 0.2  # a use whose KV transfers fit only below this NIC time share would throttle its pool
BISECTIONS = 40
# bisect_limit's relative precision: a route's predicted percentile is at most this share above the model's
# own, well inside verify's 1e-6 (about 31 evaluations from the SLO's bracket, against 40 from 20 x SLO)
LIMIT_PRECISION = 1e-9
# Admissible utilizations are grouped on the grid k / LEVELS of an instance's full-batch rate (the MILP's
# pool levels): on that grid the largest feasible point is found in ceil(log2(LEVELS + 1)) = 5 evaluations.
# For a decode use REFINE more halvings of its cell give the rate itself to 1 / (LEVELS 2^REFINE), and a
# decode level runs at the least such rate among its classes (headroom.headroom_levels). Prefill and
# colocated uses stay on the grid: there the rounding is margin the model needs (docs/formulation.md,
# "Headroom levels").
LEVELS = 20
REFINE = 3
# own_service takes a request's own batch size at these points of its distribution (the last: its largest)
MIX_BREAKS = np.array([0.9, 0.99, 0.999, 1.0])
NIC_STEPS = 8  # NIC utilizations tried per prefill use: k/8 of its mean-wait cap (nic_utilization)
# The SLO is planned at TAIL_MARGIN x its tail probability (p95 for a p90 SLO, p99.5 for p99): the promise
# is judged on 600 s windows, where the empirical percentile of a class of a few requests/s scatters by
# tens of ms, and the M/G/1 and Erlang C forms are approximations (docs/formulation.md, "Margin").
TAIL_MARGIN = 0.5
# The promise's window (../shared/design/capacity.md: 600 s after the warm-up). A slot wait is planned as
# M/D/c's (hold_factor) only where that window holds at least WINDOW_EPISODES of the slot queue's
# independent spells beyond the class's tail: epsilon x window / relaxation time (slot_relaxation_ms)
WINDOW_MS = 600e3
WINDOW_EPISODES = 10.0

_Z = np.arange(-5.0, 5.0 + 1e-9, 0.125)
_W = ndtr(np.append(_Z[1:], np.inf) - 0.0625) - ndtr(np.insert(_Z[:-1], 0, -np.inf) + 0.0625)
_W = _W / _W.sum()  # probability mass of each grid point (bins between midpoints; the ends take the tails)
# every fourth of those points: the grid of own_service's tail slots, which weigh 10% or less
_Z_TAIL = _Z[::4]
_W_TAIL = ndtr(np.append(_Z_TAIL[1:], np.inf) - 0.25) - ndtr(np.insert(_Z_TAIL[:-1], 0, -np.inf) + 0.25)
_W_TAIL = _W_TAIL / _W_TAIL.sum()
# every eighth (z = -5..5 by 1): the bulk-service chain's service grid (bulk_state)
_Z_BULK = _Z[::8]
_W_BULK = ndtr(np.append(_Z_BULK[1:], np.inf) - 0.5) - ndtr(np.insert(_Z_BULK[:-1], 0, -np.inf) + 0.5)
_W_BULK = _W_BULK / _W_BULK.sum()


@dataclass(frozen=True)
class Curves:
    """Latency percentiles of each use at its class's prompt, over the profiled batch sizes of its group.

    batches: (n_uses, K) profiled batch sizes, ascending, padded with +inf.
    ttft, tbt: (n_uses, K, 3) p50/p90/p99 in ms (NaN where not profiled), aligned with `batches`.
    """

    batches: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray

    def at(self, metric: str, n: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """(n_uses, 3) percentiles at (fractional) batch occupancy n: linear between profiled batches, the
        smallest profiled batch's figures below it (as the simulator does). `rows`: of those uses only
        (n aligned with them)."""
        values = self.ttft if metric == "ttft" else self.tbt
        rows = np.arange(len(n)) if rows is None else rows
        batches = self.batches[rows]
        k = (batches <= n[:, None]).sum(axis=1)
        hi = np.clip(k, 0, np.isfinite(batches).sum(axis=1) - 1)
        lo = np.clip(k - 1, 0, None)
        b_lo, b_hi = self.batches[rows, lo], self.batches[rows, hi]
        span = np.where(b_hi > b_lo, b_hi - b_lo, 1.0)
        frac = np.clip((n - b_lo) / span, 0.0, 1.0)[:, None]
        return values[rows, lo] + frac * (values[rows, hi] - values[rows, lo])


def service_grid(percentiles: np.ndarray, z: np.ndarray = _Z) -> np.ndarray:
    """(n, G) service times in ms at the grid quantiles z (the standard grid _Z unless given), from (n, 3)
    p50/p90/p99 (missing p50: the others)."""
    p50, p90, p99 = percentiles[:, 0], percentiles[:, 1], percentiles[:, 2]
    p50 = np.where(np.isfinite(p50), p50, np.where(np.isfinite(p90), p90, p99))
    return quantile_grid_ms(quantile_params_array(p50, p90, p99), z)


def moments(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and mean residual E[S^2] / (2 E[S]) of each row of a service grid."""
    mean = grid @ _W
    return mean, (grid**2 @ _W) / (2.0 * mean)


def tail(grid, limit, wait_prob, wait_mean, kv_prob=None, kv_mean=None, weights=None) -> np.ndarray:
    """P(S + W + V > limit) for S on `grid`, W = 0 w.p. 1 - wait_prob else exponential of mean `wait_mean`,
    and V (the KV queues, optional) likewise and independent: the sum of two exponentials is
    hypoexponential, P(E1 + E2 > r) = (m1 e^{-r/m1} - m2 e^{-r/m2}) / (m1 - m2). `weights`: the
    probability of each grid point per row (a mixture, `own_service`), else the standard grid's _W."""
    r = np.maximum(limit[:, None] - grid, 0.0)
    p1, m1 = wait_prob[:, None], np.maximum(wait_mean[:, None], 1e-12)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        e1 = np.exp(-r / m1)
        if kv_prob is None:
            out = p1 * e1
        else:
            p2, m2 = kv_prob[:, None], np.maximum(kv_mean[:, None], 1e-12)
            m2 = np.where(np.abs(m2 - m1) < 1e-9 * m1, m1 * (1 + 1e-6), m2)
            e2 = np.exp(-r / m2)
            both = (m1 * e1 - m2 * e2) / (m1 - m2)
            out = p1 * (1 - p2) * e1 + p2 * (1 - p1) * e2 + p1 * p2 * both
    out = np.where(np.isfinite(out), np.clip(out, 0.0, 1.0), 1.0)
    out = np.where(limit[:, None] - grid < 0, 1.0, out)
    return out @ _W if weights is None else (out * weights).sum(axis=1)


@dataclass(frozen=True)
class QueueWait:
    """A FIFO queue's wait in Benes's form: none with probability 1 - prob; else the sum of N >= 1 residual
    service times of scale x S (S the service on the request's own grid, its residual the equilibrium
    excess with density P(S > x) / E[S]), N geometric with mean `stretch` (inf: the queue is overloaded).
    For M/G/1 (prob = rho, stretch = 1 / (1 - rho), scale 1) it is the exact waiting time. `memoryless`
    rows take the residual as exponential of its mean E[S^2] / (2 E[S]): the wait is then zero-or-exponential
    of conditional mean scale E[S^2] / (2 E[S]) stretch (the batch wait of b > 1, `batch_wait`)."""

    prob: np.ndarray
    stretch: np.ndarray
    scale: np.ndarray
    memoryless: np.ndarray


class KvWait(NamedTuple):
    """The KV waits a prefill use's TTFT tail adds: the NIC queueing wait as a zero-or-exponential
    (probability, conditional mean ms) and `step` (ms, per row; None: none), how long each transfer of a
    batch-mate ahead of it in its own prefill batch holds the source NIC first. A batch's requests finish
    together and their transfers leave the instance's NIC one after another (simulator/kv.py), so a
    request j-th in a batch of k waits (j - 1) steps, each place 1 / k likely (`own_prefill`)."""

    prob: np.ndarray
    mean: np.ndarray
    step: np.ndarray | None = None


PLACE_GROUPS = 4  # a request's place in its prefill batch, for its batch-mates' KV transfers (own_prefill)


# The exact wait is computed on the window [0, limit] in WAIT_CELLS cells, each mass at its cell's upper end
# (so the discrete wait is never shorter than the one it stands for). The damping factor DAMP^k makes the
# mass beyond FFT_LENGTH (aliased back onto the window by the circular transform) count at most 1e-12; undoing
# it on the window multiplies round-off by at most 1e12^(WAIT_CELLS / FFT_LENGTH) = 1e6 (to ~1e-10).
WAIT_CELLS = 256
FFT_LENGTH = 512
_DAMP = np.exp(-np.log(1e12) / FFT_LENGTH) ** np.arange(WAIT_CELLS + 1)


def residual_pmf(grid: np.ndarray, scale: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """(n, WAIT_CELLS + 1) distribution of scale x the residual of S on `grid`, in cells of `cell` ms (index
    k: the mass in ((k - 1) cell, k cell]; beyond the window dropped). The residual of a service S is
    uniform on [0, s] for s drawn with probability w s / E[S], so each grid point s adds a box of height
    w / (scale E[S]) on [0, scale s]: a full cell gets w cell / (scale E[S]), the box's last one its part."""
    n, cells = grid.shape[0], WAIT_CELLS
    scale = np.maximum(np.broadcast_to(scale, (n,)), 1e-300)
    mean = grid @ _W
    some = mean > 0  # a service of 0 has a residual of 0: all its mass in cell 0
    mean = np.where(some, mean, 1.0)
    ends = np.where(some[:, None], scale[:, None] * grid / cell[:, None], 0.0)  # box ends, in cells
    full = np.minimum(np.floor(ends), cells).astype(np.int64)
    per_cell = _W[None, :] * (cell / (scale * mean))[:, None]
    rows = np.repeat(np.arange(n) * (cells + 1), grid.shape[1]).reshape(grid.shape)
    # full cells 0 .. full - 1: +per_cell from cell 0, -per_cell from cell `full` on (a running sum)
    steps = np.bincount((rows + full).ravel(), (-per_cell).ravel(), n * (cells + 1)).reshape(n, cells + 1)
    steps[:, 0] += per_cell.sum(axis=1)
    part = np.where(full < cells, per_cell * (ends - full), 0.0)
    parts = np.bincount((rows + full).ravel(), part.ravel(), n * (cells + 1))
    mass = np.cumsum(steps, axis=1) + parts.reshape(n, cells + 1)
    out = np.zeros((n, cells + 1))
    out[:, 1:] = np.where(some[:, None], np.clip(mass[:, :cells], 0.0, None), 0.0)  # masses at upper ends
    out[:, 0] = np.where(some, 0.0, 1.0)
    return out


def _exponential_pmf(prob: np.ndarray, mean: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Zero w.p. 1 - prob, else exponential of `mean`, on `residual_pmf`'s cells (masses at upper ends)."""
    edges = np.arange(WAIT_CELLS + 1) * cell[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        survival = np.exp(-edges / np.maximum(mean, 1e-12)[:, None])
    out = np.zeros_like(edges)
    out[:, 0] = 1.0 - prob
    out[:, 1:] = prob[:, None] * (survival[:, :-1] - survival[:, 1:])
    return out


def queue_tail(grid, limit, wait: QueueWait, other=None, memo: dict | None = None, own=None) -> np.ndarray:
    """P(S + W + V > limit) for S on `grid`, W a `QueueWait` on S's residual and V (optional, independent)
    zero-or-exponential given as (probability, conditional mean); 1 where the queue is overloaded. `own`:
    the service of the rows with b > 1 as a mixture over the batch sizes (`own_service`; those rows are
    memoryless), which replaces `grid` there (`_mixture_tail`).

    Memoryless rows: the closed form of two zero-or-exponential waits (`tail`). The others on the window
    [0, limit] in WAIT_CELLS cells (`_window`, `_compound_tail`). `memo`: a dict kept across calls whose
    grid, limit, share and V are the same on those rows (a bisection over the load at b = 1, where the
    batch is one request at every load): their window is computed once."""
    limit = np.asarray(limit, dtype=float)
    overloaded = ~np.isfinite(wait.stretch)
    exact = ~np.broadcast_to(wait.memoryless, overloaded.shape)
    out = np.ones(len(limit))
    m = ~exact & ~overloaded
    if m.any():
        mixture = np.zeros(len(limit), dtype=bool)
        if own is not None:
            mixture[own[0]] = True
        plain = m & ~mixture
        if plain.any():
            v = (None, None) if other is None else (other[0][plain], other[1][plain])
            mean = wait.scale[plain] * moments(grid[plain])[1] * wait.stretch[plain]
            out[plain] = tail(grid[plain], limit[plain], wait.prob[plain], mean, *v)
        if (m & mixture).any():
            _mixture_tail(out, m, limit, wait, other, own)
    if exact.any():
        window = None if memo is None else memo.get("window")
        if window is None:
            v = None if other is None else (other[0][exact], other[1][exact])
            window = _window(grid[exact], limit[exact], wait.scale[exact], v)
            if memo is not None:
                memo["window"] = window
        live = ~overloaded[exact]
        rows = np.flatnonzero(exact)[live]
        out[rows] = _compound_tail(window, live, wait.prob[rows], wait.stretch[rows])
    return np.where(overloaded, 1.0, out)


def _mixture_tail(out, m, limit, wait: QueueWait, other, own: tuple) -> None:
    """queue_tail's memoryless rows among `own`'s (b > 1), written into `out`: the service a mixture over
    the batch sizes (`own_service`), the residual that of the batch in service, E[S^2] / (2 E[S]) over
    the batches' sizes."""
    rows, mixed, mine, batches, _ = own
    keep = m[rows]
    rows, mixed, mine, batches = rows[keep], mixed[keep], mine[keep], batches[keep]
    residual = (mixed**2 * batches).sum(axis=1) / (2.0 * (mixed * batches).sum(axis=1))
    mean = wait.scale[rows] * residual * wait.stretch[rows]
    v = (None, None) if other is None else (other[0][rows], other[1][rows])
    own_time, mine = own_prefill(own, np.flatnonzero(keep), other)
    out[rows] = tail(own_time, limit[rows], wait.prob[rows], mean, *v, weights=mine)


def own_prefill(own: tuple, at: np.ndarray, kv: tuple | None) -> tuple[np.ndarray, np.ndarray]:
    """(grid, weights): the request's own time to its KV transfer on `own`'s rows `at` (`own_service`),
    its batch's prefill and, where `kv` has a step (KvWait), the steps of its batch-mates' transfers ahead
    of it. The j-th of a batch of k waits j - 1 steps, each place 1 / k likely: the places are taken in
    PLACE_GROUPS groups of equal share, each at its last place (exact up to k = PLACE_GROUPS, long
    beyond), so the grid is PLACE_GROUPS copies of the service's, shifted, side by side."""
    grid, weights, size = own[1][at], own[2][at], own[4][at]
    step = getattr(kv, "step", None)
    if step is None or not (step[own[0][at]] > 0).any():
        return grid, weights
    step = step[own[0][at], None]
    upper = [np.ceil((g + 1) * size / PLACE_GROUPS) for g in range(PLACE_GROUPS)]
    lower = [np.zeros_like(size), *upper[:-1]]
    shifted = [grid + (u - 1.0) * step for u in upper]
    shares = [weights * (u - lo) / size for u, lo in zip(upper, lower, strict=True)]
    return np.concatenate(shifted, axis=1), np.concatenate(shares, axis=1)


def _window(grid, limit, scale, other) -> tuple:
    """What the exact route reads that the load does not change, on [0, limit] in WAIT_CELLS cells: the
    damped transforms of the residual (`residual_pmf`) and of V (None without one), and for each grid
    point s the cell where limit - s falls (floored: conservative, as the masses are rounded up) and
    whether it is >= 0."""
    cell = np.maximum(limit, 1e-9) / WAIT_CELLS
    residual = np.fft.rfft(residual_pmf(grid, scale, cell) * _DAMP, FFT_LENGTH)
    v = None if other is None else _exponential_transform(*other, cell)
    return (residual, v, *_room_cells(limit, grid, cell))


def _exponential_transform(prob: np.ndarray, mean: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """The damped transform of a zero-or-exponential wait on the window's cells (`_exponential_pmf`)."""
    return np.fft.rfft(_exponential_pmf(prob, mean, cell) * _DAMP, FFT_LENGTH)


def _room_cells(limit: np.ndarray, service: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each service grid point s: the window cell where limit - s falls (floored: conservative, as the
    masses are rounded up) and whether limit - s >= 0."""
    room = limit[:, None] - service
    return np.clip(np.floor(room / cell[:, None]), 0, WAIT_CELLS).astype(np.int64), room >= 0


def _beyond(transform: np.ndarray, at: np.ndarray, inside: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """P(S + X > limit) from X's damped transform on the window and S's grid (`_room_cells`), S's points
    weighted by `weights`: the standard grid's (G,) or per row (n, G)."""
    pmf = np.fft.irfft(transform, FFT_LENGTH)[:, : WAIT_CELLS + 1] / _DAMP
    cdf = np.clip(np.cumsum(pmf, axis=1), 0.0, 1.0)
    reached = np.where(inside, np.take_along_axis(cdf, at, axis=1), 0.0)
    within = reached @ weights if weights.ndim == 1 else (reached * weights).sum(axis=1)
    return np.clip(1.0 - within, 0.0, 1.0)


def _compound_tail(window: tuple, rows: np.ndarray, prob: np.ndarray, stretch: np.ndarray) -> np.ndarray:
    """queue_tail on the `rows` of a `_window`: W's transform is (1 - prob) + prob (1 - p) R / (1 - p R),
    p = 1 - 1 / stretch (N geometric, P(N = k) = (1 - p) p^(k - 1)), times V's; P(S + W + V <= limit) is
    the cumulative distribution of W + V at limit - s, averaged over S's grid."""
    if not rows.all():
        window = tuple(None if a is None else a[rows] for a in window)
    residual, v, at, inside = window
    p = (1.0 - 1.0 / np.maximum(stretch, 1.0))[:, None]
    # in place, one (n, FFT_LENGTH / 2 + 1) array: (1 - prob) + prob (1 - p) R / (1 - p R), times V
    transform = np.multiply(residual, p)
    np.subtract(1.0, transform, out=transform)
    np.divide(residual, transform, out=transform)
    transform *= prob[:, None] * (1.0 - p)
    transform += (1.0 - prob)[:, None]
    if v is not None:
        transform *= v
    return _beyond(transform, at, inside, _W)


def _instances(servers: np.ndarray | None):
    """Instances behind join-shortest-queue, at least 1 (None: one, the MILP's view)."""
    return 1 if servers is None else np.maximum(np.asarray(servers, dtype=np.int64), 1)


def slot_wait_prob(slots: np.ndarray, load: np.ndarray, servers: np.ndarray | None) -> np.ndarray:
    """Probability that an arrival finds every slot held: Erlang C over the b slots of one instance, or
    over the c b slots of c instances behind join-shortest-queue (offered load c a)."""
    c = _instances(servers)
    return erlang_c(slots * c, np.minimum(load * c, slots * c - 1e-9))


def pooled_wait_prob(busy: np.ndarray, servers: np.ndarray | None) -> np.ndarray:
    """Probability that an arrival finds all of c instances busy when each is busy with probability `busy`:
    Erlang C, C(c, c busy) (= busy at c = 1). Under join-shortest-queue an arrival waits only then; how
    long it then waits is `queue_stretch`'s (docs/formulation.md, "Pools of several instances")."""
    if servers is None:
        return busy
    c = _instances(servers)
    pooled = erlang_c(c, np.minimum(c * busy, c - 1e-9))
    return np.where(c > 1, np.where(busy < 1.0, pooled, 1.0), busy)


def queue_stretch(rho: np.ndarray, servers: np.ndarray | None) -> np.ndarray:
    """How many times its first free server's wait a request that must wait waits on average.

    One instance (`servers` None or 1): 1 / (1 - rho), the M/G/1 (Pollaczek-Khinchine) and M/M/b forms,
    whose conditional wait is the residual over 1 - rho. Behind join-shortest-queue over c instances
    (docs/formulation.md, "Pools of several instances"): the request joins the shortest of c queues, so it
    waits for its own instance to free once (the residual) and then for what is queued there, about 1 / c
    of the pool's queue, whose mean in units of the residual is rho / (1 - rho) when every server is busy:
    1 + rho / (c (1 - rho)). At c = 1 both forms agree; as c grows the wait tends to one residual (M/M/c
    with a central queue would promise 1 / (c (1 - rho)), which the simulated JSQ tails exceed)."""
    rho = np.minimum(rho, 1.0 - 1e-9)
    return 1.0 + rho / (_instances(servers) * (1.0 - rho))


def erlang_c(servers: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Probability of waiting in M/M/c with c = servers (integer array) and offered load a < c."""
    blocking = np.ones_like(load)
    for k in range(1, int(servers.max(initial=1)) + 1):
        step = load * blocking / (k + load * blocking)
        blocking = np.where(k <= servers, step, blocking)
    rho = load / servers
    return np.clip(blocking / (1.0 - rho * (1.0 - blocking)), 0.0, 1.0)


def bisect_rate(
    feasible, upper: np.ndarray, levels: int | None = None, refine: int = 0, probe: bool = False
) -> np.ndarray:
    """The largest rate in (0, upper) where `feasible(rate)` holds, elementwise (feasible is monotone).

    With `levels`, only the grid k / levels x upper (k = 0..levels) is searched: the largest feasible grid
    point (0 if none), exactly what rounding the continuous answer down to that grid gives; then `refine`
    halvings of the cell above it: the answer rounded down to 1 / (levels 2^refine) of upper, never below
    the grid point (so flooring it to the grid gives the grid point back). `probe` (with `levels`): only
    whether the lowest grid point is feasible, that point or 0 (what decides whether a use is admitted at
    all, in one evaluation instead of a search)."""
    if levels is not None and probe:
        lowest = upper / levels
        return np.where(feasible(lowest), lowest, 0.0)
    if levels is not None:
        return _bisect_grid(feasible, upper, levels, refine)
    lo, hi = np.zeros_like(upper), upper.copy()
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        ok = feasible(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo


def _bisect_grid(feasible, upper: np.ndarray, levels: int, refine: int) -> np.ndarray:
    lo = np.zeros(upper.shape, dtype=np.int64)  # largest grid point known feasible (k = 0: nothing admitted)
    hi = np.full(upper.shape, levels + 1, dtype=np.int64)  # smallest known infeasible (levels + 1: none yet)
    while (open_ := hi - lo > 1).any():
        mid = (lo + hi) // 2
        ok = feasible(np.minimum(mid, levels) / levels * upper)
        lo, hi = np.where(open_ & ok, mid, lo), np.where(open_ & ~ok, mid, hi)
    # the cell above the grid point (none at the top: upper itself is feasible)
    low, high = lo / levels * upper, np.minimum(lo + 1, levels) / levels * upper
    for _ in range(refine):
        mid = 0.5 * (low + high)
        ok = feasible(mid) & (lo < levels)
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    return low


def batch_fixed_point(
    rate: np.ndarray, curves: Curves, batch: np.ndarray, extra_ms: np.ndarray
) -> np.ndarray:
    """Batch occupancy n* = clip(rate (E[S(n*)] + extra), 1, b): what arrives during a batch is the next.

    Iterated from n = 1 on the uses not yet at their fixed point (to 1e-12 relative), at most 12 times;
    at b = 1 the batch is one request."""
    rate, batch, extra_ms = np.broadcast_arrays(
        *(np.asarray(a, dtype=float) for a in (rate, batch, extra_ms))
    )
    n = np.ones(rate.shape)
    active = np.flatnonzero(batch > 1)
    for _ in range(12):
        if len(active) == 0:
            break
        mean = service_grid(curves.at("ttft", n[active], active)) @ _W
        new = np.clip(rate[active] * (mean + extra_ms[active]) / 1e3, 1.0, batch[active])
        moved = ~np.isclose(new, n[active], rtol=1e-12, atol=0.0)
        n[active] = new
        active = active[moved]
    return n


def own_batch(rate, mean_ms, extra_ms, batch) -> tuple[np.ndarray, np.ndarray]:
    """(batches, own), each (n, B + 1): the probability that a batch has k = 0..B requests (0 never), and
    that a request is prefilled in a batch of k, B the largest b; all of it at k = 1 where b = 1.

    A batch takes whoever waits when the server turns to prefill, up to b (simulator/engine.py,
    start_prefill). With the model's own reading of batch formation (batch_fixed_point: what arrives
    during one batch is the next) a batch has K = clip(A, 1, b) requests, A Poisson of mean rate (E[S(n*)]
    + extra). A request is k times likelier to be in a batch of k than a batch is to be of k (the
    inspection paradox): P*(k) = k P(K = k) / E[K]. At the tail that matters: at a mean batch of 1.2 a p99
    request of a long prompt is often prefilled in a batch of three or four."""
    rate, mean_ms, extra_ms, batch = np.broadcast_arrays(
        *(np.asarray(a, dtype=float) for a in (rate, mean_ms, extra_ms, batch))
    )
    b = batch.astype(np.int64)
    k = np.arange(int(b.max(initial=1)) + 1)
    pmf = bulk.poisson_pmf(np.maximum(rate * (mean_ms + extra_ms) / 1e3, 1e-12), len(k))
    cdf = np.cumsum(pmf, axis=1)
    rows = np.arange(len(b))
    p = np.where(k[None, :] < b[:, None], pmf, 0.0)
    p[:, 0] = 0.0
    p[:, 1] = np.where(b > 1, cdf[:, 1], 0.0)  # A <= 1: a batch of one
    p[rows, b] += np.where(b > 1, np.clip(1.0 - cdf[rows, b - 1], 0.0, 1.0), 1.0)  # A >= b: a full one
    p = p / p.sum(axis=1, keepdims=True)
    biased = p * k[None, :]
    return p, biased / biased.sum(axis=1, keepdims=True)


# --- prefill ----------------------------------------------------------------------------------------------


def batch_wait(rate, curves, batch, n, grid, share=1.0, full_mean=None, servers=None) -> QueueWait:
    """The wait for the prefill batches ahead of a request, batches of n* forming (docs/formulation.md,
    "Capacity model", "Prefill waits").

    The instance is busy with probability U = rate E[S(n*)] / n* (identically 1 while n* is strictly
    between 1 and b: greedy batching keeps a loaded server busy). A request then waits N >= 1 residual batch
    times (`QueueWait`), N geometric of mean 1 / (1 - rho_b): the queue builds only once batches are full,
    rho_b = rate E[S(b)] / b (the load against full-batch capacity). At b = 1 this is the M/G/1 waiting time
    exactly (Benes: P(W <= t) = (1 - rho) sum_k rho^k R^{*k}(t)); with b > 1 it keeps the batching gain that
    U alone would lose, and the residual is taken as memoryless (the wait zero-or-exponential of the same
    mean): the batch ahead's size and the request's own batch formation spread a bulk-service wait beyond
    a sum of residuals. `full_mean` (E[S(b)], `full_batch_mean`) may be passed in when the same uses are
    evaluated at many rates. `share` scales the residual (the longest class that may be ahead).

    `servers` (c >= 1 instances behind join-shortest-queue, each at `rate`): a request waits only when every
    instance is busy, with the Erlang C probability C(c, c U) in place of U (`pooled_wait_prob`), and N has
    JSQ's mean, 1 + rho_b / (c (1 - rho_b)) (`queue_stretch`)."""
    mean = grid @ _W
    busy = pooled_wait_prob(np.clip(rate * mean / (1e3 * n), 0.0, 1.0), servers)
    full_mean = full_batch_mean(curves, batch) if full_mean is None else full_mean
    rho_b = rate * full_mean / (1e3 * batch)
    stretch = np.where(rho_b < 1.0, queue_stretch(rho_b, servers), np.inf)
    scale = np.broadcast_to(share, stretch.shape)
    return QueueWait(np.where(rho_b < 1.0, busy, 1.0), stretch, scale, np.asarray(batch) > 1)


def full_batch_mean(curves, batch) -> np.ndarray:
    """E[S(b)] in ms: the mean prefill time of a full batch of each use."""
    return moments(service_grid(curves.at("ttft", batch)))[0]


def prefill_tail(
    rate,
    curves,
    batch,
    limit_ms,
    kv=None,
    share=1.0,
    full_mean=None,
    servers=None,
    memo=None,
    grids=None,
    mixture=True,
    epsilon=None,
):
    """P(TTFT > limit) for one prefill instance at `rate` requests/s (batch-as-job M/G/1; with b > 1 also
    the bulk-service queue, `bulk_state`), with the KV queueing wait `kv` = (probability, conditional
    mean) added where the KV cache moves. `memo` as `queue_tail`'s, `grids` as `own_service`'s; `mixture`
    false: the request's own batch at the mean occupancy (no `own_service`) and the b > 1 wait in its
    memoryless form alone (nic_utilization's trials, which only rank alternatives). With `epsilon`, the
    bulk-service chain runs only where the memoryless form's tail exceeds it (the smaller tail counts)."""
    state = prefill_state(rate, curves, batch, share, full_mean, servers, grids, mixture)
    out = prefill_tail_at(state, limit_ms, kv, memo)
    if not mixture:
        return out
    rows = np.asarray(batch) > 1
    if epsilon is not None:
        rows &= out > epsilon
    if rows.any():
        chain = bulk_state(rate, curves, batch, share, limit_ms, grids, rows)
        out = np.minimum(out, chain_tail(state, chain, limit_ms, kv, out))
    return out


def prefill_state(
    rate, curves, batch, share=1.0, full_mean=None, servers=None, grids=None, mixture=True, horizon=None
) -> tuple:
    """What the TTFT tail of a prefill instance at `rate` needs and the limit does not change: the service
    grid at the batch occupancy n*, the wait for the batches ahead (`batch_wait`), the request's own
    batch (`own_service`) and, with a `horizon` (ms: the longest TTFT of interest), the bulk-service wait
    of the uses with b > 1 (`bulk_state`)."""
    n = batch_fixed_point(rate, curves, batch, np.zeros_like(rate))
    grid = service_grid(curves.at("ttft", n))
    own = own_service(curves, rate, grid, 0.0, batch, grids) if mixture else None
    wait = batch_wait(rate, curves, batch, n, grid, share, full_mean, servers)
    chain = None if horizon is None else bulk_state(rate, curves, batch, share, horizon, grids)
    return grid, wait, own, chain


def bulk_state(rate, curves, batch, share, horizon, memo=None, rows=None) -> list | None:
    """The bulk-service wait (fleetplan/solver/bulk.py) of the uses with b > 1 (of `rows`, a mask, when
    given), per batch size: a list of (rows, BulkWait, Window), the window [0, horizon] in WAIT_CELLS
    cells; None where none batches. `memo` keeps each batch size's service grids across the rates of one
    bisection (`_sized_grid`, on the grid _Z_BULK)."""
    batch = np.asarray(batch)
    batched = np.flatnonzero(batch > 1)  # the rows own_service's grids (and `memo`) are kept for
    chosen = batch > 1 if rows is None else (batch > 1) & rows
    multi = np.flatnonzero(chosen)
    if not len(multi):
        return None
    rate = np.broadcast_to(np.asarray(rate, dtype=float), batch.shape)
    share = np.broadcast_to(np.asarray(share, dtype=float), batch.shape)
    horizon = np.broadcast_to(np.asarray(horizon, dtype=float), batch.shape)
    out = []
    for b in np.unique(batch[multi]).astype(int):
        at = multi[batch[multi] == b]
        pos = np.searchsorted(batched, at)
        every = [np.full(len(batched), k) for k in range(1, b + 1)]
        sized = [_sized_grid(curves, batched, k, _Z_BULK, memo)[pos] for k in every]
        service = np.stack([np.zeros((len(at), len(_Z_BULK))), *sized], axis=1)
        window = bulk.Window(np.maximum(horizon[at], 1e-9) / WAIT_CELLS, WAIT_CELLS, _DAMP, FFT_LENGTH)
        out.append((at, bulk.wait_pmf(rate[at] / 1e3, service, _W_BULK, b, share[at], window), window))
    return out


def own_service(curves, rate, grid, extra_ms, batch, memo=None) -> tuple | None:
    """The prefill times of the uses with b > 1 as a mixture over the batch sizes (`own_batch`): (their
    rows, grid, own weights, batch weights), a queue_tail `own`; None where every b is 1 (a batch of one
    request: `grid` itself). The request's own batch size is taken in slots: slot s holds the requests
    between the MIX_BREAKS[s - 1] and MIX_BREAKS[s] points of its size-biased distribution and is
    evaluated at the largest size among them (a larger batch takes longer, so each slot errs long). The
    slots' service grids side by side, the first on the standard grid and the tail slots (10% of the
    requests in all) on every fourth of its points, weighted by the slot's share for the request's own
    batch and by P(K in slot s) for a batch in service (whose residual a waiting request sees). `memo`: a
    dict kept across the calls of one bisection (the same curves and batches, other rates), where each
    slot's service grid at each whole batch size is computed once (`_sized_grid`)."""
    multi = np.flatnonzero(np.asarray(batch) > 1)
    if not len(multi):
        return None
    extra = np.broadcast_to(np.asarray(extra_ms, dtype=float), np.shape(rate))[multi]
    batches, own = own_batch(rate[multi], grid[multi] @ _W, extra, np.asarray(batch)[multi])
    cdf = np.cumsum(own, axis=1)
    # per row and slot: the least k whose size-biased cdf reaches the slot's upper break
    sizes = np.argmax(cdf[:, None, :] >= MIX_BREAKS[None, :, None] - 1e-12, axis=2)
    points = [_W] + [_W_TAIL] * (len(MIX_BREAKS) - 1)
    slots = [
        _sized_grid(curves, multi, sizes[:, s], _Z if s == 0 else _Z_TAIL, memo) for s in range(len(points))
    ]
    share = np.diff(MIX_BREAKS, prepend=0.0)
    reached = np.take_along_axis(np.cumsum(batches, axis=1), sizes, axis=1)
    in_slot = np.diff(reached, axis=1, prepend=0.0)
    mine = np.concatenate(
        [np.broadcast_to(share[s] * w, (len(multi), len(w))) for s, w in enumerate(points)], axis=1
    )
    theirs = np.concatenate([in_slot[:, s, None] * w[None, :] for s, w in enumerate(points)], axis=1)
    # each column's own batch size (own_prefill puts a request behind its batch-mates' KV transfers)
    size = np.concatenate([np.repeat(sizes[:, s, None], len(w), axis=1) for s, w in enumerate(points)], 1)
    return multi, np.concatenate(slots, axis=1), mine, theirs, size.astype(float)


def _sized_grid(curves, multi: np.ndarray, sizes: np.ndarray, z: np.ndarray, memo: dict | None) -> np.ndarray:
    """The service grids on quantiles `z` of the uses `multi` at whole batch sizes `sizes` (one per use).
    With `memo` each size is computed once for every use of `multi` and kept, per grid (`z`'s length:
    81, 21 or 11 points) and size (the rate moves a use's sizes between evaluations, never the grid at a
    size; every caller passes the uses with b > 1 as `multi`); without it, each use at its own size."""
    if memo is None:
        return service_grid(curves.at("ttft", sizes.astype(float), multi), z)
    out = np.empty((len(multi), len(z)))
    for k in np.unique(sizes):
        key = (len(z), int(k))
        if key not in memo:
            memo[key] = service_grid(curves.at("ttft", np.full(len(multi), float(k)), multi), z)
        chosen = sizes == k
        out[chosen] = memo[key][chosen]
    return out


def prefill_tail_at(state: tuple, limit_ms, kv=None, memo=None) -> np.ndarray:
    """P(TTFT > limit) from a `prefill_state` (1 where the batches overload the instance); `memo` as
    `queue_tail`'s. Uses with b > 1 that the state's bulk-service chain covers take the smaller of its
    tail (`chain_tail`) and the memoryless form's."""
    grid, wait, own, chain = state
    limit = np.broadcast_to(np.asarray(limit_ms, dtype=float), (len(grid),))
    out = queue_tail(grid, limit, wait, kv, memo, own)
    return out if chain is None else np.minimum(out, chain_tail(state, chain, limit, kv, out))


def chain_tail(state: tuple, chain: list | None, limit_ms, kv, otherwise: np.ndarray) -> np.ndarray:
    """`otherwise` with the rows of `chain` (bulk_state) that it covers replaced by their bulk-service tail
    (`bulk_tail`): the request's own prefill from the state's `own_service` (its grid where there is no
    mixture)."""
    grid, _, own, _ = state
    limit = np.broadcast_to(np.asarray(limit_ms, dtype=float), (len(grid),))
    out = otherwise.copy()
    for rows, wait_b, window in chain or ():
        if own is not None:
            at = np.searchsorted(own[0], rows)
            service, weights = own_prefill(own, at, kv)
        else:
            service, weights = grid[rows], np.broadcast_to(_W, grid[rows].shape)
        v = None if kv is None else (kv[0][rows], kv[1][rows])
        exact = bulk_tail(wait_b, window, limit[rows], v, service, weights)
        out[rows] = np.where(wait_b.covered, exact, out[rows])
    return out


def bulk_tail(wait: bulk.BulkWait, window: bulk.Window, limit, kv, service, weights) -> np.ndarray:
    """P(W + S + V > limit): W the bulk-service wait (its transform on `window`), S the request's own
    prefill (`service` with per-row `weights`), V the KV waits (zero-or-exponential, or None). Every mass
    at its cell's upper end; what falls beyond the window fails."""
    transform = wait.transform
    if kv is not None:
        transform = transform * _exponential_transform(kv[0], kv[1], window.cell)
    return _beyond(transform, *_room_cells(limit, service, window.cell), weights)


def prefill_admissible(
    curves,
    batch,
    limit_ms,
    epsilon,
    full_rate,
    kv=None,
    share=1.0,
    levels=None,
    servers=None,
    mixture=True,
    probe=False,
    window=None,
):
    """Largest per-instance rate (requests/s) keeping P(TTFT > limit) <= epsilon (on the grid k / levels
    of full_rate when `levels` is given). `mixture` as prefill_tail's: false only where the rate ranks
    alternatives and is not itself admitted (nic_utilization's trials). `window`: the class's requests
    in one judged window, where known (after the MILP: fleetplan/solver/window.py); epsilon is then
    tightened where that window's percentile would scatter beyond it (`window_epsilon`)."""
    full_grid = service_grid(curves.at("ttft", batch))  # one full batch's (full_batch_mean's)
    full_mean = moments(full_grid)[0]

    memo: dict = {}  # at b = 1 the service, limit, share and KV wait are the same at every rate
    grids: dict = {}  # at b > 1 the service grid at each whole batch size (own_service)

    def ok(rate):
        if window is None:
            planned = epsilon
        else:
            planned = prefill_window_epsilon(epsilon, rate, curves, batch, window, full_grid)
        tail_ = prefill_tail(
            rate, curves, batch, limit_ms, kv, share, full_mean, servers, memo, grids, mixture, planned
        )
        return tail_ <= planned

    return bisect_rate(ok, full_rate, levels, probe=probe)


# --- decode -----------------------------------------------------------------------------------------------


def decode_tail(rate, tbt_grid, hold_ms, slots, steps, limit_ms, share=1.0, servers=None, epsilon=None):
    """P(TPOT > limit) for one decode instance: TPOT = TBT + W / steps, W the slot wait (with `servers` =
    c instances behind join-shortest-queue: waiting with the probability of c b slots all held,
    `slot_wait_prob`, and then for a slot of its own instance, `queue_stretch`), its mean as M/M/b's times
    `hold_factor` for a class planned at tail probability `epsilon` (None: M/M/b's)."""
    load = rate * hold_ms / 1e3
    ok = load < slots
    c = np.where(ok, slot_wait_prob(slots, load, servers), 1.0)
    # share: longest holder ahead; a slot frees every hold / slots, stretched by what is queued
    wait_mean = share * hold_ms / slots * queue_stretch(load / slots, servers) / steps
    if epsilon is not None:
        wait_mean = wait_mean * hold_factor(load / slots, slots, hold_cv2(tbt_grid), epsilon, hold_ms)
    return np.where(ok, tail(tbt_grid, limit_ms, c, wait_mean), 1.0)


def hold_cv2(grid: np.ndarray) -> np.ndarray:
    """Squared coefficient of variation of one draw on a service grid: a slot's hold sums its decode
    segments' times, each one draw (simulator/engine.py, start_segment), so this bounds the hold's own."""
    mean, _ = moments(grid)
    return np.clip((grid**2 @ _W) / np.maximum(mean, 1e-12) ** 2 - 1.0, 0.0, 1.0)


def slot_relaxation_ms(rho, slots, cv2, hold_ms) -> np.ndarray:
    """How long the slot queue of one instance takes to forget where it was (ms): the heavy-traffic
    relaxation time 2 sigma^2 / delta^2 of its queue length as a reflected Brownian motion, drift delta =
    c mu (1 - rho) and variance sigma^2 = lambda + c mu cv2 ~ c mu (1 + cv2): (1 + cv2) hold / (c (1 - rho)^2)
    (Abate and Whitt 1987; for M/M/1 it is 4 / (mu (1 - rho)^2))."""
    c = np.maximum(np.asarray(slots, dtype=float), 1.0)
    gap = np.maximum(1.0 - np.asarray(rho, dtype=float), 1e-9)
    return (1.0 + cv2) * hold_ms / (c * gap**2)


def hold_factor(rho, slots, cv2, epsilon, hold_ms) -> np.ndarray:
    """The decode slot wait's mean over M/M/b's when holds are near-deterministic (docs/formulation.md,
    "Slot waits"): Cosmetatos's M/G/c interpolation cv2 + (1 - cv2) W(M/D/c) / W(M/M/c), with
    W(M/D/c) / W(M/M/c) = (1 + (1 - rho)(c - 1)(sqrt(4 + 5c) - 2) / (16 rho c)) / 2 (Cosmetatos 1976).
    With Erlang C's probability of waiting kept, the zero-or-exponential wait this gives reaches the exact
    M/D/c quantiles (Crommelin's chain) within a few percent, most of them above.

    That is the long-run tail; the promise is judged on one window. Where the window holds fewer than
    WINDOW_EPISODES spells of the queue beyond the tail (epsilon x WINDOW_MS / slot_relaxation_ms: a p99
    class, or a queue near saturation), its percentile scatters far above the long-run one, and M/M/b's
    heavier tail is kept (factor 1)."""
    c = np.maximum(np.asarray(slots, dtype=float), 1.0)
    rho = np.clip(rho, 1e-9, 1.0 - 1e-9)
    ratio = 0.5 * (1.0 + (1.0 - rho) * (c - 1.0) * (np.sqrt(4.0 + 5.0 * c) - 2.0) / (16.0 * rho * c))
    factor = cv2 + (1.0 - cv2) * np.minimum(ratio, 1.0)
    episodes = epsilon * WINDOW_MS / slot_relaxation_ms(rho, c, cv2, hold_ms)
    return np.where(episodes >= WINDOW_EPISODES, factor, 1.0)


def window_epsilon(epsilon, load, cv2, requests) -> np.ndarray:
    """A use's planned tail probability when its class has `requests` requests in one judged window:
    `epsilon` (TAIL_MARGIN of the class's tail) or less, where that window's count above the level would
    exceed the class's tail more than WINDOW_DELTA of the time (`window_margin`), the count's index of
    dispersion at the queue's `load` with service spread `cv2` (`window_dispersion`). Only ever tightens
    the margin, which also covers the model's approximations."""
    tail = np.asarray(epsilon, dtype=float) / TAIL_MARGIN
    margin = window_margin(window_dispersion(load, cv2), requests, tail)
    return np.minimum(epsilon, margin * tail)


def prefill_window_epsilon(epsilon, rate, curves, batch, requests, grid=None) -> np.ndarray:
    """`window_epsilon` of a prefill use at `rate`: its load against full-batch capacity, rho_b = rate
    E[S(b)] / b (batch_wait's: a batching server is busy at any load while its batches fill, but its queue
    builds, and its episodes last, only as rho_b nears 1; at b = 1 it is the busy fraction), with one full
    batch's squared CV. `grid`: that full batch's service grid where the caller has it (the same at every
    rate of a bisection)."""
    batch = np.asarray(batch, dtype=float)
    grid = service_grid(curves.at("ttft", batch)) if grid is None else grid
    rho_b = np.clip(np.asarray(rate, dtype=float) * moments(grid)[0] / (1e3 * batch), 0.0, 1.0)
    return window_epsilon(epsilon, rho_b, hold_cv2(grid), requests)


def decode_window_epsilon(epsilon, rate, curves, batch, steps, requests, grid=None) -> np.ndarray:
    """`window_epsilon` of a decode use at `rate`: its slot queue's load, rate H / b with H = steps E[TBT]
    (decode_tail's), and one step's squared CV (a hold's draws bound its own: hold_cv2). `grid`: the TBT
    service grid where the caller has it (the same at every rate of a bisection)."""
    grid = service_grid(curves.at("tbt", batch)) if grid is None else grid
    hold = np.maximum(steps, 1.0) * moments(grid)[0]
    load = np.clip(np.asarray(rate, dtype=float) * hold / (1e3 * np.asarray(batch, dtype=float)), 0.0, 1.0)
    return window_epsilon(epsilon, load, hold_cv2(grid), requests)


def use_window_epsilon(t: "UseTable", curves: Curves, rate: np.ndarray) -> np.ndarray:
    """Each use's planned tail probability at `rate` for its class's requests in one window (`t.window`):
    prefill and decode uses by their queues' loads; colocated uses keep `t.epsilon` (their TTFT form is
    optimistic near its knee, docs/formulation.md "Slot waits", and has no window form yet)."""
    out = np.asarray(t.epsilon, dtype=float).copy()
    pre, dec = t.role == "prefill", t.role == "decode"
    if pre.any():
        s, c = take_rows(t, pre), take_rows(curves, pre)
        out[pre] = prefill_window_epsilon(s.epsilon, rate[pre], c, s.batch, s.window)
    if dec.any():
        s, c = take_rows(t, dec), take_rows(curves, dec)
        out[dec] = decode_window_epsilon(s.epsilon, rate[dec], c, s.batch, s.steps, s.window)
    return out


# --- KV transfer queues -------------------------------------------------------------------------------


# --- per use -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UseTable:
    """What the capacity model reads per (class, pool) use, as aligned arrays (ms, requests/s, Gbit)."""

    w: np.ndarray  # class index
    role: np.ndarray  # "prefill" | "decode" | "colocated"
    batch: np.ndarray
    rate: np.ndarray  # the MILP's full-batch rate r per instance (requests/s)
    ttft_q: np.ndarray  # TTFT at the class percentile, full batch
    tbt_q: np.ndarray
    ttft_slo: np.ndarray
    tbt_slo: np.ndarray
    epsilon: np.ndarray  # 1 - q / 100
    steps: np.ndarray  # output_tokens - 1: decode steps after the first token
    t_kv: np.ndarray  # worst KV transfer time of a prefill use (to the slowest tier it reaches), else 0
    own_bw: np.ndarray  # NIC Gbit/s of one instance (inf: no NIC)
    min_bw: np.ndarray  # the slower end of its worst transfer
    kv_slack_ms: np.ndarray  # TTFT slack reserved for the KV queues (with_kv_reserve)
    # >= 1: how much longer than this class's own the service or slot holding time of the longest class
    # that may share its pool is; a FIFO wait is the residual of whoever is ahead, so waits scale by it
    share: np.ndarray
    # >= 1: the longest KV transfer that may hold the same NICs (classes sharing its pool shape), over its own
    kv_share: np.ndarray
    # budgeted link queues the use's transfers cross (0, 1 or 2: its (source, target) link budget, the
    # fleet's kv_budget_gbps for a move between device types; a decode use: the most among the prefill uses
    # that send to it; candidates.kv_links). They share the KV reserve with the two NICs (kv_servers), and
    # a prefill use's TTFT limit gives up their parts (link_reserve). None: one link
    kv_links: np.ndarray | None = None
    # NIC utilization cap per use (nic_utilization); None: the M/D/1 mean-wait cap alone
    nic_u: np.ndarray | None = None
    # instances behind join-shortest-queue in the use's pool (None: one; the MILP plans per instance)
    servers: np.ndarray | None = None
    # the class's requests in one judged window (served rps x WINDOW_MS), known once a plan exists (None:
    # the MILP's admission, which plans at TAIL_MARGIN alone; window_epsilon)
    window: np.ndarray | None = None


def with_kv_reserve(t: UseTable, curves: Curves) -> UseTable:
    """Reserve KV_SHARE of the TTFT slack for the KV queues of every use whose KV moves.

    A prefill use's slack is slo.ttft_ms - TTFT_q(1) - t_kv with its single-request prefill time (the
    service a lightly loaded instance gives; the prefill queue's own admissible load is then found with
    these KV waits inside the tail). A decode use (whose source is not known) gets the smallest reserve
    among its class's prefill uses."""
    # the class's own percentile column (p50, p90, p99) from its planned tail probability
    p50, p90 = t.epsilon >= 0.5 * TAIL_MARGIN * (1 - 1e-9), t.epsilon >= 0.05 * TAIL_MARGIN
    column = np.select([p50, p90], [0, 1], 2)
    single = curves.at("ttft", np.ones(len(t.rate)))
    single = np.where(
        np.isfinite(single[np.arange(len(column)), column]), single[np.arange(len(column)), column], t.ttft_q
    )
    prefill = (t.role == "prefill") & (t.t_kv > 0)
    slack = np.where(prefill, KV_SHARE * np.maximum(t.ttft_slo - single - t.t_kv, 0.0), np.inf)
    # prefill uses whose NICs could run only below NIC_FLOOR are dropped (nic_caps): they do not count
    kept = prefill & (md1_cap(t.t_kv * t.kv_share, slack / kv_servers(t)) >= NIC_FLOOR)
    by_class = np.full(int(t.w.max(initial=0)) + 1, np.inf)
    np.minimum.at(by_class, t.w[kept], slack[kept])
    decode = (t.role == "decode") & (t.t_kv > 0)
    slack = np.where(prefill, slack, np.where(decode, by_class[t.w], 0.0))
    slack = np.where(np.isfinite(slack), slack, 0.0)
    t = dataclasses.replace(t, kv_slack_ms=slack)
    return dataclasses.replace(t, nic_u=nic_utilization(t, curves))


def nic_utilization(t: UseTable, curves: Curves) -> np.ndarray:
    """The utilization each use allows its NICs.

    At most the M/D/1 cap whose mean wait fits the NIC's third of the KV reserve. For a prefill use, the
    fraction k/8 of that cap (k = 1..8, at or above NIC_FLOOR) that lets one instance carry the most:
    min(admissible prefill rate with both NICs at that utilization, what the NIC moves, u x 1000 / t_kv).
    At p99 a KV wait sized by its mean can alone break the percentile, and the prefill queue would then be
    admitted no load at all; a lower NIC cap trades transfer throughput for TTFT."""
    u = _mean_wait_nic_cap(t)
    pre = (t.role == "prefill") & (t.t_kv > 0)
    if not pre.any():
        return u
    # every trial fraction k / NIC_STEPS of every prefill use in one vectorized bisection (rows: k-major)
    fractions = np.repeat(np.arange(NIC_STEPS, 0, -1) / NIC_STEPS, pre.sum())
    trial = np.tile(u[pre], NIC_STEPS) * fractions
    # below NIC_FLOOR the use would be dropped (nic_caps): only the mean-wait cap itself is kept there, and
    # the trials below it are not evaluated
    tried = (trial >= NIC_FLOOR) | (fractions == 1.0)
    rows = np.tile(np.flatnonzero(pre), NIC_STEPS)[tried]
    s, c = take_rows(t, rows), take_rows(curves, rows)
    limit = s.ttft_slo - s.t_kv - link_reserve(s)
    kv = _two_nic_wait(trial[tried], s.t_kv * s.kv_share)
    carried = np.full(len(trial), -1.0)
    carried[tried] = np.minimum(
        prefill_admissible(c, s.batch, limit, s.epsilon, s.rate, kv, s.share, LEVELS, mixture=False),
        trial[tried] * 1e3 / s.t_kv,
    )
    carried = carried.reshape(NIC_STEPS, -1)
    trial = trial.reshape(NIC_STEPS, -1)
    # the most carried; among equals the largest utilization (the first row, k = NIC_STEPS, on ties)
    best = np.argmax(carried >= carried.max(axis=0) * (1 - 1e-9) - 1e-12, axis=0)
    out = u.copy()
    out[pre] = trial[best, np.arange(trial.shape[1])]
    return out


def rates(t: UseTable, curves: Curves, levels: int | None = None, probe: bool = False) -> np.ndarray:
    """Admissible requests/s per instance for every use (the SLO percentile holds with the waits); with
    `levels`, the largest such rate on the grid k / levels of the full-batch rate (`bisect_rate`); with
    `probe` too, only the lowest grid point where it is admissible (else 0)."""
    out = np.zeros(len(t.rate))
    for role, fn in (("prefill", _prefill_rates), ("decode", _decode_rates), ("colocated", _colocated_rates)):
        mask = t.role == role
        if mask.any():
            out[mask] = fn(take_rows(t, mask), take_rows(curves, mask), levels, probe)
    return out


def kv_servers(t: UseTable) -> np.ndarray:
    """How many FIFO servers share each use's KV reserve: its two NICs and the budgeted links its transfers
    cross (one link where `kv_links` is not given)."""
    return NIC_SERVERS + _links(t)


def _links(t: UseTable) -> np.ndarray:
    return np.ones(len(t.rate)) if t.kv_links is None else t.kv_links


def link_reserve(t: UseTable) -> np.ndarray:
    """The part of a prefill use's TTFT held back for the link queues its KV crosses (ms): one equal part of
    its KV reserve per link (a link's wait is capped by that part: candidates.link_headroom). A transfer
    that crosses no budgeted link waits for no link (the simulator has no queue there), so its reserve is
    the two NICs' alone and no TTFT is held back."""
    return np.where(t.t_kv > 0, _links(t) * t.kv_slack_ms / kv_servers(t), 0.0)


def _prefill_rates(t: UseTable, curves: Curves, levels: int | None, probe: bool = False) -> np.ndarray:
    # the KV cache crosses the two NICs at their caps: those waits join the TTFT tail; a link budget's
    # share of the reserve is taken off the limit
    limit = t.ttft_slo - t.t_kv - link_reserve(t)
    kv = kv_wait(t)
    return prefill_admissible(
        curves,
        t.batch,
        limit,
        t.epsilon,
        t.rate,
        kv,
        t.share,
        levels,
        t.servers,
        probe=probe,
        window=t.window,
    )


def _decode_rates(t: UseTable, curves: Curves, levels: int | None, probe: bool = False) -> np.ndarray:
    tbt_grid = service_grid(curves.at("tbt", t.batch))
    mean, _ = moments(tbt_grid)
    steps = np.maximum(t.steps, 1.0)
    hold = steps * mean
    slots = t.batch.astype(np.int64)

    def ok(rate):
        planned = t.epsilon
        if t.window is not None:
            planned = decode_window_epsilon(t.epsilon, rate, curves, t.batch, t.steps, t.window, tbt_grid)
        tail_ = decode_tail(rate, tbt_grid, hold, slots, steps, t.tbt_slo, t.share, t.servers, planned)
        return tail_ <= planned

    return np.where(t.steps > 0, bisect_rate(ok, t.rate, levels, REFINE, probe), t.rate)


def _colocated_rates(t: UseTable, curves: Curves, levels: int | None, probe: bool = False) -> np.ndarray:
    """Both percentiles: TPOT = TBT / (1 - u_p) (prefill stalls) and TTFT = slot wait + step + prefill."""
    tbt_mean, _ = moments(service_grid(curves.at("tbt", t.batch)))
    stall_cap = np.clip(1.0 - t.tbt_q / t.tbt_slo, 0.0, 1.0)  # largest prefill share of the instance's time
    slots = t.batch.astype(np.int64)
    full_mean = full_batch_mean(curves, t.batch)
    grids: dict = {}  # own_service's service grids at whole batch sizes, across the bisection

    def ok(rate):
        n = batch_fixed_point(rate, curves, t.batch, tbt_mean)
        grid = service_grid(curves.at("ttft", n))
        prefill_mean, _ = moments(grid)
        stall = rate * prefill_mean / (1e3 * n)
        stretch = 1.0 / np.maximum(1.0 - stall, 1e-9)
        hold = prefill_mean + t.steps * tbt_mean * stretch
        load = rate * hold / 1e3
        fits = (load < slots) & (stall <= stall_cap)
        means = (prefill_mean, tbt_mean, hold)
        slot, batch = _colocated_waits(t, curves, rate, grid, n, means, slots, full_mean)
        own = own_service(curves, rate, grid, tbt_mean, t.batch, grids)
        return fits & (queue_tail(grid, t.ttft_slo - tbt_mean, batch, slot, own=own) <= t.epsilon)

    return bisect_rate(ok, t.rate, levels, probe=probe)


def cohort_hold(prefill_mean, steps, tbt_mean, slots, hold) -> np.ndarray:
    """How long the requests that fill a colocated instance's b slots hold them (ms): a request finds every
    slot held when b requests hold them at once, and under prefill first each of those decodes through the
    prefills of the others admitted while it runs, up to b - 1 of them, so the holds that fill the slots
    are longer than the mean `hold` (whose stall is the long-run share): E[S] + steps E[TBT] + (b - 1) E[S],
    and never below `hold` (docs/formulation.md, "Colocated slot waits")."""
    return np.maximum(hold, prefill_mean * slots + np.maximum(steps, 0.0) * tbt_mean)


def _colocated_waits(t: UseTable, curves, rate, grid, n, means, slots, full_mean=None) -> tuple:
    """A colocated request's two waits before its prefill ends, as `queue_tail` takes them: a free slot
    ((probability, conditional mean): Erlang C over the b slots at the load of the holds that fill them,
    `cohort_hold`, and M/M/b's conditional mean at the mean hold) and the prefill batches ahead
    (`batch_wait`, as for a prefill instance; prefill-first scheduling runs one batch at a time). `means`:
    the caller's (E[S(n*)] of `grid`, E[TBT], mean hold) in ms."""
    prefill_mean, tbt_mean, hold = means
    load = rate * hold / 1e3
    filling = cohort_hold(prefill_mean, t.steps, tbt_mean, slots, hold)
    slot_prob = slot_wait_prob(slots, rate * filling / 1e3, t.servers)
    # M/M/b's mean, not hold_factor's: the colocated TTFT is optimistic near its knee already (gen-26's
    # p90 class on a batch-4 TPU v5e at 4.09 requests/s: predicted 222 ms, 261 over 6000 s simulated;
    # with the factor 179), docs/formulation.md, "Slot waits"
    slot_mean = t.share * hold / slots * queue_stretch(load / slots, t.servers)
    return (slot_prob, slot_mean), batch_wait(rate, curves, t.batch, n, grid, t.share, full_mean, t.servers)


def md1_cap(service_ms: np.ndarray, allowance_ms: np.ndarray) -> np.ndarray:
    """Largest utilization of an M/D/1 server whose mean wait u (D / 2) / (1 - u) stays <= allowance."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(service_ms > 0, allowance_ms / (service_ms / 2.0), np.inf)
    return np.where(np.isfinite(x), x / (1.0 + np.where(np.isfinite(x), x, 0.0)), 1.0)


def link_cap(hold_ms: np.ndarray, allowance_ms: np.ndarray, epsilon: np.ndarray) -> np.ndarray:
    """Largest utilization of a FIFO link whose longest transfer takes `hold_ms`: its M/D/1 mean wait within
    the allowance (md1_cap) and its wait beyond the allowance no likelier than half the tail probability.
    The wait is taken as zero or exponential (probability u, conditional mean (D / 2) / (1 - u)); the M/D/1
    tail decays faster than that exponential, so the cap is conservative. A mean-sized cap alone let a p99
    class's 1.3 ms transfers queue behind 38 ms ones (predicted p99 TTFT 25 ms, simulated 185-203 ms)."""
    mean_cap = md1_cap(hold_ms, allowance_ms)

    def ok(u):
        with np.errstate(divide="ignore", over="ignore"):
            beyond = u * np.exp(-allowance_ms * (1.0 - u) / np.maximum(hold_ms / 2.0, 1e-12))
        return beyond <= 0.5 * epsilon

    return np.where(ok(mean_cap), mean_cap, bisect_rate(ok, mean_cap))


def kv_wait(t: UseTable) -> KvWait:
    """The KV waits of a use: the queueing wait of its two NICs at their caps, and behind each batch-mate's
    transfer the longest that may share its NIC (t_kv x kv_share; KvWait.step)."""
    return KvWait(*_two_nic_wait(_nic_u(t), t.t_kv * t.kv_share), t.t_kv * t.kv_share)


def _nic_u(t: UseTable) -> np.ndarray:
    return t.nic_u if t.nic_u is not None else _mean_wait_nic_cap(t)


def _mean_wait_nic_cap(t: UseTable) -> np.ndarray:
    """The M/D/1 utilization whose mean wait behind the longest transfer fits the NIC's reserve share."""
    return np.where(t.t_kv > 0, md1_cap(t.t_kv * t.kv_share, t.kv_slack_ms / kv_servers(t)), 0.0)


def _two_nic_wait(u: np.ndarray, longest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two FIFO servers at utilization u whose longest transfer is D: each waits with probability u, mean
    residual at most D / 2 over 1 - u; merged into one zero-or-exponential wait with the same mean.

    Not two independent M/D/1 waits in Benes's form (`QueueWait`): a transfer waits for both NICs to be free
    at once (simulator/kv.py), so each idles while it waits for the other and runs busier than u says;
    measured, that form let a p99 class sending 1024-token caches into Inferentia2 be predicted at 828 ms
    and simulated at 1001 ms against 1000 (docs/formulation.md, "Capacity model")."""
    prob = 1.0 - (1.0 - u) ** 2
    mean_total = 2.0 * u * (longest / 2.0) / np.maximum(1.0 - u, 1e-9)
    return prob, np.where(prob > 0, mean_total / np.maximum(prob, 1e-12), 0.0)


def nic_caps(t: UseTable) -> tuple[np.ndarray, np.ndarray]:
    """(largest NIC utilization as traffic / own NIC bandwidth, whether the use keeps its NICs usable).

    The cap is the M/D/1 utilization at which the mean wait stays within the NIC's share of the KV
    reserve, scaled by min_bw / own_bw because a transfer holds the NIC for kv / min(both ends). A use
    whose NICs could only run below NIC_FLOOR of their time would throttle its pool: it is not usable."""
    cap = np.where(t.t_kv > 0, _nic_u(t), 1.0)
    return cap * nic_speed(t), cap >= NIC_FLOOR


def nic_speed(t: UseTable) -> np.ndarray:
    """min_bw / own_bw (at most 1): how much of its own NIC's bandwidth a use's transfer runs at; its NIC
    is held 1 / nic_speed times as long as the traffic alone would say."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(t.own_bw) & np.isfinite(t.min_bw), t.min_bw / t.own_bw, 1.0)
    return np.clip(ratio, 0.0, 1.0)


def _rows(table, take):
    """A copy of a UseTable or Curves with `take` applied to every per-use array (None stays None)."""
    fields = {name: getattr(table, name) for name in table.__dataclass_fields__}
    return type(table)(**{name: None if a is None else take(a) for name, a in fields.items()})


def take_rows(table, rows: np.ndarray):
    """A UseTable or Curves of the given uses only (`rows`: a boolean mask or positions)."""
    return _rows(table, lambda a: a[rows])


# --- predictions at the planned load -----------------------------------------------------------------


def bisect_limit(
    tail_at, epsilon: np.ndarray, upper: np.ndarray, first: np.ndarray | None = None
) -> np.ndarray:
    """The smallest limit (ms) with tail_at(limit) <= epsilon, elementwise: a percentile of the latency,
    from above to within LIMIT_PRECISION of it (never below: only limits that keep the tail move `hi`).
    `first` (optional, ms): a likely bracket tried before halving (the SLO, which an admitted use keeps):
    where it holds the search starts from [0, first] instead of [0, upper]."""
    lo, hi = np.zeros_like(upper), upper.copy()
    if first is not None:
        first = np.minimum(first, upper)
        ok = tail_at(first) <= epsilon
        lo, hi = np.where(ok, lo, first), np.where(ok, first, hi)
    while (open_ := hi - lo > LIMIT_PRECISION * hi).any():
        mid = 0.5 * (lo + hi)
        ok = tail_at(mid) <= epsilon
        lo, hi = np.where(open_ & ~ok, mid, lo), np.where(open_ & ok, mid, hi)
    return hi


def predict(t: UseTable, curves: Curves, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TBT) at each use's SLO percentile when one instance takes `rate` requests/s of it, waits
    included: TTFT of prefill and colocated uses (prefill: without the KV transfer), TBT (TPOT) of decode
    and colocated uses; NaN where the role has no such latency or the instance would be overloaded."""
    ttft, tbt = np.full(len(rate), np.nan), np.full(len(rate), np.nan)
    upper = 20.0 * (t.ttft_slo + t.ttft_q) + 1e3
    pre = t.role == "prefill"
    if pre.any():
        s, c = take_rows(t, pre), take_rows(curves, pre)
        horizon = 2.0 * s.ttft_slo + s.ttft_q  # the bulk-service chain's reach (beyond it: memoryless)
        kv = kv_wait(s)
        state = prefill_state(rate[pre], c, s.batch, s.share, servers=s.servers, horizon=horizon)
        ttft[pre] = bisect_limit(
            lambda lim: prefill_tail_at(state, lim, kv), s.epsilon, upper[pre], s.ttft_slo
        )
    dec = (t.role == "decode") & (t.steps > 0)
    if dec.any():
        s, c = take_rows(t, dec), take_rows(curves, dec)
        grid = service_grid(c.at("tbt", s.batch))
        hold = s.steps * moments(grid)[0]
        slots, lam = s.batch.astype(np.int64), rate[dec]

        def tpot_tail(lim):
            return decode_tail(lam, grid, hold, slots, s.steps, lim, s.share, s.servers, s.epsilon)

        tbt[dec] = bisect_limit(tpot_tail, s.epsilon, 20.0 * s.tbt_slo + 1e3, s.tbt_slo)
    col = t.role == "colocated"
    if col.any():
        ttft[col], tbt[col] = _predict_colocated(take_rows(t, col), take_rows(curves, col), rate[col])
    return ttft, tbt


def _predict_colocated(t: UseTable, curves: Curves, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tbt_mean, _ = moments(service_grid(curves.at("tbt", t.batch)))
    n = batch_fixed_point(rate, curves, t.batch, tbt_mean)
    grid = service_grid(curves.at("ttft", n))
    prefill_mean, _ = moments(grid)
    stall = np.clip(rate * prefill_mean / (1e3 * n), 0.0, 1.0 - 1e-9)
    hold = prefill_mean + t.steps * tbt_mean / (1.0 - stall)
    slots = t.batch.astype(np.int64)
    slot, batch = _colocated_waits(t, curves, rate, grid, n, (prefill_mean, tbt_mean, hold), slots)
    own = own_service(curves, rate, grid, tbt_mean, t.batch)
    upper = 20.0 * (t.ttft_slo + t.ttft_q) + 1e3
    ttft = bisect_limit(
        lambda lim: queue_tail(grid, lim - tbt_mean, batch, slot, own=own), t.epsilon, upper, t.ttft_slo
    )
    overloaded = rate * hold / 1e3 >= slots
    return np.where(overloaded, np.nan, ttft), np.where(overloaded, np.nan, t.tbt_q / (1.0 - stall))
