"""Forecast each class's rate over the next horizon and the rate to plan for (docs/store.md, "Forecast").

A method turns a class's history (rate per bin, oldest first) into a path of point forecasts, one per bin
of the horizon; the planned rate is the `quantile` of that path (0.95 over a day of hourly bins: plan for
about the second-busiest hour; 1.0: for the peak).

- constant: every bin at the last bin's rate;
- ewma: every bin at the exponentially weighted level l_t = alpha y_t + (1 - alpha) l_{t-1}, l_0 = y_0;
- seasonal_naive: bin h at the rate one season earlier, y[n - m + (h mod m)], with m a week of bins when
  the history holds two weeks, else a day when it holds one (else: constant, noted);
- ets: statsforecast's AutoETS (the optional `forecast` extra) with a daily season when a day is at most
  24 bins (its ETS takes no longer season: a week of hourly bins would fit no season at all) and two days
  are observed, else without season (noted).
"""

import numpy as np

from fleetplan.models.base import RPS_LIMIT
from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest
from fleetplan.models.store import ClassForecast, ForecastReport, ForecastSpec
from fleetplan.replan.traffic import FIELD, Rates

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
# the longest season statsforecast's ETS fits (a longer one is silently dropped)
ETS_MAX_SEASON = 24


def season_steps(n_history: int, interval_s: float) -> int | None:
    """Bins per season: a week when two fit in the history, else a day when one does, else None."""
    for period in (WEEK_S, DAY_S):
        steps = period / interval_s
        if abs(steps - round(steps)) > 1e-9 or round(steps) < 2:
            continue
        needed = 2 * round(steps) if period == WEEK_S else round(steps)
        if n_history >= needed:
            return round(steps)
    return None


def constant(history: np.ndarray, steps: int) -> np.ndarray:
    return np.full(steps, float(history[-1]))


def ewma(history: np.ndarray, steps: int, alpha: float) -> np.ndarray:
    """The EWMA level after the last bin, held over the horizon (vectorized: weights (1-alpha)^age)."""
    n = len(history)
    age = np.arange(n - 1, -1, -1, dtype=float)
    weights = alpha * (1.0 - alpha) ** age
    weights[0] = (1.0 - alpha) ** (n - 1)  # l_0 = y_0 carries the rest of the weight
    return np.full(steps, float(weights @ history))


def seasonal_naive(history: np.ndarray, steps: int, season: int) -> np.ndarray:
    last_season = history[-season:]
    return last_season[np.arange(steps) % season].astype(float)


ETS_MISSING = "method 'ets' needs statsforecast, which is not installed: pip install 'fleetplan[forecast]'"


def ets_available() -> bool:
    """statsforecast is importable (the `forecast` extra)."""
    try:
        import statsforecast.models  # noqa: F401
    except ImportError:
        return False
    return True


def ets(history: np.ndarray, steps: int, season: int | None) -> np.ndarray:
    """AutoETS from statsforecast (optional dependency: pip install 'fleetplan[forecast]')."""
    try:
        from statsforecast.models import AutoETS
    except ImportError as error:
        raise InputError(ETS_MISSING, field="forecast.method") from error
    model = AutoETS(season_length=season or 1)
    fitted = model.fit(np.asarray(history, dtype=float))
    return np.asarray(fitted.predict(h=steps)["mean"], dtype=float)


def forecast_path(history: np.ndarray, steps: int, spec: ForecastSpec, interval_s: float) -> tuple:
    """(point forecasts for the next `steps` bins, a note when the method had to fall back)."""
    season = season_steps(len(history), interval_s)
    if spec.method == "constant":
        return constant(history, steps), None
    if spec.method == "ewma":
        return ewma(history, steps, spec.alpha), None
    if spec.method == "ets":
        return _ets_path(history, steps, interval_s)
    if season is None:
        note = f"seasonal_naive: {len(history)} bins of {interval_s:g} s hold no full day; used constant"
        return constant(history, steps), note
    return seasonal_naive(history, steps, season), None


def _ets_path(history: np.ndarray, steps: int, interval_s: float) -> tuple:
    day = DAY_S / interval_s
    daily = abs(day - round(day)) < 1e-9 and 2 <= round(day) <= ETS_MAX_SEASON
    if daily and len(history) >= 2 * round(day):
        return ets(history, steps, round(day)), None
    why = (
        "fewer than two days observed"
        if daily
        else f"a day of {interval_s:g} s bins is {day:g} bins, not 2 to {ETS_MAX_SEASON}"
    )
    return ets(history, steps, None), f"ets: fitted without a daily season ({why})"


def planned_rate(path: np.ndarray, quantile: float) -> float:
    return max(float(np.quantile(path, quantile)), 0.0)


def checked_rate(name: str, rate: float) -> float:
    """`rate` rounded to 1e-6 rps, or InputError when it is no rate a request may carry (NaN, infinite, or
    beyond the models' bound): what the file held, not the solver, is at fault."""
    if not np.isfinite(rate) or rate >= RPS_LIMIT:
        msg = f"class {name!r}: the traffic forecasts {rate:g} rps, not a rate a plan can be made for"
        raise InputError(msg, field=FIELD)
    return round(rate, 6)


def forecast_classes(request: PlanRequest, rates: Rates, spec: ForecastSpec) -> ForecastReport:
    """Per class: history, forecast path and planned rate; the report the RUN carries. A class the traffic
    has no observation of (`Rates.unobserved`) is planned at the fleet's own rate, with a note: a missing
    series is not a class without traffic. Raises InputError (naming `traffic.path`) for a planned rate
    that is not a finite number of requests/s."""
    steps = max(1, round(spec.horizon_h * 3600.0 / rates.interval_s))
    classes, notes = [], []
    for workload in request.workloads:
        if workload.name in rates.unobserved:
            notes.append(
                f"class {workload.name!r}: the traffic file has no observation of it; planned at the "
                f"fleet's rate, {workload.rate_rps:g} rps"
            )
            rate = workload.rate_rps
            classes.append(
                ClassForecast(
                    name=workload.name, history_rps=[], forecast_rps=[], planned_rps=rate, previous_rps=rate
                )
            )
            continue
        history = rates.frame[workload.name].to_numpy(float)
        path, note = forecast_path(history, steps, spec, rates.interval_s)
        if note and note not in notes:
            notes.append(note)
        classes.append(
            ClassForecast(
                name=workload.name,
                history_rps=[round(v, 6) for v in history.tolist()],
                forecast_rps=[round(v, 6) for v in np.maximum(path, 0.0).tolist()],
                planned_rps=checked_rate(workload.name, planned_rate(path, spec.quantile)),
                previous_rps=workload.rate_rps,
            )
        )
    return ForecastReport(
        method=spec.method,
        horizon_h=spec.horizon_h,
        quantile=spec.quantile,
        interval_s=rates.interval_s,
        rows=rates.rows,
        unmapped_rows=rates.unmapped,
        classes=classes,
        notes=notes,
    )


__all__ = [
    "ETS_MISSING",
    "checked_rate",
    "constant",
    "ets",
    "ets_available",
    "ewma",
    "forecast_classes",
    "forecast_path",
    "planned_rate",
    "seasonal_naive",
]
