"""Why a class is not (fully) served, and what a plan rests on that the profile did not measure, in words a
capacity planner can act on."""

import math

import numpy as np
import pandas as pd

from fleetplan.models.plan import DeviceUse, LinkUse, PlanRequest, PoolRef, WorkloadResult
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.memo import per_table


def _best(frame: pd.DataFrame, column: str) -> str:
    row = frame.loc[frame[column].idxmin()]
    return f"{row['device']} (tp {row['tp']}, batch {row['batch']}) at {row[column]:.1f} ms"


def no_candidate_reason(cand: Candidates, w: int, table=None) -> str:
    """The first SLO or data gap that leaves class w without any pool (`table`, the profile table: the
    profiled prompt range, where the prompt lies outside it)."""
    request = cand.request
    c = cand.classes.loc[w]
    q = int(c["percentile"])
    model = c["model"]
    counts = {d.name: d.capacity for d in request.devices}
    latency = cand.latency[cand.latency["w"] == w]
    on_fleet = latency[
        [counts.get(dev, 0) >= tp for dev, tp in zip(latency["device"], latency["tp"], strict=True)]
    ]
    if on_fleet.empty:
        return (
            f"no device in the fleet ({', '.join(counts)}) has profile rows for {model} "
            "with enough devices for its tp"
        )
    in_range = on_fleet[on_fleet["in_range"]]
    if in_range.empty:
        span = ""
        if table is not None:
            frame = table.frame
            rows = frame[(frame["model"] == model) & frame["device"].isin(list(counts))]
            span = f" ({int(rows['prompt_tokens'].min())}..{int(rows['prompt_tokens'].max())} tokens)"
        return (
            f"prompt {c['prompt_tokens']} tokens is outside the profiled prompt range of {model}{span} "
            "on every fleet device; latencies are never extrapolated"
        )
    valid = in_range.dropna(subset=["ttft_ms", "tbt_ms"])
    if valid.empty:
        return f"no p{q} latencies profiled for {model} at prompt {c['prompt_tokens']} on the fleet's devices"
    slo_ttft, slo_tbt = c["ttft_slo_ms"], c["tbt_slo_ms"]
    if (valid["tbt_ms"] > slo_tbt).all():
        return f"no device meets TBT {slo_tbt:g} ms for {model} at p{q}: best is {_best(valid, 'tbt_ms')}"
    if (valid["ttft_ms"] > slo_ttft).all():
        return f"no device meets TTFT {slo_ttft:g} ms for {model} at p{q}: best is {_best(valid, 'ttft_ms')}"
    if request.options.batch_sizes is not None or request.options.tp_degrees is not None:
        scope = " within options.batch_sizes / tp_degrees"
    else:
        scope = ""
    return (
        f"no colocated pool meets both TTFT {slo_ttft:g} ms and TBT {slo_tbt:g} ms "
        f"for {model} at p{q}{scope}, "
        f"and no prefill->decode pair meets TTFT including the KV transfer of {c['kv_gbit']:.3g} Gbit"
    )


def has_room(request: PlanRequest, used: dict[str, int], device: pd.Series, tp: np.ndarray) -> np.ndarray:
    """Whether one more instance (`tp` devices of type `device`, per row) fits what the device types have
    left: their capacity (owned plus purchasable) less `used`. A full type's instances buy nothing, so a
    budget is judged against the cheapest instance that fits (shortfall_reasons, whatif budget_binding)."""
    room = {d.name: d.capacity - used.get(d.name, 0) for d in request.devices}
    return tp <= device.map(room).fillna(0).to_numpy()


def shortfall_reasons(
    cand: Candidates, classes: list[int], devices: list[DeviceUse], links: list[LinkUse], cost_per_hour: float
) -> dict[int, str]:
    """The resources that bind for each of `classes` (each has candidates but is not fully served)."""
    if not classes:
        return {}
    uses = cand.uses[cand.uses["w"].isin(classes)]
    min_tp = uses.groupby(["w", "device"])["tp"].min()
    price = uses["device"].map(cand.devices.set_index("device")["cost_per_hour"]).to_numpy(float)
    tps: dict[int, dict[str, int]] = {w: {} for w in classes}
    for (w, device), tp in min_tp.items():
        tps[w][device] = int(tp)
    # what one more instance of each (device, tp) the class can use costs: the budget binds where the
    # cheapest one the devices still have room for does not fit it (a full device's price says nothing)
    used = {d.name: d.used for d in devices}
    fits = has_room(cand.request, used, uses["device"], uses["tp"].to_numpy())
    instance = pd.Series(price * uses["tp"].to_numpy(), index=uses["w"].to_numpy())
    cheapest = instance[fits].groupby(level=0).min()
    anywhere = instance.groupby(level=0).min()  # every device full: what one more would cost at all
    return {
        w: _shortfall(
            cand, tps[w], float(cheapest.get(w, anywhere.get(w, math.inf))), devices, links, cost_per_hour
        )
        for w in classes
    }


def _shortfall(
    cand: Candidates,
    min_tp: dict[str, int],
    cheapest: float,
    devices: list[DeviceUse],
    links: list[LinkUse],
    cost_per_hour: float,
) -> str:
    """One class's binding resources; `min_tp`: its smallest tp per device it has uses on, `cheapest`: the
    price of its cheapest instance on a device with room for it (with none, on any device)."""
    request: PlanRequest = cand.request
    rho = cand.link_rho
    binding = []
    capacity = {d.name: d.capacity for d in request.devices}  # owned plus purchasable
    full = [
        f"{d.name} {d.used}/{capacity[d.name]}"
        for d in devices
        if d.name in min_tp and capacity[d.name] - d.used < min_tp[d.name]
    ]
    if full:
        binding.append("device capacity (" + ", ".join(full) + " in use)")
    for link in links:
        share = rho.get((link.source, link.target), 1.0)
        at_cap = link.budget_gbps is not None and link.gbps >= share * link.budget_gbps * (1 - 1e-6)
        if at_cap and link.source in min_tp:
            binding.append(
                f"link {link.source}->{link.target} at {share:.0%} of its {link.budget_gbps:g} Gbit/s budget"
            )
    if request.kv_budget_gbps is not None:
        cross = sum(link.gbps for link in links if link.source != link.target)
        if cross >= rho[None] * request.kv_budget_gbps * (1 - 1e-6):
            binding.append(f"kv_budget_gbps {request.kv_budget_gbps:g} reached (at {rho[None]:.0%} headroom)")
    budget = request.options.budget_per_hour
    if budget is not None and cost_per_hour + cheapest > budget + 1e-9 * max(1.0, budget):  # no instance fits
        binding.append(
            f"budget_per_hour {budget:g} reached ({cost_per_hour:.2f} in use; one more instance the class "
            f"can use costs {cheapest:.2f}/h)"
        )
    if not binding:
        return "capacity went to classes with more weighted goodput per device (or NIC bandwidth binds)"
    return "; ".join(binding)


def with_dropped_flow(reason: str | None, rps: float) -> str:
    """`reason`, and that `rps` the solver routed through pools it gave no instance is counted unserved."""
    note = (
        f"{rps:.3g} RPS the solver routed through pools with 0 instances (within its numerical tolerances) "
        "is reported unserved"
    )
    return note if reason is None else f"{reason}; {note}"


def with_sliver(reason: str | None, window_s: float, tail_requests: float) -> str:
    """`reason`, and that the sliver the solver served of this class is counted unserved."""
    note = (
        f"the solver served only a sliver, allowing fewer than {tail_requests:g} request(s) beyond the SLO "
        f"percentile per {window_s:g} s window, on which the percentile cannot be promised: reported unserved"
    )
    return note if reason is None else f"{reason}; {note}"


def profile_warnings(request: PlanRequest, table) -> list[str]:
    """What the profile rows leave out of the request, said before anyone wonders why a device sits idle:
    a fleet device with no rows (it can serve nothing); a device with rows for a class's model but none at
    the class's SLO percentile (the class cannot use it); rows without the p50 (a conservative plan that the
    simulator cannot replay); an `options.batch_sizes` or `options.tp_degrees` value no row of the classes'
    models has (never planned); and, for inline rows, rows of a device not in the fleet (a misspelt name:
    those rows serve nothing)."""
    frame = table.frame
    profiled = set(frame["device"])
    warnings = [
        f"device {d.name!r} has no rows in profile set {table.name!r}: it can serve nothing"
        for d in request.devices
        if d.name not in profiled and d.count > 0
    ]
    fleet = [d.name for d in request.devices if d.count > 0 or d.max_count]
    for w in request.workloads:
        q = w.slo.percentile
        rows = frame[frame["model"] == w.model]
        at_q = rows[rows[f"ttft_ms_p{q}"].notna() & rows[f"tbt_ms_p{q}"].notna()]
        for device in sorted(set(rows["device"]) & set(fleet) - set(at_q["device"])):
            warnings.append(
                f"device {device!r} has no rows with ttft_ms_p{q} and tbt_ms_p{q} for model {w.model!r}: "
                f"class {w.name!r} (p{q} SLO) cannot use it"
            )
    models = frame[frame["model"].isin({w.model for w in request.workloads})]
    medianless = models[
        models["device"].isin(fleet) & (models["ttft_ms_p50"].isna() | models["tbt_ms_p50"].isna())
    ]
    for (model, device), _ in medianless.groupby(["model", "device"]):
        warnings.append(
            f"profile rows of model {model!r} on device {device!r} lack ttft_ms_p50 or tbt_ms_p50: the "
            "capacity model takes the next percentile as the median (a conservative plan), and `simulate` "
            "cannot replay them; profile the p50 too"
        )
    for option, column in (("batch_sizes", "batch"), ("tp_degrees", "tp")):
        unprofiled = sorted(set(getattr(request.options, option) or ()) - set(models[column]))
        if unprofiled:
            warnings.append(
                f"options.{option}: {unprofiled} has no profile rows for the classes' models "
                f"(profiled: {sorted(models[column].unique().tolist())}); never planned"
            )
    if request.profiles.rows is not None:
        strangers = sorted(profiled - {d.name for d in request.devices})
        if strangers:
            warnings.append(
                f"profiles.rows name device(s) {strangers} that the fleet does not have "
                f"(devices: {sorted(d.name for d in request.devices)}); those rows serve nothing"
            )
    return warnings


def interpolation_warnings(request: PlanRequest, results: list[WorkloadResult], table) -> list[str]:
    """One warning per (class, pool side) whose latency the plan uses was interpolated across a gap.

    A gap: the class's prompt lies strictly between the two profiled prompt lengths of the pool's (model,
    device, tp, batch) that bracket it, and another (device, tp, batch) of that model was profiled at a
    prompt length strictly between those two. The straight line then spans a range where the profile
    measured the shape of the curve elsewhere but not here (e.g. rows at 128 and 1024, none at 512, while
    other devices have 512).
    """
    by_model, by_group = _profiled_prompts(table)
    workloads = {w.name: w for w in request.workloads}
    warnings: list[str] = []
    seen: set[tuple] = set()
    for result in results:
        w = workloads[result.name]
        for route in result.routes:
            if route.colocated is not None:
                sides = [("TTFT and TBT", route.colocated)]
            else:
                sides = [("TTFT", route.prefill), ("TBT", route.decode)]
            for metric, ref in sides:
                key = (w.name, metric, ref.device, ref.tp, ref.batch)
                if key in seen:
                    continue
                seen.add(key)
                profiled = by_group.get((w.model, ref.device, ref.tp, ref.batch))
                text = _gap(w, metric, ref, profiled, by_model[w.model])
                if text is not None:
                    warnings.append(text)
    return warnings


@per_table
def _profiled_prompts(table) -> tuple[dict, dict]:
    """The sorted profiled prompt lengths per model and per (model, device, tp, batch); kept per table."""
    frame = table.frame
    by_model = {m: np.sort(g["prompt_tokens"].unique()) for m, g in frame.groupby("model")}
    group = ["model", "device", "tp", "batch"]
    by_group = {k: np.sort(g["prompt_tokens"].unique()) for k, g in frame.groupby(group)}
    return by_model, by_group


def _gap(w, metric: str, ref: PoolRef, profiled, model_prompts: np.ndarray) -> str | None:
    prompt = w.prompt_tokens
    if profiled is None or prompt in profiled or prompt < profiled[0] or prompt > profiled[-1]:
        return None
    lo, hi = int(profiled[profiled < prompt][-1]), int(profiled[profiled > prompt][0])
    inside = [int(p) for p in model_prompts if lo < p < hi]
    if not inside:
        return None
    return (
        f"class {w.name!r}: {metric} of {w.model} on {ref.device} (tp {ref.tp}, batch {ref.batch}) at "
        f"prompt {prompt} is interpolated between its profiled prompts {lo} and {hi}, across a gap: other "
        f"profiles of {w.model} have rows at {inside} in between, this one does not"
    )
