"""The two reference points a plan is compared with, from the same candidate tables.

GPU-only: the same MILP restricted to colocated pools on one device type.
Greedy: classes in order of weight * demand each take their best single pairing (by RPS per device) among
the devices still free, the per-workload pairing of the original study.
Both obey the device counts and options.budget_per_hour, like the plan they are compared with.
"""

import dataclasses
import math
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd

from fleetplan.models.hardware import kind_of
from fleetplan.models.plan import GpuOnlyBaseline, GreedyBaseline, PlanRequest
from fleetplan.solver.backends import Sense
from fleetplan.solver.candidates import Candidates, keep_pools


@dataclass(frozen=True)
class Usage:
    """What a baseline uses: devices per type and their cost per hour (the Plan shows only its RPS), and
    for the greedy baseline its instances per candidate pool (in cand.pools' order; the solver's greedy
    start, optimize.primal_start)."""

    devices: dict[str, int]
    cost_per_hour: float
    instances: np.ndarray | None = None


def _usage(request: PlanRequest, devices: dict[str, int], instances: np.ndarray | None = None) -> Usage:
    price = {d.name: d.cost_per_hour for d in request.devices}
    return Usage(devices, float(sum(price[name] * n for name, n in devices.items())), instances)


def baseline_device(request: PlanRequest) -> str | None:
    """options.baseline_device, else the first device of kind "gpu" (its `kind`, else the hardware
    catalog's for its name: models.hardware.kind_of)."""
    if request.options.baseline_device is not None:
        return request.options.baseline_device
    return next((d.name for d in request.devices if kind_of(d.name, d.kind) == "gpu"), None)


def gpu_only(cand: Candidates, time_limit_s: float) -> GpuOnlyBaseline:
    """Max goodput with colocated pools on the baseline device only: the plan's own candidates, restricted."""
    return gpu_only_run(cand, time_limit_s)[0]


def gpu_only_run(cand: Candidates, time_limit_s: float) -> tuple[GpuOnlyBaseline, Usage]:
    """The GPU-only baseline and the devices and cost it uses (within the counts and budget_per_hour)."""
    from fleetplan.solver.extract import solution_from
    from fleetplan.solver.optimize import optimize

    request = cand.request
    device = baseline_device(request)
    idle = _usage(request, {})
    if device is None:
        return GpuOnlyBaseline(
            device=None, slo_rps=0.0, reason="no device of kind 'gpu'; set options.baseline_device"
        ), idle
    if not request.options.allow_colocated:
        return GpuOnlyBaseline(device=device, slo_rps=0.0, reason="options.allow_colocated is false"), idle
    options = msgspec.structs.replace(
        request.options,
        allow_disaggregated=False,
        objective="max_goodput",
        time_limit_s=max(time_limit_s, 0.05),
    )
    restricted = msgspec.structs.replace(
        request,
        devices=[d for d in request.devices if d.name == device],
        links=[],
        kv_budget_gbps=None,
        options=options,
    )
    on_device = ((cand.pools["role"] == "colocated") & (cand.pools["device"] == device)).to_numpy()
    pools, uses = keep_pools(cand.pools, cand.uses, on_device)
    if uses.empty:
        reason = f"no colocated candidate on {device} meets any SLO"
        return GpuOnlyBaseline(device=device, slo_rps=0.0, reason=reason), idle
    devices = cand.devices[cand.devices["device"] == device].reset_index(drop=True)
    restricted_cand = dataclasses.replace(
        cand, request=restricted, pools=pools, uses=uses, devices=devices, keyed=False
    )
    outcome = optimize(restricted, restricted_cand, [("goodput", Sense.MAX)])
    if outcome.values is None:
        return GpuOnlyBaseline(device=device, slo_rps=0.0, reason=f"solver: {outcome.termination}"), idle
    solution = solution_from(restricted_cand, outcome.columns, outcome.values)
    used = int(solution.instances @ pools["tp"].to_numpy())
    return GpuOnlyBaseline(device=device, slo_rps=round(float(solution.flow.sum()), 9)), _usage(
        request, {device: used}
    )


def _per_instance(cand: Candidates, uses: pd.DataFrame) -> np.ndarray:
    """RPS one instance can carry: headroom * rate, and for disaggregated pools no more than its NIC moves."""
    kv = uses["kv_gbit"].to_numpy()
    nic_bw = uses["bw_gbps"].to_numpy() * uses["nic_rho"].to_numpy()
    nic_limit = np.where(uses["role"].to_numpy() == "colocated", np.inf, nic_bw / kv)
    return np.minimum(uses["rho"].to_numpy() * uses["rate_rps"].to_numpy(), nic_limit)


def _pairings(cand: Candidates) -> pd.DataFrame:
    """Every single pairing of every class, with devices per RPS: colocated pools and reachable (P, D) pairs.

    The best pool per (class, device, tp, key, tier or level) is enough to rank pairings.
    """
    uses = cand.uses.copy()
    uses["per_instance"] = _per_instance(cand, uses)
    uses["device_per_rps"] = uses["tp"] / uses["per_instance"]
    colocated = uses[uses["role"] == "colocated"]
    decode = uses[uses["role"] == "decode"].sort_values("device_per_rps", kind="stable")
    decode = decode.drop_duplicates(["w", "key", "tier", "device", "tp"])
    prefill = uses[uses["role"] == "prefill"].sort_values("device_per_rps", kind="stable")
    prefill = prefill.drop_duplicates(["w", "key", "level", "device", "tp"])
    pairs = prefill.merge(decode, on=["w", "key"], suffixes=("_p", "_d"))
    pairs = pairs[pairs["tier_d"] <= pairs["level_p"]]
    parts = [
        pd.DataFrame(
            {
                "w": colocated["w"],
                "pool_p": colocated["pool"],
                "pool_d": -1,
                "device_p": colocated["device"],
                "tp_p": colocated["tp"],
                "per_p": colocated["per_instance"],
                "device_d": None,
                "tp_d": 0,
                "per_d": np.inf,
                "cost": colocated["device_per_rps"],
            }
        ),
        pd.DataFrame(
            {
                "w": pairs["w"],
                "pool_p": pairs["pool_p"],
                "pool_d": pairs["pool_d"],
                "device_p": pairs["device_p"],
                "tp_p": pairs["tp_p"],
                "per_p": pairs["per_instance_p"],
                "device_d": pairs["device_d"],
                "tp_d": pairs["tp_d"],
                "per_d": pairs["per_instance_d"],
                "cost": pairs["device_per_rps_p"] + pairs["device_per_rps_d"],
            }
        ),
    ]
    table = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    return table.sort_values(["w", "cost"], kind="stable").reset_index(drop=True)


def _affordable(budget: float, price: float) -> float:
    """How many units at `price` the budget buys (inf when free or unbounded)."""
    if price <= 0 or math.isinf(budget):
        return math.inf
    return math.floor((budget + 1e-9) / price)


def _serve(
    pairing,
    demand: float,
    free: dict[str, float],
    kv: float,
    links: dict,
    kv_budget: float,
    budget: float,
    price: dict,
) -> tuple:
    """Largest s <= demand one pairing can carry with the free devices and budget left; the instances needed.

    Partial service: when the full demand does not fit, s is what the devices and the budget allow.
    """
    dp, tp_p, per_p = pairing.device_p, int(pairing.tp_p), pairing.per_p
    dd, tp_d, per_d = pairing.device_d, int(pairing.tp_d), pairing.per_d
    cost_p = tp_p * price[dp]
    cost_d = 0.0 if dd is None else tp_d * price[dd]
    cap = demand
    if dd is not None:
        link_left = links.get((dp, dd), math.inf)
        cross_left = kv_budget if dp != dd else math.inf
        cap = min(cap, link_left / kv, cross_left / kv)
    best = 0.0
    max_p = min(int(free[dp] // tp_p), _affordable(budget, cost_p))
    for n_p in range(1, int(max_p) + 1):
        s = min(cap, n_p * per_p)
        if dd is not None:
            left_d = free[dd] - (n_p * tp_p if dd == dp else 0)
            n_d = min(left_d // tp_d, _affordable(budget - n_p * cost_p, cost_d))
            s = min(s, n_d * per_d)
        best = max(best, s)
        if best >= cap:
            break
    if best <= 0:
        return 0.0, 0, 0
    n_p = math.ceil(best / per_p - 1e-9)
    n_d = 0 if dd is None else math.ceil(best / per_d - 1e-9)
    return best, n_p, n_d


def greedy(cand: Candidates) -> GreedyBaseline:
    """Classes by weight * demand, each served by its best single pairing on the devices left."""
    return greedy_run(cand)[0]


def greedy_run(cand: Candidates) -> tuple[GreedyBaseline, Usage]:
    """The greedy baseline and the devices, cost and instances per pool it uses (within the counts and
    budget_per_hour).

    Per class, in order of weight * demand: the best pairing (by devices per RPS) that can serve anything
    on the devices and budget left serves as much of the class as they allow.
    """
    request = cand.request
    classes = cand.classes
    free = {d.name: float(d.capacity) for d in request.devices}
    rho = cand.link_rho  # bandwidth budgets carry the same headroom as in the MILP
    links = {
        (link.source, link.target): rho[(link.source, link.target)] * link.gbps for link in request.links
    }
    kv_budget = math.inf if request.kv_budget_gbps is None else rho[None] * request.kv_budget_gbps
    budget = math.inf if request.options.budget_per_hour is None else request.options.budget_per_hour
    price = {d.name: d.cost_per_hour for d in request.devices}
    order = np.argsort(-(classes["weight"] * classes["rate_rps"]).to_numpy(), kind="stable")
    served_total = 0.0
    instances = np.zeros(len(cand.pools))
    if cand.uses.empty:
        return GreedyBaseline(slo_rps=0.0), _usage(request, {}, instances)
    pairings = _pairings(cand)
    by_class = dict(tuple(pairings.groupby("w", sort=False)))
    for w in order:
        demand = float(classes.at[w, "rate_rps"])
        if demand <= 0 or w not in by_class:
            continue
        kv = float(classes.at[w, "kv_gbit"])
        for pairing in by_class[w].itertuples(index=False):
            need_p = pairing.tp_p + (pairing.tp_d if pairing.device_d == pairing.device_p else 0)
            if free[pairing.device_p] < need_p or (
                pairing.device_d is not None and free[pairing.device_d] < pairing.tp_d
            ):
                continue
            s, n_p, n_d = _serve(pairing, demand, free, kv, links, kv_budget, budget, price)
            spend = n_p * pairing.tp_p * price[pairing.device_p]
            if pairing.device_d is not None:
                spend += n_d * pairing.tp_d * price[pairing.device_d]
            if s <= 0 or spend > budget + 1e-9:
                continue
            free[pairing.device_p] -= n_p * pairing.tp_p
            budget -= spend
            instances[pairing.pool_p] += n_p
            if pairing.device_d is not None:
                instances[pairing.pool_d] += n_d
                free[pairing.device_d] -= n_d * pairing.tp_d
                pair = (pairing.device_p, pairing.device_d)
                if pair in links:
                    links[pair] -= s * kv
                if pairing.device_p != pairing.device_d:
                    kv_budget -= s * kv
            served_total += s
            break
    used = {
        d.name: int(round(d.capacity - free[d.name])) for d in request.devices if free[d.name] < d.capacity
    }
    return GreedyBaseline(slo_rps=round(served_total, 9)), _usage(request, used, instances)
