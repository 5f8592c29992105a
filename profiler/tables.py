"""Profile tables: load, check, hash. Checks are named functions that name the bad rows; gaps are never filled.

A table is a pandas DataFrame with the key columns (model, device, tp, batch, prompt_tokens), the six latency
columns (NaN where a percentile was not given) and `source`.
"""

import hashlib
import io
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from models.errors import ProfileMissing
from models.profile import KEY_COLUMNS, LATENCY_COLUMNS, PERCENTILES, ProfileRow

_INT_COLUMNS = ("tp", "batch", "prompt_tokens")


class ProfileTable(msgspec.Struct, frozen=True):
    """A checked latency table with the name and content hash a plan reports."""

    name: str
    sha256: str
    frame: pd.DataFrame


def _rows_label(frame: pd.DataFrame, mask: np.ndarray, limit: int = 5) -> str:
    """`rows 3, 7 (mistral-7b/inf2/tp1/b4/p512)...`: row numbers and keys of the offending rows."""
    bad = frame[mask]
    shown = [
        f"{index} ({row.model}/{row.device}/tp{row.tp}/b{row.batch}/p{row.prompt_tokens})"
        for index, row in zip(bad.index[:limit], bad.itertuples(index=False), strict=False)
    ]
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"rows {', '.join(shown)}{more}"


def check_columns(frame: pd.DataFrame) -> None:
    """Key columns and at least one TTFT and one TBT column are present."""
    missing = [c for c in KEY_COLUMNS if c not in frame.columns]
    if missing:
        msg = f"missing key column(s) {missing}"
        raise ProfileMissing(msg, field="profiles")
    if not any(c in frame.columns for c in LATENCY_COLUMNS[:3]) or not any(
        c in frame.columns for c in LATENCY_COLUMNS[3:]
    ):
        msg = f"needs at least one ttft_ms_p* and one tbt_ms_p* column, has {list(frame.columns)}"
        raise ProfileMissing(msg, field="profiles")


def check_keys_valid(frame: pd.DataFrame) -> None:
    """tp, batch and prompt_tokens are positive integers; model and device are non-empty."""
    for column in _INT_COLUMNS:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < 1) | (values != np.round(values))
        if bad.any():
            msg = f"{column} must be a positive integer: {_rows_label(frame, bad)}"
            raise ProfileMissing(msg, field=f"profiles.{column}")
    for column in ("model", "device"):
        bad = frame[column].isna().to_numpy() | (frame[column].astype(str).str.len() == 0).to_numpy()
        if bad.any():
            msg = f"{column} is empty in {int(bad.sum())} row(s)"
            raise ProfileMissing(msg, field=f"profiles.{column}")


def check_latencies_positive(frame: pd.DataFrame) -> None:
    """Every latency given is finite and > 0 (NaN means "percentile not given", never zero)."""
    for column in LATENCY_COLUMNS:
        values = frame[column].to_numpy(dtype=float)
        bad = np.isinf(values) | (values <= 0)
        if bad.any():
            msg = f"{column} must be finite and > 0: {_rows_label(frame, bad)}"
            raise ProfileMissing(msg, field=f"profiles.{column}")


def check_percentiles_ordered(frame: pd.DataFrame) -> None:
    """p50 <= p90 <= p99 wherever both percentiles are given (they come from one sample)."""
    for metric in ("ttft", "tbt"):
        for low, high in zip(PERCENTILES, PERCENTILES[1:], strict=False):
            lo = frame[f"{metric}_ms_p{low}"].to_numpy(dtype=float)
            hi = frame[f"{metric}_ms_p{high}"].to_numpy(dtype=float)
            bad = lo > hi * (1 + 1e-9)
            if bad.any():
                msg = f"{metric}_ms_p{low} > {metric}_ms_p{high}: {_rows_label(frame, bad)}"
                raise ProfileMissing(msg, field=f"profiles.{metric}_ms_p{low}")


def check_unique_keys(frame: pd.DataFrame) -> None:
    """One row per (model, device, tp, batch, prompt_tokens): two rows for one point would be ambiguous."""
    bad = frame.duplicated(list(KEY_COLUMNS), keep=False).to_numpy()
    if bad.any():
        msg = f"duplicate (model, device, tp, batch, prompt_tokens): {_rows_label(frame, bad)}"
        raise ProfileMissing(msg, field="profiles")


CHECKS = (check_columns, check_keys_valid, check_latencies_positive, check_percentiles_ordered, check_unique_keys)


def normalize(frame: pd.DataFrame) -> pd.DataFrame:
    """All latency columns present (NaN where absent), typed keys, sorted by key, a fresh 0..n index."""
    check_columns(frame)
    frame = frame.copy()
    for column in LATENCY_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    if "source" not in frame.columns:
        frame["source"] = ""
    frame["source"] = frame["source"].fillna("").astype(str)
    frame = frame.reset_index(drop=True)
    for check in CHECKS[1:]:
        check(frame)
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype(np.int64)
    frame["model"] = frame["model"].astype(str)
    frame["device"] = frame["device"].astype(str)
    columns = [*KEY_COLUMNS, *LATENCY_COLUMNS, "source"]
    return frame[columns].sort_values(list(KEY_COLUMNS), kind="stable").reset_index(drop=True)


def content_hash(frame: pd.DataFrame) -> str:
    """sha256 of the canonical CSV rendering: equal tables hash equal whatever their origin."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, float_format="%.6g", lineterminator="\n")
    return hashlib.sha256(buffer.getvalue().encode()).hexdigest()


def from_frame(frame: pd.DataFrame, name: str, sha256: str | None = None) -> ProfileTable:
    """A checked table; `sha256` defaults to the hash of its canonical rendering."""
    clean = normalize(frame)
    return ProfileTable(name=name, sha256=sha256 or content_hash(clean), frame=clean)


def from_rows(rows: list[ProfileRow], name: str = "inline") -> ProfileTable:
    """A table from rows given inline in a request."""
    return from_frame(pd.DataFrame(msgspec.to_builtins(rows)), name)


def read_csv(path: Path, name: str) -> ProfileTable:
    """A table from a profile CSV, hashed as stored (the hash its manifest records); an unreadable or
    malformed file names itself."""
    try:
        data = path.read_bytes()
        frame = pd.read_csv(io.BytesIO(data))
    except (OSError, ValueError) as error:
        msg = f"cannot read profile set {name!r} at {path}: {error}"
        raise ProfileMissing(msg, field="profiles.set") from error
    return from_frame(frame, name, hashlib.sha256(data).hexdigest())
