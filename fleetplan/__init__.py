"""fleetplan: a placement planner for LLM serving fleets.

Subpackages, one floor each (data flows down, no import runs back up): `fleetplan.models` (the msgspec
Structs), `fleetplan.profiler` (latency tables), `fleetplan.solver` (candidates -> MILP -> plan),
`fleetplan.api` (the Litestar service and the click CLI) and `fleetplan.fixtures` (bundled data).
"""

from importlib import metadata

try:
    __version__ = metadata.version("fleetplan")
except metadata.PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"
