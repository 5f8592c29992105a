"""Per-pool latency curves: for every (pool, class it serves) and batch occupancy n = 1..batch, the
quantile parameters of TTFT and TBT (fleetplan/profiler/latency.py) at the class's prompt.

In prompt length the curves use the one interpolator the solver uses too
(`fleetplan.profiler.tables.latency_at_prompt`); over batch sizes they are linear between profiled batches,
and below the smallest profiled batch the smallest one's figures are used (conservative).
"""

import math

import numpy as np
import pandas as pd

from fleetplan.models.errors import ProfileMissing
from fleetplan.models.profile import PERCENTILES
from fleetplan.profiler.latency import Params, quantile_params
from fleetplan.profiler.tables import ProfileTable, latency_at_prompt

# Per n = 1..batch (index 0 unused): the quantile params of one metric at one prompt.
Curve = list[Params | None]


class CurveBook:
    """The latency-at-prompt rows of a profile table, looked up once per (model, device, tp, prompt)."""

    def __init__(self, table: ProfileTable) -> None:
        self.table = table
        self._points: dict[tuple[str, str, int, int], pd.DataFrame] = {}

    def points(self, model: str, device: str, tp: int, prompt: int) -> pd.DataFrame:
        """One row per profiled batch of (model, device, tp) inside the prompt range, by batch, with the six
        latency columns at `prompt`."""
        key = (model, device, tp, prompt)
        if key not in self._points:
            frame = self.table.frame
            rows = frame[(frame["model"] == model) & (frame["device"] == device) & (frame["tp"] == tp)]
            if rows.empty:
                msg = f"no profile rows for {model}/{device}/tp{tp}"
                raise ProfileMissing(msg, field="profiles")
            at = latency_at_prompt(rows, pd.DataFrame({"model": [model], "prompt_tokens": [prompt]}))
            self._points[key] = at[at["in_range"].to_numpy()].sort_values("batch", kind="stable")
        return self._points[key]

    def _why_no_curve(self, model: str, device: str, tp: int, prompt: int, metric: str, batch: int) -> str:
        """Why (model, device, tp) has no `metric` curve up to `batch` at `prompt`: the prompt outside every
        profiled range of its batches, or the p50 the simulator draws from missing."""
        frame = self.table.frame
        rows = frame[(frame["model"] == model) & (frame["device"] == device) & (frame["tp"] == tp)]
        lo, hi = int(rows["prompt_tokens"].min()), int(rows["prompt_tokens"].max())
        where = f"{model}/{device}/tp{tp}"
        if self.points(model, device, tp, prompt).empty:
            return (
                f"prompt {prompt} is outside the profiled prompt lengths of {where} ({lo}..{hi}); latencies "
                "are never extrapolated: profile that prompt length to simulate it"
            )
        return (
            f"no {metric} profile with a p50 for {where} up to batch {batch} at prompt {prompt}: the "
            "simulator draws each latency from its p50 and p90; give the rows a p50 to simulate"
        )

    def curve(self, model: str, device: str, tp: int, prompt: int, metric: str, batch: int) -> Curve:
        """Quantile params of `metric` ("ttft" or "tbt") per n = 1..batch: each percentile interpolated
        linearly over the profiled batches (NaN for every n when it is missing at any of them); batches
        without a p50 at this prompt are left out."""
        points = self.points(model, device, tp, prompt)
        columns = [f"{metric}_ms_p{q}" for q in PERCENTILES]
        values = points[columns].to_numpy(float)
        usable = np.isfinite(values[:, 0])
        batches, values = points["batch"].to_numpy(float)[usable], values[usable]
        if not len(batches) or batches.max() < batch:
            raise ProfileMissing(
                self._why_no_curve(model, device, tp, prompt, metric, batch), field="profiles"
            )
        complete = [bool(np.isfinite(values[:, j]).all()) for j in range(3)]
        out: Curve = [None]
        for n in range(1, batch + 1):
            at_n = [float(np.interp(n, batches, values[:, j])) for j in range(3)]
            point = [value if complete[j] else math.nan for j, value in enumerate(at_n)]
            out.append(quantile_params(*point))
        return out
