"""The nightly re-plan (docs/store.md): traffic readers, forecasts, churn-limited re-plan, simulation gate,
diff and promotion. `replan()` is the one service function the CLI and the HTTP API call."""

from fleetplan.replan.service import replan

__all__ = ["replan"]
