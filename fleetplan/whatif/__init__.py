"""What-if sweeps over one base request: axes and grid, executors, frontier, outputs (docs/whatif.md)."""

from fleetplan.whatif.service import run_whatif, to_csv

__all__ = ["run_whatif", "to_csv"]
