"""The OR-Tools solve, in a process of its own: `python -P _ortools_worker.py IN.npz OUT.npz`.

Run by fleetplan/solver/backends/ortools.py and by nothing else. It must never share a process with
highspy: both ship a `libhighs.so.1` (HiGHS 1.15.1 in highspy, 1.12.0 inside ortools 9.15) and whichever
loads second fails with an undefined symbol (docs/solvers.md). So this file imports only the standard
library, numpy and ortools, and is started by path with `-P` rather than as
`-m fleetplan.solver.backends._ortools_worker`: `-m` would first run `fleetplan/solver/__init__.py`
(pandas, the pipeline, and whatever else the package imports some day), and a plain script path would put
fleetplan/solver/backends/ at the front of sys.path, where `ortools.py` would shadow the real package.

Solver: SCIP through pywraplp (CBC when this build has no SCIP), never CP-SAT, which discretises the
continuous flow variables and reports "optimal" at a wrong objective (solver-notes.md, pitfall 2).

Protocol. IN.npz: A as CSR (A_data, A_indices, A_indptr, A_shape), row_lo, row_hi, col_lo, col_hi
(+-inf allowed), integer (bool), objective, sense ("max"/"min"), deadline (time.time() by which the
solve must stop; the parent's start-up cost is charged to it), mip_rel_gap, relax, solvers (names in
order of preference) and optionally start. OUT.npz: status (pywraplp status name), solver, values (empty
when there is none), objective and bound (nan when unknown), seconds (the solver's wall time), detail.
Exit code 3 with a message on stderr: ortools is not importable here.
"""

import sys
import time

EXIT_NO_ORTOOLS = 3

try:  # before anything else: the only import that can legitimately be missing
    from ortools.linear_solver import pywraplp
except ImportError as error:
    print(f"ortools is not importable in {sys.executable}: {error}", file=sys.stderr)
    sys.exit(EXIT_NO_ORTOOLS)

import numpy as np  # noqa: E402 (after the guarded ortools import, on purpose)

_STATUS_NAMES = {
    pywraplp.Solver.OPTIMAL: "OPTIMAL",
    pywraplp.Solver.FEASIBLE: "FEASIBLE",
    pywraplp.Solver.INFEASIBLE: "INFEASIBLE",
    pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
    pywraplp.Solver.ABNORMAL: "ABNORMAL",
    pywraplp.Solver.MODEL_INVALID: "MODEL_INVALID",
    pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
}


def _create(names: list[str]) -> tuple["pywraplp.Solver", str]:
    for name in names:
        solver = pywraplp.Solver.CreateSolver(name)
        if solver is not None:
            return solver, name
    msg = f"none of the OR-Tools solvers {names} is available in this ortools build"
    raise RuntimeError(msg)


def solve(data: dict[str, np.ndarray]) -> dict[str, object]:
    """Build the MatrixForm row by row in pywraplp and solve it."""
    solver, name = _create([str(s) for s in data["solvers"]])
    inf = solver.infinity()
    relax = bool(data["relax"])
    col_lo = np.where(np.isfinite(data["col_lo"]), data["col_lo"], -inf).tolist()
    col_hi = np.where(np.isfinite(data["col_hi"]), data["col_hi"], inf).tolist()
    integer = (data["integer"] & (not relax)).tolist()
    variables = [
        solver.IntVar(lo, hi, f"v{j}") if is_int else solver.NumVar(lo, hi, f"v{j}")
        for j, (lo, hi, is_int) in enumerate(zip(col_lo, col_hi, integer, strict=True))
    ]
    row_lo = np.where(np.isfinite(data["row_lo"]), data["row_lo"], -inf).tolist()
    row_hi = np.where(np.isfinite(data["row_hi"]), data["row_hi"], inf).tolist()
    indptr, indices, values = data["A_indptr"].tolist(), data["A_indices"].tolist(), data["A_data"].tolist()
    for i, (lo, hi) in enumerate(zip(row_lo, row_hi, strict=True)):
        if indptr[i + 1] == indptr[i]:
            continue
        row = solver.RowConstraint(lo, hi, "")
        for k in range(indptr[i], indptr[i + 1]):
            row.SetCoefficient(variables[indices[k]], values[k])
    goal = solver.Objective()
    for j in np.flatnonzero(data["objective"]).tolist():
        goal.SetCoefficient(variables[j], float(data["objective"][j]))
    if str(data["sense"]) == "max":
        goal.SetMaximization()
    else:
        goal.SetMinimization()
    if "start" in data and not relax:
        solver.SetHint(variables, data["start"].astype(float).tolist())  # SCIP: a (partial) start solution

    remaining = float(data["deadline"]) - time.time()
    solver.SetTimeLimit(max(int(remaining * 1000), 1))  # milliseconds
    is_mip = any(integer)  # solver.IsMip() tells the solver type (SCIP: always), not the model
    params = pywraplp.MPSolverParameters()
    if is_mip:
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, float(data["mip_rel_gap"]))
    began = time.perf_counter()
    status = solver.Solve(params)
    seconds = time.perf_counter() - began

    has_values = status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE)
    objective = goal.Value() if has_values else float("nan")
    if is_mip:
        bound = goal.BestBound()
    else:
        bound = objective if status == pywraplp.Solver.OPTIMAL else float("nan")
    return {
        "status": np.str_(_STATUS_NAMES.get(status, f"STATUS_{status}")),
        "solver": np.str_(name),
        "values": np.array([v.solution_value() for v in variables]) if has_values else np.zeros(0),
        "objective": np.float64(objective),
        "bound": np.float64(bound),
        "seconds": np.float64(seconds),
        "detail": np.str_(f"{solver.SolverVersion()}; {solver.nodes()} nodes" if is_mip else name),
    }


def main(argv: list[str]) -> int:
    source, target = argv[1], argv[2]
    with np.load(source, allow_pickle=False) as archive:
        data = {key: archive[key] for key in archive.files}
    np.savez(target, **solve(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
