"""The fleet-wide placement MILP: candidates, formulation, backends, extraction, baselines, verification."""

from solver.pipeline import plan

__all__ = ["plan"]
