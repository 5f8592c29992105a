"""Solver scaling benchmark: instances S, M, L (bench/instances.py), build and solve times, bounds and
baselines.

Per instance and repeat:
  1. candidates and matrix built once outside any solve (sizes; build ms),
  2. the goodput stage alone: fleetplan.solver.optimize.optimize(request, cand, [("goodput", MAX)])
     (our route: LP relaxation -> RENS-style sub-MIP -> full MIP seeded with its plan),
  3. the same goodput MIP handed to the HiGHS backend directly, no start ("naive": plain HiGHS),
  4. the full solver.plan(request, with_baselines=True) (goodput, cost tie-break, baselines, verify).

Instrumentation: none is patched in. Every solver call optimize() makes comes back as a StageRecord
(step, objective, kind, ms, termination, objective value, bound, gap, nodes; Outcome.stages, and
Plan.solver.stages inside solver.plan); the lp / sub_mip / mip / tie_break times are their sums. The
steps of solver.plan around the solver (profiles, candidates, gpu_only, greedy, verify) are timed by
calling the same functions from this script on the same request right after step 4 (warm, as inside
plan()), so 'goodput done ms' from plan() entry and 'other' are estimates.

    python -m bench.solver_scaling [--instances S M L] [--seeds 5] [--time-limit 10] [--repeat N] [--no-naive]

Writes bench/results/solver_scaling-<UTC timestamp>.json and bench/results/solver_scaling-latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pickle
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from bench.instances import instance, seeded_names
from bench.record import RESULTS, ROOT, git_info, git_line, machine_info, machine_line, write_results
from fleetplan.models.plan import StageRecord
from fleetplan.solver import baselines, plan
from fleetplan.solver.backends import Sense, get_backend, relative_gap
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.formulation import build_matrix
from fleetplan.solver.optimize import optimize
from fleetplan.solver.pipeline import resolve_profiles
from fleetplan.solver.verify import verify

# ------------------------------------------------------------------------------------------ measurement

# the bench's four kinds of solver time, from a StageRecord's step and kind
SOLVE_KEYS = ("lp", "sub_mip", "mip", "tie_break")


def solve_key(record: StageRecord) -> str:
    """lp (the relaxations and the LP with rounded x fixed), sub_mip, mip (the primary stage), tie_break."""
    if record.step == "primary":
        return "mip"
    if record.step == "tie_break":
        return "tie_break"
    return "sub_mip" if record.kind == "submip" else "lp"


def stage_ms(records, key: str) -> float:
    return sum(r.ms for r in records if solve_key(r) == key)


def first(records, step: str, kind: str | None = None) -> StageRecord | None:
    return next((r for r in records if r.step == step and kind in (None, r.kind)), None)


def stage_rows(records) -> list[dict]:
    return [msgspec.to_builtins(r) for r in records]


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def with_time_limit(request, seconds: float):
    options = msgspec.structs.replace(request.options, time_limit_s=seconds)
    return msgspec.structs.replace(request, options=options)


def run_once(request, naive: bool) -> dict:
    opts = request.options
    out: dict = {}

    # 1. build (outside any solve)
    began = time.perf_counter()
    table = resolve_profiles(request)
    t_profiles = time.perf_counter()
    cand = build_candidates(request, table)
    t_cand = time.perf_counter()
    form, cols = build_matrix(cand)
    t_matrix = time.perf_counter()
    out["build"] = {
        "profiles_ms": (t_profiles - began) * 1e3,
        "candidates_ms": (t_cand - t_profiles) * 1e3,
        "matrix_ms": (t_matrix - t_cand) * 1e3,
    }
    out["size"] = {
        "classes": len(cand.classes),
        "device_types": len(request.devices),
        "pools": int(cols.n_pools),
        "integers": int(form.integer.sum()),
        "variables": int(form.A.shape[1]),
        "rows": int(form.A.shape[0]),
        "nonzeros": int(form.nonzeros),
    }

    # 2. the goodput stage alone, through our heuristic route
    began, cpu = time.perf_counter(), time.process_time()
    outcome = optimize(request, cand, [("goodput", Sense.MAX)])
    wall, cpu = (time.perf_counter() - began) * 1e3, (time.process_time() - cpu) * 1e3
    sub_mip = first(outcome.stages, "start", "submip")
    out["goodput"] = {
        "wall_ms": wall,  # includes optimize's own matrix build
        "cpu_ms": cpu,  # this process's CPU time: robust to other load on the machine
        "build_ms": outcome.build_ms,
        "solve_ms": outcome.solve_ms,
        **{f"{k}_ms": stage_ms(outcome.stages, k) for k in ("lp", "sub_mip", "mip")},
        "status": str(outcome.termination),
        "objective": outcome.primary_value,
        "mip_bound": outcome.primary_bound,
        "gap": relative_gap(outcome.primary_value, outcome.primary_bound),
        "lp_bound": outcome.lp_bound,
        "sub_mip_objective": None if sub_mip is None else sub_mip.objective,
        "stages": stage_rows(outcome.stages),
    }

    # 3. naive: plain HiGHS on the same goodput MIP, no start, same time limit and gap
    if naive:
        backend = get_backend(opts.solver)
        began, cpu = time.perf_counter(), time.process_time()
        result = backend.solve(
            form,
            form.objectives["goodput"],
            Sense.MAX,
            time_limit_s=opts.time_limit_s,
            mip_rel_gap=opts.mip_rel_gap,
        )
        out["naive"] = {
            "wall_ms": (time.perf_counter() - began) * 1e3,
            "cpu_ms": (time.process_time() - cpu) * 1e3,
            "status": str(result.termination),
            "detail": result.detail,
            "objective": result.objective,
            "mip_bound": result.bound,
            "gap": relative_gap(result.objective, result.bound),
        }

    # 4. the full plan, as the API runs it; its solver calls from result.solver.stages
    began, cpu = time.perf_counter(), time.process_time()
    result = plan(request, with_baselines=True)
    ended, cpu = time.perf_counter(), (time.process_time() - cpu) * 1e3
    wall = (ended - began) * 1e3
    records = result.solver.stages or []
    primary = first(records, "primary")
    sub_mip = first(records, "start", "submip")
    solve = {k: stage_ms(records, k) for k in SOLVE_KEYS}
    # the steps of solver.plan around the solver, timed here on the same request (estimates)
    optimize_ms = result.solver.build_ms + result.solver.solve_ms
    steps = around_solver_ms(request, result, optimize_ms)
    before_solver = steps["profiles"] + steps["candidates"]
    accounted = before_solver + optimize_ms + steps["gpu_only"] + steps["greedy"] + steps["verify"]
    done_in_optimize = None if primary is None else primary.ended_ms
    lp_relaxation = first(records, "relaxation")
    out["plan"] = {
        "wall_ms": wall,
        "cpu_ms": cpu,
        # the root LP relaxation of the primary objective: the yardstick of "plan() <= 10x its LP time"
        "lp_relaxation_ms": None if lp_relaxation is None else lp_relaxation.ms,
        "tie_break_gap": result.solver.tie_break_gap,
        "goodput_done_ms": None if done_in_optimize is None else before_solver + done_in_optimize,
        "goodput_done_in_optimize_ms": done_in_optimize,
        # the goodput stage as solver.plan runs it (its LP relaxations span both stages)
        "goodput_in_plan": {
            "lp_ms": solve["lp"],
            "sub_mip_ms": solve["sub_mip"],
            "mip_ms": solve["mip"],
            "status": None if primary is None else primary.termination,
            "objective": None if primary is None else primary.objective,
            "mip_bound": None if primary is None else primary.bound,
            "gap": None if primary is None else primary.gap,
            "nodes": None if primary is None else primary.nodes,
            "sub_mip_objective": None if sub_mip is None else sub_mip.objective,
        },
        "steps_ms": {
            "profiles": steps["profiles"],
            "candidates": steps["candidates"],
            "matrix": result.solver.build_ms,
            **solve,
            "gpu_only": steps["gpu_only"],
            "greedy": steps["greedy"],
            "verify": steps["verify"],
            "other": wall - accounted,  # extract, explain, Plan assembly (and the estimates' error)
        },
        "stages": stage_rows(records),
        "status": result.status,
        "termination": result.solver.termination,
        "tie_break": result.solver.tie_break,
        "slo_rps": result.slo_rps,
        "demand_rps": result.demand_rps,
        "bound_rps": result.bound_rps,
        "mip_gap": result.mip_gap,
        "cost_per_hour": result.cost_per_hour,
        "solver_build_ms": result.solver.build_ms,
        "solver_solve_ms": result.solver.solve_ms,
        "gpu_only_device": result.baselines.gpu_only.device if result.baselines else None,
        "gpu_only_rps": result.baselines.gpu_only.slo_rps if result.baselines else None,
        "greedy_rps": result.baselines.greedy.slo_rps if result.baselines else None,
    }
    out["plan"]["vs_gpu_only"] = ratio(result.slo_rps, out["plan"]["gpu_only_rps"])
    out["plan"]["vs_greedy"] = ratio(result.slo_rps, out["plan"]["greedy_rps"])
    return out


def cached_candidates(name: str, request, cache: Path | None):
    """(candidates, ms to build them or None when read from `cache`). The cache holds pickled
    (request, candidates) per instance name ("M/1" -> M_1.pkl), written by an earlier run of the same
    candidates code: the solve is what --solve-only measures, and on a loaded 2-vCPU machine the queueing
    candidates of one L instance take minutes to build."""
    path = None if cache is None else cache / (name.replace("/", "_").replace("@", "_at_") + ".pkl")
    if path is not None and path.exists():
        cached_request, cand = pickle.loads(path.read_bytes())  # noqa: S301 (our own file)
        if msgspec.json.encode(cached_request.workloads) != msgspec.json.encode(request.workloads):
            msg = f"{path}: cached candidates are for another request"
            raise SystemExit(msg)
        return dataclasses.replace(cand, request=request), None
    began = time.perf_counter()
    cand = build_candidates(request, resolve_profiles(request))
    ms = (time.perf_counter() - began) * 1e3
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps((request, cand)))
    return cand, ms


def run_solve_only(name: str, request, cache: Path | None = None) -> dict:
    """--solve-only: candidates built once, then optimize(request, cand) with every stage of the objective
    (goodput, then the cost tie-break), as plan() runs it, without the baselines, extraction and verify."""
    cand, candidates_ms = cached_candidates(name, request, cache)
    began, cpu = time.perf_counter(), time.process_time()
    outcome = optimize(request, cand)
    wall, cpu = (time.perf_counter() - began) * 1e3, (time.process_time() - cpu) * 1e3
    records = outcome.stages
    primary = first(records, "primary")
    relaxation = first(records, "relaxation")
    tie = [r for r in records if r.step == "tie_break"]
    base = name.split("@")[0].split("/")[0]
    gap_goal, s_goal = (GOAL_M_GAP, GOAL_M_S) if base == "M" else (GOAL_L_GAP, GOAL_L_S)
    done_s = None if primary is None else primary.ended_ms / 1e3
    gap = relative_gap(outcome.primary_value, outcome.primary_bound)
    return {
        "instance": name,
        "integers": int(outcome.form.integer.sum()),
        "rows": int(outcome.form.A.shape[0]),
        "candidates_ms": candidates_ms,
        "optimize_ms": wall,
        "optimize_cpu_ms": cpu,
        "build_ms": outcome.build_ms,
        "lp_ms": None if relaxation is None else relaxation.ms,
        "goodput_done_ms": None if primary is None else primary.ended_ms,
        "status": str(outcome.termination),
        "objective": outcome.primary_value,
        "bound": outcome.primary_bound,
        "gap": gap,
        "nodes": None if primary is None else primary.nodes,
        "tie_break": outcome.tie_break,
        "tie_break_gap": outcome.tie_break_gap,
        "tie_break_ms": sum(r.ms for r in tie),
        "goal": f"gap <= {gap_goal:g} in <= {s_goal:g} s" if base in ("M", "L") else None,
        "holds": base in ("M", "L")
        and gap is not None
        and gap <= gap_goal + 1e-12
        and done_s is not None
        and done_s <= s_goal,
        "stages": stage_rows(records),
    }


def solve_only_table(rows: list[dict]) -> str:
    headers = ["inst", "ints", "rows", "cand ms", "LP ms", "goodput done ms", "optimize ms", "cpu ms",
               "status", "objective", "bound", "gap", "nodes", "tie gap", "goal", "verdict"]  # fmt: skip
    body = [
        [
            r["instance"],
            str(r["integers"]),
            str(r["rows"]),
            fmt(r["candidates_ms"]),
            fmt(r["lp_ms"]),
            fmt(r["goodput_done_ms"]),
            fmt(r["optimize_ms"]),
            fmt(r["optimize_cpu_ms"]),
            r["status"],
            fmt(r["objective"], ".3f"),
            fmt(r["bound"], ".3f"),
            pct(r["gap"]),
            fmt(r["nodes"]),
            pct(r["tie_break_gap"]),
            r["goal"] or "-",
            "-" if r["goal"] is None else "holds" if r["holds"] else "MISSED",
        ]  # fmt: skip
        for r in rows
    ]
    return table(headers, body, right={1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13})


def main_solve_only(names: list[str], args, meta: dict, stamp) -> int:
    rows = []
    for name in names:
        request = with_time_limit(instance(name), args.time_limit)
        t = time.perf_counter()
        rows.append(run_solve_only(name, request, args.cand_cache))
        print(f"  {name}: {time.perf_counter() - t:.1f} s", flush=True)
    with contextlib.suppress(OSError, AttributeError):
        meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    load_end = meta.get("loadavg_at_end", ["?"])[0]
    text = "\n".join(
        [
            f"Solver scaling, --solve-only  |  {meta['utc']}  |  {git_line(meta['git'])}",
            f"Machine: {machine_line(meta['machine'])}",
            f"time_limit_s={args.time_limit:g}, default options (queueing capacity model), HiGHS threads=1; "
            f"load avg at end {load_end}",
            "optimize(request, cand) with every stage (goodput, then the cost tie-break); candidates built",
            "once, outside it. 'goodput done' = ms from optimize() entry to the goodput MIP's end (wall);",
            "'cpu ms' = this process's CPU time over optimize() (robust to other load on the machine).",
            solve_only_table(rows),
        ]
    )
    print()
    print(text)
    record = {**meta, "solve_only": rows, "table": text}
    path = write_results("solver_scaling_solve", record, args.out, stamp=stamp)
    print(f"\nwrote {shown(path)} and solver_scaling_solve-latest.json")
    return 0


def around_solver_ms(request, result, optimize_ms: float) -> dict[str, float]:
    """The steps of solver.plan around optimize(), called as plan() calls them and timed one by one, after
    plan() (so with the same warm caches): profiles, candidates, the baselines (gpu_only with the time plan()
    would leave it), verify."""
    ms = {}
    began = time.perf_counter()
    table = resolve_profiles(request)
    ms["profiles"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    cand = build_candidates(request, table)
    ms["candidates"] = (time.perf_counter() - began) * 1e3
    spent_s = (ms["profiles"] + ms["candidates"] + optimize_ms) / 1e3
    began = time.perf_counter()
    baselines.gpu_only(cand, request.options.time_limit_s - spent_s)
    ms["gpu_only"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    baselines.greedy(cand)
    ms["greedy"] = (time.perf_counter() - began) * 1e3
    began = time.perf_counter()
    verify(request, result, table)
    ms["verify"] = (time.perf_counter() - began) * 1e3
    return ms


def median(runs: list[dict], *path: str) -> float | None:
    values = []
    for run in runs:
        v = run
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        if v is not None:
            values.append(v)
    return statistics.median(values) if values else None


_TIMED_PLAN_KEYS = (
    "wall_ms",
    "cpu_ms",
    "lp_relaxation_ms",
    "goodput_done_ms",
    "goodput_done_in_optimize_ms",
    "steps_ms",
    "goodput_in_plan",
)


def summarize(name: str, gen_ms: float, runs: list[dict]) -> dict:
    """Median times over the repeats; statuses and values from the last run (the instances are seeded)."""
    last = runs[-1]
    s = {"instance": name, "generate_ms": gen_ms, "repeats": len(runs), **last["size"]}
    s["candidates_ms"] = median(runs, "build", "candidates_ms")
    s["matrix_ms"] = median(runs, "build", "matrix_ms")
    s["build_ms"] = s["candidates_ms"] + s["matrix_ms"]
    s["profiles_ms"] = median(runs, "build", "profiles_ms")
    g = last["goodput"]
    s["goodput"] = {
        **{
            k: median(runs, "goodput", k)
            for k in ("wall_ms", "cpu_ms", "build_ms", "solve_ms", "lp_ms", "sub_mip_ms", "mip_ms")
        },
        **{k: g[k] for k in ("status", "objective", "mip_bound", "gap", "lp_bound", "sub_mip_objective")},
        "statuses": [r["goodput"]["status"] for r in runs],
        "stages": g["stages"],
    }
    if "naive" in last:
        n = last["naive"]
        s["naive"] = {
            "wall_ms": median(runs, "naive", "wall_ms"),
            "cpu_ms": median(runs, "naive", "cpu_ms"),
            **{k: n[k] for k in ("status", "detail", "objective", "mip_bound", "gap")},
            "statuses": [r["naive"]["status"] for r in runs],
        }
        s["naive_over_heuristic"] = ratio(s["naive"]["wall_ms"], s["goodput"]["wall_ms"])
    p = last["plan"]
    s["plan"] = {
        "wall_ms": median(runs, "plan", "wall_ms"),
        "cpu_ms": median(runs, "plan", "cpu_ms"),
        "lp_relaxation_ms": median(runs, "plan", "lp_relaxation_ms"),
        "goodput_done_ms": median(runs, "plan", "goodput_done_ms"),
        "goodput_done_in_optimize_ms": median(runs, "plan", "goodput_done_in_optimize_ms"),
        "steps_ms": {k: median(runs, "plan", "steps_ms", k) for k in p["steps_ms"]},
        "goodput_in_plan": {
            **p["goodput_in_plan"],
            **{k: median(runs, "plan", "goodput_in_plan", k) for k in ("lp_ms", "sub_mip_ms", "mip_ms")},
            "statuses": [r["plan"]["goodput_in_plan"]["status"] for r in runs],
        },
        **{k: v for k, v in p.items() if k not in _TIMED_PLAN_KEYS},
        "tie_breaks": [r["plan"]["tie_break"] for r in runs],
    }
    if "naive" in s:
        s["naive_over_in_plan"] = ratio(s["naive"]["wall_ms"], s["plan"]["goodput_done_in_optimize_ms"])
    plan_s = s["plan"]
    plan_s["plan_over_lp"] = ratio(plan_s["wall_ms"], plan_s["lp_relaxation_ms"])
    solve_ms = (plan_s.get("solver_build_ms") or 0.0) + (plan_s.get("solver_solve_ms") or 0.0)
    plan_s["solve_over_lp"] = ratio(solve_ms, plan_s["lp_relaxation_ms"])
    s["goals"] = goals(name, s)
    return s


# The goals (issue 10), per instance family: (what, holds?) from one summary.
GOAL_M_GAP, GOAL_M_S = 1e-4, 1.0
GOAL_L_GAP, GOAL_L_S = 1e-3, 10.0
GOAL_S_LP_RATIO = 10.0


def goals(name: str, s: dict) -> list[dict]:
    """Each goal of the issue that applies to this instance, with the measured figure and whether it holds.

    M: the goodput stage proven optimal (gap <= 1e-4) within 1 s of optimize() entry, inside plan().
    L: the goodput stage within 0.1% gap within 10 s, inside plan(). S: plan() <= 10x its LP relaxation
    (and, separately, the solver's own share: build + solve over the LP). Wall and CPU both recorded.
    """
    p = s["plan"]
    primary = p["goodput_in_plan"]
    done_s = None if p["goodput_done_in_optimize_ms"] is None else p["goodput_done_in_optimize_ms"] / 1e3
    base = name.split("@")[0].split("/")[0]
    if "@" in name:
        return []
    if base in ("M", "L"):
        gap_goal, s_goal = (GOAL_M_GAP, GOAL_M_S) if base == "M" else (GOAL_L_GAP, GOAL_L_S)
        # the plan's own gap: the goodput MIP's value against the tighter of its dual bound and the first LP
        # relaxation's (a MIP stopped before its root LP ends reports only its trivial bound)
        gaps = [g for g in (primary["gap"], p.get("mip_gap")) if g is not None]
        gap = min(gaps) if gaps else None
        holds_gap = gap is not None and gap <= gap_goal + 1e-12
        holds_time = done_s is not None and done_s <= s_goal
        return [
            {
                "goal": f"gap <= {gap_goal:g} in <= {s_goal:g} s",
                "gap": gap,
                "seconds": done_s,
                "holds": holds_gap and holds_time,
            }
        ]
    return [
        {
            "goal": f"plan() <= {GOAL_S_LP_RATIO:g}x its LP relaxation",
            "ratio": p["plan_over_lp"],
            "solve_ratio": p["solve_over_lp"],
            "holds": p["plan_over_lp"] is not None and p["plan_over_lp"] <= GOAL_S_LP_RATIO,
        }
    ]


# -------------------------------------------------------------------------------------------- printing


def fmt(v, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.3%}"


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def status_of(statuses: list[str | None]) -> str:
    """One status if every repeat agrees, else each with its count ("optimal 2/3, feasible 1/3")."""
    if len(set(statuses)) <= 1:
        return statuses[0] or "-" if statuses else "-"
    return ", ".join(f"{s} {statuses.count(s)}/{len(statuses)}" for s in dict.fromkeys(statuses))


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Plain aligned columns; `right` = indices of right-aligned columns (default: all but the first)."""
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def size_table(summaries: list[dict]) -> str:
    headers = ["inst", "rep", "classes", "dev types", "pools(int)", "vars", "rows", "nnz",
               "profiles ms", "cand ms", "matrix ms", "build ms"]  # fmt: skip
    rows = [
        [
            s["instance"],
            str(s["repeats"]),
            str(s["classes"]),
            str(s["device_types"]),
            str(s["integers"]),
            str(s["variables"]),
            str(s["rows"]),
            str(s["nonzeros"]),
            fmt(s["profiles_ms"]),
            fmt(s["candidates_ms"]),
            fmt(s["matrix_ms"]),
            fmt(s["build_ms"]),
        ]  # fmt: skip
        for s in summaries
    ]
    return table(headers, rows)


def goodput_table(summaries: list[dict]) -> str:
    headers = ["inst", "route", "goodput ms", "cpu ms", "lp", "sub-MIP", "MIP", "sub-MIP obj", "status",
               "objective", "MIP bound", "gap", "LP bound"]  # fmt: skip
    rows = []
    for s in summaries:
        g, p, n = s["goodput"], s["plan"]["goodput_in_plan"], s.get("naive")
        routes = [
            ("ours-alone", g["wall_ms"], g, g["lp_bound"]),
            ("ours-in-plan", s["plan"]["goodput_done_in_optimize_ms"], p, g["lp_bound"]),
        ]
        if n:
            routes.append(("naive", n["wall_ms"], n, None))
        for label, ms, r, lp in routes:
            rows.append(
                [
                    s["instance"],
                    label,
                    fmt(ms),
                    fmt(r.get("cpu_ms")),
                    fmt(r.get("lp_ms")),
                    fmt(r.get("sub_mip_ms")),
                    fmt(r.get("mip_ms")),
                    fmt(r.get("sub_mip_objective"), ".3f"),
                    status_of(r["statuses"]),
                    fmt(r["objective"], ".3f"),
                    fmt(r["mip_bound"], ".3f"),
                    pct(r["gap"]),
                    fmt(lp, ".3f"),
                ]  # fmt: skip
            )
    return table(headers, rows, right={2, 3, 4, 5, 6, 7, 9, 10, 11, 12})


def plan_table(summaries: list[dict]) -> str:
    headers = ["inst", "plan ms", "cpu ms", "goodput done ms", "LP ms", "plan/LP", "solve/LP", "status",
               "slo_rps", "gpu_only", "greedy", "plan/gpu_only", "plan/greedy", "tie_break"]  # fmt: skip
    rows = []
    for s in summaries:
        p = s["plan"]
        rows.append(
            [
                s["instance"],
                fmt(p["wall_ms"]),
                fmt(p["cpu_ms"]),
                fmt(p["goodput_done_ms"]),
                fmt(p["lp_relaxation_ms"]),
                times(p["plan_over_lp"]),
                times(p["solve_over_lp"]),
                p["status"],
                fmt(p["slo_rps"], ".3f"),
                fmt(p["gpu_only_rps"], ".3f"),
                fmt(p["greedy_rps"], ".3f"),
                times(p["vs_gpu_only"]),
                times(p["vs_greedy"]),
                p["tie_break"] or "-",
            ]  # fmt: skip
        )
    return table(headers, rows, right={1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12})


def goals_table(summaries: list[dict]) -> str:
    """The issue's goals per instance (M, L: the goodput stage inside plan(); S: plan() over its LP)."""
    rows = []
    for s in summaries:
        for g in s["goals"]:
            figure = (
                f"gap {pct(g['gap'])} at {fmt(g['seconds'], '.2f')} s"
                if "gap" in g
                else f"plan/LP {times(g['ratio'])} (solver build+solve/LP {times(g['solve_ratio'])})"
            )
            rows.append([s["instance"], g["goal"], figure, "holds" if g["holds"] else "MISSED"])
    if not rows:
        return "(no goal applies to these instances)"
    return table(["inst", "goal", "measured (wall, inside plan())", "verdict"], rows, right=set())


STEP_KEYS = ["profiles", "candidates", "matrix", "lp", "sub_mip", "mip", "tie_break", "gpu_only", "greedy",
             "verify", "other"]  # fmt: skip


def steps_table(summaries: list[dict]) -> str:
    rows = [
        [s["instance"], fmt(s["plan"]["wall_ms"]), *(fmt(s["plan"]["steps_ms"].get(k)) for k in STEP_KEYS)]
        for s in summaries
    ]
    return table(["inst", "plan ms", *STEP_KEYS], rows)


def stages_table(summaries: list[dict]) -> str:
    """Every solver call of solver.plan's optimize (last repeat): Plan.solver.stages."""
    headers = ["inst", "step", "stage", "kind", "ms", "ended ms", "termination", "objective", "bound", "gap",
               "nodes"]  # fmt: skip
    rows = [
        [
            s["instance"],
            r["step"],
            r["stage"],
            r["kind"],
            fmt(r["ms"]),
            fmt(r["ended_ms"]),
            r["termination"],
            fmt(r["objective"], ".4f"),
            fmt(r["bound"], ".4f"),
            pct(r["gap"]),
            fmt(r["nodes"]),
        ]
        for s in summaries
        for r in s["plan"]["stages"]
    ]
    return table(headers, rows, right={4, 5, 7, 8, 9, 10})


def report(summaries: list[dict], meta: dict) -> str:
    load_end = meta.get("loadavg_at_end", ["?"])[0]
    return "\n".join(
        [
            f"Solver scaling  |  {meta['utc']}  |  {git_line(meta['git'])}",
            f"Machine: {machine_line(meta['machine'])}",
            f"time_limit_s={meta['time_limit_s']:g} (every instance), mip_rel_gap={meta['mip_rel_gap']:g}, "
            f"HiGHS threads=1; load avg at end {load_end}",
            "Times in ms, medians over the repeats; 'cpu ms' = this process's CPU time (robust to load)",
            "",
            "1) Size and build (outside any solve)",
            size_table(summaries),
            "",
            "2) Goodput stage. ms from optimize() entry (its own matrix build included); naive: solve only",
            "   ours-alone   = fleetplan.solver.optimize.optimize(request, cand, [('goodput', MAX)])",
            "   ours-in-plan = the goodput stage inside solver.plan (goodput, then cost), to its MIP's end",
            "   naive        = the same goodput MIP on the HiGHS backend directly (no LP/sub-MIP, no start)",
            goodput_table(summaries),
            "",
            "3) Full solver.plan(request, with_baselines=True); 'goodput done' = ms from plan() entry",
            plan_table(summaries),
            "",
            "4) Where solver.plan's time goes (ms; lp/sub_mip/mip = goodput stage, from Plan.solver.stages;",
            "   profiles, candidates, gpu_only, greedy, verify timed on the same request outside plan())",
            steps_table(summaries),
            "",
            "5) Every solver call of solver.plan (Plan.solver.stages, last repeat; ended ms from optimize())",
            stages_table(summaries),
            "",
            "6) The goals of issue 10 (wall time on this machine; see the load average above)",
            goals_table(summaries),
        ]
    )


# -------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--instances",
        nargs="+",
        default=["S", "M", "L"],
        help='S, M, L at the default max_utilization; "M@0.9" = M planned at max_utilization 0.9',
    )
    parser.add_argument("--time-limit", type=float, default=10.0, help="options.time_limit_s, every instance")
    parser.add_argument("--repeat", type=int, default=None, help="repeats per instance (default: S/M 3, L 1)")
    parser.add_argument("--no-naive", action="store_true", help="skip the plain-HiGHS comparison")
    parser.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="M and L: this many seeds of each generator (the default seed first); naive on the first only",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--solve-only",
        action="store_true",
        help="only optimize() (all stages) on candidates built once: no plan(), baselines or naive run",
    )
    parser.add_argument(
        "--cand-cache", type=Path, default=None, help="--solve-only: read/write pickled candidates here"
    )
    args = parser.parse_args(argv)

    stamp = datetime.now(UTC)
    meta = {
        "utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "git": git_info(),
        "time_limit_s": args.time_limit,
        "argv": sys.argv[1:] if argv is None else argv,
    }
    print(f"machine: {machine_line(meta['machine'])}", flush=True)
    summaries, raw = [], {}
    mip_rel_gap = None
    names = [seeded for name in args.instances for seeded in seeded_names(name, args.seeds)]
    if args.solve_only:
        return main_solve_only(names, args, meta, stamp)
    for name in names:
        began = time.perf_counter()
        request = with_time_limit(instance(name), args.time_limit)
        gen_ms = (time.perf_counter() - began) * 1e3
        mip_rel_gap = request.options.mip_rel_gap
        repeat = max(1, args.repeat or (3 if name == "S" else 1))
        runs = []
        for r in range(repeat):
            t = time.perf_counter()
            runs.append(run_once(request, naive=not args.no_naive and "/" not in name))
            print(f"  {name} run {r + 1}/{repeat}: {time.perf_counter() - t:.1f} s", flush=True)
        summaries.append(summarize(name, gen_ms, runs))
        raw[name] = runs
    meta["mip_rel_gap"] = mip_rel_gap
    with contextlib.suppress(OSError, AttributeError):
        meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]

    text = report(summaries, meta)
    print()
    print(text)

    record = {**meta, "summary": summaries, "runs": raw, "table": text}
    path = write_results("solver_scaling", record, args.out, stamp=stamp)
    print(f"\nwrote {shown(path)} and solver_scaling-latest.json")
    return 0


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


if __name__ == "__main__":
    sys.exit(main())
