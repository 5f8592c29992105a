"""Each route's own share of SLO misses in simulation: does a plan keep a class's percentile route by
route, or only over the class's mix of routes?

    python -m bench.route_tails [--only gen-16 gen-28] [--plans default uniform] [--seeds 0 1 2]
                                [--uniform-from bench/results/fidelity-latest.json]

The promise is per class (../shared/design/capacity.md): the q-th percentile of a class's TTFT and TBT over
all its requests. The capacity model plans each route (a class through a pool) at its own tail probability
(TAIL_MARGIN of 1 - q / 100), so a route that misses the SLO more often than that, made up by a faster
route of the same class, is a plan it never offers. This bench tells the two apart on real plans. For each
request it plans at default options ("default") and with the flat model at the request's recorded best
safe uniform rho ("uniform", bench/fidelity.py's), splits every served class into one class per route at
that route's rate (a Poisson stream routed at random is one independent Poisson stream per route, as the
simulator draws them), simulates the split plan on the seeds (600 s after a 60 s warm-up, as the fidelity
bench does) and counts, per route and per class, the measured requests whose TTFT, or whose mean TBT,
exceeds the class's SLO. A class keeps its percentile while its share stays below 1 - q / 100.

Prints a table and writes bench/results/route_tails-<UTC timestamp>.json (and route_tails-latest.json).
About 20 s a plan.
"""

import argparse
import time
from pathlib import Path

import msgspec
import numpy as np

from bench.fidelity import recorded_uniform, requests
from bench.record import report
from bench.uniform_gap import LATEST as LATEST_UNIFORM  # the recorded best safe uniform plans
from fleetplan.models.plan import Plan, PlanRequest, WorkloadResult
from fleetplan.simulator import simulate
from fleetplan.solver import plan
from fleetplan.solver.pipeline import resolve_profiles


def planned(request: PlanRequest, kind: str, uniform: dict | None) -> Plan | None:
    """The plan at default options, or the flat model's at the recorded uniform rho (None without one)."""
    if kind == "default":
        return plan(request, with_baselines=False)
    if not uniform or uniform.get("rho") is None:
        return None
    options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=uniform["rho"])
    return plan(msgspec.structs.replace(request, options=options), with_baselines=False)


def split(request: PlanRequest, result: Plan) -> tuple[PlanRequest, Plan, list[tuple[int, int]]]:
    """The request and plan with every route its own class (named class#route, at the route's rate), and
    per new class its (class, route) position."""
    workloads, results, where = [], [], []
    for w, (workload, served) in enumerate(zip(request.workloads, result.workloads, strict=True)):
        for r, route in enumerate(served.routes):
            name = f"{workload.name}#{r}"
            workloads.append(msgspec.structs.replace(workload, name=name, rate_rps=route.rps))
            results.append(
                WorkloadResult(name=name, served_rps=route.rps, unserved_rps=0.0, reason=None, routes=[route])
            )
            where.append((w, r))
    return (
        msgspec.structs.replace(request, workloads=workloads),
        msgspec.structs.replace(result, workloads=results),
        where,
    )


def misses(request: PlanRequest, result: Plan, seeds: list[int], duration: float) -> list[dict]:
    """Per route of `result`: its requests measured over the seeds and how many missed each SLO."""
    split_request, split_plan, where = split(request, result)
    table = resolve_profiles(request)
    counts = np.zeros((len(where), 3), dtype=np.int64)  # measured, TTFT misses, TBT misses
    for seed in seeds:
        report = simulate(
            split_request, split_plan, table, duration_s=duration, warmup_s=60.0, seed=seed, keep_samples=True
        )
        for i, (metrics, (w, _)) in enumerate(zip(report.classes, where, strict=True)):
            slo = request.workloads[w].slo
            ttft, tbt = np.asarray(metrics.ttft_ms_samples or []), np.asarray(metrics.tbt_ms_samples or [])
            counts[i] += (len(ttft), int((ttft > slo.ttft_ms).sum()), int((tbt > slo.tbt_ms).sum()))
    rows = []
    for (w, r), (n, ttft_out, tbt_out) in zip(where, counts, strict=True):
        route = result.workloads[w].routes[r]
        rows.append(
            {
                "class": request.workloads[w].name,
                "percentile": request.workloads[w].slo.percentile,
                "route": _label(route),
                "rps": route.rps,
                "measured": int(n),
                "ttft_miss": int(ttft_out) / max(int(n), 1),
                "tbt_miss": int(tbt_out) / max(int(n), 1),
                "ttft_misses": int(ttft_out),
                "tbt_misses": int(tbt_out),
            }
        )
    return rows


def _label(route) -> str:
    first = route.colocated or route.prefill
    return f"{first.device}/b{first.batch}" + (f" -> {route.decode.device}" if route.decode else "")


def per_class(routes: list[dict]) -> list[dict]:
    """Each class's share of misses over its routes, against what its percentile allows."""
    out: dict[str, dict] = {}
    for row in routes:
        c = out.setdefault(row["class"], {"class": row["class"], "allowed": 1 - row["percentile"] / 100})
        for key in ("measured", "ttft_misses", "tbt_misses"):
            c[key] = c.get(key, 0) + row[key]
        c["worst_route_ttft_miss"] = max(c.get("worst_route_ttft_miss", 0.0), row["ttft_miss"])
    for c in out.values():
        c["ttft_miss"] = c["ttft_misses"] / max(c["measured"], 1)
        c["tbt_miss"] = c["tbt_misses"] / max(c["measured"], 1)
        c["mix_only"] = c["worst_route_ttft_miss"] > c["allowed"] >= c["ttft_miss"]
    return list(out.values())


def render(rows: list[dict]) -> str:
    lines = [
        "| request | plan | class | route | requests/s | TTFT misses | TBT misses | allowed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for r in row["routes"]:
            allowed = 1 - r["percentile"] / 100
            lines.append(
                f"| {row['request']} | {row['plan']} | {r['class']} | {r['route']} | {r['rps']:.2f} "
                f"| {r['ttft_miss']:.3f} | {r['tbt_miss']:.3f} | {allowed:.3f} |"
            )
        for c in row["classes"]:
            mark = " (only over its routes)" if c["mix_only"] else ""
            lines.append(
                f"| {row['request']} | {row['plan']} | {c['class']}, all routes{mark} | | "
                f"| {c['ttft_miss']:.3f} | {c['tbt_miss']:.3f} | {c['allowed']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="request names (default: every one with a uniform plan)")
    parser.add_argument("--plans", nargs="+", default=["default", "uniform"], choices=["default", "uniform"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--generated", type=int, default=30)
    parser.add_argument("--uniform-from", type=Path, default=LATEST_UNIFORM)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    recorded = recorded_uniform(args.uniform_from)
    rows = []
    for name, request in requests(args.generated):
        if args.only and name not in args.only:
            continue
        for kind in args.plans:
            result = planned(request, kind, recorded.get(name))
            if result is None:
                continue
            routes = misses(request, result, args.seeds, args.duration)
            rows.append(
                {
                    "request": name,
                    "plan": kind,
                    "slo_rps": result.slo_rps,
                    "routes": routes,
                    "classes": per_class(routes),
                }
            )
            print(f"{name} {kind}: {round(time.perf_counter() - began, 1)} s", flush=True)
    report("route_tails", args, began, render(rows), requests=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
