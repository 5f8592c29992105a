"""What every backend returns, never None: a termination from one explicit table per backend."""

import importlib
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


@dataclass(frozen=True)
class SolveResult:
    termination: Termination
    values: np.ndarray | None
    objective: float | None
    bound: float | None
    seconds: float
    detail: str = ""

    @property
    def has_solution(self) -> bool:
        return self.values is not None

    @property
    def gap(self) -> float | None:
        """Relative gap |bound - objective| / max(1, |objective|)."""
        if self.objective is None or self.bound is None:
            return None
        return abs(self.bound - self.objective) / max(1.0, abs(self.objective))


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
