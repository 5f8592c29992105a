"""The discrete-event simulator: the judge of plans (docs/simulation.md).

`simulate(request, plan, table)` replays Poisson or trace arrivals through a plan's pools and reports
simulated next to predicted latencies, attainment and goodput.
"""

from fleetplan.simulator.arrivals import load_trace, map_trace_to_classes
from fleetplan.simulator.run import replay, simulate

__all__ = ["load_trace", "map_trace_to_classes", "replay", "simulate"]
