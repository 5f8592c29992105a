"""HiGHS through Pyomo (APPSI): the same MatrixForm as an algebraic ConcreteModel.

Why a second route to HiGHS: Pyomo is the modelling layer many users already know; writing the model out
through it (`model.write("plan.lp")`) or swapping in another Pyomo solver is a small step from here. It is
slower to build (one Pyomo expression per row) and adds Pyomo's overhead to every solve; see docs/solvers.md.

Interface: `pyomo.contrib.appsi.solvers.Highs` called directly, not through `SolverFactory('appsi_highs')`.
The SolverFactory wrapper rebuilds its config on every `solve()`, so a time limit set on `opt.config` is
ignored, and it raises on a time-out without an incumbent unless `load_solutions=False`; the direct class
honours `config.time_limit` / `config.mip_gap`, never loads a solution by itself (`load_solution=False`),
and reports `best_objective_bound` (the MIP dual bound). It warm-starts through highspy's `setSolution`
from the Var values (`config.warmstart`). It uses highspy underneath, so it shares the process with the
`highs` backend but can never share one with OR-Tools (docs/solvers.md).

This module is only imported by `get_backend("pyomo")`, so importing Pyomo here is already lazy.
"""

import logging
import time
from collections.abc import Mapping

import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.appsi.base import TerminationCondition
from pyomo.contrib.appsi.solvers.highs import Highs
from pyomo.core.expr import LinearExpression

from fleetplan.solver.backends.base import Sense, SolveResult, Termination
from fleetplan.solver.formulation import MatrixForm

# Pyomo re-logs HiGHS output through the `pyomo` logger; under Litestar that recursed (solver-notes.md 3).
logging.getLogger("pyomo").setLevel(logging.WARNING)

# Stopped early: FEASIBLE if an incumbent exists, demoted to NO_SOLUTION below otherwise.
CONDITION_MAP = {
    TerminationCondition.optimal: Termination.OPTIMAL,
    TerminationCondition.infeasible: Termination.INFEASIBLE,
    TerminationCondition.infeasibleOrUnbounded: Termination.INFEASIBLE,
    TerminationCondition.maxTimeLimit: Termination.FEASIBLE,
    TerminationCondition.maxIterations: Termination.FEASIBLE,  # also HiGHS kSolutionLimit (node limits)
    TerminationCondition.objectiveLimit: Termination.FEASIBLE,
    TerminationCondition.interrupted: Termination.FEASIBLE,
    TerminationCondition.unbounded: Termination.ERROR,  # every column is bounded: a formulation bug
    TerminationCondition.error: Termination.ERROR,
    TerminationCondition.unknown: Termination.ERROR,
}

# HiGHS options passed through APPSI, the same as the highs backend sets: threads=1 (HiGHS keeps one global
# scheduler per process, and a different thread count in a later solve is refused) and no MIP restarts.
_HIGHS_OPTIONS = {"output_flag": False, "threads": 1, "mip_abs_gap": 1e-9, "mip_allow_restart": False}


def build_model(form: MatrixForm, objective: np.ndarray, sense: Sense, relax: bool) -> pyo.ConcreteModel:
    """v[j] with the form's bounds; one constraint lo <= A[i] v <= hi per non-empty CSR row with a finite
    bound; c @ v."""
    n = form.A.shape[1]
    model = pyo.ConcreteModel()

    def bounds(_model: pyo.ConcreteModel, j: int) -> tuple[float | None, float | None]:
        lo, hi = form.col_lo[j], form.col_hi[j]
        return (float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None)

    def domain(_model: pyo.ConcreteModel, j: int) -> object:
        return pyo.Integers if form.integer[j] and not relax else pyo.Reals

    model.v = pyo.Var(range(n), domain=domain, bounds=bounds)
    A = form.A.tocsr()
    indptr, indices, data = A.indptr, A.indices, A.data
    # a row with no finite bound constrains nothing (HiGHS takes it as free); Pyomo refuses (None, body, None)
    bounded = np.isfinite(form.row_lo) | np.isfinite(form.row_hi)
    rows = [i for i in range(A.shape[0]) if indptr[i + 1] > indptr[i] and bounded[i]]

    def row(model: pyo.ConcreteModel, i: int) -> object:
        start, end = indptr[i], indptr[i + 1]
        body = LinearExpression(
            constant=0.0,
            linear_coefs=data[start:end].tolist(),
            linear_vars=[model.v[j] for j in indices[start:end].tolist()],
        )
        lo, hi = form.row_lo[i], form.row_hi[i]
        return (float(lo) if np.isfinite(lo) else None, body, float(hi) if np.isfinite(hi) else None)

    model.rows = pyo.Constraint(rows, rule=row)
    nz = np.flatnonzero(objective)
    model.obj = pyo.Objective(
        expr=LinearExpression(
            constant=0.0,
            linear_coefs=objective[nz].astype(float).tolist(),
            linear_vars=[model.v[j] for j in nz.tolist()],
        ),
        sense=pyo.maximize if sense is Sense.MAX else pyo.minimize,
    )
    return model


class PyomoBackend:
    name = "pyomo"
    # What this backend honours (style rule 5); docs/solvers.md has the table for every backend.
    capabilities = frozenset({"time_limit", "mip_rel_gap", "warm_start", "mip_bound"})

    def solve(
        self,
        form: MatrixForm,
        objective: np.ndarray,
        sense: Sense,
        *,
        time_limit_s: float,
        mip_rel_gap: float,
        relax: bool = False,
        start: np.ndarray | None = None,
        tuning: Mapping[str, bool | int | float | str] | None = None,
    ) -> SolveResult:
        begin = time.perf_counter()
        n = form.A.shape[1]
        if n == 0:
            # HiGHS calls a column-less model "empty" and APPSI maps that to `unknown`; nothing to decide.
            return SolveResult(
                Termination.OPTIMAL, np.zeros(0), 0.0, 0.0, time.perf_counter() - begin, "empty"
            )
        model = build_model(form, objective, sense, relax)
        warm = start is not None and not relax
        if warm:
            for j, value in enumerate(np.asarray(start, dtype=float).tolist()):
                model.v[j].set_value(value, skip_validation=True)
        opt = Highs()
        opt.config.time_limit = max(float(time_limit_s), 1e-3)
        opt.config.mip_gap = float(mip_rel_gap)
        opt.config.load_solution = False  # never raise on a time-out without an incumbent
        opt.config.warmstart = warm
        opt.highs_options = {**_HIGHS_OPTIONS, **(tuning or {})}  # HiGHS underneath: the same options
        results = opt.solve(model)
        condition = results.termination_condition
        termination = CONDITION_MAP.get(condition, Termination.ERROR)
        incumbent = results.best_feasible_objective
        values = None
        if incumbent is not None:
            # APPSI hands HiGHS only the variables some row or the objective references; any other
            # column is free within its bounds and gets the value nearest 0.
            values = np.clip(0.0, form.col_lo, form.col_hi).astype(float)
            for var, value in results.solution_loader.get_primals().items():
                values[var.index()] = value
        if termination is Termination.FEASIBLE and values is None:
            termination = Termination.NO_SOLUTION
        if termination is Termination.OPTIMAL and values is None:
            termination = Termination.ERROR
        bound = results.best_objective_bound
        return SolveResult(
            termination,
            values,
            float(incumbent) if incumbent is not None else None,
            float(bound) if bound is not None and np.isfinite(bound) else None,
            time.perf_counter() - begin,
            f"appsi_highs: {condition.name}",
        )


BACKEND = PyomoBackend()
