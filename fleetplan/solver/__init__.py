"""The fleet-wide placement MILP: candidates, formulation, backends, extraction, baselines, verification."""

from fleetplan.solver.pipeline import plan

__all__ = ["plan"]
