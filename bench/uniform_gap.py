"""Where the best safe uniform plan's lead comes from: the capacity model's value of that plan's fleet.

    python -m bench.uniform_gap [--uniform-from bench/results/fidelity-latest.json] [--only gen-24 ...]

For every request of the fidelity benchmark (bench/fidelity.py) with a recorded best safe uniform plan:
1. plan it again with the flat model at its recorded rho (the plan the simulator judged safe), and count its
   instances per pool shape (owner, role, device, tp, batch);
2. hold the queueing model's instance counts at those (each shape's `n[s]` column, or its one pool's `x`;
   `optimize.optimize_fixed`) and let the MILP choose only the split into headroom levels and mixes and
   the flows (maximizing goodput, also for a min_cost request: plan() falls back to it when not every
   class fits, as on `infeasible`), then apply the pooled credit as `plan()` does (`solver/pooled.py`).
3. plan it at default options, as bench/fidelity.py does.
The "fleet under the model" column is that objective: what the capacity model admits on the uniform plan's
own hardware. Against the default plan's objective it tells the two reasons a request can fall below the
uniform plan apart:
- fleet under the model >= default: the MILP (or the credit applied after it) missed a fleet the model
  itself admits at more, i.e. a solver or formulation question;
- fleet under the model < default: the model admits less on that fleet than the simulator showed safe,
  i.e. the capacity model's conservatism, which no solver change removes.
No simulation runs (about a minute for all 34 requests). Prints a table and writes
bench/results/uniform_gap-<UTC timestamp>.json and uniform_gap-latest.json.
"""

import argparse
import math
import statistics
import time
from pathlib import Path

import msgspec
import numpy as np

from bench.fidelity import objective, recorded_uniform, requests
from bench.record import report
from fleetplan.models.plan import PlanRequest
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.formulation import KEY, build_matrix, instance_units
from fleetplan.solver.optimize import optimize_fixed
from fleetplan.solver.pipeline import plan, resolve_profiles
from fleetplan.solver.window import settle

ROOT = Path(__file__).resolve().parent.parent
LATEST = ROOT / "bench" / "results" / "fidelity-latest.json"


def uniform_counts(request: PlanRequest, rho: float) -> tuple[dict[tuple, int], float]:
    """The flat plan at `rho`: its instances per pool shape and its objective."""
    options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=rho)
    result = plan(msgspec.structs.replace(request, options=options), with_baselines=False)
    counts: dict[tuple, int] = {}
    for pool in result.pools:
        key = (pool.workload or pool.model, pool.role, pool.device, pool.tp, pool.batch)
        counts[key] = counts.get(key, 0) + pool.instances
    return counts, objective(result)


def fleet_under_model(request: PlanRequest, counts: dict[tuple, int]) -> dict:
    """The queueing model's best objective with every pool shape's instances held at `counts` (the MILP's
    and after the pooled credit), and the shapes of `counts` it has no pool for (their instances idle)."""
    if request.options.objective == "min_cost":  # as plan() falls back when not every class fits
        request = msgspec.structs.replace(
            request, options=msgspec.structs.replace(request.options, objective="max_goodput")
        )
    cand = build_candidates(request, resolve_profiles(request, None))
    form, cols = build_matrix(cand)
    columns, pools = instance_units(cand, cols)
    keys = [tuple(row) for row in cand.pools[KEY].itertuples(index=False)]
    # at most a column's bound (formulation.column_bounds: instances beyond it carry nothing more)
    fixed = {
        int(c): min(float(counts.get(_plain(keys[p]), 0)), float(form.col_hi[c]))
        for c, p in zip(columns, pools, strict=True)
    }
    outcome = optimize_fixed(request, cand, fixed)
    if outcome.values is None:
        return {"milp": None, "credited": None, "missing": sorted(map(str, counts))}
    goodput = outcome.form.objectives["goodput"]
    milp = float(goodput @ outcome.values)
    _, credited = settle(request, cand, outcome)
    offered = {_plain(k) for k in keys}
    return {
        "milp": milp,
        "credited": float(goodput @ credited.values),
        "missing": sorted(str(k) for k in counts if k not in offered),
    }


def _plain(key: tuple) -> tuple:
    """A pool key with numpy scalars as Python ones (to match the plan's)."""
    return tuple(v.item() if isinstance(v, np.generic) else v for v in key)


def evaluate(name: str, request: PlanRequest, uniform: dict) -> dict:
    began = time.perf_counter()
    default = objective(plan(request, with_baselines=False))
    counts, flat_objective = uniform_counts(request, uniform["rho"])
    valued = fleet_under_model(request, counts)
    return {
        "request": name,
        "uniform_rho": uniform["rho"],
        "uniform_objective": uniform["objective"],
        "flat_objective_now": flat_objective,
        "default_objective": default,
        "fleet_milp": valued["milp"],
        "fleet_credited": valued["credited"],
        "missing_shapes": valued["missing"],
        "wall_s": round(time.perf_counter() - began, 1),
    }


def render(rows: list[dict]) -> str:
    head = (
        f"{'request':12s} {'rho':>5s} {'uniform':>9s} {'default':>9s} {'fleet under model':>18s}"
        f" {'(MILP)':>9s} {'fleet/uniform':>13s} {'default/uniform':>15s}  reading"
    )
    lines = [head]
    for r in rows:
        fleet = r["fleet_credited"] or 0.0
        u, d = r["uniform_objective"], r["default_objective"]
        reading = "" if d >= u * (1 - 1e-6) else ("solver" if fleet >= d else "model")
        lines.append(
            f"{r['request']:12s} {r['uniform_rho']:5.2f} {u:9.3f} {d:9.3f} {fleet:18.3f}"
            f" {r['fleet_milp'] or 0.0:9.3f} {fleet / u:13.3f} {d / u:15.3f}  {reading}"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> dict:
    below = [r for r in rows if r["default_objective"] < r["uniform_objective"] * (1 - 1e-6)]
    ratios = [r["fleet_credited"] / r["uniform_objective"] for r in rows if r["fleet_credited"]]
    return {
        "requests": len(rows),
        "below_uniform": [r["request"] for r in below],
        "below_uniform_for_the_model": [
            r["request"] for r in below if (r["fleet_credited"] or 0.0) < r["default_objective"]
        ],
        "geomean_fleet_over_uniform": math.exp(statistics.mean(map(math.log, ratios))) if ratios else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uniform-from", type=Path, default=LATEST)
    parser.add_argument("--only", nargs="*", help="request names (e.g. paper gen-24)")
    parser.add_argument("--generated", type=int, default=30)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    recorded = recorded_uniform(args.uniform_from)
    rows = []
    for name, request in requests(args.generated):
        uniform = recorded.get(name)
        if (args.only and name not in args.only) or not uniform or uniform.get("rho") is None:
            continue
        rows.append(evaluate(name, request, uniform))
        print(f"{name}: {rows[-1]['wall_s']} s", flush=True)
    report("uniform_gap", args, began, render(rows), summary=summary(rows), requests=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
