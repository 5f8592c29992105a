"""Small fleets for the store and re-plan tests: one llama-3.2-1b class on a6000ada and inf2, with the
paper profile rows inline (flat capacity model: a plan takes well under a second)."""

from pathlib import Path

import pandas as pd

from fleetplan import fixtures
from fleetplan.models.codec import convert
from fleetplan.models.plan import PlanRequest
from fleetplan.models.store import GateSpec

# a short gate: one seed, 20 s measured after 5 s (the default is 3 seeds of 600 s)
QUICK_GATE = GateSpec(seeds=1, duration_s=20.0, warmup_s=5.0)


def paper_rows() -> pd.DataFrame:
    frame = pd.read_csv(Path(fixtures.profiles_dir()) / "paper" / "profile.csv")
    keep = (frame["model"] == "llama-3.2-1b") & frame["device"].isin(["a6000ada", "inf2"])
    return frame[keep].drop(columns=["source"]).reset_index(drop=True)


def faster_inf2_decode(rows: pd.DataFrame, factor: float = 0.5) -> pd.DataFrame:
    """The same rows with inf2's decode step (TBT) `factor` times as long: a faster decode device."""
    fast = rows.copy()
    on_inf2 = fast["device"] == "inf2"
    for column in ("tbt_ms_p50", "tbt_ms_p90", "tbt_ms_p99"):
        fast.loc[on_inf2, column] = fast.loc[on_inf2, column] * factor
    return fast


def tiny_request(rows: pd.DataFrame | None = None, rate_rps: float = 20.0, **options) -> PlanRequest:
    """A one-class fleet whose TBT SLO (5 ms) only a6000ada meets with the paper rows (inf2 takes 5.7 ms
    per step at p90), so decode runs on a6000ada; inf2 costs half as much."""
    rows = paper_rows() if rows is None else rows
    return convert(
        {
            "devices": [
                {"name": "a6000ada", "count": 8, "cost_per_hour": 1.0, "network_gbps": 25.0},
                {"name": "inf2", "count": 8, "cost_per_hour": 0.5, "network_gbps": 25.0},
            ],
            "workloads": [
                {
                    "name": "chat",
                    "model": "llama-3.2-1b",
                    "prompt_tokens": 512,
                    "output_tokens": 128,
                    "rate_rps": rate_rps,
                    "slo": {"ttft_ms": 500, "tbt_ms": 5, "percentile": 90},
                }
            ],
            "profiles": {"rows": rows.to_dict("records")},
            "options": {
                "time_limit_s": 5,
                "capacity_model": "flat",
                "max_utilization": 0.5,
                "allow_colocated": False,
                **options,
            },
        },
        PlanRequest,
    )


def pool_counts(plan) -> dict[tuple, int]:
    """Instances per (role, device) of a plan, counted independently of replan.diff."""
    counts: dict[tuple, int] = {}
    for pool in plan.pools:
        counts[(pool.role, pool.device)] = counts.get((pool.role, pool.device), 0) + pool.instances
    return counts
