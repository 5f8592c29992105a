"""Profile tables: load, check, hash, interpolate. Checks are named functions that name the bad rows; gaps are
never filled.

A table is a pandas DataFrame with the key columns (model, device, tp, batch, prompt_tokens), the six latency
columns (NaN where a percentile was not given) and `source`.
"""

import hashlib
import io
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from fleetplan.models.errors import ProfileMissing
from fleetplan.models.profile import KEY_COLUMNS, LATENCY_COLUMNS, PERCENTILES, ProfileRow

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


def _row_field(frame: pd.DataFrame, mask: np.ndarray, column: str) -> str:
    """The field of the first offending row: `profiles.rows[3].tbt_ms_p90` (the row's index: its place
    in a request's inline rows, or its data row in a set's CSV)."""
    return f"profiles.rows[{frame.index[np.argmax(mask)]}].{column}"


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
            raise ProfileMissing(msg, field=_row_field(frame, bad, column))
    for column in ("model", "device"):
        bad = frame[column].isna().to_numpy() | (frame[column].astype(str).str.len() == 0).to_numpy()
        if bad.any():
            msg = f"{column} is empty in {int(bad.sum())} row(s)"
            raise ProfileMissing(msg, field=_row_field(frame, bad, column))


def check_latencies_positive(frame: pd.DataFrame) -> None:
    """Every latency given is finite and > 0 (NaN means "percentile not given", never zero)."""
    for column in LATENCY_COLUMNS:
        values = frame[column].to_numpy(dtype=float)
        bad = np.isinf(values) | (values <= 0)
        if bad.any():
            msg = f"{column} must be finite and > 0: {_rows_label(frame, bad)}"
            raise ProfileMissing(msg, field=_row_field(frame, bad, column))


def check_percentiles_ordered(frame: pd.DataFrame) -> None:
    """p50 <= p90 <= p99 wherever both percentiles are given (they come from one sample)."""
    for metric in ("ttft", "tbt"):
        for low, high in zip(PERCENTILES, PERCENTILES[1:], strict=False):
            lo = frame[f"{metric}_ms_p{low}"].to_numpy(dtype=float)
            hi = frame[f"{metric}_ms_p{high}"].to_numpy(dtype=float)
            bad = lo > hi * (1 + 1e-9)
            if bad.any():
                msg = f"{metric}_ms_p{low} > {metric}_ms_p{high}: {_rows_label(frame, bad)}"
                raise ProfileMissing(msg, field=_row_field(frame, bad, f"{metric}_ms_p{low}"))


def check_unique_keys(frame: pd.DataFrame) -> None:
    """One row per (model, device, tp, batch, prompt_tokens): two rows for one point would be ambiguous."""
    bad = frame.duplicated(list(KEY_COLUMNS), keep=False).to_numpy()
    if bad.any():
        msg = f"duplicate (model, device, tp, batch, prompt_tokens): {_rows_label(frame, bad)}"
        raise ProfileMissing(msg, field="profiles")


CHECKS = (
    check_columns,
    check_keys_valid,
    check_latencies_positive,
    check_percentiles_ordered,
    check_unique_keys,
)


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
    frame["source"] = frame["source"].astype(object).where(frame["source"].notna(), "").astype(str)
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


# --- checks for measured sets and uploads (the profiler's runner and POST /profiles) ----------------------

# TTFT may dip this much when prompt or batch grows before it is flagged (timer noise at tiny sizes);
# TBT may fall this much when the batch grows (it should not fall at all: a bigger batch does more work).
MONOTONE_TOLERANCE = 0.05
TBT_DROP_TOLERANCE = 0.20


def check_no_nan(frame: pd.DataFrame, columns: tuple[str, ...] = LATENCY_COLUMNS) -> None:
    """Every measured column holds a figure in every row: a measured set has all six percentiles."""
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = np.isnan(values)
        if bad.any():
            msg = f"{column} is NaN (not measured): {_rows_label(frame, bad)}"
            raise ProfileMissing(msg, field=f"profiles.{column}")


def check_rows_have_latencies(frame: pd.DataFrame) -> None:
    """Every row gives at least one TTFT and one TBT percentile (a row with neither says nothing)."""
    for metric, columns in (("ttft", LATENCY_COLUMNS[:3]), ("tbt", LATENCY_COLUMNS[3:])):
        present = [c for c in columns if c in frame.columns]
        values = frame[present].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        bad = np.isnan(values).all(axis=1) if present else np.ones(len(frame), dtype=bool)
        if bad.any():
            msg = f"no {metric}_ms_p* figure: {_rows_label(frame, bad)}"
            raise ProfileMissing(msg, field=f"profiles.{metric}_ms_p50")


def _first_present(frame: pd.DataFrame, metric: str) -> str | None:
    """The lowest percentile column of `metric` with any figure (p50 when measured)."""
    for q in PERCENTILES:
        column = f"{metric}_ms_p{q}"
        if column in frame.columns and frame[column].notna().any():
            return column
    return None


def _drops(frame: pd.DataFrame, column: str, group: list[str], axis: str, tolerance: float) -> np.ndarray:
    """Rows whose `column` is lower than (1 - tolerance) x the row before it along `axis` within `group`."""
    ordered = frame.sort_values([*group, axis], kind="stable")
    previous = ordered.groupby(group, sort=False)[column].shift(1)
    bad = (ordered[column] < previous * (1 - tolerance)).to_numpy()
    mask = np.zeros(len(frame), dtype=bool)
    mask[frame.index.get_indexer(ordered.index[bad])] = True
    return mask


def monotone_warnings(frame: pd.DataFrame) -> list[str]:
    """Sanity warnings, not errors: TTFT grows with prompt and batch; TBT does not fall much with batch.

    Each warning names the rows (and their keys) that break the trend, compared with the next smaller
    prompt or batch of the same (model, device, tp, ...). A warning never changes the table.
    """
    frame = frame.reset_index(drop=True)
    warnings: list[str] = []
    ttft = _first_present(frame, "ttft")
    tbt = _first_present(frame, "tbt")
    if ttft is not None:
        bad = _drops(frame, ttft, ["model", "device", "tp", "batch"], "prompt_tokens", MONOTONE_TOLERANCE)
        if bad.any():
            warnings.append(f"{ttft} falls as prompt_tokens grows: {_rows_label(frame, bad)}")
        bad = _drops(frame, ttft, ["model", "device", "tp", "prompt_tokens"], "batch", MONOTONE_TOLERANCE)
        if bad.any():
            warnings.append(f"{ttft} falls as batch grows: {_rows_label(frame, bad)}")
    if tbt is not None:
        bad = _drops(frame, tbt, ["model", "device", "tp", "prompt_tokens"], "batch", TBT_DROP_TOLERANCE)
        if bad.any():
            warnings.append(
                f"{tbt} falls more than {TBT_DROP_TOLERANCE:.0%} as batch grows: {_rows_label(frame, bad)}"
            )
    return warnings


def missing_grid_points(
    frame: pd.DataFrame, device: str, points: list[tuple[str, int, int, int]]
) -> list[tuple[str, int, int, int]]:
    """The (model, tp, batch, prompt_tokens) grid points on `device` that have no row, in grid order."""
    have = {
        (str(r.model), int(r.tp), int(r.batch), int(r.prompt_tokens))
        for r in frame[frame["device"].astype(str) == device].itertuples(index=False)
    }
    return [point for point in points if point not in have]


def check_grid_complete(frame: pd.DataFrame, device: str, points: list[tuple[str, int, int, int]]) -> None:
    """Every grid point has a row; the missing ones are listed, never filled."""
    missing = missing_grid_points(frame, device, points)
    if missing:
        shown = ", ".join(f"{m}/{device}/tp{t}/b{b}/p{p}" for m, t, b, p in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        msg = f"{len(missing)} grid point(s) have no row: {shown}{more}"
        raise ProfileMissing(msg, field="profiles")


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """The canonical CSV rendering of a normalized table: the bytes `content_hash` hashes."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, float_format="%.6g", lineterminator="\n")
    return buffer.getvalue().encode()


def merge_tables(tables: list[ProfileTable]) -> pd.DataFrame:
    """The rows of several sets, one table; a point present in two sets is an error naming both rows."""
    frames = [t.frame.assign(set_name=t.name, set_row=np.arange(len(t.frame))) for t in tables]
    merged = pd.concat(frames, ignore_index=True)
    clash = merged.duplicated(list(KEY_COLUMNS), keep=False).to_numpy()
    if clash.any():
        clashes = _clashes(merged[clash])
        msg = f"the same point is in two sets: {clashes}; merge sets that measured different points"
        raise ProfileMissing(msg, field="sets")
    return merged.drop(columns=["set_name", "set_row"])


def _clashes(rows: pd.DataFrame, limit: int = 5) -> str:
    """ "llama-3.2-1b/h100/tp1/b1/p128 (set 'a' row 0, set 'b' row 1); ...": each point in several sets, by
    each set's own row number (the combined table's numbers named rows a set did not have)."""
    groups = list(rows.groupby(list(KEY_COLUMNS), sort=True))
    shown = [
        f"{model}/{device}/tp{tp}/b{batch}/p{prompt} ("
        + ", ".join(f"set {name!r} row {row}" for name, row in zip(g["set_name"], g["set_row"], strict=True))
        + ")"
        for (model, device, tp, batch, prompt), g in groups[:limit]
    ]
    more = f"; and {len(groups) - limit} more points" if len(groups) > limit else ""
    return "; ".join(shown) + more


# --- latency at a prompt length: the one interpolator the solver and the simulator share -----------------

PROFILE_GROUP = ["model", "device", "tp", "batch"]


def latency_at_prompt(frame: pd.DataFrame, queries: pd.DataFrame) -> pd.DataFrame:
    """The six latency columns of every profiled (device, tp, batch) of each query's model, at its prompt.

    `queries` has `model` and `prompt_tokens` (and any columns to carry along, e.g. a class index). The
    result has one row per (query, device, tp, batch) profiled for the query's model, in query order then
    (device, tp, batch) order: the query's columns, device, tp, batch, the six `LATENCY_COLUMNS` and
    `in_range`.

    Each latency is linear in prompt_tokens between the two profiled rows that bracket the prompt (the
    nearest at or below it and the nearest at or above it; one row when the prompt is profiled), computed
    as np.interp does: `(hi - lo) / (p_hi - p_lo) * (prompt - p_lo) + lo`. Outside the profiled range every
    column is NaN (`in_range` False): never extrapolated.

    A percentile missing (NaN) at one prompt length: the value is NaN exactly where that prompt length is
    one of the two bracketing rows (a gap is never filled from farther rows), and unaffected elsewhere.
    Each percentile is interpolated on its own, so a missing p99 does not hide p50 and p90.
    """
    rows = frame.sort_values([*PROFILE_GROUP, "prompt_tokens"], kind="stable")
    group_of = rows.groupby(PROFILE_GROUP, sort=False).ngroup().to_numpy(np.int64)
    starts = np.flatnonzero(np.diff(group_of, prepend=-1) != 0)
    ends = np.append(starts[1:], len(rows)).astype(np.int64)
    groups = rows.iloc[starts][PROFILE_GROUP].reset_index(drop=True)
    queries = queries.reset_index(drop=True)
    query, group = _query_groups(groups["model"].to_numpy(), queries["model"].to_numpy())
    prompt = queries["prompt_tokens"].to_numpy(np.int64)[query]
    p_rows = rows["prompt_tokens"].to_numpy(np.int64)
    # rows sorted by (group, prompt): one searchsorted on group * scale + prompt brackets every prompt
    scale = p_rows.max(initial=0) + prompt.max(initial=0) + 2
    keys, target = group_of * scale + p_rows, group * scale + prompt
    above = np.searchsorted(keys, target, side="left")  # the nearest profiled prompt at or above
    below = np.searchsorted(keys, target, side="right") - 1  # the nearest at or below
    in_range = (above < ends[group]) & (below >= starts[group]) if len(rows) else np.zeros(len(group), bool)
    lo_i, hi_i = np.where(in_range, below, 0), np.where(in_range, above, 0)
    p = prompt.astype(float)[:, None]
    p_lo, p_hi = p_rows[lo_i].astype(float)[:, None], p_rows[hi_i].astype(float)[:, None]
    span = np.where(in_range[:, None], p_hi - p_lo, 0.0)
    values = rows[list(LATENCY_COLUMNS)].to_numpy(float)
    lo, hi = values[lo_i], values[hi_i]
    with np.errstate(invalid="ignore", divide="ignore"):
        between = (hi - lo) / np.where(span > 0, span, 1.0) * (p - p_lo) + lo
    latency = np.where(in_range[:, None], np.where(span > 0, between, lo), np.nan)
    out = queries.iloc[query].reset_index(drop=True)
    for column in ("device", "tp", "batch"):
        out[column] = groups[column].to_numpy()[group]
    for j, column in enumerate(LATENCY_COLUMNS):
        out[column] = latency[:, j]
    out["in_range"] = in_range
    return out


def _query_groups(group_models: np.ndarray, query_models: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query index, group index) of every profiled group of each query's model, query-major: the groups of
    one model are contiguous in `group_models` (sorted by model first)."""
    first = np.searchsorted(group_models, query_models, side="left")
    counts = np.searchsorted(group_models, query_models, side="right") - first
    query = np.repeat(np.arange(len(query_models)), counts)
    offset = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return query, (np.repeat(first, counts) + offset).astype(np.int64)
