"""How much more load a plan keeps its promise under, on its own hardware and routes.

    python -m bench.load_slack [--only paper gen-16] [--scales 1.1 1.2 1.3 1.5 2.0] [--seeds 0 1 2]

For every request of the fidelity benchmark (bench/fidelity.py) it plans at default options and simulates
the plan with every class's arrivals scaled (`simulate(..., rate_scale=s)`: each route's Poisson stream at
s times its planned rate), at each scale in turn until a served class breaks its SLO percentile on one of
the seeds (600 s after a 60 s warm-up, as the fidelity bench judges). It reports the largest scale held,
and at the first scale that breaks, how many (class, seed) pairs broke their TTFT and their TBT, and the
plan's busiest pool of each role (its utilization: the share of the pool's full-batch rate it carries).
bench/route_tails.py counts how far inside the SLO each route's requests are; this says whether that is
slack in load too.

Prints a table and writes bench/results/load_slack-<UTC timestamp>.json (and load_slack-latest.json).
About a minute for the 34 requests on 2 processes.
"""

import argparse
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from bench.fidelity import requests
from bench.record import report
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.simulator import simulate
from fleetplan.solver import plan
from fleetplan.solver.pipeline import resolve_profiles


def broken(request: PlanRequest, result: Plan, scale: float, seeds: list[int], duration: float) -> dict:
    """(class, seed) pairs whose served class breaks its TTFT or its TBT percentile at `scale`."""
    table = resolve_profiles(request)
    out = {"ttft": 0, "tbt": 0}
    for seed in seeds:
        report = simulate(
            request, result, table, duration_s=duration, warmup_s=60.0, seed=seed, rate_scale=scale
        )
        for c in report.classes:
            if c.predicted_rps <= 0 or c.slo_met:
                continue
            q = c.slo_percentile
            ttft, tbt = getattr(c, f"ttft_ms_p{q}"), getattr(c, f"tbt_ms_p{q}")
            out["ttft"] += int(ttft is None or ttft > c.slo_ttft_ms)
            out["tbt"] += int(tbt is None or tbt > c.slo_tbt_ms)
    return out


def evaluate(job: tuple[str, PlanRequest, list[float], list[int], float]) -> dict:
    name, request, scales, seeds, duration = job
    began = time.perf_counter()
    result = plan(request, with_baselines=False)
    busiest = {}
    for pool in result.pools:
        busiest[pool.role] = max(busiest.get(pool.role, 0.0), pool.utilization)
    row = {"request": name, "slo_rps": result.slo_rps, "held": 1.0, "breaks_at": None, "busiest": busiest}
    for scale in scales:
        counts = broken(request, result, scale, seeds, duration)
        if counts["ttft"] or counts["tbt"]:
            row.update(breaks_at=scale, broken_ttft=counts["ttft"], broken_tbt=counts["tbt"])
            break
        row["held"] = scale
    row["wall_s"] = round(time.perf_counter() - began, 1)
    return row


def render(rows: list[dict]) -> str:
    lines = [
        "| request | SLO RPS | held | breaks at | broken TTFT / TBT (class, seed) "
        "| busiest prefill / decode / colocated |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        busy = " / ".join(f"{r['busiest'][role]:.2f}" if role in r["busiest"] else "-" for role in _ROLES)
        at = "-" if r["breaks_at"] is None else f"{r['breaks_at']}x"
        counts = "-" if r["breaks_at"] is None else f"{r['broken_ttft']} / {r['broken_tbt']}"
        lines.append(f"| {r['request']} | {r['slo_rps']:.2f} | {r['held']}x | {at} | {counts} | {busy} |")
    return "\n".join(lines)


_ROLES = ("prefill", "decode", "colocated")


def summary(rows: list[dict]) -> dict:
    held = [r["held"] for r in rows]
    return {
        "requests": len(rows),
        "held": {str(s): held.count(s) for s in sorted(set(held))},
        "median_held": statistics.median(held) if held else None,
        "broken_ttft": sum(r.get("broken_ttft", 0) for r in rows),
        "broken_tbt": sum(r.get("broken_tbt", 0) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="request names (default: all)")
    parser.add_argument("--scales", nargs="+", type=float, default=[1.1, 1.2, 1.3, 1.5, 2.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--generated", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    jobs = [
        (name, request, sorted(args.scales), args.seeds, args.duration)
        for name, request in requests(args.generated)
        if not args.only or name in args.only
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(evaluate, jobs))
    report("load_slack", args, began, render(rows), summary=summary(rows), requests=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
