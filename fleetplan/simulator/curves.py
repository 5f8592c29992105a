"""Per-pool latency curves: for every (pool, class it serves) and batch occupancy n = 1..batch, the
quantile parameters of TTFT and TBT (fleetplan/profiler/latency.py) at the class's prompt.

Linear in prompt length (as the solver does), then linear over the profiled batch sizes; below the smallest
profiled batch the smallest one's figures are used (conservative).
"""

import math

import numpy as np

from fleetplan.profiler.latency import Params, quantile_params
from fleetplan.profiler.tables import ProfileTable

# Per n = 1..batch (index 0 unused): the quantile params of one metric at one prompt.
Curve = list[Params | None]


class CurveBook:
    """Builds the curves of one profile table."""

    def __init__(self, table: ProfileTable) -> None:
        self.table = table

    def curve(self, model: str, device: str, tp: int, prompt: int, metric: str, batch: int) -> Curve:
        """Quantile params of `metric` ("ttft" or "tbt") at `prompt` per n = 1..batch."""
        frame = self.table.frame
        rows = frame[(frame["model"] == model) & (frame["device"] == device) & (frame["tp"] == tp)]
        if rows.empty:
            msg = f"no profile rows for {model}/{device}/tp{tp}"
            raise ValueError(msg)
        batches, values = [], []
        for b, group in rows.groupby("batch"):
            group = group.sort_values("prompt_tokens")
            xs = group["prompt_tokens"].to_numpy(float)
            if not xs[0] <= prompt <= xs[-1]:
                continue
            cols = [f"{metric}_ms_p{q}" for q in (50, 90, 99)]
            point = []
            for c in cols:
                ys = group[c].to_numpy(float)
                point.append(float(np.interp(prompt, xs, ys)) if np.isfinite(ys).all() else math.nan)
            if not np.isfinite(point[0]):
                continue
            batches.append(int(b))
            values.append(point)
        if not batches or max(batches) < batch:
            msg = f"no {metric} profile for {model}/{device}/tp{tp} up to batch {batch} at prompt {prompt}"
            raise ValueError(msg)
        bx = np.array(batches, float)
        vals = np.array(values, float)
        out: Curve = [None]
        for n in range(1, batch + 1):
            point = [
                float(np.interp(n, bx, vals[:, j])) if np.isfinite(vals[:, j]).all() else math.nan
                for j in range(3)
            ]
            out.append(quantile_params(*point))
        return out
