"""The flat model's headroom: plan each fixture at several max_utilization values, simulate every plan, report
the highest value whose simulated SLO attainment stays >= 99% on every fixture.

    python -m bench.headroom_sweep [--values 0.4 0.5 ...] [--duration 600] [--seeds 0 1 2]

Writes bench/results/headroom_sweep-<UTC timestamp>.json and headroom_sweep-latest.json.
"""

import argparse
import datetime
import statistics
import time
from pathlib import Path

import msgspec

from bench.record import write_results
from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.simulator import simulate
from fleetplan.solver import plan
from fleetplan.solver.pipeline import resolve_profiles

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = ("paper", "scarce_gpus", "link_bound")
TARGET = 0.99


def sweep(values: list[float], duration_s: float, seeds: list[int]) -> list[dict]:
    rows = []
    for fixture in FIXTURES:
        request = read_request(fixtures.request_path(fixture))
        table = resolve_profiles(request)
        for rho in values:
            options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=rho)
            at_rho = msgspec.structs.replace(request, options=options)
            planned = plan(at_rho, with_baselines=False)
            runs = [simulate(at_rho, planned, table, duration_s=duration_s, seed=seed) for seed in seeds]
            rows.append(
                {
                    "fixture": fixture,
                    "max_utilization": rho,
                    "planned_rps": planned.slo_rps,
                    "simulated_rps": statistics.mean(r.goodput_rps for r in runs),
                    "attainment": statistics.mean(r.attainment for r in runs),
                    "attainment_min": min(r.attainment for r in runs),
                    "goodput_error": statistics.mean(r.goodput_rps for r in runs) / planned.slo_rps - 1
                    if planned.slo_rps
                    else 0.0,
                }
            )
            r = rows[-1]
            print(
                f"{fixture:<12} rho {rho:.2f}  planned {r['planned_rps']:7.2f}"
                f"  simulated {r['simulated_rps']:7.2f}  ({r['goodput_error']:+.1%})"
                f"  attainment {r['attainment']:.1%} (min {r['attainment_min']:.1%})",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=float, nargs="+", default=[0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    began = time.perf_counter()
    rows = sweep(args.values, args.duration, args.seeds)
    ok = [
        rho
        for rho in args.values
        if all(r["attainment_min"] >= TARGET for r in rows if r["max_utilization"] == rho)
    ]
    best = max(ok) if ok else None
    print(
        f"highest max_utilization with simulated attainment >= {TARGET:.0%} on every fixture and seed: {best}"
    )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "created": stamp,
        "target_attainment": TARGET,
        "duration_s": args.duration,
        "seeds": args.seeds,
        "best_max_utilization": best,
        "rows": rows,
        "wall_s": time.perf_counter() - began,
    }
    write_results("headroom_sweep", result)


if __name__ == "__main__":
    main()
