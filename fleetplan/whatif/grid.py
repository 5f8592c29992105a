"""Axes -> grid points, and the one function that turns the base request into a point's request."""

import msgspec

from fleetplan.models.codec import convert, to_builtins
from fleetplan.models.plan import PlanRequest
from fleetplan.models.whatif import Axis, WhatIfRequest

# Axes that change only bounds and coefficients of the model (device counts, prices, the budget row):
# candidates are built once per sweep. demand_scale and slo_scale change the candidate tables themselves.
SHARED_CANDIDATE_KINDS = frozenset({"budget_per_hour", "count", "max_count", "price"})


def grid(request: WhatIfRequest) -> list[dict[str, float]]:
    """Every point's coordinates, first axis slowest."""
    points: list[dict[str, float]] = [{}]
    for axis in request.axes:
        points = [{**p, axis.param: v} for p in points for v in axis.grid()]
    return points


def shares_candidates(axes: list[Axis]) -> bool:
    """Whether every point of these axes plans from one candidate set."""
    return all(axis.kind in SHARED_CANDIDATE_KINDS for axis in axes)


def variant(base: PlanRequest, coords: dict[str, float]) -> PlanRequest:
    """The base request with a point's changes, validated like any request.

    budget_per_hour: options.budget_per_hour; demand_scale: every class's rate_rps times the value;
    slo_scale: every class's TTFT and TBT SLO times the value; count:D / max_count:D / price:D: that
    device's count, max_count or cost_per_hour (a count above max_count lifts max_count with it).
    """
    data = to_builtins(base)
    devices = {d["name"]: d for d in data["devices"]}
    for param, value in coords.items():
        kind, _, name = param.partition(":")
        if kind == "budget_per_hour":
            data["options"]["budget_per_hour"] = value
        elif kind == "demand_scale":
            for workload in data["workloads"]:
                workload["rate_rps"] = workload["rate_rps"] * value
        elif kind == "slo_scale":
            for workload in data["workloads"]:
                workload["slo"]["ttft_ms"] = workload["slo"]["ttft_ms"] * value
                workload["slo"]["tbt_ms"] = workload["slo"]["tbt_ms"] * value
        elif kind == "price":
            devices[name]["cost_per_hour"] = value
        elif kind == "count":
            devices[name]["count"] = int(value)
            if devices[name].get("max_count") is not None:
                devices[name]["max_count"] = max(devices[name]["max_count"], int(value))
        elif kind == "max_count":
            devices[name]["max_count"] = int(value)
    return convert(data, PlanRequest)


def one_more(request: PlanRequest, device: str) -> PlanRequest:
    """The request with one more device of type `device` (owned, and purchasable if it has max_count)."""
    devices = [
        d
        if d.name != device
        else msgspec.structs.replace(
            d, count=d.count + 1, max_count=None if d.max_count is None else d.max_count + 1
        )
        for d in request.devices
    ]
    return msgspec.structs.replace(request, devices=devices)


def widened(base: PlanRequest, axes: list[Axis], marginal: bool) -> PlanRequest:
    """The base request with every device's max_count raised to the most any point (and, for marginal
    values, one more device) may use: the candidates built from it hold every pool any point can run.

    Pools too large for a point's own fleet stay as columns whose bound is 0 instances, so each point's
    model has the same optimum as a model built from that point's own request (docs/whatif.md).
    """
    most = {d.name: d.capacity for d in base.devices}
    for axis in axes:
        if axis.kind in ("count", "max_count"):
            name = axis.device
            assert name is not None
            most[name] = max(most[name], int(max(axis.grid())))
    extra = 1 if marginal else 0
    devices = [
        msgspec.structs.replace(d, max_count=most[d.name] + extra) if most[d.name] + extra > d.count else d
        for d in base.devices
    ]
    return msgspec.structs.replace(base, devices=devices)
