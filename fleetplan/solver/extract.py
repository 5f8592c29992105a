"""Solution vector -> the parts of a Plan: instances, utilization, routes, device and link use."""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fleetplan.models.plan import DeviceUse, LinkUse, Pool, PoolRef, Route
from fleetplan.solver.candidates import Candidates, transfer_ms
from fleetplan.solver.formulation import Columns

EPS = 1e-7


@dataclass(frozen=True)
class Solution:
    """Instances per pool and RPS per use, with idle instances already removed."""

    instances: np.ndarray
    flow: np.ndarray
    capacity_used: np.ndarray  # sum_w f / r per pool, in instances


def _capacity_used(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    uses = cand.uses
    return np.bincount(uses["pool"], weights=flow / uses["rate_rps"].to_numpy(), minlength=len(cand.pools))


def _nic_used(cand: Candidates, flow: np.ndarray) -> np.ndarray:
    """KV Gbit/s through each pool's NICs (prefill: out, decode: in, colocated: none)."""
    uses = cand.uses
    kv = uses["kv_gbit"].to_numpy()
    moving = (uses["role"] != "colocated").to_numpy()
    return np.bincount(uses["pool"], weights=flow * kv * moving, minlength=len(cand.pools))


def solution_from(cand: Candidates, cols: Columns, values: np.ndarray) -> Solution:
    """Round x, clip flows at 0 and drop instances no capacity or NIC constraint needs (they serve nothing)."""
    flow = np.clip(values[cols.use_offset : cols.chain_offset], 0.0, None)
    flow[flow < EPS] = 0.0
    x = np.round(values[: cols.n_pools]).astype(np.int64)
    rho = cand.request.options.max_utilization
    used = _capacity_used(cand, flow)
    pools = cand.pools
    nic = pools["device"].map(cand.devices.set_index("device")["nic_gbps"]).to_numpy()
    per_instance = pools["tp"].to_numpy(float) * nic
    nic_need = np.where(np.isfinite(per_instance), _nic_used(cand, flow) / per_instance, 0.0)
    need = np.ceil(np.maximum(used / rho, nic_need) - 1e-6).astype(np.int64)
    return Solution(np.minimum(x, need), flow, used)


def pools_out(cand: Candidates, sol: Solution) -> list[Pool]:
    pools = cand.pools
    pooling_by_class = cand.request.options.pooling == "class"
    out = []
    for index in np.flatnonzero(sol.instances > 0):
        row = pools.iloc[index]
        out.append(
            Pool(
                model=row["model"],
                role=row["role"],
                device=row["device"],
                tp=int(row["tp"]),
                batch=int(row["batch"]),
                instances=int(sol.instances[index]),
                utilization=round(float(sol.capacity_used[index] / sol.instances[index]), 6),
                workload=row["owner"] if pooling_by_class else None,
            )
        )
    return out


def _ref(row: pd.Series) -> PoolRef:
    return PoolRef(device=row["device"], tp=int(row["tp"]), batch=int(row["batch"]))


def match_kv_flows(sources: pd.DataFrame, sinks: pd.DataFrame) -> list[tuple[int, int, float]]:
    """Split aggregated prefill and decode flows of one (class, key) into (prefill, decode, rps) pairs.

    Reachable sets are nested (level l reaches tiers 0..l), so serving the most constrained sources first,
    from any sink they reach, never blocks a later source.
    """
    remaining = sinks["flow"].to_numpy().copy()
    tiers = sinks["tier"].to_numpy()
    pairs = []
    for s_index, level, amount in zip(sources.index, sources["level"], sources["flow"], strict=True):
        for k in np.flatnonzero(tiers <= level)[::-1]:
            if amount <= EPS:
                break
            take = min(amount, remaining[k])
            if take > EPS:
                pairs.append((s_index, sinks.index[k], take))
                remaining[k] -= take
                amount -= take
    return pairs


def routes_out(cand: Candidates, sol: Solution) -> dict[int, list[Route]]:
    """Routes per class index, with latencies at the class's SLO percentile."""
    uses = cand.uses.assign(flow=sol.flow)
    active = uses[uses["flow"] > 0]
    classes = cand.classes
    routes: dict[int, list[Route]] = {w: [] for w in classes.index}
    for _, row in active[active["role"] == "colocated"].iterrows():
        routes[row["w"]].append(
            Route(
                prefill=None,
                decode=None,
                colocated=_ref(row),
                rps=float(row["flow"]),
                ttft_ms=float(row["ttft_ms"]),
                tbt_ms=float(row["tbt_ms"]),
                kv_gbps=0.0,
                prefill_ms=float(row["ttft_ms"]),
                kv_transfer_ms=0.0,
            )
        )
    disagg = active[active["role"] != "colocated"]
    for (w, _key), group in disagg.groupby(["w", "key"], sort=True):
        sources = group[group["role"] == "prefill"].sort_values("level", kind="stable")
        sinks = group[group["role"] == "decode"]
        kv = float(classes.at[w, "kv_gbit"])
        for p, d, rps in match_kv_flows(sources, sinks):
            src, dst = uses.loc[p], uses.loc[d]
            t_kv = float(transfer_ms(np.array([kv]), np.array([src["bw_gbps"]]), np.array([dst["bw_gbps"]]))[0])
            routes[w].append(
                Route(
                    prefill=_ref(src),
                    decode=_ref(dst),
                    colocated=None,
                    rps=float(rps),
                    ttft_ms=float(src["ttft_ms"]) + t_kv,
                    tbt_ms=float(dst["tbt_ms"]),
                    kv_gbps=float(rps * kv),
                    prefill_ms=float(src["ttft_ms"]),
                    kv_transfer_ms=t_kv,
                )
            )
    return routes


def devices_out(cand: Candidates, sol: Solution) -> list[DeviceUse]:
    used = pd.Series(sol.instances * cand.pools["tp"].to_numpy(), index=cand.pools["device"]).groupby(level=0).sum()
    return [DeviceUse(name=d.name, used=int(used.get(d.name, 0)), available=d.count) for d in cand.request.devices]


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
        LinkUse(source=s, target=t, gbps=round(traffic.get((s, t), 0.0), 9), budget_gbps=budgets.get((s, t)))
        for s, t in pairs
    ]
