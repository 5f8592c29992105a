"""What every backend returns, never None: a termination from one explicit table per backend."""

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.solver.formulation import MatrixForm


class Termination(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # stopped (time limit) with an incumbent
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no_solution"  # stopped without an incumbent
    ERROR = "error"


class Sense(StrEnum):
    MAX = "max"
    MIN = "min"


# Differences in objective up to this are closed gaps: the mip_abs_gap the HiGHS backends run with.
GAP_ABS_TOL = 1e-9


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """The one relative MIP gap of fleetplan: |bound - objective| / |objective|.

    - None when either is None (no incumbent, or no bound).
    - 0 when |bound - objective| <= GAP_ABS_TOL (1e-9), so equal values, and objective 0 with bound 0, are 0.
    - Otherwise the difference over max(|objective|, 1e-9): the incumbent's magnitude, as HiGHS measures its
      mip_rel_gap, whatever the signs. An objective of 0 with a bound away from it is a gap of at least 1
      (1e9 per unit of difference): nothing of the bound is proven reached.

    Plan.mip_gap, the tie-break gap in SolverInfo.tie_break, StageRecord.gap and bench/solver_scaling.py
    all use it
    (docs/api.md, "mip_gap").
    """
    if objective is None or bound is None:
        return None
    difference = abs(bound - objective)
    if difference <= GAP_ABS_TOL:
        return 0.0
    return difference / max(abs(objective), 1e-9)


@dataclass(frozen=True)
class SolveResult:
    termination: Termination
    values: np.ndarray | None
    objective: float | None
    bound: float | None
    seconds: float
    detail: str = ""
    nodes: int | None = None  # branch-and-bound nodes, where the backend reports them (HiGHS MIPs)

    @property
    def has_solution(self) -> bool:
        return self.values is not None

    @property
    def gap(self) -> float | None:
        """relative_gap(objective, bound)."""
        return relative_gap(self.objective, self.bound)


class Backend(Protocol):
    name: str

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
    ) -> SolveResult: ...


_BACKENDS = {
    "highs": "fleetplan.solver.backends.highs",
    "pyomo": "fleetplan.solver.backends.pyomo",
    "ortools": "fleetplan.solver.backends.ortools",
}


def get_backend(name: str) -> Backend:
    """The backend module's BACKEND, imported lazily (pyomo is an optional extra)."""
    if name not in _BACKENDS:
        msg = f"unknown solver {name!r}; choose one of {sorted(_BACKENDS)}"
        raise InputError(msg, field="options.solver")
    try:
        module = importlib.import_module(_BACKENDS[name])
    except ImportError as error:
        msg = (
            f"solver {name!r} is not installed ({error.name}); "
            f"install it with: pip install 'fleetplan[{name}]'"
        )
        raise InputError(msg, field="options.solver") from error
    return module.BACKEND
