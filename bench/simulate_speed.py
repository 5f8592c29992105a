"""How fast the simulator (fleetplan.simulator) replays a plan: one simulated hour of a ~100-RPS fleet.

The fleet is the paper fixture with twice the devices and twice the demand, planned with
the flat model at max_utilization 0.6 (healthy); arrivals are scaled so the total offered rate is --rps.

    .venv/bin/python -m bench.simulate_speed                  # 1 h at 100 RPS, 3 repeats
    .venv/bin/python -m bench.simulate_speed --hours 0.25 --repeat 1

Writes bench/results/simulate_speed-<UTC timestamp>.json and simulate_speed-latest.json.
"""

import argparse
import datetime as dt
import time
from pathlib import Path

import msgspec
import numpy as np

from bench.record import git_info, machine_info, write_results
from fleetplan import fixtures
from fleetplan.models.plan import Options, PlanRequest
from fleetplan.simulator import simulate
from fleetplan.solver.pipeline import plan, resolve_profiles

ROOT = Path(__file__).resolve().parent.parent


def fleet(scale: int = 2) -> PlanRequest:
    request = msgspec.json.decode(fixtures.request_path("paper").read_bytes(), type=PlanRequest)
    devices = [msgspec.structs.replace(d, count=d.count * scale) for d in request.devices]
    workloads = [msgspec.structs.replace(w, rate_rps=w.rate_rps * scale) for w in request.workloads]
    return msgspec.structs.replace(
        request,
        devices=devices,
        workloads=workloads,
        options=Options(capacity_model="flat", max_utilization=0.6),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rps", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    request = fleet()
    began = time.perf_counter()
    result = plan(request, with_baselines=False)
    plan_ms = 1e3 * (time.perf_counter() - began)
    table = resolve_profiles(request)
    scale = args.rps / result.slo_rps
    duration = 3600.0 * args.hours
    runs = []
    for i in range(args.repeat):
        report = simulate(
            request, result, table, duration_s=duration, warmup_s=60.0, seed=args.seed + i, rate_scale=scale
        )
        runs.append(
            {
                "seed": args.seed + i,
                "wall_s": report.wall_ms / 1e3,
                "events": report.events,
                "events_per_s": report.events / (report.wall_ms / 1e3),
                "arrivals": report.arrivals,
                "offered_rps": report.offered_rps,
                "goodput_rps": report.goodput_rps,
                "predicted_goodput_rps": report.predicted_goodput_rps * scale,
                "attainment": report.attainment,
            }
        )
    walls = [r["wall_s"] for r in runs]
    summary = {
        "simulated_s": duration + 60.0,
        "wall_s_median": float(np.median(walls)),
        "wall_s_min": float(min(walls)),
        "events_median": int(np.median([r["events"] for r in runs])),
        "events_per_s_median": float(np.median([r["events_per_s"] for r in runs])),
        "sim_seconds_per_wall_second": (duration + 60.0) / float(np.median(walls)),
    }
    header = (
        f"{'seed':>4} {'wall s':>8} {'events':>10} {'events/s':>10} "
        f"{'offered':>8} {'goodput':>8} {'attain':>7}"
    )
    lines = [header] + [
        f"{r['seed']:>4} {r['wall_s']:>8.2f} {r['events']:>10} {r['events_per_s']:>10.0f} "
        f"{r['offered_rps']:>8.2f} {r['goodput_rps']:>8.2f} {r['attainment']:>7.3f}"
        for r in runs
    ]
    lines.append(
        f"median wall {summary['wall_s_median']:.2f} s for {duration / 3600:.2f} h (+60 s warmup) "
        f"at {args.rps:.0f} RPS: {summary['events_per_s_median']:.0f} events/s, "
        f"{summary['sim_seconds_per_wall_second']:.0f}x real time"
    )
    table_text = "\n".join(lines)
    print(
        f"plan: {result.slo_rps:.2f} RPS planned, {sum(p.instances for p in result.pools)} instances, "
        f"{plan_ms:.0f} ms; rate_scale {scale:.3f}"
    )
    print(table_text)

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = {
        "benchmark": "simulate_speed",
        "timestamp": stamp,
        "machine": machine_info(),
        "git": git_info(),
        "args": vars(args),
        "fleet": {
            "planned_rps": result.slo_rps,
            "rate_scale": scale,
            "instances": sum(p.instances for p in result.pools),
        },
        "summary": summary,
        "runs": runs,
        "table": table_text,
    }
    write_results("simulate_speed", out)


if __name__ == "__main__":
    main()
