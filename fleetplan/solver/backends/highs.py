"""HiGHS through highspy: the whole model handed over as arrays in one passModel call."""

import time
from collections.abc import Mapping

import highspy
import numpy as np

from fleetplan.models.errors import SolverFailure
from fleetplan.solver.backends.base import Sense, SolveResult, Termination
from fleetplan.solver.formulation import MatrixForm

_STATUS = highspy.HighsModelStatus
CONDITION_MAP = {
    _STATUS.kOptimal: Termination.OPTIMAL,
    _STATUS.kInfeasible: Termination.INFEASIBLE,
    _STATUS.kUnboundedOrInfeasible: Termination.INFEASIBLE,
    _STATUS.kTimeLimit: Termination.FEASIBLE,
    _STATUS.kIterationLimit: Termination.FEASIBLE,
    _STATUS.kSolutionLimit: Termination.FEASIBLE,
    _STATUS.kInterrupt: Termination.FEASIBLE,
    _STATUS.kModelEmpty: Termination.OPTIMAL,
}


def _lp(form: MatrixForm, objective: np.ndarray, sense: Sense, relax: bool) -> highspy.HighsLp:
    csc = form.A.tocsc()
    if not (np.isfinite(csc.data).all() and np.isfinite(objective).all()):
        # HiGHS 1.15 crashes the process (SIGSEGV) on some of these: a rate of inf once reached it
        raise SolverFailure(
            "the model has a non-finite coefficient: an input out of range reached the solver"
        )
    lp = highspy.HighsLp()
    lp.num_col_ = csc.shape[1]
    lp.num_row_ = csc.shape[0]
    lp.col_cost_ = objective.astype(float)
    lp.col_lower_ = form.col_lo
    lp.col_upper_ = form.col_hi
    lp.row_lower_ = form.row_lo
    lp.row_upper_ = form.row_hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = csc.indptr
    lp.a_matrix_.index_ = csc.indices
    lp.a_matrix_.value_ = csc.data
    lp.sense_ = highspy.ObjSense.kMaximize if sense is Sense.MAX else highspy.ObjSense.kMinimize
    if not relax and form.integer.any():
        lp.integrality_ = np.where(
            form.integer, highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
        )
    return lp


class HighsBackend:
    name = "highs"

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
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("time_limit", max(float(time_limit_s), 1e-3))
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
        h.setOptionValue("mip_abs_gap", 1e-9)
        # Restarts re-presolve after the root; measured slower on every bench instance (bench/README.md).
        h.setOptionValue("mip_allow_restart", False)
        for option, value in (tuning or {}).items():  # per-stage HiGHS options (optimize.STAGE_TUNING)
            h.setOptionValue(option, value)
        h.passModel(_lp(form, objective, sense, relax))
        if start is not None and not relax:
            solution = highspy.HighsSolution()
            solution.col_value = list(start)
            solution.value_valid = True
            h.setSolution(solution)
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        has_primal = info.primal_solution_status == 2  # kSolutionStatusFeasible
        termination = CONDITION_MAP.get(status, Termination.ERROR)
        if termination is Termination.FEASIBLE and not has_primal:
            termination = Termination.NO_SOLUTION
        values = np.asarray(h.getSolution().col_value, dtype=float) if has_primal else None
        objective_value = float(info.objective_function_value) if has_primal else None
        is_mip = bool(form.integer.any()) and not relax
        bound = float(info.mip_dual_bound) if is_mip else objective_value
        if termination is Termination.OPTIMAL and values is None:
            termination = Termination.ERROR
        return SolveResult(
            termination,
            values,
            objective_value,
            bound if bound is not None and np.isfinite(bound) else None,
            time.perf_counter() - begin,
            h.modelStatusToString(status),
            nodes=int(info.mip_node_count) if is_mip else None,
        )


BACKEND = HighsBackend()
