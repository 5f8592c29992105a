"""Checks on a backend-neutral model (fleetplan.solver.formulation.MatrixForm) that the tests share."""

import numpy as np

from fleetplan.solver.formulation import MatrixForm


def is_feasible(form: MatrixForm, v: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether `v` keeps every column bound, integrality and row of `form` (within `tol`, relative to
    max(1, |bound|) for rows)."""
    if np.any(v < form.col_lo - tol) or np.any(v > form.col_hi + tol):
        return False
    ints = v[form.integer]
    if np.any(np.abs(ints - np.round(ints)) > tol):
        return False
    activity = form.A @ v
    lo_ok = activity >= form.row_lo - tol * np.maximum(1.0, np.abs(np.nan_to_num(form.row_lo)))
    hi_ok = activity <= form.row_hi + tol * np.maximum(1.0, np.abs(np.nan_to_num(form.row_hi)))
    return bool(np.all(lo_ok) and np.all(hi_ok))
