"""Engine backends the profiler measures through, chosen by name and imported lazily."""

from fleetplan.profiler.engines.base import Engine, EngineUnavailable, RequestTiming, get_engine

__all__ = ["Engine", "EngineUnavailable", "RequestTiming", "get_engine"]
