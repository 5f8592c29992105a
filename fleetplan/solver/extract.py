"""Solution vector -> the parts of a Plan: instances, utilization, routes, device and link use."""

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fleetplan.models.plan import DeviceUse, LinkUse, Pool, PoolRef, Route
from fleetplan.solver.candidates import Candidates, predicted_latency, transfer_ms
from fleetplan.solver.formulation import Columns

EPS = 1e-7
# The promise is judged per class on a 600 s window (docs/simulation.md): a class served only in part, at a
# rate that allows fewer than MIN_TAIL_REQUESTS requests beyond its percentile in one window, has that
# percentile read off the window's slowest request (gen-22's 0.01 RPS sliver of a p90 class: 6 requests in a
# window, 0.6 allowed beyond its p90; it broke on one seed of three). Such a sliver is reported unserved
# (sliver_classes).
WINDOW_S = 600.0
MIN_TAIL_REQUESTS = 1.0


@dataclass(frozen=True)
class Solution:
    """Instances per pool and RPS per use, with idle instances already removed."""

    instances: np.ndarray
    flow: np.ndarray
    capacity_used: np.ndarray  # sum_w f / r per pool, in instances
    dropped: np.ndarray | None = None  # RPS per class dropped for running through pools with 0 instances
    slivers: np.ndarray | None = None  # per class: its partial service was a sliver, dropped (sliver_classes)


def capacity_used(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    """Per pool, the instance-loads its uses' flow takes: sum of f / r (the capacity rows' left side)."""
    uses = cand.uses
    return np.bincount(uses["pool"], weights=flow / uses["rate_rps"].to_numpy(), minlength=len(cand.pools))


def _nic_used(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    """KV Gbit/s through each pool's NICs (prefill: out, decode: in, colocated: none)."""
    uses = cand.uses
    kv = uses["kv_gbit"].to_numpy()
    moving = (uses["role"] != "colocated").to_numpy()
    return np.bincount(uses["pool"], weights=flow * kv * moving, minlength=len(cand.pools))


def solution_from(cand: Candidates, cols: Columns, values: np.ndarray) -> Solution:
    """Round x, clip flows at 0, drop instances no capacity or NIC constraint needs (they serve nothing)."""
    flow = np.clip(values[cols.use_offset : cols.chain_offset], 0.0, None)
    flow[flow < EPS] = 0.0
    x = np.round(values[: cols.n_pools]).astype(np.int64)
    pools = cand.pools
    rho = pools["rho"].to_numpy(float)
    used = capacity_used(cand, flow)
    nic = pools["device"].map(cand.devices.set_index("device")["nic_gbps"]).to_numpy()
    per_instance = pools["tp"].to_numpy(float) * nic * pools["nic_rho"].to_numpy(float)
    nic_need = np.where(np.isfinite(per_instance), _nic_used(cand, flow) / per_instance, 0.0)
    # a pool the window guard took to 0 headroom (solver/window.py) carries nothing and needs nothing
    load = np.divide(used, rho, out=np.where(used > 0, x.astype(float), 0.0), where=rho > 0)
    need = np.ceil(np.maximum(load, nic_need) - 1e-6).astype(np.int64)
    instances = np.minimum(x, need)
    if "pooled" in pools.columns:  # a pooled headroom (solver/pooled.py) holds only with all its instances
        instances = np.where((need > 0) & (pools["pooled"].to_numpy() > 1), x, instances)
    return without_orphan_flows(cand, Solution(instances, flow, used))


def served_by_class(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    """RPS per class in `flow` (per use): what its colocated and prefill uses carry (a decode use carries the
    same requests again)."""
    uses = cand.uses
    serves = uses["role"].isin(["colocated", "prefill"]).to_numpy()
    return np.bincount(uses["w"].to_numpy(), weights=flow * serves, minlength=len(cand.classes))


def sliver_classes(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    """Per class: served in part (max_goodput only) at fewer than MIN_TAIL_REQUESTS requests beyond its
    percentile per WINDOW_S. (max_min_fraction serves every class the same fraction, min_cost all of it.)"""
    classes = cand.classes
    if cand.request.options.objective != "max_goodput":
        return np.zeros(len(classes), dtype=bool)
    served = served_by_class(cand, flow)
    demand = classes["rate_rps"].to_numpy(float)
    beyond = served * WINDOW_S * (1.0 - classes["percentile"].to_numpy(float) / 100.0)
    return (served > 0) & (served < demand * (1 - 1e-6)) & (beyond < MIN_TAIL_REQUESTS)


def without_orphan_flows(cand: Candidates, sol: Solution) -> Solution:
    """No class is served through a pool with 0 instances, nor as a sliver (sliver_classes).

    Rounding x, and the 1e-6 slack on the instances a pool needs, can leave a pool with 0 instances and a
    tiny flow (within the solver's tolerances). Such flows, and every flow of a sliver class, are dropped
    to unserved; a prefill or decode flow that loses its other end with them is cut to what the KV matching
    still pairs up, and a pool left without flow keeps no instances. `dropped` is the RPS each class loses
    to pools with 0 instances (almost always nothing), `slivers` which classes were dropped as slivers.
    """
    uses = cand.uses.reset_index(drop=True)
    pool = uses["pool"].to_numpy()
    idle = (sol.instances[pool] == 0) & (sol.flow > 0)
    slivers = sliver_classes(cand, np.where(idle, 0.0, sol.flow))
    sliver_flow = slivers[uses["w"].to_numpy()] & (sol.flow > 0) & ~idle
    orphan = idle | sliver_flow
    dropped = np.zeros(len(cand.classes))
    if not orphan.any():
        return Solution(sol.instances, sol.flow, sol.capacity_used, dropped, slivers)
    flow = np.where(orphan, 0.0, sol.flow)
    frame = uses.assign(flow=flow)
    active = frame[(frame["flow"] > 0) & (frame["role"] != "colocated")]
    flow[(uses["role"] != "colocated").to_numpy()] = 0.0
    for p, d, rps in kv_pairs(active):
        flow[p] += rps
        flow[d] += rps
    instances = np.where(np.bincount(pool, weights=flow, minlength=len(cand.pools)) > 0, sol.instances, 0)
    dropped = served_by_class(cand, (sol.flow - flow) * ~sliver_flow)
    dropped = np.where(dropped > 1e-9, dropped, 0.0)
    return Solution(instances, flow, capacity_used(cand, flow), dropped, slivers)


def pool_groups(cand: Candidates, sol: Solution) -> np.ndarray:
    """Per pool: 0, or 1, 2, ... for further headroom levels or mixes of the same (owner, role, device, tp,
    batch) that the plan runs (highest headroom first, ties in pool order); they are separate groups of
    instances."""
    pools = cand.pools
    groups = np.zeros(len(pools), np.int64)
    on = np.flatnonzero(sol.instances > 0)
    on = on[np.argsort(-pools["rho"].to_numpy(float)[on], kind="stable")]
    chosen = pools.iloc[on]
    keys = zip(chosen["owner"], chosen["role"], chosen["device"], chosen["tp"], chosen["batch"], strict=True)
    seen: Counter[tuple] = Counter()
    for index, key in zip(on, keys, strict=True):
        groups[index] = seen[key]
        seen[key] += 1
    return groups


def pools_out(cand: Candidates, sol: Solution, groups: np.ndarray | None = None) -> list[Pool]:
    """The pools the plan runs (`groups`: pool_groups, when the caller has it)."""
    groups = pool_groups(cand, sol) if groups is None else groups
    on = np.flatnonzero(sol.instances > 0)
    pools = cand.pools.iloc[on]
    owners = pools["owner"] if cand.request.options.pooling == "class" else [None] * len(on)
    utilization = sol.capacity_used[on] / sol.instances[on]
    return [
        Pool(
            model=model,
            role=role,
            device=device,
            tp=int(tp),
            batch=int(batch),
            instances=int(sol.instances[index]),
            utilization=round(float(used), 6),
            workload=owner,
            headroom=float(rho),
            group=int(groups[index]),
        )
        for index, model, role, device, tp, batch, used, owner, rho in zip(
            on,
            pools["model"],
            pools["role"],
            pools["device"],
            pools["tp"].to_numpy(),
            pools["batch"].to_numpy(),
            utilization,
            owners,
            pools["rho"].to_numpy(float),
            strict=True,
        )
    ]


def _refs(active: pd.DataFrame, groups: np.ndarray) -> list[PoolRef]:
    """The pool each row of `active` runs on, as a route names it."""
    return [
        PoolRef(device=device, tp=int(tp), batch=int(batch), group=int(groups[pool]))
        for device, tp, batch, pool in zip(
            active["device"],
            active["tp"].to_numpy(),
            active["batch"].to_numpy(),
            active["pool"].to_numpy(),
            strict=True,
        )
    ]


def match_kv_flows(
    src_labels: np.ndarray,
    src_levels: np.ndarray,
    src_flows: np.ndarray,
    sink_labels: np.ndarray,
    sink_tiers: np.ndarray,
    sink_flows: np.ndarray,
) -> list[tuple[int, int, float]]:
    """Split aggregated prefill and decode flows of one (class, key) into (prefill, decode, rps) pairs;
    sources in the order given (by level), labels are what the pairs name.

    Reachable sets are nested (level l reaches tiers 0..l), so serving the most constrained sources first,
    from any sink they reach, never blocks a later source.
    """
    remaining = np.array(sink_flows, dtype=float)
    pairs = []
    for s_index, level, amount in zip(src_labels, src_levels, src_flows, strict=True):
        for k in np.flatnonzero(sink_tiers <= level)[::-1]:
            if amount <= EPS:
                break
            take = min(amount, remaining[k])
            if take > EPS:
                pairs.append((s_index, sink_labels[k], take))
                remaining[k] -= take
                amount -= take
    return pairs


def kv_pairs(frame: pd.DataFrame) -> list[tuple[int, int, float]]:
    """(prefill label, decode label, rps) of every KV pairing among the prefill and decode rows of `frame`
    (with `flow`), per (class, key) in order, each class's sources by level (match_kv_flows)."""
    if frame.empty:
        return []
    labels, role = frame.index.to_numpy(), frame["role"].to_numpy()
    level, tier = frame["level"].to_numpy(), frame["tier"].to_numpy()
    flow = frame["flow"].to_numpy(float)
    groups = frame.groupby(["w", "key"], sort=True).indices
    pairs = []
    for key in sorted(groups):
        at = groups[key]
        src, dst = at[role[at] == "prefill"], at[role[at] == "decode"]
        src = src[np.argsort(level[src], kind="stable")]
        pairs += match_kv_flows(labels[src], level[src], flow[src], labels[dst], tier[dst], flow[dst])
    return pairs


def predicted(cand: Candidates, sol: Solution, uses: pd.DataFrame) -> pd.DataFrame:
    """`uses` with pred_ttft_ms / pred_tbt_ms: the capacity model's percentile latencies, waits included,
    at the load the plan puts on one instance of each pool (its utilization times the class's rate)."""
    per_instance = sol.capacity_used / np.maximum(sol.instances, 1)
    pool = uses["pool"].to_numpy()
    if cand.request.options.capacity_model == "flat":  # v1: routes report service times, no waits
        nothing = np.full(len(uses), np.nan)
        return uses.assign(pred_ttft_ms=nothing, pred_tbt_ms=nothing)
    rate = per_instance[pool] * uses["rate_rps"].to_numpy(float)
    # `uses`: rows of cand.uses (their index is their position there)
    rows = uses.index.to_numpy()
    ttft, tbt = predicted_latency(cand, rows, rate, servers=np.maximum(sol.instances[pool], 1))
    return uses.assign(pred_ttft_ms=ttft, pred_tbt_ms=tbt)


def _finite(value: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(value), value, fallback)


def routes_out(cand: Candidates, sol: Solution, groups: np.ndarray | None = None) -> dict[int, list[Route]]:
    """Routes per class index, with latencies at the class's SLO percentile, waits included (`groups`:
    pool_groups, when the caller has it)."""
    uses = cand.uses.assign(flow=sol.flow)
    active = predicted(cand, sol, uses[uses["flow"] > 0])
    groups = pool_groups(cand, sol) if groups is None else groups
    refs = _refs(active, groups)
    w_of, flow = active["w"].to_numpy(), active["flow"].to_numpy(float)
    service_ttft, service_tbt = active["ttft_ms"].to_numpy(float), active["tbt_ms"].to_numpy(float)
    ttft = _finite(active["pred_ttft_ms"].to_numpy(float), service_ttft)
    tbt = _finite(active["pred_tbt_ms"].to_numpy(float), service_tbt)
    routes: dict[int, list[Route]] = {w: [] for w in cand.classes.index}
    colocated = (active["role"] == "colocated").to_numpy()
    for i in np.flatnonzero(colocated):
        routes[w_of[i]].append(
            Route(
                prefill=None,
                decode=None,
                colocated=refs[i],
                rps=float(flow[i]),
                ttft_ms=float(ttft[i]),
                tbt_ms=float(tbt[i]),
                kv_gbps=0.0,
                prefill_ms=float(service_ttft[i]),
                kv_transfer_ms=0.0,
                step_ms=float(service_tbt[i]),
            )
        )
    pairs = kv_pairs(active[~colocated])
    if not pairs:
        return routes
    src_labels, dst_labels, rps = zip(*pairs, strict=True)
    src, dst = active.index.get_indexer(list(src_labels)), active.index.get_indexer(list(dst_labels))
    bw = active["bw_gbps"].to_numpy(float)
    kv = cand.classes["kv_gbit"].reindex(w_of[src]).to_numpy(float)
    t_kv = transfer_ms(kv, bw[src], bw[dst])
    for p, d, r, k, t in zip(src, dst, rps, kv, t_kv, strict=True):
        routes[w_of[p]].append(
            Route(
                prefill=refs[p],
                decode=refs[d],
                colocated=None,
                rps=float(r),
                ttft_ms=float(ttft[p] + t),  # prefill's prediction holds its queue and the KV queues
                tbt_ms=float(tbt[d]),
                kv_gbps=float(r * k),
                prefill_ms=float(service_ttft[p]),
                kv_transfer_ms=float(t),
                step_ms=float(service_tbt[d]),
            )
        )
    return routes


def devices_used(cand: Candidates, instances: np.ndarray) -> dict[str, int]:
    """Devices per type of the request's fleet that `instances` (per pool) take: the sum of tp x over the
    type's pools (0 for a type without any)."""
    pools = cand.pools
    used = pd.Series(instances * pools["tp"].to_numpy(), index=pools["device"]).groupby(level=0).sum()
    return {d.name: int(round(used.get(d.name, 0))) for d in cand.request.devices}


def devices_out(cand: Candidates, sol: Solution) -> list[DeviceUse]:
    used = devices_used(cand, sol.instances)
    return [
        DeviceUse(name=d.name, used=used[d.name], available=d.count, bought=max(used[d.name] - d.count, 0))
        for d in cand.request.devices
    ]


def links_out(cand: Candidates, routes: dict[int, list[Route]]) -> list[LinkUse]:
    """KV traffic per (prefill device, decode device) with flow, plus every budgeted link."""
    traffic: dict[tuple[str, str], float] = {}
    for class_routes in routes.values():
        for route in class_routes:
            if route.prefill is not None and route.decode is not None:
                pair = (route.prefill.device, route.decode.device)
                traffic[pair] = traffic.get(pair, 0.0) + route.kv_gbps
    budgets = {(link.source, link.target): link.gbps for link in cand.request.links}
    pairs = sorted(set(traffic) | set(budgets))
    return [
        LinkUse(
            source=s,
            target=t,
            gbps=round(traffic.get((s, t), 0.0), 9),
            budget_gbps=budgets.get((s, t)),
            headroom=cand.link_rho.get((s, t)) if (s, t) in budgets else None,
        )
        for s, t in pairs
    ]
