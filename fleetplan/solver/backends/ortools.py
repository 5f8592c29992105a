"""OR-Tools (SCIP, CBC as fallback) in a child process: this process never imports ortools.

Why a child process: highspy 1.15.1 and ortools 9.15 each ship a `libhighs.so.1` of a different HiGHS
(1.15.1 and 1.12.0). Whichever loads first wins, and the other import fails with an undefined symbol, in
either order (measured; docs/solvers.md). The planner always has highspy loaded (the default backend,
and Pyomo's HiGHS interface), so OR-Tools runs in `_ortools_worker.py`, started per solve with the same
interpreter. The MatrixForm goes over as an .npz file in a temporary directory and the answer comes back
the same way (exact float64 both ways, no pickle). Start-up (interpreter, numpy, ortools) costs about
0.3-0.5 s a solve; it is charged to the caller's time limit (the worker gets an absolute deadline).

Why SCIP and not CP-SAT: CP-SAT discretises the continuous flow variables and reports "optimal" at a
wrong objective. SCIP is a real LP-based branch and bound; CBC is the fallback when a build lacks SCIP.
"""

import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.solver.backends.base import Sense, SolveResult, Termination
from fleetplan.solver.formulation import MatrixForm

WORKER = Path(__file__).with_name("_ortools_worker.py")
EXIT_NO_ORTOOLS = 3  # the worker's exit code when ortools does not import (kept equal to the worker's)
SOLVERS = ("SCIP", "CBC")  # pywraplp names, in order of preference; never "CP-SAT"/"SAT"
INSTALL_HINT = "pip install 'fleetplan[ortools]'"
# The child is killed if it outlives its deadline by this much (start-up, model build, overshoot).
GRACE_S = 30.0

# pywraplp's status names (as the worker writes them). Stopped early: FEASIBLE if an incumbent came back,
# demoted to NO_SOLUTION below otherwise; SCIP reports a time-out without an incumbent as NOT_SOLVED.
CONDITION_MAP = {
    "OPTIMAL": Termination.OPTIMAL,
    "FEASIBLE": Termination.FEASIBLE,
    "INFEASIBLE": Termination.INFEASIBLE,
    "NOT_SOLVED": Termination.NO_SOLUTION,
    "UNBOUNDED": Termination.ERROR,  # every column is bounded: a formulation bug
    "ABNORMAL": Termination.ERROR,
    "MODEL_INVALID": Termination.ERROR,
}


def ortools_installed() -> bool:
    """Whether the worker can import ortools; find_spec locates the package without loading it."""
    return importlib.util.find_spec("ortools") is not None


def worker_command(source: Path, target: Path) -> list[str]:
    """`-P`: do not put fleetplan/solver/backends/ (holding this `ortools.py`) at the front of the child's
    sys.path."""
    return [sys.executable, "-P", str(WORKER), str(source), str(target)]


def _not_installed(detail: str) -> InputError:
    msg = f"solver 'ortools' is not installed ({detail}); install it with: {INSTALL_HINT}"
    return InputError(msg, field="options.solver")


def _payload(
    form: MatrixForm,
    objective: np.ndarray,
    sense: Sense,
    deadline: float,
    mip_rel_gap: float,
    relax: bool,
    start: np.ndarray | None,
) -> dict[str, np.ndarray]:
    A = form.A.tocsr()
    data = {
        "A_data": np.asarray(A.data, dtype=float),
        "A_indices": np.asarray(A.indices, dtype=np.int64),
        "A_indptr": np.asarray(A.indptr, dtype=np.int64),
        "A_shape": np.asarray(A.shape, dtype=np.int64),
        "row_lo": np.asarray(form.row_lo, dtype=float),
        "row_hi": np.asarray(form.row_hi, dtype=float),
        "col_lo": np.asarray(form.col_lo, dtype=float),
        "col_hi": np.asarray(form.col_hi, dtype=float),
        "integer": np.asarray(form.integer, dtype=bool),
        "objective": np.asarray(objective, dtype=float),
        "sense": np.str_(sense.value),
        "deadline": np.float64(deadline),
        "mip_rel_gap": np.float64(mip_rel_gap),
        "relax": np.bool_(relax),
        "solvers": np.array(SOLVERS),
    }
    if start is not None:
        data["start"] = np.asarray(start, dtype=float)
    return data


def _finite(value: np.ndarray) -> float | None:
    number = float(value)
    return number if np.isfinite(number) else None


class OrtoolsBackend:
    name = "ortools"
    # What this backend honours (style rule 5); warm_start only with SCIP (CBC ignores the hint).
    capabilities = frozenset({"time_limit", "mip_rel_gap", "warm_start", "mip_bound", "own_process"})

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
        tuning: Mapping[str, bool | int | float | str] | None = None,  # HiGHS options: not for SCIP
    ) -> SolveResult:
        begin = time.perf_counter()
        if not ortools_installed():
            raise _not_installed("no module named 'ortools'")
        deadline = time.time() + max(float(time_limit_s), 1e-3)
        with tempfile.TemporaryDirectory(prefix="fleetplan-ortools-") as folder:
            source, target = Path(folder) / "in.npz", Path(folder) / "out.npz"
            np.savez(source, **_payload(form, objective, sense, deadline, mip_rel_gap, relax, start))
            try:
                child = subprocess.run(  # our own interpreter running our own file
                    worker_command(source, target),
                    capture_output=True,
                    text=True,
                    timeout=max(float(time_limit_s), 1e-3) + GRACE_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                seconds = time.perf_counter() - begin
                detail = (
                    f"ortools worker killed after {seconds:.1f} s (time limit {time_limit_s} s + {GRACE_S} s)"
                )
                return SolveResult(Termination.NO_SOLUTION, None, None, None, seconds, detail)
            if child.returncode == EXIT_NO_ORTOOLS:
                raise _not_installed(child.stderr.strip())
            if child.returncode != 0 or not target.exists():
                tail = child.stderr.strip().splitlines()[-5:]
                detail = f"ortools worker exited with {child.returncode}: " + " | ".join(tail)
                return SolveResult(Termination.ERROR, None, None, None, time.perf_counter() - begin, detail)
            with np.load(target, allow_pickle=False) as archive:
                answer = {key: archive[key] for key in archive.files}
        status = str(answer["status"])
        termination = CONDITION_MAP.get(status, Termination.ERROR)
        solved = status in ("OPTIMAL", "FEASIBLE") and answer["values"].size == form.A.shape[1]
        values = answer["values"].astype(float) if solved else None
        if termination is Termination.FEASIBLE and values is None:
            termination = Termination.NO_SOLUTION
        if termination is Termination.OPTIMAL and values is None:
            termination = Termination.ERROR
        return SolveResult(
            termination,
            values,
            _finite(answer["objective"]) if values is not None else None,
            _finite(answer["bound"]),
            time.perf_counter() - begin,
            f"{status}; {answer['detail']}; solve {float(answer['seconds']):.3f} s",
        )


BACKEND = OrtoolsBackend()
