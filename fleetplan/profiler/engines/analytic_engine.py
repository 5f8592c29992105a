"""The `analytic` engine: profile rows for a device nobody has measured, from the roofline estimator.

It times nothing. Instead of `run_batch` the runner calls `estimate_point` (the `RowEstimator` protocol in
profiler.runner), which evaluates profiler.analytic.estimate_rows at one grid point with the spec sheet
`fleetplan.models.hardware.HARDWARE[device]` and the architecture `fleetplan.models.workload.CATALOG[model]`.
A point where the model does not fit in memory gets no row (None): it is listed as missing, never filled.
"""

import platform
from typing import Any

from fleetplan.models.codec import convert
from fleetplan.models.errors import InputError
from fleetplan.models.hardware import HARDWARE, HardwareSpec
from fleetplan.models.profile import ProfileGrid, ProfileRow
from fleetplan.models.workload import CATALOG, ModelSpec
from fleetplan.profiler.analytic import Efficiency, estimate_rows
from fleetplan.profiler.engines.base import RequestTiming


class AnalyticEngine:
    """Roofline estimates for `device` (a models.hardware.HARDWARE name); `efficiency` overrides the
    calibrated factors (an Efficiency, or its JSON-shaped dict, decoded through models.codec)."""

    name = "analytic"

    def __init__(
        self,
        device: str,
        efficiency: Efficiency | dict[str, Any] | None = None,
        models: dict[str, ModelSpec] | None = None,
    ) -> None:
        if device not in HARDWARE:
            msg = f"unknown device {device!r} for the analytic engine; known: {sorted(HARDWARE)}"
            raise InputError(msg, field="device")
        self.hardware: HardwareSpec = HARDWARE[device]
        if isinstance(efficiency, dict):
            efficiency = convert(efficiency, Efficiency)
        self.efficiency = efficiency or Efficiency()
        self.models = {**CATALOG, **(models or {})}
        try:
            self.efficiency.factors(self.hardware)
        except ValueError as error:
            raise InputError(str(error), field="efficiency") from error

    def describe(self) -> dict[str, str]:
        return {
            "engine": self.name,
            "estimator": f"fleetplan.profiler.analytic ({self.efficiency.tag})",
            "device": self.hardware.name,
            "host": platform.node(),
        }

    def validate_grid(self, grid: ProfileGrid) -> None:
        """Every model is known and has the architecture the estimator needs; checked before any work."""
        if grid.device != self.hardware.name:
            msg = f"the grid is for {grid.device!r} but the analytic engine estimates {self.hardware.name!r}"
            raise InputError(msg, field="device")
        for model in grid.models:
            self._model(model)

    def _model(self, model: str) -> ModelSpec:
        if model not in self.models:
            msg = f"unknown model {model!r} for the analytic engine; known: {sorted(self.models)}"
            raise InputError(msg, field="models")
        spec = self.models[model]
        if spec.params_b is None or spec.hidden_size is None or spec.layers is None:
            msg = f"model {model!r}: the analytic estimator needs params_b, hidden_size and layers"
            raise InputError(msg, field="models")
        return spec

    def estimate_point(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> ProfileRow | None:
        """The row at one grid point, or None where the model does not fit in memory."""
        rows = estimate_rows(
            self._model(model),
            self.hardware,
            [tp],
            [batch],
            [prompt_tokens],
            efficiency=self.efficiency,
            output_tokens=output_tokens,
        )
        return rows[0] if rows else None

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        """Not supported: an estimate has no per-request timings (the runner uses estimate_point)."""
        msg = "the analytic engine estimates rows (estimate_point); it does not run batches"
        raise NotImplementedError(msg)

    def close(self) -> None:
        """Nothing to release."""


__all__ = ["AnalyticEngine"]
