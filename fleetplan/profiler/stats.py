"""Reduce one grid point's timings to the percentile columns of a ProfileRow.

Every request of every measured batch contributes its TTFT to one sample and every one of its inter-token
gaps to another; each sample is reduced to p50/p90/p99 in milliseconds with numpy's default (linear)
interpolation, so the figures are reproducible from the raw timings with `np.percentile`.
"""

from collections.abc import Iterable, Sequence

import numpy as np

from fleetplan.models.profile import PERCENTILES
from fleetplan.profiler.engines.base import RequestTiming


def percentiles_ms(samples_s: Sequence[float] | np.ndarray) -> dict[int, float]:
    """{50: p50, 90: p90, 99: p99} of `samples_s` (seconds) in milliseconds; empty or non-finite is an error.

    A gap is never filled: an empty sample or a NaN in it raises ValueError instead of producing a figure.
    """
    values = np.asarray(samples_s, dtype=float)
    if values.size == 0:
        msg = "no samples to take percentiles of"
        raise ValueError(msg)
    if not np.isfinite(values).all():
        msg = f"{int((~np.isfinite(values)).sum())} of {values.size} samples are NaN or infinite"
        raise ValueError(msg)
    figures = np.percentile(values * 1e3, PERCENTILES)
    return {q: float(v) for q, v in zip(PERCENTILES, figures, strict=True)}


def latency_columns(batches: Iterable[Sequence[RequestTiming]]) -> dict[str, float]:
    """`ttft_ms_p50` ... `tbt_ms_p99` over all requests (TTFT) and all their inter-token gaps (TBT)."""
    ttfts: list[float] = []
    gaps: list[float] = []
    for batch in batches:
        for timing in batch:
            ttfts.append(timing.ttft_s)
            gaps.extend(timing.gaps_s)
    columns: dict[str, float] = {}
    for metric, sample in (("ttft", ttfts), ("tbt", gaps)):
        try:
            figures = percentiles_ms(sample)
        except ValueError as error:
            msg = f"{metric}: {error}"
            raise ValueError(msg) from error
        columns.update({f"{metric}_ms_p{q}": value for q, value in figures.items()})
    return columns


__all__ = ["latency_columns", "percentiles_ms"]
