"""Recompute every constraint of docs/formulation.md from a Plan and its request alone.

Independent of the formulation code on purpose: per-instance rates come from the latencies the routes
report, KV sizes from the request's models, transfer times from the devices' NICs. Optionally the route
latencies themselves are re-derived from the profile table. Used by the tests and before the API answers.
"""

from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from fleetplan.models.errors import PlanVerificationError
from fleetplan.models.plan import Plan, PlanRequest, Pool, PoolRef, Route
from fleetplan.profiler.tables import latency_at_prompt
from fleetplan.solver.memo import per_table

REL = 1e-6


def _close(a: float, b: float, scale: float = 1.0) -> bool:
    return abs(a - b) <= REL * max(1.0, abs(a), abs(b), scale)


def _at_most(a: float, b: float) -> bool:
    return a <= b + REL * max(1.0, abs(b))


def _interpolated(latency, model: str, ref: PoolRef, prompt: int, column: str) -> float:
    """The profile's latency of one (model, device, tp, batch) at a prompt; NaN where it has none."""
    row = latency.get((model, prompt, ref.device, ref.tp, ref.batch))
    return float("nan") if row is None else float(row[column])


def verify(request: PlanRequest, plan: Plan, table=None) -> None:
    """Raise PlanVerificationError naming every violated constraint; return None when the plan holds."""
    flows = _Flows()
    problems = _check_classes(request, plan, _profile_latency(request, table), flows)
    problems += _check_pools(request, plan, flows)
    used = _devices_used(plan)
    problems += _check_devices(request, plan, used)
    problems += _check_links(request, plan, flows.link_traffic)
    problems += _check_totals(request, plan, used, flows.served_total)
    problems += _check_objective(request, plan)
    if problems:
        more = f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""
        raise PlanVerificationError("; ".join(problems[:20]) + more)


def _profile_latency(request: PlanRequest, table) -> dict | None:
    """Each class's profiled latencies at its prompt, per (model, prompt, device, tp, batch), from the one
    latency-at-prompt interpolator (`profiler.tables.latency_at_prompt`); None without a table. Kept per
    (table, prompts asked) across plans (solver/memo.py): read-only."""
    if table is None:
        return None
    asked = tuple(sorted({(w.model, w.prompt_tokens) for w in request.workloads}))
    return _latency_at(table, asked)


@per_table
def _latency_at(table, asked: tuple[tuple[str, int], ...]) -> dict:
    queries = pd.DataFrame(list(asked), columns=["model", "prompt_tokens"])
    rows = latency_at_prompt(table.frame, queries)
    keys = zip(rows["model"], rows["prompt_tokens"], rows["device"], rows["tp"], rows["batch"], strict=True)
    return dict(zip(keys, rows.to_dict("records"), strict=True))


def _pool_key(owner: str, role: str, ref: PoolRef | Pool) -> tuple:
    """A pool as the constraints see it: (owning model or class, role, device, tp, batch, group)."""
    return (owner, role, ref.device, ref.tp, ref.batch, ref.group)


@dataclass
class _Flows:
    """What the routes put on the pools, their NICs and the links, recomputed from the route latencies."""

    pool_load: dict[tuple, float] = field(default_factory=lambda: defaultdict(float))  # instance-loads
    pool_traffic: dict[tuple, float] = field(default_factory=lambda: defaultdict(float))  # KV Gbit/s
    link_traffic: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    served_total: float = 0.0

    def add_route(self, owner: str, output_tokens: int, route: Route, kv_gbit: float) -> None:
        """A route's load on its pools (rps / per-instance rate) and its KV traffic (rps * 8 S_w / 1e9)."""
        o = output_tokens
        if route.colocated is not None:
            ref = route.colocated
            rate = ref.batch / ((route.prefill_ms + (o - 1) * route.step_ms) / 1e3)
            self.pool_load[_pool_key(owner, "colocated", ref)] += route.rps / rate
            return
        p, d = route.prefill, route.decode
        assert p is not None
        assert d is not None
        prefill, decode = _pool_key(owner, "prefill", p), _pool_key(owner, "decode", d)
        self.pool_load[prefill] += route.rps / (p.batch / (route.prefill_ms / 1e3))
        self.pool_load[decode] += route.rps / (d.batch / (o * route.step_ms / 1e3))
        self.pool_traffic[prefill] += route.rps * kv_gbit
        self.pool_traffic[decode] += route.rps * kv_gbit
        self.link_traffic[(p.device, d.device)] += route.rps * kv_gbit


def _check_classes(request: PlanRequest, plan: Plan, latency, flows: _Flows) -> list[str]:
    """Every class listed once, served + unserved = demand, and every route; adds the routes to `flows`."""
    problems: list[str] = []
    specs = request.model_specs()
    workloads = {w.name: w for w in request.workloads}
    by_class = request.options.pooling == "class"
    if sorted(r.name for r in plan.workloads) != sorted(workloads):
        problems.append("plan.workloads does not list every request class exactly once")
    for result in plan.workloads:
        w = workloads.get(result.name)
        if w is None:
            continue
        served = sum(route.rps for route in result.routes)
        flows.served_total += result.served_rps
        if not _close(served, result.served_rps):
            problems.append(f"{w.name}: routes carry {served} RPS, served_rps says {result.served_rps}")
        if not _at_most(result.served_rps, w.rate_rps):
            problems.append(f"{w.name}: served {result.served_rps} > demand {w.rate_rps}")
        if not _close(result.served_rps + result.unserved_rps, w.rate_rps):
            problems.append(f"{w.name}: served + unserved != demand {w.rate_rps}")
        owner = w.name if by_class else w.model
        kv = specs[w.model].kv_gbit(w.prompt_tokens)
        for route in result.routes:
            problems += _check_route(request, w, route, latency)
            flows.add_route(owner, w.output_tokens, route, kv)
            if route.colocated is None and not _close(route.kv_gbps, route.rps * kv):
                problems.append(
                    f"{w.name}: route kv_gbps {route.kv_gbps} != rps * 8 S_w / 1e9 = {route.rps * kv}"
                )
    return problems


def _check_pools(request: PlanRequest, plan: Plan, flows: _Flows) -> list[str]:
    """Each pool listed once within max_utilization, and its instances carry its load and its NIC traffic."""
    problems: list[str] = []
    cap = request.options.max_utilization  # under "queueing" an upper bound on every headroom
    devices = {d.name: d for d in request.devices}
    by_class = request.options.pooling == "class"
    instances: dict[tuple, int] = {}
    headroom: dict[tuple, float] = {}
    for pool in plan.pools:
        key = _pool_key(pool.workload if by_class else pool.model, pool.role, pool)
        if key in instances:
            problems.append(f"pool {key} listed twice")
        instances[key], headroom[key] = pool.instances, pool.headroom
        if cap is not None and not _at_most(pool.headroom, cap):
            problems.append(f"pool {key}: headroom {pool.headroom} > max_utilization {cap}")
    for key, load in flows.pool_load.items():
        n, rho = instances.get(key, 0), headroom.get(key, 0.0)
        if not _at_most(load, rho * n):
            problems.append(f"capacity: pool {key} needs {load:.6f} instance-loads > {rho} * {n} instances")
    for key, traffic in flows.pool_traffic.items():
        nic = devices[key[2]].network_gbps
        if nic is not None and not _at_most(traffic, instances.get(key, 0) * key[3] * nic):
            problems.append(f"nic: pool {key} moves {traffic:.6f} Gbit/s > instances * tp * {nic}")
    for key in flows.pool_load:
        if instances.get(key, 0) < 1:
            problems.append(f"routes: a class is served through pool {key}, which has no instance")
    return problems


def _devices_used(plan: Plan) -> dict[str, int]:
    """Devices of each type the pools take: tp * instances."""
    used: dict[str, int] = defaultdict(int)
    for pool in plan.pools:
        used[pool.device] += pool.tp * pool.instances
    return used


def _check_devices(request: PlanRequest, plan: Plan, used: dict[str, int]) -> list[str]:
    """The pools fit the device counts (owned plus purchasable), and plan.devices reports what they use
    and what it buys."""
    problems: list[str] = []
    devices = {d.name: d for d in request.devices}
    for name, n in used.items():
        if n > devices[name].capacity:
            problems.append(f"devices: {name} uses {n} > {devices[name].capacity}")
    for use in plan.devices:
        if use.bought != max(used.get(use.name, 0) - devices[use.name].count, 0):
            problems.append(f"devices: {use.name} reports {use.bought} bought for {use.used} used")
        if use.used != used.get(use.name, 0) or use.available != devices[use.name].count:
            problems.append(
                f"devices: {use.name} reported {use.used}/{use.available}, pools give {used.get(use.name, 0)}"
            )
    return problems


def _check_links(request: PlanRequest, plan: Plan, link_traffic: dict[tuple[str, str], float]) -> list[str]:
    """KV traffic within each link's and the fleet-wide KV budget's planned headroom."""
    problems: list[str] = []
    shares = {(link.source, link.target): link.headroom for link in plan.links}
    for link in request.links:
        share = shares.get((link.source, link.target)) or 0.0
        traffic = link_traffic.get((link.source, link.target), 0.0)
        if not _at_most(traffic, share * link.gbps):
            problems.append(f"link {link.source}->{link.target}: {traffic} > {share} * {link.gbps}")
    if request.kv_budget_gbps is not None:
        cross = sum(v for (s, t), v in link_traffic.items() if s != t)
        share = plan.kv_budget_headroom or 0.0
        if not _at_most(cross, share * request.kv_budget_gbps):
            problems.append(f"kv_budget_gbps: {cross} > {share} * {request.kv_budget_gbps}")
    return problems


def _check_totals(request: PlanRequest, plan: Plan, used: dict[str, int], served_total: float) -> list[str]:
    """The cost within budget_per_hour, and cost_per_hour, slo_rps and demand_rps adding up."""
    problems: list[str] = []
    devices = {d.name: d for d in request.devices}
    cost = sum(devices[name].cost_per_hour * n for name, n in used.items())
    budget = request.options.budget_per_hour
    if budget is not None and not _at_most(cost, budget):
        problems.append(f"budget_per_hour: cost {cost} > {budget}")
    if not _close(cost, plan.cost_per_hour):
        problems.append(f"cost_per_hour {plan.cost_per_hour} != devices in use x price = {cost}")
    if not _close(served_total, plan.slo_rps):
        problems.append(f"slo_rps {plan.slo_rps} != sum of served {served_total}")
    if not _close(sum(w.rate_rps for w in request.workloads), plan.demand_rps):
        problems.append("demand_rps != sum of class rates")
    return problems


def _check_objective(request: PlanRequest, plan: Plan) -> list[str]:
    """A goodput objective is labelled weighted when a weight differs from 1, its value is the plan's, and
    bound_rps (RPS) is not the weighted bound."""
    if plan.objective_unit not in ("rps", "weighted_rps"):
        return []
    problems = []
    weights = {w.name: w.weight for w in request.workloads}
    unweighted = all(v == 1 for v in weights.values())
    if (plan.objective_unit == "rps") != unweighted:
        distinct = sorted(set(weights.values()))
        problems.append(f"objective_unit {plan.objective_unit!r} but the weights are {distinct}")
    proven_zero = plan.status == "no_candidates"  # nothing can be served: 0 bounds RPS too
    if plan.objective_unit == "weighted_rps" and plan.bound_rps is not None and not proven_zero:
        problems.append("bound_rps given for a weighted objective: it bounds weighted RPS, not RPS")
    value = sum(weights.get(r.name, 0.0) * r.served_rps for r in plan.workloads)
    if plan.objective_value is not None and not _close(value, plan.objective_value):
        problems.append(f"objective_value {plan.objective_value} != sum of weight x served = {value}")
    return problems


def _check_route(request: PlanRequest, w, route: Route, latency) -> list[str]:
    """SLOs, transfer time and (with a table) the latencies of one route."""
    problems = []
    colocated = route.colocated is not None
    if colocated == (route.prefill is not None or route.decode is not None) or (
        not colocated and (route.prefill is None or route.decode is None)
    ):
        return [f"{w.name}: a route is either colocated or prefill+decode"]
    if not _at_most(route.ttft_ms, w.slo.ttft_ms) or not _at_most(route.tbt_ms, w.slo.tbt_ms):
        problems.append(f"{w.name}: route breaks the SLO (TTFT {route.ttft_ms} / TBT {route.tbt_ms} ms)")
    if route.rps < 0:
        problems.append(f"{w.name}: negative route rps")
    expected_kv_ms = 0.0
    if not colocated:
        devices = {d.name: d for d in request.devices}
        p, d = route.prefill, route.decode
        nic_p, nic_d = devices[p.device].network_gbps, devices[d.device].network_gbps
        if nic_p is not None and nic_d is not None:
            kv_gbit = request.model_specs()[w.model].kv_gbit(w.prompt_tokens)
            expected_kv_ms = 1e3 * kv_gbit / min(nic_p * p.tp, nic_d * d.tp)
    # ttft_ms is the predicted percentile with waits at the planned load, where batches may be partial
    # (faster than prefill_ms, the full-batch service time): it is bounded by the SLO, not by prefill_ms
    if not _close(route.kv_transfer_ms, expected_kv_ms) or not _at_most(route.kv_transfer_ms, route.ttft_ms):
        problems.append(f"{w.name}: KV transfer {route.kv_transfer_ms} ms, expected {expected_kv_ms} ms")
    if latency is not None:
        q = w.slo.percentile
        prefill_ref = route.colocated if colocated else route.prefill
        decode_ref = route.colocated if colocated else route.decode
        ttft = _interpolated(latency, w.model, prefill_ref, w.prompt_tokens, f"ttft_ms_p{q}")
        tbt = _interpolated(latency, w.model, decode_ref, w.prompt_tokens, f"tbt_ms_p{q}")
        if not (_close(ttft, route.prefill_ms) and _close(tbt, route.step_ms)):
            problems.append(
                f"{w.name}: route latencies ({route.prefill_ms}, {route.step_ms}) "
                f"differ from the profile ({ttft}, {tbt})"
            )
    return problems
