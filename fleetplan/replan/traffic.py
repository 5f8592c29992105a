"""Observed traffic -> the rate of each of a fleet's classes per time bin (docs/store.md, "Traffic").

Three formats:
- `azure_csv`: the Azure LLM inference traces, one request per row: TIMESTAMP, ContextTokens,
  GeneratedTokens (an optional `model` column restricts a row to that model's classes);
- `mooncake_jsonl`: one JSON object per line: timestamp (milliseconds, as in the Mooncake traces),
  input_length, output_length (optional `model`);
- `rates_csv`: per-class rate series, e.g. exported from Prometheus: time (ISO 8601 or seconds), class,
  rps.

Request rows go to the nearest class of their model (simulator.arrivals.map_trace_to_classes, the one
class mapping: log prompt and output lengths). Bins are counted back from the newest row, so every bin is
complete but possibly the oldest, which is dropped when there are others.

What a file cannot say is refused or named, never read as "no traffic" (docs/store.md, "Traffic"): a
value that is not a finite number (a rate below 0, a time that does not parse), a file none of whose rows
maps to a class, and a request trace shorter than one bin are InputErrors; a class the file has no
observation of (no row of its name in a rates CSV, no row of its model in a trace with a `model` column)
is listed in `Rates.unobserved`, and the forecast plans it at the fleet's own rate.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest
from fleetplan.models.store import TrafficSpec
from fleetplan.simulator.arrivals import (
    CONTENT_ERRORS,
    finite_column,
    load_trace,
    map_trace_to_classes,
    model_column,
    tokens,
)

FIELD = "traffic.path"


class Rates:
    """Per-class rates (requests/s) per bin, oldest bin first: `frame` has one column per class, in the
    request's order; `rows` counted and `unmapped` rows no class could take; `unobserved`: the classes the
    file says nothing about (their column is 0, which is not an observation)."""

    def __init__(
        self,
        frame: pd.DataFrame,
        interval_s: float,
        rows: int,
        unmapped: int,
        unobserved: list[str] | None = None,
    ) -> None:
        self.frame = frame
        self.interval_s = interval_s
        self.rows = rows
        self.unmapped = unmapped
        self.unobserved = unobserved or []


def read_rates(request: PlanRequest, spec: TrafficSpec) -> Rates:
    """The observed rate of each class of `request` per `spec.interval_s` bin."""
    path = Path(spec.path)
    if not path.is_file():
        raise InputError(f"no such traffic file {spec.path!r}", field=FIELD)
    try:
        if spec.source == "rates_csv":
            rates = _rates_from_series(request, pd.read_csv(path), spec.interval_s)
        else:
            rows = load_trace(path) if spec.source == "azure_csv" else read_mooncake(path)
            rates = _rates_from_requests(request, rows, spec.interval_s)
    except InputError:
        raise
    except (*CONTENT_ERRORS, OSError) as error:  # the file's error, named as such (never a 500)
        raise InputError(f"{spec.source} file {spec.path!r}: {error}", field=FIELD) from error
    if rates.rows == rates.unmapped or len(rates.unobserved) == len(request.workloads):
        raise InputError(_nothing_maps(request, spec, rates), field=FIELD)
    return rates


def _nothing_maps(request: PlanRequest, spec: TrafficSpec, rates: Rates) -> str:
    what = "class names" if spec.source == "rates_csv" else "models"
    mine = [w.name for w in request.workloads] if spec.source == "rates_csv" else _models(request)
    return (
        f"{spec.source} file {spec.path!r}: none of its {rates.rows} row(s) maps to a class of the fleet "
        f"(its {what}: {mine}); refusing to plan the fleet as if it had no traffic"
    )


def _models(request: PlanRequest) -> list[str]:
    return sorted({w.model for w in request.workloads})


def read_mooncake(path: Path) -> pd.DataFrame:
    """A Mooncake-style JSONL trace as the columns load_trace gives: t_s, prompt_tokens, output_tokens."""
    records, lines = [], []  # lines: each record's line in the file, for the errors
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            msg = f"line {number}: {error.msg} (column {error.colno})"
            raise ValueError(msg) from error
        if not isinstance(record, dict):
            msg = f"line {number}: expected a JSON object, got {type(record).__name__}"
            raise ValueError(msg)
        records.append(record)
        lines.append(number)
    frame = pd.DataFrame.from_records(records)
    missing = [c for c in ("timestamp", "input_length", "output_length") if c not in frame.columns]
    if missing:
        msg = f"missing key(s) {missing}; expected timestamp, input_length, output_length"
        raise ValueError(msg)
    seconds = finite_column(frame["timestamp"], "timestamp", lines=lines) / 1000.0
    out = pd.DataFrame(
        {
            "t_s": seconds - seconds.min(),
            "prompt_tokens": tokens(frame["input_length"], "input_length", lines),
            "output_tokens": tokens(frame["output_length"], "output_length", lines),
        }
    )
    if "model" in frame.columns:
        out["model"] = model_column(frame["model"])
    return out.sort_values("t_s", kind="stable").reset_index(drop=True)


def _bins_from_end(
    seconds: np.ndarray, interval_s: float, drop_partial: bool = True
) -> tuple[np.ndarray, int]:
    """Bin index of each time, oldest 0, counted back from the newest time (that bin ends just after it);
    and the number of bins kept (with `drop_partial`, the oldest is dropped when partial and not alone:
    request counts in it would understate the rate; rate samples are not counts and keep it)."""
    end = float(seconds.max()) + 1e-9
    back = np.floor((end - seconds) / interval_s).astype(np.int64)
    n_bins = int(back.max()) + 1
    span = end - float(seconds.min())
    partial = drop_partial and n_bins > 1 and span < n_bins * interval_s - 1e-9
    complete = n_bins - 1 if partial else n_bins
    return n_bins - 1 - back - (n_bins - complete), complete


def _rates_from_requests(request: PlanRequest, rows: pd.DataFrame, interval_s: float) -> Rates:
    if rows.empty:
        raise InputError("the traffic file has no rows", field=FIELD)
    seconds = rows["t_s"].to_numpy(float)
    span = float(seconds.max() - seconds.min())
    if span <= 0:
        raise InputError("the trace spans 0 s: one instant has no rate", field=FIELD)
    classes = map_trace_to_classes(request, rows)
    bins, n_bins = _bins_from_end(seconds, interval_s)
    counted = (bins >= 0) & (classes >= 0)
    n_classes = len(request.workloads)
    counts = np.zeros((n_bins, n_classes))
    np.add.at(counts, (bins[counted], classes[counted]), 1.0)
    names = [w.name for w in request.workloads]
    # a trace shorter than one bin is one bin at its rate over the span its rows cover ((n - 1) / span for
    # n requests, which Poisson arrivals make unbiased), not its count over the whole bin: ten minutes of
    # traffic read as a sixth of its rate before session 25
    frame = pd.DataFrame(counts * _lone_bin_scale(len(seconds), span, interval_s), columns=names)
    unobserved = []
    seen = set(rows["model"]) if "model" in rows.columns else {""}
    if "" not in seen:  # a row that names no model may go to every class: then each class is observed
        unobserved = [w.name for w in request.workloads if w.model not in seen]
    counted_rows = int((bins >= 0).sum())
    return Rates(frame, interval_s, counted_rows, int(((bins >= 0) & (classes < 0)).sum()), unobserved)


def _lone_bin_scale(rows: int, span: float, interval_s: float) -> float:
    """What a bin's count is multiplied by to be a rate: 1 / interval_s, or for a trace shorter than one
    bin (n rows over `span` s) (n - 1) / (n span)."""
    return 1.0 / interval_s if span >= interval_s else (rows - 1) / (rows * span)


def _rates_from_series(request: PlanRequest, series: pd.DataFrame, interval_s: float) -> Rates:
    missing = [c for c in ("time", "class", "rps") if c not in series.columns]
    if missing:
        msg = f"missing column(s) {missing}; expected time,class,rps"
        raise ValueError(msg)
    if series.empty:
        raise InputError("the traffic file has no rows", field=FIELD)
    names = [w.name for w in request.workloads]
    classes = series["class"].astype(str)
    unknown = sorted(set(classes) - set(names))
    seconds = _seconds(series["time"])
    bins, n_bins = _bins_from_end(seconds, interval_s, drop_partial=False)
    # a blank or NaN rate is no sample (Prometheus writes NaN for 0/0; long exports leave cells empty), and
    # only the fleet's classes are read: any other value that is no rate is refused by its line
    raw = series["rps"]
    blank = raw.isna().to_numpy() | raw.astype(str).str.strip().str.lower().isin(["", "nan"]).to_numpy()
    keep = classes.isin(names).to_numpy() & ~blank
    kept = series[keep]
    rps = finite_column(kept["rps"], "rps", nonnegative=True, lines=(kept.index + 2).tolist())
    frame = pd.DataFrame({"bin": bins[keep], "class": classes[keep].to_numpy(), "rps": rps})
    frame = frame[frame["bin"] >= 0]
    # a bin's rate is the mean of the samples in it; a class with no sample in a bin had no traffic
    table = frame.pivot_table(index="bin", columns="class", values="rps", aggfunc="mean")
    table = table.reindex(index=range(n_bins), columns=names).fillna(0.0)
    unmapped = int(classes.isin(unknown).sum())
    unobserved = [name for name in names if name not in set(frame["class"])]
    return Rates(table.reset_index(drop=True), interval_s, len(series), unmapped, unobserved)


def _seconds(stamps: pd.Series) -> np.ndarray:
    """A rates CSV's `time` column in seconds: numbers as they are, else ISO 8601 times from the first."""
    if pd.api.types.is_numeric_dtype(stamps):
        return finite_column(stamps, "time")
    parsed = pd.to_datetime(stamps, format="mixed", utc=True, errors="coerce")
    if parsed.isna().any():
        row = int(np.argmax(parsed.isna().to_numpy()))
        msg = f"line {row + 2}: time {stamps.iloc[row]!r} is neither seconds nor an ISO 8601 time"
        raise ValueError(msg)
    return (parsed - parsed.min()).dt.total_seconds().to_numpy(float)


__all__ = ["Rates", "read_mooncake", "read_rates"]
