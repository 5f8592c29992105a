"""simulate(request, plan, table) -> SimulationReport: replay arrivals through a plan's pools.

A heap-based discrete-event loop (docs/simulation.md). Requests arrive (Poisson at each class's planned
rate x rate_scale, or from an Azure-format trace), are split over the class's routes with probability
rps / served (the plan's flows), join the shortest queue among the instances of the route's first pool, are
prefilled in dynamic batches, move their KV cache over FIFO NICs/links, and decode under continuous batching.

Hot-path choices: all randomness is drawn up front or from pre-drawn standard-normal buffers (numpy, in
blocks); per-request state lives in plain Python lists; a decode instance advances a whole *segment* of steps
(until the next request leaves, or until the next step boundary when a request must join) with one event,
so a 128-token request costs a handful of events, not 128.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from pathlib import Path

import numpy as np
import pandas as pd

from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.simulation import ClassMetrics, PoolMetrics, SimulationReport
from fleetplan.profiler.tables import ProfileTable

Z90 = 1.2815515655446004  # standard normal quantiles of 0.90 and 0.99
Z99 = 2.3263478740408408
Z_CLIP = 5.0  # |z| beyond this is clipped: guards against absurd tails from a steep p90->p99 segment
_BLOCK = 1 << 16

_PREFILL, _DECODE, _COLOCATED = 0, 1, 2
_ROLE_CODE = {"prefill": _PREFILL, "decode": _DECODE, "colocated": _COLOCATED}
_EV_PREFILL_DONE, _EV_SEGMENT_END, _EV_KV_DONE = 0, 1, 2


# --- latency model --------------------------------------------------------------------------------------


def quantile_params(p50: float, p90: float, p99: float) -> tuple[float, float, float, float]:
    """(log p50, slope below p90, log p90, slope above p90) in log-seconds per unit z, from ms percentiles.

    The sample is exp(piecewise-linear(z)) with z standard normal, through (0, log p50), (Z90, log p90),
    (Z99, log p99): it reproduces the three percentiles exactly, is lognormal with sigma = slope below
    p90 and continues the p90->p99 slope in the tail. Missing percentiles degrade gracefully: no p90 ->
    the p50->p99 slope; no p99 -> the p50->p90 slope; only p50 -> deterministic.
    """
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


def sample_ms(params: tuple[float, float, float, float], z: float) -> float:
    """One latency (ms) at standard-normal draw z; z = 0 gives p50."""
    l50, s_lo, l90, s_hi = params
    return 1e3 * (math.exp(l50 + s_lo * z) if z <= Z90 else math.exp(l90 + s_hi * (z - Z90)))


def _curve(table: ProfileTable, model: str, device: str, tp: int, prompt: int, metric: str, batch: int):
    """Per n = 1..batch: quantile params of `metric` at `prompt`, interpolated linearly in prompt (as the
    solver does) and then linearly over the profiled batch sizes; below the smallest profiled batch the
    smallest one's figures are used (conservative)."""
    frame = table.frame
    rows = frame[(frame["model"] == model) & (frame["device"] == device) & (frame["tp"] == tp)]
    if rows.empty:
        msg = f"no profile rows for {model}/{device}/tp{tp}"
        raise ValueError(msg)
    batches, values = [], []
    for b, group in rows.groupby("batch"):
        group = group.sort_values("prompt_tokens")
        xs = group["prompt_tokens"].to_numpy(float)
        if not xs[0] <= prompt <= xs[-1]:
            continue
        cols = [f"{metric}_ms_p{q}" for q in (50, 90, 99)]
        point = []
        for c in cols:
            ys = group[c].to_numpy(float)
            point.append(float(np.interp(prompt, xs, ys)) if np.isfinite(ys).all() else math.nan)
        if not np.isfinite(point[0]):
            continue
        batches.append(int(b))
        values.append(point)
    if not batches or max(batches) < batch:
        msg = f"no {metric} profile for {model}/{device}/tp{tp} up to batch {batch} at prompt {prompt}"
        raise ValueError(msg)
    bx = np.array(batches, float)
    vals = np.array(values, float)
    out = [None]
    for n in range(1, batch + 1):
        point = [
            float(np.interp(n, bx, vals[:, j])) if np.isfinite(vals[:, j]).all() else math.nan
            for j in range(3)
        ]
        out.append(quantile_params(*point))
    return out


# --- arrivals --------------------------------------------------------------------------------------------


def load_trace(source) -> pd.DataFrame:
    """An Azure LLM inference trace (CSV with TIMESTAMP, ContextTokens, GeneratedTokens) as columns
    t_s (seconds from the first row), prompt_tokens, output_tokens, sorted by time. `source` is a path or
    a DataFrame. TIMESTAMP may be a datetime string (the public traces) or a number of seconds."""
    frame = source if isinstance(source, pd.DataFrame) else pd.read_csv(Path(source))
    missing = [c for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if c not in frame.columns]
    if missing:
        msg = f"trace: missing column(s) {missing}; expected TIMESTAMP,ContextTokens,GeneratedTokens"
        raise ValueError(msg)
    stamps = frame["TIMESTAMP"]
    if pd.api.types.is_numeric_dtype(stamps):
        seconds = stamps.to_numpy(float)
    else:
        parsed = pd.to_datetime(stamps, format="mixed")
        seconds = (parsed - parsed.min()).dt.total_seconds().to_numpy(float)
    seconds = seconds - seconds.min()
    out = pd.DataFrame(
        {
            "t_s": seconds,
            "prompt_tokens": frame["ContextTokens"].to_numpy(np.int64).clip(1),
            "output_tokens": frame["GeneratedTokens"].to_numpy(np.int64).clip(1),
        }
    )
    return out.sort_values("t_s", kind="stable").reset_index(drop=True)


def map_trace_to_classes(request: PlanRequest, trace: pd.DataFrame) -> np.ndarray:
    """Index of the nearest workload class per trace row: smallest squared distance in
    (log prompt_tokens, log output_tokens), so 2x too long counts the same at any scale."""
    lp = np.log(np.array([w.prompt_tokens for w in request.workloads], float))
    lo = np.log(np.array([w.output_tokens for w in request.workloads], float))
    tp = np.log(trace["prompt_tokens"].to_numpy(float))[:, None]
    to = np.log(trace["output_tokens"].to_numpy(float))[:, None]
    return np.argmin((tp - lp) ** 2 + (to - lo) ** 2, axis=1)


# --- the plan as runtime tables ---------------------------------------------------------------------------


class _Pool:
    __slots__ = ("batch", "classes", "index", "instances", "pool", "role", "single", "tbt", "ttft")

    def __init__(self, index, pool):
        self.index = index
        self.pool = pool
        self.role = _ROLE_CODE[pool.role]
        self.batch = pool.batch
        self.classes: dict[int, int] = {}  # class index -> local index into ttft / tbt
        self.ttft: list = []
        self.tbt: list = []
        self.instances: list = []
        self.single = True


class _Inst:
    __slots__ = (
        "b",
        "batch",
        "busy",
        "inbound",
        "nic_bw",
        "nic_free",
        "phase",
        "pool",
        "queue",
        "role",
        "running",
        "seg_dt",
        "seg_k",
        "seg_start",
        "slot_time",
        "steps",
        "version",
        "device",
    )

    def __init__(self, pool: _Pool, nic_bw: float, device: str):
        self.pool = pool
        self.role = pool.role
        self.b = pool.batch
        self.queue: deque = deque()
        self.running: list = []
        self.batch: list = []
        self.phase = 0  # 0 idle, 1 prefill, 2 decode segment
        self.seg_start = self.seg_dt = 0.0
        self.seg_k = 0
        self.steps = 0
        self.version = 0
        self.inbound = 0
        self.busy = 0.0
        self.slot_time = 0.0
        self.nic_bw = nic_bw
        self.nic_free = 0.0
        self.device = device


def _pool_key(model_or_owner, role, device, tp, batch):
    return (model_or_owner, role, device, tp, batch)


def _build(request: PlanRequest, plan: Plan, table: ProfileTable):
    """Runtime pools, instances and per-class routes (cumulative probabilities, pools, KV gigabits)."""
    nic = {d.name: (math.inf if d.network_gbps is None else d.network_gbps) for d in request.devices}
    specs = request.model_specs()
    pools: list[_Pool] = []
    by_key: dict = {}
    for i, p in enumerate(plan.pools):
        rp = _Pool(i, p)
        for _ in range(p.instances):
            rp.instances.append(_Inst(rp, nic[p.device] * p.tp, p.device))
        pools.append(rp)
        by_key[_pool_key(p.workload or p.model, p.role, p.device, p.tp, p.batch)] = rp
    per_class = []
    for w_index, (w, result) in enumerate(zip(request.workloads, plan.workloads, strict=True)):
        owner = w.name if request.options.pooling == "class" else w.model
        kv_gbit = specs[w.model].kv_gbit(w.prompt_tokens)
        routes = []
        for route in result.routes:
            if route.rps <= 0:
                continue
            if route.colocated is not None:
                refs = [("colocated", route.colocated)]
            else:
                refs = [("prefill", route.prefill), ("decode", route.decode)]
            rt = []
            for role, ref in refs:
                key = _pool_key(owner, role, ref.device, ref.tp, ref.batch)
                if key not in by_key or not by_key[key].instances:
                    msg = f"class {w.name!r}: route uses pool {key} that the plan does not provision"
                    raise ValueError(msg)
                pool = by_key[key]
                if w_index not in pool.classes:
                    pool.classes[w_index] = len(pool.ttft)
                    pool.ttft.append(
                        _curve(table, w.model, ref.device, ref.tp, w.prompt_tokens, "ttft", ref.batch)
                    )
                    pool.tbt.append(
                        _curve(table, w.model, ref.device, ref.tp, w.prompt_tokens, "tbt", ref.batch)
                    )
                rt.append(pool)
            routes.append((route, rt))
        rps = np.array([r.rps for r, _ in routes], float)
        cum = (np.cumsum(rps) / rps.sum()).tolist() if len(rps) else []
        per_class.append((routes, cum, kv_gbit))
    for pool in pools:
        pool.single = len(pool.classes) <= 1
    links = {(lk.source, lk.target): [lk.gbps, 0.0] for lk in request.links}
    budget = None if request.kv_budget_gbps is None else [request.kv_budget_gbps, 0.0]
    return pools, per_class, links, budget


# --- the event loop ---------------------------------------------------------------------------------------


def simulate(  # noqa: C901, PLR0912, PLR0913, PLR0915
    request: PlanRequest,
    plan: Plan,
    table: ProfileTable,
    *,
    duration_s: float = 600.0,
    warmup_s: float = 60.0,
    seed: int = 0,
    rate_scale: float = 1.0,
    trace=None,
    deterministic: bool = False,
    drain_s: float | None = None,
    keep_samples: bool = False,
) -> SimulationReport:
    """Replay arrivals through `plan` and measure what requests arriving in [warmup_s, warmup_s + duration_s)
    get. Arrivals continue for `drain_s` after the window (default: 3x the largest SLO'd request time, at
    least 30 s) so the measured requests finish under load; any still unfinished count as SLO misses.
    `deterministic` draws every latency at its p50 (z = 0): service is then exactly the profile's median.
    `keep_samples` puts every measured request's TTFT and mean TBT into the report (for distribution plots).
    """
    began = time.perf_counter()
    if duration_s <= 0 or warmup_s < 0 or rate_scale <= 0:
        raise ValueError("duration_s > 0, warmup_s >= 0 and rate_scale > 0 are required")
    workloads = request.workloads
    n_cls = len(workloads)
    if drain_s is None:
        longest = max((w.slo.ttft_ms + w.output_tokens * w.slo.tbt_ms) / 1e3 for w in workloads)
        drain_s = max(30.0, 3.0 * longest)
    win_lo, win_hi = warmup_s, warmup_s + duration_s
    t_stop = win_hi + drain_s

    pools, per_class, links, budget = _build(request, plan, table)
    seeds = np.random.SeedSequence(seed).spawn(3)
    rng_arr, rng_route, rng_lat = (np.random.default_rng(s) for s in seeds)

    # Arrivals: times, classes, output tokens.
    served = np.array([sum(r.rps for r in res.routes) for res in plan.workloads], float)
    unrouted = 0
    if trace is None:
        source = "poisson"
        times, classes = [], []
        for c in range(n_cls):
            lam = served[c] * rate_scale
            if lam <= 0:
                continue
            count = int(rng_arr.poisson(lam * t_stop))
            times.append(np.sort(rng_arr.uniform(0.0, t_stop, count)))
            classes.append(np.full(count, c, np.int64))
        t_all = np.concatenate(times) if times else np.zeros(0)
        c_all = np.concatenate(classes) if classes else np.zeros(0, np.int64)
        order = np.argsort(t_all, kind="stable")
        t_all, c_all = t_all[order], c_all[order]
        o_all = np.array([w.output_tokens for w in workloads], np.int64)[c_all]
    else:
        source = "trace"
        frame = load_trace(trace)
        t_all = frame["t_s"].to_numpy(float) / rate_scale
        c_all = map_trace_to_classes(request, frame)
        o_all = frame["output_tokens"].to_numpy(np.int64)
        keep = t_all < t_stop
        routed = served[c_all] > 0
        unrouted = int((keep & ~routed & (t_all >= win_lo) & (t_all < win_hi)).sum())
        keep &= routed
        t_all, c_all, o_all = t_all[keep], c_all[keep], o_all[keep]
    n_req = len(t_all)
    # Route per request: inverse CDF over the class's cumulative route shares.
    u_route = rng_route.random(n_req)
    r_all = np.zeros(n_req, np.int64)
    for c in range(n_cls):
        mask = c_all == c
        if mask.any() and per_class[c][1]:
            r_all[mask] = np.minimum(
                np.searchsorted(per_class[c][1], u_route[mask], side="right"), len(per_class[c][1]) - 1
            )

    arr = t_all.tolist()
    cls = c_all.tolist()
    rix = r_all.tolist()
    out = o_all.tolist()
    t_start = [math.nan] * n_req
    t_first = [math.nan] * n_req
    t_done = [math.nan] * n_req
    t_ready = [math.nan] * n_req
    kv_ms = [0.0] * n_req
    d_wait = [0.0] * n_req
    finish = [0] * n_req
    dec_of: list = [None] * n_req

    zbuf: list = []
    zpos = [0]

    def draw() -> float:
        if deterministic:
            return 0.0
        if zpos[0] >= len(zbuf):
            zbuf[:] = np.clip(rng_lat.standard_normal(_BLOCK), -Z_CLIP, Z_CLIP).tolist()
            zpos[0] = 0
        z = zbuf[zpos[0]]
        zpos[0] += 1
        return z

    exp = math.exp
    heap: list = []
    push = heapq.heappush
    pop = heapq.heappop
    seq = 0
    events = 0

    def latency_s(pool: _Pool, curves, members, n: int) -> float:
        z = draw()
        if pool.single:
            l50, s_lo, l90, s_hi = curves[0][n]
            return exp(l50 + s_lo * z) if z <= Z90 else exp(l90 + s_hi * (z - Z90))
        local = pool.classes
        total = 0.0
        for r in members:
            l50, s_lo, l90, s_hi = curves[local[cls[r]]][n]
            total += exp(l50 + s_lo * z) if z <= Z90 else exp(l90 + s_hi * (z - Z90))
        return total / n

    def clip(a: float, b: float) -> float:
        lo = a if a > win_lo else win_lo
        hi = b if b < win_hi else win_hi
        return hi - lo if hi > lo else 0.0

    def start_segment(inst: _Inst, now: float) -> None:
        nonlocal seq
        running = inst.running
        n = len(running)
        k = min(finish[r] for r in running) - inst.steps
        dt = latency_s(inst.pool, inst.pool.tbt, running, n)
        inst.phase = 2
        inst.seg_start = now
        inst.seg_dt = dt
        inst.seg_k = k
        inst.version += 1
        seq += 1
        push(heap, (now + k * dt, seq, _EV_SEGMENT_END, inst, inst.version))

    def interrupt(inst: _Inst, now: float) -> None:
        """End the running segment at the next step boundary so a waiting request can join."""
        nonlocal seq
        j = int((now - inst.seg_start) / inst.seg_dt) + 1
        if j < inst.seg_k:
            inst.seg_k = j
            inst.version += 1
            seq += 1
            push(heap, (inst.seg_start + j * inst.seg_dt, seq, _EV_SEGMENT_END, inst, inst.version))

    def try_start(inst: _Inst, now: float) -> None:
        nonlocal seq
        queue = inst.queue
        role = inst.role
        if role == _DECODE:
            running = inst.running
            b = inst.b
            while queue and len(running) < b:
                r = queue.popleft()
                d_wait[r] = now - t_ready[r]
                finish[r] = inst.steps + out[r] - 1
                running.append(r)
            if running:
                start_segment(inst, now)
            else:
                inst.phase = 0
            return
        free = inst.b - len(inst.running) if role == _COLOCATED else inst.b
        if queue and free > 0:
            n = min(free, len(queue))
            batch = [queue.popleft() for _ in range(n)]
            for r in batch:
                t_start[r] = now
            dt = latency_s(inst.pool, inst.pool.ttft, batch, n)
            inst.batch = batch
            inst.phase = 1
            inst.seg_start = now
            seq += 1
            push(heap, (now + dt, seq, _EV_PREFILL_DONE, inst, 0))
        elif inst.running:
            start_segment(inst, now)
        else:
            inst.phase = 0

    def pick(pool: _Pool) -> _Inst:
        best = None
        best_load = 1 << 60
        for inst in pool.instances:
            ld = len(inst.queue) + len(inst.running) + len(inst.batch) + inst.inbound
            if ld < best_load:
                best, best_load = inst, ld
        return best

    def transfer(r: int, src: _Inst, dst: _Inst, now: float) -> float:
        """KV of request r from src to dst: store-and-forward over the source NIC, the destination NIC, the
        device-type link (if budgeted) and the fleet cross-type budget (if given), each a FIFO server."""
        gbit = per_class[cls[r]][2]
        bw = src.nic_bw if src.nic_bw < dst.nic_bw else dst.nic_bw
        t_nic = gbit / bw if bw < math.inf else 0.0
        start = now
        if t_nic > 0:
            start = max(start, src.nic_free, dst.nic_free)
        dur = t_nic
        link = links.get((src.device, dst.device))
        if link is not None and link[0] > 0:
            start = max(start, link[1])
            dur = max(dur, gbit / link[0])
        shared = budget if (budget is not None and src.device != dst.device and budget[0] > 0) else None
        if shared is not None:
            start = max(start, shared[1])
            dur = max(dur, gbit / shared[0])
        end = start + dur
        if t_nic > 0:
            src.nic_free = end
            dst.nic_free = end
        if link is not None and link[0] > 0:
            link[1] = end
        if shared is not None:
            shared[1] = end
        kv_ms[r] = 1e3 * (end - now)
        return end

    i = 0
    while True:
        if heap and (i >= n_req or heap[0][0] <= arr[i]):
            now, _, kind, a, b = pop(heap)
            if now > t_stop:
                break
            events += 1
            if kind == _EV_SEGMENT_END:
                inst = a
                if b != inst.version:
                    continue
                k = inst.seg_k
                inst.steps += k
                n = len(inst.running)
                inst.busy += clip(inst.seg_start, now)
                inst.slot_time += n * clip(inst.seg_start, now)
                steps = inst.steps
                keep = []
                for r in inst.running:
                    if finish[r] <= steps:
                        t_done[r] = now
                    else:
                        keep.append(r)
                inst.running = keep
                inst.phase = 0
                try_start(inst, now)
            elif kind == _EV_PREFILL_DONE:
                inst = a
                batch = inst.batch
                inst.batch = []
                inst.busy += clip(inst.seg_start, now)
                inst.slot_time += len(batch) * clip(inst.seg_start, now)
                inst.phase = 0
                if inst.role == _COLOCATED:
                    for r in batch:
                        t_first[r] = now
                        if out[r] <= 1:
                            t_done[r] = now
                        else:
                            finish[r] = inst.steps + out[r] - 1
                            inst.running.append(r)
                else:
                    for r in batch:
                        dpool = per_class[cls[r]][0][rix[r]][1][1]
                        dst = pick(dpool)
                        dst.inbound += 1
                        dec_of[r] = dst
                        seq += 1
                        push(heap, (transfer(r, inst, dst, now), seq, _EV_KV_DONE, r, 0))
                try_start(inst, now)
            else:  # KV landed
                r = a
                dst = dec_of[r]
                dst.inbound -= 1
                t_first[r] = now
                if out[r] <= 1:
                    t_done[r] = now
                    continue
                t_ready[r] = now
                dst.queue.append(r)
                if dst.phase == 0:
                    try_start(dst, now)
                elif len(dst.running) < dst.b:
                    interrupt(dst, now)
        elif i < n_req:
            r = i
            now = arr[i]
            i += 1
            events += 1
            inst = pick(per_class[cls[r]][0][rix[r]][1][0])
            inst.queue.append(r)
            if inst.phase == 0:
                try_start(inst, now)
            elif inst.role == _COLOCATED and inst.phase == 2 and len(inst.running) < inst.b:
                interrupt(inst, now)
        else:
            break

    return _report(
        request,
        plan,
        pools,
        locals_=dict(
            arr=t_all,
            cls=c_all,
            out=o_all,
            t_start=t_start,
            t_first=t_first,
            t_done=t_done,
            kv_ms=kv_ms,
            d_wait=d_wait,
            served=served,
        ),
        meta=dict(
            source=source,
            duration_s=duration_s,
            warmup_s=warmup_s,
            drain_s=drain_s,
            seed=seed,
            rate_scale=rate_scale,
            deterministic=deterministic,
            keep_samples=keep_samples,
            unrouted=unrouted,
            events=events,
            began=began,
        ),
    )


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if len(values) else None


def _report(request: PlanRequest, plan: Plan, pools, locals_, meta) -> SimulationReport:
    arr = locals_["arr"]
    cls = locals_["cls"]
    out = locals_["out"].astype(float)
    t_start = np.array(locals_["t_start"], float)
    t_first = np.array(locals_["t_first"], float)
    t_done = np.array(locals_["t_done"], float)
    kv_ms = np.array(locals_["kv_ms"], float)
    d_wait = np.array(locals_["d_wait"], float)
    served = locals_["served"]
    duration = meta["duration_s"]
    win_lo, win_hi = meta["warmup_s"], meta["warmup_s"] + duration
    measured = (arr >= win_lo) & (arr < win_hi)
    done = np.isfinite(t_done)
    ttft = 1e3 * (t_first - arr)
    tbt = np.where(out > 1, 1e3 * (t_done - t_first) / np.maximum(out - 1, 1), 0.0)
    wait = 1e3 * (t_start - arr)
    classes = []
    total_met = 0
    total_arrivals = int(measured.sum())
    for c, (w, res) in enumerate(zip(request.workloads, plan.workloads, strict=True)):
        m = measured & (cls == c)
        md = m & done
        met = md & (ttft <= w.slo.ttft_ms) & (tbt <= w.slo.tbt_ms)
        n_m, n_done, n_met = int(m.sum()), int(md.sum()), int(met.sum())
        total_met += n_met
        q = w.slo.percentile
        tt, tb = ttft[md], tbt[md]
        slo_met = bool(
            n_done
            and n_done == n_m
            and np.percentile(tt, q) <= w.slo.ttft_ms
            and np.percentile(tb, q) <= w.slo.tbt_ms
        )
        decoded = md & np.isfinite(t_start)
        classes.append(
            ClassMetrics(
                name=w.name,
                offered_rps=round(float(served[c]) * meta["rate_scale"], 6)
                if meta["source"] == "poisson"
                else round(n_m / duration, 6),
                predicted_rps=float(res.served_rps),
                arrivals=n_m,
                completed=n_done,
                ttft_ms_p50=_pct(tt, 50),
                ttft_ms_p90=_pct(tt, 90),
                ttft_ms_p99=_pct(tt, 99),
                tbt_ms_p50=_pct(tb, 50),
                tbt_ms_p90=_pct(tb, 90),
                tbt_ms_p99=_pct(tb, 99),
                predicted_ttft_ms=max((r.ttft_ms for r in res.routes), default=None),
                predicted_tbt_ms=max((r.tbt_ms for r in res.routes), default=None),
                slo_percentile=q,
                slo_ttft_ms=w.slo.ttft_ms,
                slo_tbt_ms=w.slo.tbt_ms,
                attainment=round(n_met / n_m, 6) if n_m else 1.0,
                slo_met=slo_met,
                goodput_rps=round(n_met / duration, 6),
                mean_queue_wait_ms=round(float(wait[decoded].mean()), 4) if decoded.any() else None,
                mean_decode_wait_ms=round(float(d_wait[md].mean()) * 1e3, 4) if n_done else None,
                mean_kv_transfer_ms=round(float(kv_ms[md].mean()), 4) if n_done else None,
                ttft_ms_samples=np.round(tt, 3).tolist() if meta["keep_samples"] else None,
                tbt_ms_samples=np.round(tb, 3).tolist() if meta["keep_samples"] else None,
            )
        )
    pool_metrics = []
    for rp in pools:
        p = rp.pool
        n = max(len(rp.instances), 1)
        busy = sum(inst.busy for inst in rp.instances) / (n * duration)
        slots = sum(inst.slot_time for inst in rp.instances) / (n * p.batch * duration)
        pool_metrics.append(
            PoolMetrics(
                model=p.model,
                role=p.role,
                device=p.device,
                tp=p.tp,
                batch=p.batch,
                instances=p.instances,
                workload=p.workload,
                utilization_predicted=p.utilization,
                utilization_simulated=round(busy, 6),
                occupancy_simulated=round(slots, 6),
            )
        )
    return SimulationReport(
        engine="heap",
        arrivals_source=meta["source"],
        duration_s=duration,
        warmup_s=meta["warmup_s"],
        drain_s=meta["drain_s"],
        seed=meta["seed"],
        rate_scale=meta["rate_scale"],
        deterministic=meta["deterministic"],
        offered_rps=round(total_arrivals / duration, 6),
        goodput_rps=round(total_met / duration, 6),
        predicted_goodput_rps=float(plan.slo_rps),
        attainment=round(total_met / total_arrivals, 6) if total_arrivals else 1.0,
        arrivals=total_arrivals,
        completed=int((measured & done).sum()),
        unrouted=meta["unrouted"],
        events=meta["events"],
        wall_ms=round(1e3 * (time.perf_counter() - meta["began"]), 3),
        classes=classes,
        pools=pool_metrics,
    )


__all__ = ["load_trace", "map_trace_to_classes", "quantile_params", "sample_ms", "simulate"]
