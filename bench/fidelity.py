"""Fidelity: does the planned SLO RPS hold in simulation, and how does it compare with the best uniform rho?

    python -m bench.fidelity [--generated 30] [--duration 600] [--seeds 0 1 2] [--workers 2] [--only NAME ...]
    python -m bench.fidelity --uniform-from bench/results/fidelity-...json --objective max_min_fraction

For every bundled request and `--generated` generated ones (random fleets of the paper set's devices,
counts, classes, rates, SLO scales, p90/p99 mixes, weights and link budgets; fixed seeds):
1. plan at default options (the queueing capacity model), simulate on every seed for `--duration` s after a
   60 s warm-up, and record per served class the predicted and simulated TTFT/TBT at its SLO percentile and
   `slo_met` (the promise of ../docs/formulation.md: every served class meets its percentile on every seed);
2. plan with the flat model at uniform rho = 0.95, 0.90, ..., 0.30 and simulate each plan (a seed that
   breaks a promise stops that rho): the best safe uniform plan is the first rho, from the top, whose plan
   keeps every promise on every seed.
Both plans maximize the same objective, sum_w weight_w x served_w (SLO RPS when every weight is 1), so the
ratio is taken on that objective; the table shows the unweighted SLO RPS beside it.
Prints a table and writes bench/results/fidelity-<UTC timestamp>.json and fidelity-latest.json. Each request's
row is appended to bench/results/fidelity-partial.jsonl as it finishes; `--resume` skips the requests found
there (a full run takes hours on 2 cores). `--uniform-from bench/results/fidelity-latest.json` reuses each
request's recorded best safe uniform plan and judges only the default plans (20 s for all 34 on a
quiet machine), for trying a change to the capacity model or the solver; it writes fidelity_plans-*.json.
With it, `--objective` plans every request with another objective (min_cost, max_min_fraction: the promise
holds for each) and writes fidelity_<objective>-*.json, and `--replan SCALE` judges the nightly job's
re-plans instead: each request planned, then re-planned against that plan with every class's demand times
SCALE, churn-limited as `fleetplan replan` does (`--max-moves`, the default penalty); it writes
fidelity_replan<SCALE>-*.json.
"""

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec
import numpy as np

from bench.record import git_info, git_line, machine_info, machine_line, write_results
from bench.solver_scaling import table
from fleetplan import fixtures
from fleetplan.models.codec import read_request, to_builtins
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.replan.service import DEFAULT_CHURN_PENALTY
from fleetplan.simulator import simulate
from fleetplan.solver import plan
from fleetplan.solver.formulation import Churn
from fleetplan.solver.pipeline import resolve_profiles

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RHOS = [round(0.95 - 0.05 * k, 2) for k in range(14)]  # 0.95 .. 0.30
BUNDLED = ("paper", "scarce_gpus", "link_bound", "infeasible")
PROMPTS = {"short": 128, "medium": 512, "long": 1024}
SLO = {"short": (200.0, 50.0), "medium": (500.0, 50.0), "long": (1000.0, 100.0)}  # paper.json's SLOs
MODELS = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b", "mistral": "mistral-7b"}


# --- requests -------------------------------------------------------------------------------------------


def generated(seed: int) -> PlanRequest:
    """A random request on the paper set's devices: counts, classes, rates, SLO scales, p90/p99, weights."""
    rng = np.random.default_rng(1000 + seed)
    base = to_builtins(read_request(fixtures.request_path("paper")))
    specs = {d["name"]: d for d in base["devices"]}
    counts = {
        "a6000ada": int(rng.integers(1, 7)),
        "inf2": int(rng.integers(0, 11)),
        "tpu-v5e": int(rng.integers(0, 11)),
    }
    devices = [{**specs[name], "count": n} for name, n in counts.items() if n > 0]
    workloads = []
    n_classes = int(rng.integers(2, 8))
    for index in range(n_classes):
        model = str(rng.choice(list(MODELS)))
        size = str(rng.choice(list(PROMPTS)))
        scale = float(rng.choice([0.6, 0.8, 1.0, 1.25, 1.5]))
        ttft, tbt = SLO[size]
        workloads.append(
            {
                "name": f"{model}-{size}-{index}",
                "model": MODELS[model],
                "prompt_tokens": PROMPTS[size],
                "output_tokens": int(rng.choice([32, 128, 256])),
                "rate_rps": round(float(rng.uniform(1.0, 20.0)), 2),
                "slo": {
                    "ttft_ms": ttft * scale,
                    "tbt_ms": tbt * scale,
                    "percentile": int(rng.choice([90, 90, 99])),
                },
                "weight": float(rng.choice([1.0, 1.0, 0.5, 2.0])),
            }
        )
    body = {
        "devices": devices,
        "workloads": workloads,
        "profiles": {"set": "paper"},
        "options": {"time_limit_s": 20},
    }
    if rng.random() < 0.3 and len(devices) > 1:
        src, dst = rng.choice([d["name"] for d in devices], size=2, replace=False)
        body["links"] = [
            {"source": str(src), "target": str(dst), "gbps": float(rng.choice([5.0, 10.0, 25.0]))}
        ]
    return msgspec.convert(body, PlanRequest)


def requests(n_generated: int) -> list[tuple[str, PlanRequest]]:
    out = [(name, read_request(fixtures.request_path(name))) for name in BUNDLED]
    return out + [(f"gen-{seed:02d}", generated(seed)) for seed in range(n_generated)]


# --- one request ----------------------------------------------------------------------------------------


def judge(
    request: PlanRequest, result, seeds: list[int], duration: float, stop_early: bool
) -> tuple[bool, list]:
    """Simulate a plan on the seeds; (every served class met its percentile on every seed, reports)."""
    table = resolve_profiles(request)
    reports, ok = [], True
    if result.slo_rps <= 0:
        return True, reports
    for seed in seeds:
        report = simulate(request, result, table, duration_s=duration, warmup_s=60.0, seed=seed)
        reports.append(report)
        ok &= all(c.slo_met for c in report.classes if c.predicted_rps > 0)
        if stop_early and not ok:
            break
    return ok, reports


def class_rows(request: PlanRequest, result, reports: list) -> list[dict]:
    """Per served class: predicted vs simulated TTFT/TBT at its percentile (worst seed) and slo_met."""
    rows = []
    by_name = {w.name: w for w in request.workloads}
    for w in result.workloads:
        if w.served_rps <= 0:
            continue
        q = by_name[w.name].slo.percentile
        metrics = [next(c for c in r.classes if c.name == w.name) for r in reports]
        rows.append(
            {
                "class": w.name,
                "percentile": q,
                "served_rps": w.served_rps,
                "slo_ttft_ms": by_name[w.name].slo.ttft_ms,
                "slo_tbt_ms": by_name[w.name].slo.tbt_ms,
                "predicted_ttft_ms": max(r.ttft_ms for r in w.routes),
                "predicted_tbt_ms": max(r.tbt_ms for r in w.routes),
                "simulated_ttft_ms": max((getattr(m, f"ttft_ms_p{q}") or math.inf) for m in metrics),
                "simulated_tbt_ms": max((getattr(m, f"tbt_ms_p{q}") or math.inf) for m in metrics),
                "slo_met": all(m.slo_met for m in metrics),
            }
        )
    return rows


def best_uniform(request: PlanRequest, seeds: list[int], duration: float) -> dict:
    """The first rho from the top whose flat plan keeps every promise on every seed."""
    tried = []
    for rho in RHOS:
        options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=rho)
        at_rho = msgspec.structs.replace(request, options=options)
        result = plan(at_rho, with_baselines=False)
        ok, _ = judge(at_rho, result, seeds, duration, stop_early=True)
        tried.append({"rho": rho, "slo_rps": result.slo_rps, "objective": objective(result), "safe": ok})
        if ok:
            return {"rho": rho, "slo_rps": result.slo_rps, "objective": objective(result), "tried": tried}
    return {"rho": None, "slo_rps": 0.0, "objective": 0.0, "tried": tried}


def objective(result) -> float:
    """What the plan maximizes: weighted SLO RPS (the SLO RPS itself when every weight is 1)."""
    return result.objective_value if result.objective_value is not None else result.slo_rps


def replanned(request: PlanRequest, replan: tuple[float, int | None]) -> tuple[PlanRequest, Plan]:
    """The nightly job's re-plan of `request` (`replan` = (demand scale, max_moves)): its plan at default
    options is the plan in force; every class's demand is scaled and the request planned again against
    it, churn-limited with the default penalty, as replan.service does. Returns the scaled request and
    its re-plan."""
    scale, max_moves = replan
    first = plan(request, with_baselines=False)
    workloads = [msgspec.structs.replace(w, rate_rps=round(w.rate_rps * scale, 6)) for w in request.workloads]
    again = msgspec.structs.replace(request, workloads=workloads)
    churn = Churn.from_pools(first.pools, request.options.pooling, max_moves, DEFAULT_CHURN_PENALTY)
    return again, plan(again, with_baselines=False, churn=churn)


def evaluate(job: tuple[str, PlanRequest, list[int], float, dict | None, tuple | None]) -> dict:
    name, request, seeds, duration, uniform, replan = job
    began = time.perf_counter()
    if replan is None:
        result = plan(request, with_baselines=False)
    else:
        request, result = replanned(request, replan)
    ok, reports = judge(request, result, seeds, duration, stop_early=False)
    simulated = statistics.mean(r.goodput_rps for r in reports) if reports else 0.0
    return {
        "request": name,
        "status": result.status,
        "slo_rps": result.slo_rps,
        "objective": objective(result),
        "demand_rps": result.demand_rps,
        "safe": ok,
        "simulated_goodput_rps": simulated,
        "classes": class_rows(request, result, reports),
        "uniform": uniform if uniform is not None else best_uniform(request, seeds, duration),
        "wall_s": round(time.perf_counter() - began, 1),
    }


# --- report ---------------------------------------------------------------------------------------------


def summary(rows: list[dict]) -> dict:
    classes = [c for r in rows for c in r["classes"]]
    ratios = [r["objective"] / r["uniform"]["objective"] for r in rows if r["uniform"]["objective"] > 0]
    goodput = [r["simulated_goodput_rps"] / r["slo_rps"] - 1 for r in rows if r["slo_rps"] > 0]
    return {
        "requests": len(rows),
        "requests_safe": sum(r["safe"] for r in rows),
        "served_classes": len(classes),
        "classes_keeping_promise": sum(c["slo_met"] for c in classes),
        "requests_at_least_uniform": sum(
            r["objective"] >= r["uniform"]["objective"] * (1 - 1e-6) or not r["uniform"]["objective"]
            for r in rows
        ),
        "geomean_ratio_vs_uniform": math.exp(statistics.mean(math.log(x) for x in ratios))
        if ratios
        else None,
        "min_ratio_vs_uniform": min(ratios) if ratios else None,
        "goodput_sim_vs_plan_worst": max(goodput, key=abs) if goodput else None,
        "goodput_sim_vs_plan_mean": statistics.mean(goodput) if goodput else None,
    }


def render(rows: list[dict], total: dict) -> str:
    lines = []
    body = []
    for r in rows:
        u = r["uniform"]
        ratio = r["objective"] / u["objective"] if u["objective"] else math.nan
        broken = [c["class"] for c in r["classes"] if not c["slo_met"]]
        body.append(
            [
                r["request"],
                f"{r['slo_rps']:.2f}",
                f"{r['objective']:.2f}",
                f"{r['simulated_goodput_rps']:.2f}",
                "yes" if r["safe"] else "NO: " + ",".join(broken),
                "-" if u["rho"] is None else f"{u['rho']:.2f}",
                f"{u['slo_rps']:.2f}",
                f"{u['objective']:.2f}",
                f"{ratio:.3f}",
            ]
        )
    headers = [
        "request",
        "SLO RPS",
        "objective",
        "sim goodput",
        "promise kept",
        "best safe rho",
        "its SLO RPS",
        "its objective",
        "ratio",
    ]
    lines.append(table(headers, body, right={1, 2, 3, 6, 7, 8}))
    lines.append("")
    lines.append(
        f"promise kept: {total['classes_keeping_promise']}/{total['served_classes']} served classes, "
        f"{total['requests_safe']}/{total['requests']} requests; objective >= best safe uniform on "
        f"{total['requests_at_least_uniform']}/{total['requests']}; geomean ratio "
        f"{total['geomean_ratio_vs_uniform']:.3f} (min {total['min_ratio_vs_uniform']:.3f}); "
        f"simulated goodput vs planned: mean {total['goodput_sim_vs_plan_mean']:+.2%}, "
        f"worst {total['goodput_sim_vs_plan_worst']:+.2%}"
    )
    return "\n".join(lines)


PARTIAL = RESULTS / "fidelity-partial.jsonl"


def finished_rows(run_key: dict) -> dict[str, dict]:
    """Rows already in PARTIAL from a run of the same commit, seeds and duration, by request name."""
    if not PARTIAL.exists():
        return {}
    out = {}
    for line in PARTIAL.read_text().splitlines():
        entry = json.loads(line)
        if entry["run"] == run_key:
            out[entry["row"]["request"]] = entry["row"]
    return out


def append_partial(run_key: dict, row: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with PARTIAL.open("a") as out:
        out.write(json.dumps({"run": run_key, "row": row}, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generated", type=int, default=30)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="request names to run (e.g. paper gen-03)")
    parser.add_argument("--resume", action="store_true", help="reuse rows of this commit and settings")
    parser.add_argument("--uniform-from", type=Path, help=UNIFORM_FROM_HELP)
    parser.add_argument("--objective", choices=OBJECTIVES, help=OBJECTIVE_HELP)
    parser.add_argument("--replan", type=float, metavar="SCALE", help=REPLAN_HELP)
    parser.add_argument("--max-moves", type=int, default=4, help="with --replan: instances moved at most")
    args = parser.parse_args(argv)
    if (args.objective or args.replan) and not args.uniform_from:
        parser.error(
            "--objective and --replan need --uniform-from (the uniform search plans the request itself)"
        )
    replan = None if args.replan is None else (args.replan, args.max_moves)
    began = time.perf_counter()
    git = git_info()
    run_key = {"commit": git.get("commit"), "seeds": args.seeds, "duration": args.duration}
    done = finished_rows(run_key) if args.resume and not args.uniform_from else {}
    recorded = recorded_uniform(args.uniform_from)
    jobs = [
        (n, with_objective(r, args.objective), args.seeds, args.duration, recorded.get(n), replan)
        for n, r in requests(args.generated)
        if (not args.only or n in args.only) and n not in done
    ]
    rows = [row for name, row in done.items() if not args.only or name in args.only]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for row in pool.map(evaluate, jobs):
            rows.append(row)
            if not args.uniform_from:
                append_partial(run_key, row)
            print(
                f"{row['request']}: {row['slo_rps']:.2f} SLO RPS, safe={row['safe']}, uniform rho "
                f"{row['uniform']['rho']} -> {row['uniform']['slo_rps']:.2f} ({row['wall_s']} s)",
                flush=True,
            )
    order = {name: k for k, (name, _) in enumerate(requests(args.generated))}
    rows.sort(key=lambda row: order.get(row["request"], len(order)))
    total = summary(rows)
    text = render(rows, total)
    machine = machine_info()
    print(machine_line(machine))
    print(git_line(git))
    print(text)
    record = {
        "benchmark": "fidelity",
        "machine": machine,
        "git": git,
        "args": vars(args),
        "wall_s": round(time.perf_counter() - began, 1),
        "summary": total,
        "requests": rows,
        "table": text,
    }
    name = "fidelity_plans" if args.uniform_from else "fidelity"
    if args.objective:
        name = f"fidelity_{args.objective}"
    if args.replan is not None:
        name = f"fidelity_replan{args.replan:g}" + (f"_{args.objective}" if args.objective else "")
    write_results(name, record)
    return 0


UNIFORM_FROM_HELP = (
    "take each request's best safe uniform plan from an earlier run's JSON instead of searching for it again "
    "(valid while the flat model, the simulator and the generators are unchanged: the search is most of a "
    "run's time); writes fidelity_plans-*.json, never fidelity-latest.json"
)


OBJECTIVES = ("max_goodput", "min_cost", "max_min_fraction")
OBJECTIVE_HELP = (
    "plan every request with this objective instead of its own (the promise holds for every objective); the "
    "ratio columns still compare with the recorded max-goodput uniform plans, so only the promise columns "
    "and the SLO RPS are that objective's"
)


REPLAN_HELP = (
    "judge the nightly job's re-plans: each request planned, then re-planned against that plan with every "
    "class's demand times SCALE (churn-limited: --max-moves, the default penalty); the ratio columns still "
    "compare with the recorded uniform plans of the unscaled requests, so only the promise columns count"
)


def with_objective(request: PlanRequest, objective: str | None) -> PlanRequest:
    """`request` with options.objective replaced (None: as it is)."""
    if objective is None:
        return request
    return msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, objective=objective)
    )


def recorded_uniform(path: Path | None) -> dict[str, dict]:
    """request name -> its recorded best safe uniform plan (`--uniform-from`), or {}."""
    if path is None:
        return {}
    return {row["request"]: row["uniform"] for row in json.loads(path.read_text())["requests"]}


if __name__ == "__main__":
    raise SystemExit(main())
