"""How far one judged window's percentile scatters around the long-run tail the capacity model plans for.

The promise is judged on one 600 s window per seed (../shared/design/capacity.md), and the model plans each
class at TAIL_MARGIN x its tail probability (p95 for a p90 SLO, p99.5 for p99). Whether that margin covers
a window depends on how the window's exceedances cluster: behind a queue they come in bursts, so their
count in a window scatters far more than a binomial count would.

This bench measures it on the queue the simulator runs for a batch-1 prefill instance (FIFO, Poisson
arrivals, one service draw per request: an M/G/1, by Lindley's recursion), with the service drawn as the
simulator draws it (`fleetplan.profiler.latency.quantile_ms`, clipped at Z_CLIP) from a profile's p50, p90
and p99. Per load and percentile q it reports:

- the planned level L: the long-run quantile of TTFT (wait + service) at 1 - TAIL_MARGIN (1 - q / 100);
- P(window q-th percentile > L): how often one window breaks a class planned exactly at L;
- the count of requests above L per window: its mean and its index of dispersion (variance over mean; 1
  for independent exceedances, larger when they cluster);
- a negative binomial with that mean and dispersion: its P(count > (1 - q / 100) N), against the measured
  one, and the margin it would take to keep that probability at WINDOW_DELTA, with the measured index and
  with the capacity model's (`scatter.window_dispersion`);
- the level planned as the capacity model plans a prefill use (the smaller of TAIL_MARGIN and that
  margin, `capacity.window_epsilon`) and how often one window breaks it.

Run: `python -m bench.window_scatter` (about 10 s); `--windows` and `--loads` to change the grid. Results
go to bench/results/window_scatter-<UTC>.json; docs/formulation.md ("Margin") reads them.
"""

from __future__ import annotations

import argparse
import heapq
import time
from dataclasses import dataclass

import numpy as np

from bench.record import git_info, git_line, machine_info, machine_line, write_results
from fleetplan.profiler.latency import quantile_ms, quantile_params_array
from fleetplan.solver.capacity import TAIL_MARGIN, WINDOW_MS
from fleetplan.solver.scatter import WINDOW_DELTA, window_breaks, window_dispersion, window_margin

# mistral-7b, 1024-token prompts, one A6000 Ada (the analytic profile's p50/p90/p99, ms, at batch 1 and 4):
# a near-deterministic service, as the analytic profiles' prefills are; the same instance batching up to 4
# (the simulator's batch former: whoever waits when it turns to prefill, its time interpolated linearly
# over the profiled batches); and an exponential service of batch 1's mean for contrast
PROFILE = (148.719, 158.551, 166.565)
PROFILE_B4 = (593.377, 632.605, 664.582)


@dataclass(frozen=True)
class Server:
    name: str
    profile: tuple | None  # batch 1's (p50, p90, p99); None: exponential of PROFILE's mean
    batch: int = 1
    slots: int = 0  # > 0: a decode instance's slot queue (FIFO M/G/c), holds of HOLD_MS with PROFILE's spread


SERVERS = (
    Server("a6000 mistral-7b 1024 (lognormal)", PROFILE),
    Server("the same, batch 4", PROFILE, 4),
    Server("exponential, same mean", None),
    Server("decode: 4 slots, 1.5 s holds", PROFILE, slots=4),
)
HOLD_MS = 1500.0  # a 1B model's 255 decode steps of ~6 ms: one hold (the simulator draws once per segment)


def lindley_ttft(arrival_gap: np.ndarray, service: np.ndarray) -> np.ndarray:
    """TTFT = W + S of each request of a FIFO single server: W_{n+1} = max(0, W_n + S_n - A_{n+1}),
    as a running minimum of the partial sums (no Python loop)."""
    step = np.concatenate([[0.0], service[:-1] - arrival_gap[1:]])
    walk = np.cumsum(step)
    return walk - np.minimum.accumulate(np.minimum(walk, 0.0)) + service


def batch_params(batch: int) -> np.ndarray:
    """(batch + 1, 4) quantile params of a batch of k = 0..batch (row 0 unused), linear between the
    profiled batches 1 and 4 as the simulator's curves are."""
    k = np.arange(batch + 1, dtype=float)
    given = np.array([PROFILE, PROFILE_B4])
    at = [np.interp(k, [1.0, 4.0], given[:, j]) for j in range(3)]
    return quantile_params_array(*(np.maximum(a, 1e-3) for a in at))


def bulk_ttft(arrival: np.ndarray, z: np.ndarray, batch: int) -> np.ndarray:
    """TTFT of each request at a server that, when free, prefills whoever waits (up to `batch`) as one
    batch, one standard-normal draw per batch (simulator/engine.py, start_prefill)."""
    params = batch_params(batch)
    times = [quantile_ms(params[k], z) for k in range(batch + 1)]
    done = np.empty(len(arrival))
    free, i, n, b = 0.0, 0, len(arrival), 0
    while i < n:
        start = arrival[i] if arrival[i] > free else free
        k = 1
        while k < batch and i + k < n and arrival[i + k] <= start:
            k += 1
        free = start + times[k][b]
        done[i : i + k] = free
        i, b = i + k, b + 1
    return done - arrival


def slot_latency(arrival: np.ndarray, hold: np.ndarray, slots: int) -> np.ndarray:
    """Wait + hold of each request of a FIFO queue for `slots` servers (Kiefer-Wolfowitz: each takes the
    earliest free slot), the decode slot queue of simulator/engine.py's admit_decodes."""
    free = [0.0] * slots
    out = np.empty(len(arrival))
    for i, (t, h) in enumerate(zip(arrival.tolist(), hold.tolist(), strict=True)):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + h)
        out[i] = start + h - t
    return out


def server_ttft(server: Server, rng: np.random.Generator, lam: float, n: int, mean_ms: float) -> np.ndarray:
    gaps = rng.exponential(1.0 / lam, n)
    if server.slots:
        hold = draw_service(rng, server.profile, mean_ms, n) * (HOLD_MS / mean_ms)
        return slot_latency(np.cumsum(gaps), hold, server.slots)
    if server.batch > 1:
        return bulk_ttft(np.cumsum(gaps), rng.standard_normal(n), server.batch)
    return lindley_ttft(gaps, draw_service(rng, server.profile, mean_ms, n))


def draw_service(rng: np.random.Generator, profile: tuple | None, mean_ms: float, n: int) -> np.ndarray:
    if profile is None:
        return rng.exponential(mean_ms, n)
    params = quantile_params_array(*(np.array([v]) for v in profile))[0]
    return quantile_ms(params, rng.standard_normal(n))


def load_and_cv2(server: Server, lam: float) -> tuple[float, float]:
    """(rho_b, squared CV of one full batch's draw): what capacity.window_epsilon reads; rho_b the load
    against full-batch capacity, lam E[S(b)] / b (for slots: lam H / c and one hold's CV)."""
    if server.slots:
        draws = draw_service(np.random.default_rng(7), PROFILE, 0.0, 400_000)
        return lam * HOLD_MS / server.slots, float(draws.var() / draws.mean() ** 2)
    if server.profile is None:
        mean = float(draw_service(np.random.default_rng(7), PROFILE, 0.0, 400_000).mean())
        return lam * mean, 1.0
    full = (
        PROFILE
        if server.batch == 1
        else tuple(quantile_ms(batch_params(server.batch)[-1], [0.0, 1.2816, 2.3263]))
    )
    draws = draw_service(np.random.default_rng(7), full, 0.0, 400_000)
    return lam * float(draws.mean()) / server.batch, float(draws.var() / draws.mean() ** 2)


def scalar(fn, *args) -> float:
    return float(fn(*(np.array([a], dtype=float) for a in args))[0])


def measure(server: Server, load: float, windows: int, seed: int) -> list[dict]:
    """One server at one load (the arrival rate over its full-batch rate b / p90(S(b)), as the model's
    utilization; `rho_b` the load against full-batch capacity in mean service): both percentiles, from
    one sample path of `windows` back-to-back 600 s windows."""
    mean_ms = float(draw_service(np.random.default_rng(seed + 99), PROFILE, 0.0, 400_000).mean())
    full_ms = PROFILE[1] if server.batch == 1 else PROFILE_B4[1] / server.batch
    if server.slots:  # the load is the slot load itself
        full_ms = HOLD_MS / server.slots
    lam = load / full_ms  # per ms
    per_window = int(lam * WINDOW_MS)
    ttft = server_ttft(server, np.random.default_rng(seed), lam, per_window * windows, mean_ms)
    rho_b, cv2 = load_and_cv2(server, lam)
    out = []
    for q in (90, 99):
        tail = 1.0 - q / 100.0
        level = float(np.quantile(ttft, 1.0 - TAIL_MARGIN * tail))
        by_window = ttft.reshape(windows, per_window)
        count = (by_window > level).sum(axis=1)
        window_q = np.quantile(by_window, q / 100.0, axis=1)
        dispersion = float(count.var() / max(count.mean(), 1e-12))
        modelled = scalar(window_dispersion, rho_b, cv2)
        margin = scalar(window_margin, modelled, per_window, tail)
        guarded = float(np.quantile(ttft, 1.0 - min(margin, TAIL_MARGIN) * tail))
        out.append(
            {
                "service": server.name,
                "load": load,
                "rho_b": round(rho_b, 4),
                "percentile": q,
                "requests_per_window": per_window,
                "planned_level_ms": round(level, 1),
                "window_percentile_ms_p50": round(float(np.median(window_q)), 1),
                "window_percentile_ms_max": round(float(window_q.max()), 1),
                "p_window_breaks": round(float((window_q > level).mean()), 4),
                "count_mean": round(float(count.mean()), 2),
                "dispersion": round(dispersion, 2),
                "model_dispersion": round(modelled, 2),
                "nb_p_breaks": round(scalar(window_breaks, count.mean(), dispersion, tail * per_window), 4),
                "nb_margin": round(scalar(window_margin, dispersion, per_window, tail), 3),
                "model_margin": round(margin, 3),
                "guarded_level_ms": round(guarded, 1),
                "p_window_breaks_guarded": round(float((window_q > guarded).mean()), 4),
            }
        )
    return out


def render(rows: list[dict]) -> str:
    head = (
        f"{'service':34s} {'load':>4s} {'rho_b':>5s} {'q':>3s} {'N':>5s} {'level':>7s} {'win p50':>7s} "
        f"{'win max':>7s} {'P(break)':>8s} {'NB':>6s} {'disp':>6s} {'model':>6s} {'margin':>6s} "
        f"{'model':>6s} {'guarded':>7s} {'P':>6s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['service']:34s} {r['load']:4.2f} {r['rho_b']:5.2f} {r['percentile']:3d} "
            f"{r['requests_per_window']:5d} {r['planned_level_ms']:7.0f} "
            f"{r['window_percentile_ms_p50']:7.0f} {r['window_percentile_ms_max']:7.0f} "
            f"{r['p_window_breaks']:8.3f} {r['nb_p_breaks']:6.3f} {r['dispersion']:6.1f} "
            f"{r['model_dispersion']:6.1f} {r['nb_margin']:6.2f} {r['model_margin']:6.2f} "
            f"{r['guarded_level_ms']:7.0f} {r['p_window_breaks_guarded']:6.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1000, help="600 s windows per load (default 1000)")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = [
        row
        for server in SERVERS
        for load in args.loads
        for row in measure(server, load, args.windows, args.seed)
    ]
    machine, git = machine_info(), git_info()
    print(machine_line(machine))
    print(git_line(git))
    print(render(rows))
    print(
        f"TAIL_MARGIN {TAIL_MARGIN}; P(break): one window's percentile above the planned level; NB: a "
        f"negative binomial's P with the measured dispersion (disp; model: scatter.window_dispersion); "
        f"margin: the NB's for P <= {WINDOW_DELTA}, with the measured and the modelled dispersion; "
        f"guarded: the level planned at the smaller of TAIL_MARGIN and the modelled margin, P: its P(break)"
    )
    if not args.no_record:
        record = {
            "benchmark": "window_scatter",
            "machine": machine,
            "git": git,
            "args": vars(args),
            "tail_margin": TAIL_MARGIN,
            "delta": WINDOW_DELTA,
            "wall_s": round(time.perf_counter() - started, 2),
            "rows": rows,
        }
        print(f"recorded {write_results('window_scatter', record)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
