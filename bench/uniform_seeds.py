"""Do the best safe uniform plans keep their promises beyond the seeds that chose them?

    python -m bench.uniform_seeds [--only gen-16 gen-21 gen-28] [--seeds 3 4 ... 14]
                                  [--uniform-from bench/results/fidelity-latest.json]

bench/fidelity.py picks each request's best safe uniform plan as the first rho from the top (0.95 .. 0.30)
whose flat plan keeps every served class's percentile on seeds 0, 1 and 2: the largest of fourteen noisy
pass/fail verdicts, so a plan at the edge of its promise can pass on those three seeds by luck. The default
plans are held to more: every served class is checked on seeds 0-14 (README, "Fidelity"). This bench puts
the uniform plans to the same test. For each request with a recorded uniform plan (`--uniform-from`):
1. plan it with the flat model at its recorded rho and simulate it on `--seeds` (default 3-14; 600 s after a
   60 s warm-up, as the fidelity bench does), stopping at the first seed that breaks a served class;
2. where it breaks, walk rho down by 0.05 (past the fidelity bench's 0.30, to 0.05) to the first plan that
   keeps every promise on seeds 0-2 and on `--seeds` (the best uniform plan safe on all of them);
3. plan it at default options (the fidelity bench's plan, whose promises its runs check on seeds 0-14) and
   compare its objective with both uniform ones.
Simulation is the judge as in bench/fidelity.py; nothing about it changes here. Prints a table and writes
bench/results/uniform_seeds-<UTC timestamp>.json and uniform_seeds-latest.json. About 15-30 s a request
whose uniform plan holds, minutes for one that must walk down (2 workers).
"""

import argparse
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec

from bench.fidelity import RESULTS, RHOS, judge, objective, recorded_uniform, requests
from bench.record import report
from bench.solver_scaling import table
from fleetplan.models.plan import PlanRequest
from fleetplan.solver import plan

DURATION_S = 600.0
JUDGED = [0, 1, 2]  # the seeds bench/fidelity.py chose the uniform plans on
# the walk down goes past bench/fidelity.py's lowest rho (0.30), so that a request none of whose uniform
# plans there holds on every seed still gets a reference
WALK = [*RHOS, 0.25, 0.2, 0.15, 0.1, 0.05]


def at_rho(request: PlanRequest, rho: float) -> PlanRequest:
    """The request planned with the flat model at a uniform rho (bench/fidelity.py's uniform plans)."""
    options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=rho)
    return msgspec.structs.replace(request, options=options)


def first_break(request: PlanRequest, result, seeds: list[int]) -> tuple[int, str] | None:
    """(seed, class) of the first served class that misses its percentile, or None if every one holds
    (`judge` stops at the first seed that breaks one: its report is the last)."""
    ok, reports = judge(request, result, seeds, DURATION_S, stop_early=True)
    if ok:
        return None
    broken = next(c.name for c in reports[-1].classes if c.predicted_rps > 0 and not c.slo_met)
    return seeds[len(reports) - 1], broken


def walk_down(request: PlanRequest, start: float, seeds: list[int]) -> dict:
    """The first rho below `start` whose flat plan keeps every promise on JUDGED and `seeds`."""
    for rho in (r for r in WALK if r < start - 1e-9):
        at = at_rho(request, rho)
        result = plan(at, with_baselines=False)
        if first_break(at, result, JUDGED + seeds) is None:
            return {"rho": rho, "objective": objective(result), "slo_rps": result.slo_rps}
    return {"rho": None, "objective": 0.0, "slo_rps": 0.0}


def evaluate(job: tuple[str, PlanRequest, dict, list[int]]) -> dict:
    name, request, uniform, seeds = job
    began = time.perf_counter()
    rho = uniform["rho"]
    row: dict = {"request": name, "rho": rho, "uniform": uniform["objective"]}
    default = plan(request, with_baselines=False)
    row["default"] = objective(default)
    if rho is None:
        row.update(breaks=None, safe_rho=None, safe_uniform=0.0)
    else:
        at = at_rho(request, rho)
        broke = first_break(at, plan(at, with_baselines=False), seeds)
        row["breaks"] = None if broke is None else {"seed": broke[0], "class": broke[1]}
        safe = (
            {"rho": rho, "objective": uniform["objective"]}
            if broke is None
            else walk_down(request, rho, seeds)
        )
        row.update(safe_rho=safe["rho"], safe_uniform=safe["objective"])
    row["seconds"] = round(time.perf_counter() - began, 1)
    print(f"{name}: {row['seconds']} s", flush=True)
    return row


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def render(rows: list[dict], seeds: list[int]) -> tuple[str, dict]:
    header = ["request", "rho 0-2", "uniform", f"breaks on {seeds[0]}-{seeds[-1]}", "rho all seeds"]
    header += ["uniform all seeds", "default", "default/uniform", "default/uniform all seeds"]
    lines = []
    for r in rows:
        broke = "-" if not r.get("breaks") else f"seed {r['breaks']['seed']}: {r['breaks']['class']}"
        lines.append(
            [
                r["request"],
                "-" if r["rho"] is None else f"{r['rho']:.2f}",
                f"{r['uniform']:.3f}",
                broke,
                "-" if r["safe_rho"] is None else f"{r['safe_rho']:.2f}",
                f"{r['safe_uniform']:.3f}",
                f"{r['default']:.3f}",
                f"{ratio(r['default'], r['uniform']):.3f}",
                f"{ratio(r['default'], r['safe_uniform']):.3f}",
            ]
        )
    finite = [r for r in rows if r["uniform"] > 0 and r["safe_uniform"] > 0]
    summary = {
        "requests": len(rows),
        "uniform_breaks_beyond_0_2": [r["request"] for r in rows if r.get("breaks")],
        "default_at_least_uniform": sum(r["default"] >= r["uniform"] * (1 - 1e-9) for r in rows),
        "default_at_least_uniform_all_seeds": sum(
            r["default"] >= r["safe_uniform"] * (1 - 1e-9) for r in rows
        ),
        "geomean_default_over_uniform": statistics.geometric_mean(
            [ratio(r["default"], r["uniform"]) for r in finite]
        )
        if finite
        else None,
        "geomean_default_over_uniform_all_seeds": statistics.geometric_mean(
            [ratio(r["default"], r["safe_uniform"]) for r in finite]
        )
        if finite
        else None,
    }
    return table(header, lines), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="request names (e.g. gen-16 gen-21)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(3, 15)))
    parser.add_argument("--generated", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--uniform-from", type=Path, default=RESULTS / "fidelity-latest.json")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    uniform = recorded_uniform(args.uniform_from)
    jobs = [
        (name, request, uniform[name], args.seeds)
        for name, request in requests(args.generated)
        if name in uniform and (not args.only or name in args.only)
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(evaluate, jobs))
    text, summary = render(rows, args.seeds)
    report("uniform_seeds", args, began, text, summary=summary, requests=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
