"""Who arrives when (docs/simulation.md, "Arrivals" and "Routing"): Poisson streams at the planned rates or
the rows of an Azure-format trace, then one route per request drawn from the plan's flows."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fleetplan.models.base import TOKEN_LIMIT
from fleetplan.models.plan import PlanRequest


@dataclass(frozen=True)
class Arrivals:
    """Requests in arrival order: time (s), class index, output tokens; and for a trace, the measured-window
    rows no served class could take (`unrouted`) and per class its rows in the window, served or not."""

    source: str  # "poisson" or "trace"
    times: np.ndarray
    classes: np.ndarray
    outputs: np.ndarray
    unrouted: int = 0
    demand_rows: np.ndarray | None = None


LOADED = ("t_s", "prompt_tokens", "output_tokens")  # load_trace's columns
# what pandas and numpy raise on a file's content before it is known to be numbers: the file's error
CONTENT_ERRORS = (ValueError, KeyError, TypeError, IndexError, OverflowError)


def finite_column(
    values: pd.Series,
    name: str,
    *,
    nonnegative: bool = False,
    at_most: float = np.inf,
    lines: list[int] | None = None,
) -> np.ndarray:
    """`values` as floats, or a ValueError naming the first row that is not a finite number (or is
    negative, with `nonnegative`; or is above `at_most`) by its line in the file: `lines[row]`, else the
    row of a CSV under its header (row + 2)."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(float)
    bad = ~np.isfinite(numbers) | ((numbers < 0) if nonnegative else False) | (numbers > at_most)
    if bad.any():
        row = int(np.argmax(bad))
        kind = "a finite number >= 0" if nonnegative else "a finite number"
        kind += f" at most {at_most:.12g}" if np.isfinite(at_most) else ""
        line = lines[row] if lines is not None else row + 2
        msg = f"line {line}: {name} {str(values.iloc[row])!r} is not {kind}"
        raise ValueError(msg)
    return numbers


def tokens(values: pd.Series, name: str, lines: list[int] | None = None) -> np.ndarray:
    """A token-count column as integers of at least 1 (a 0 is taken as 1), or a ValueError naming the
    first row that is no number from 0 to the models' token limit."""
    counts = finite_column(values, name, nonnegative=True, at_most=TOKEN_LIMIT, lines=lines)
    return np.maximum(counts, 1.0).astype(np.int64)


def load_trace(source) -> pd.DataFrame:
    """An Azure LLM inference trace (CSV with TIMESTAMP, ContextTokens, GeneratedTokens) as columns
    t_s (seconds from the first row), prompt_tokens, output_tokens, sorted by time. `source` is a path or
    a DataFrame. TIMESTAMP may be a datetime string (the public traces) or a number of seconds. An optional
    `model` column (the model each request names) is kept as `model`."""
    if isinstance(source, pd.DataFrame) and set(LOADED) <= set(source.columns):
        return source  # loaded already (the CLI reads --trace first to name what is wrong with it)
    frame = source if isinstance(source, pd.DataFrame) else pd.read_csv(Path(source))
    missing = [c for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if c not in frame.columns]
    if missing:
        msg = f"trace: missing column(s) {missing}; expected TIMESTAMP,ContextTokens,GeneratedTokens"
        raise ValueError(msg)
    if frame.empty:
        raise ValueError("trace: no rows")
    stamps = frame["TIMESTAMP"]
    if pd.api.types.is_numeric_dtype(stamps):
        seconds = finite_column(stamps, "TIMESTAMP")
    else:
        parsed = pd.to_datetime(stamps, format="mixed")
        seconds = (parsed - parsed.min()).dt.total_seconds().to_numpy(float)
    if not np.isfinite(seconds).all():  # a date that did not parse (NaT); numbers were checked above
        row = int(np.argmax(~np.isfinite(seconds)))
        msg = f"line {row + 2}: TIMESTAMP {str(stamps.iloc[row])!r} is neither a time nor a finite number"
        raise ValueError(msg)
    seconds = seconds - seconds.min()
    out = pd.DataFrame(
        {
            "t_s": seconds,
            "prompt_tokens": tokens(frame["ContextTokens"], "ContextTokens"),
            "output_tokens": tokens(frame["GeneratedTokens"], "GeneratedTokens"),
        }
    )
    if "model" in frame.columns:
        out["model"] = model_column(frame["model"])
    return out.sort_values("t_s", kind="stable").reset_index(drop=True)


def model_column(values: pd.Series) -> np.ndarray:
    """A trace's `model` column as names without surrounding blanks; a row that names none is ""."""
    return values.fillna("").astype(str).str.strip().to_numpy(dtype=object)


def map_trace_to_classes(request: PlanRequest, trace: pd.DataFrame) -> np.ndarray:
    """Index of the nearest workload class per trace row: smallest squared distance in
    (log prompt_tokens, log output_tokens), so 2x too long counts the same at any scale; ties to the first
    class listed. When the trace has a `model` column a row may only go to a class of its model (a row that
    names no model, "", goes to the nearest class of any); a row whose model no class has gets -1."""
    lp = np.log(np.array([w.prompt_tokens for w in request.workloads], float))
    lo = np.log(np.array([w.output_tokens for w in request.workloads], float))
    tp = np.log(trace["prompt_tokens"].to_numpy(float))[:, None]
    to = np.log(trace["output_tokens"].to_numpy(float))[:, None]
    distance = (tp - lp) ** 2 + (to - lo) ** 2
    if "model" not in trace.columns:
        return np.argmin(distance, axis=1)
    models = np.array([w.model for w in request.workloads], dtype=object)
    named = trace["model"].to_numpy(dtype=object)[:, None]
    allowed = (named == models[None, :]) | (named == "")
    nearest = np.argmin(np.where(allowed, distance, np.inf), axis=1)
    return np.where(allowed.any(axis=1), nearest, -1)


def poisson_arrivals(
    request: PlanRequest, served: np.ndarray, rate_scale: float, t_stop: float, rng: np.random.Generator
) -> Arrivals:
    """Class w arrives as a Poisson stream at served(w) x rate_scale on [0, t_stop): the plan's admitted
    rate, unserved demand being rejected upfront."""
    times, classes = [], []
    for c in range(len(request.workloads)):
        lam = served[c] * rate_scale
        if lam <= 0:
            continue
        count = int(rng.poisson(lam * t_stop))
        times.append(np.sort(rng.uniform(0.0, t_stop, count)))
        classes.append(np.full(count, c, np.int64))
    t_all = np.concatenate(times) if times else np.zeros(0)
    c_all = np.concatenate(classes) if classes else np.zeros(0, np.int64)
    order = np.argsort(t_all, kind="stable")
    t_all, c_all = t_all[order], c_all[order]
    o_all = np.array([w.output_tokens for w in request.workloads], np.int64)[c_all]
    return Arrivals("poisson", t_all, c_all, o_all)


def trace_arrivals(
    request: PlanRequest,
    trace,
    served: np.ndarray,
    rate_scale: float,
    t_stop: float,
    window: tuple[float, float],
) -> Arrivals:
    """The trace's rows before t_stop, times divided by rate_scale, each to its nearest class; rows with no
    class (their model has none) or whose class the plan does not serve are dropped (counted in `unrouted`
    when inside the measured window)."""
    frame = load_trace(trace)
    t_all = frame["t_s"].to_numpy(float) / rate_scale
    c_all = map_trace_to_classes(request, frame)
    o_all = frame["output_tokens"].to_numpy(np.int64)
    keep = t_all < t_stop
    routed = (c_all >= 0) & (served[np.maximum(c_all, 0)] > 0)
    in_window = keep & (t_all >= window[0]) & (t_all < window[1])
    unrouted = int((in_window & ~routed).sum())
    demand_rows = np.bincount(c_all[in_window & (c_all >= 0)], minlength=len(request.workloads))
    keep &= routed
    return Arrivals("trace", t_all[keep], c_all[keep], o_all[keep], unrouted, demand_rows)


def draw_routes(classes: np.ndarray, route_cum: list[list[float]], rng: np.random.Generator) -> np.ndarray:
    """Per request, the index of its route: inverse CDF of one uniform draw over its class's cumulative
    route shares (Poisson splitting reproduces the plan's flows)."""
    u_route = rng.random(len(classes))
    routes = np.zeros(len(classes), np.int64)
    for c, cum in enumerate(route_cum):
        mask = classes == c
        if mask.any() and cum:
            routes[mask] = np.minimum(np.searchsorted(cum, u_route[mask], side="right"), len(cum) - 1)
    return routes
