"""Solver backends: each takes a MatrixForm and one objective vector and returns a SolveResult."""

from fleetplan.solver.backends.base import Sense, SolveResult, Termination, get_backend, relative_gap

__all__ = ["Sense", "SolveResult", "Termination", "get_backend", "relative_gap"]
