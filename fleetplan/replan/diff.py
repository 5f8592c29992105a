"""The one diff of two plans: what operators change to go from the plan in force to the new one.

Pools are compared per (model, role, device, tp, batch), instances summed over headroom groups (and over
classes under pooling = "class"): the same key the churn limit counts moves on, so `moves` never exceeds
the max_moves the solver was given.
"""

from collections import defaultdict

from fleetplan.models.plan import Plan, PlanRequest, WorkloadResult
from fleetplan.models.store import Change, ClassChange, DeviceChange, Diff, PoolChange

# served RPS within this of each other are the same (the solver's round-off)
RPS_TOL = 1e-6


def _pool_counts(plan: Plan | None) -> dict[tuple, int]:
    counts: dict[tuple, int] = defaultdict(int)
    for pool in plan.pools if plan else []:
        counts[(pool.model, pool.role, pool.device, pool.tp, pool.batch)] += pool.instances
    return counts


def _device_counts(plan: Plan | None) -> dict[str, int]:
    return {d.name: d.used for d in plan.devices} if plan else {}


def _why(result: WorkloadResult, demand: tuple[float | None, float]) -> str:
    """Why a class's served RPS changed: its demand, and the solver's reason for what it leaves unserved."""
    old_demand, new_demand = demand
    parts = []
    if old_demand is not None and abs(old_demand - new_demand) > RPS_TOL:
        parts.append(f"demand {old_demand:g} -> {new_demand:g} rps")
    if result.unserved_rps > RPS_TOL and result.reason:
        parts.append(f"{result.unserved_rps:g} rps unserved: {result.reason}")
    if not parts:
        parts.append("new class" if old_demand is None else "capacity or profiles changed")
    return "; ".join(parts)


def diff(
    before: Plan | None,
    after: Plan,
    before_request: PlanRequest | None = None,
    after_request: PlanRequest | None = None,
) -> Diff:
    """Pools, devices, SLO RPS, cost and classes before and after. `before` None (a fleet's first plan):
    every class is listed, with the reason for any demand it leaves unserved."""
    old_pools, new_pools = _pool_counts(before), _pool_counts(after)
    pools = [
        PoolChange(
            model=k[0], role=k[1], device=k[2], tp=k[3], batch=k[4], before=old_pools[k], after=new_pools[k]
        )
        for k in sorted(set(old_pools) | set(new_pools))
        if old_pools[k] != new_pools[k]
    ]
    old_devices, new_devices = _device_counts(before), _device_counts(after)
    devices = [
        DeviceChange(name=n, before=old_devices.get(n, 0), after=new_devices.get(n, 0))
        for n in sorted(set(old_devices) | set(new_devices))
        if old_devices.get(n, 0) != new_devices.get(n, 0)
    ]
    old_served = {w.name: w.served_rps for w in before.workloads} if before else {}
    old_demand = {w.name: w.rate_rps for w in before_request.workloads} if before_request else {}
    new_demand = {w.name: w.rate_rps for w in after_request.workloads} if after_request else {}
    classes = []
    for result in after.workloads:
        served_before = old_served.get(result.name, 0.0)
        demand = (old_demand.get(result.name), new_demand.get(result.name, 0.0))
        if before is None or abs(served_before - result.served_rps) > RPS_TOL:
            why = _why(result, demand)
            classes.append(
                ClassChange(
                    name=result.name, served_before=served_before, served_after=result.served_rps, why=why
                )
            )
    for name in sorted(set(old_served) - {w.name for w in after.workloads}):
        classes.append(
            ClassChange(name=name, served_before=old_served[name], served_after=0.0, why="class removed")
        )
    return Diff(
        moves=sum(abs(p.after - p.before) for p in pools),
        pools=pools,
        devices=devices,
        slo_rps=Change(before=before.slo_rps if before else 0.0, after=after.slo_rps),
        cost_per_hour=Change(before=before.cost_per_hour if before else 0.0, after=after.cost_per_hour),
        classes=classes,
    )


def is_empty(change: Diff) -> bool:
    """Nothing for operators to do: no move, no device, no class served differently."""
    return change.moves == 0 and not change.pools and not change.devices and not change.classes


__all__ = ["diff", "is_empty"]
