"""Forecasts on synthetic series with known answers, and the three traffic readers on generated files."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from store_helpers import tiny_request

from fleetplan.models.codec import convert
from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest
from fleetplan.models.store import ForecastSpec, ReplanRequest, TrafficSpec
from fleetplan.replan.forecast import (
    ewma,
    forecast_classes,
    forecast_path,
    planned_rate,
    season_steps,
)
from fleetplan.replan.service import replan_request
from fleetplan.replan.traffic import Rates, read_rates

HOUR = 3600.0


def _path(history, method, steps=24, **spec):
    return forecast_path(np.asarray(history, float), steps, ForecastSpec(method=method, **spec), HOUR)[0]


@pytest.mark.parametrize("method", ["constant", "ewma", "seasonal_naive"])
def test_a_constant_series_forecasts_itself(method):
    history = np.full(72, 7.5)
    path = _path(history, method)
    np.testing.assert_allclose(path, 7.5)
    assert planned_rate(path, 0.95) == pytest.approx(7.5)


def test_a_trend_constant_takes_the_last_bin_and_ewma_lags_by_its_closed_form():
    """y_t = 3 + 0.5 t. The EWMA level of a line settles b (1 - alpha) / alpha below the line."""
    t = np.arange(200, dtype=float)
    history = 3.0 + 0.5 * t
    assert _path(history, "constant")[0] == pytest.approx(history[-1])
    alpha = 0.25
    lag = 0.5 * (1 - alpha) / alpha
    assert _path(history, "ewma", alpha=alpha)[0] == pytest.approx(history[-1] - lag, rel=1e-9)
    # and the vectorized level equals the recursion l_t = alpha y_t + (1 - alpha) l_{t-1}
    level = history[0]
    for y in history[1:]:
        level = alpha * y + (1 - alpha) * level
    assert ewma(history, 1, alpha)[0] == pytest.approx(level, rel=1e-12)
    # seasonal naive repeats the last day: its peak is the last bin, its trough the value a day before
    path = _path(history, "seasonal_naive")
    assert path.max() == pytest.approx(history[-1])
    assert path.min() == pytest.approx(history[-24])


def test_a_daily_cycle_seasonal_naive_continues_it_exactly():
    t = np.arange(24 * 3 + 24, dtype=float)
    cycle = 10.0 + 5.0 * np.sin(2 * np.pi * t / 24.0)
    history, future = cycle[:72], cycle[72:]
    assert season_steps(len(history), HOUR) == 24
    path = _path(history, "seasonal_naive")
    np.testing.assert_allclose(path, future, atol=1e-12)
    assert planned_rate(path, 1.0) == pytest.approx(15.0)
    assert planned_rate(path, 0.5) == pytest.approx(np.median(future))
    # the constant method cannot see the cycle: it plans the last hour's rate whatever the quantile
    assert planned_rate(_path(history, "constant"), 1.0) == pytest.approx(history[-1])


def test_seasonal_naive_without_a_full_day_falls_back_to_constant_and_says_so():
    path, note = forecast_path(np.array([1.0, 2.0, 4.0]), 5, ForecastSpec(method="seasonal_naive"), HOUR)
    np.testing.assert_allclose(path, 4.0)
    assert "no full day" in note


def test_weekly_season_when_two_weeks_are_observed():
    assert season_steps(24 * 13, HOUR) == 24
    assert season_steps(24 * 14, HOUR) == 24 * 7


def _two_class_request() -> PlanRequest:
    data = {
        "devices": [{"name": "a6000ada", "count": 1}],
        "workloads": [
            {"name": "short", "model": "llama-3.2-1b", "prompt_tokens": 128, "output_tokens": 64,
             "rate_rps": 1.0, "slo": {"ttft_ms": 500, "tbt_ms": 50}},
            {"name": "long", "model": "llama-3.2-1b", "prompt_tokens": 2048, "output_tokens": 512,
             "rate_rps": 1.0, "slo": {"ttft_ms": 500, "tbt_ms": 50}},
        ],
    }  # fmt: skip
    return convert(data, PlanRequest)


def _rows(per_bin: list[tuple[int, int]], interval_s: float) -> pd.DataFrame:
    """Evenly spaced requests: in bin b, per_bin[b] = (short, long) requests."""
    rows = []
    for b, (short, long) in enumerate(per_bin):
        for count, prompt, output in ((short, 130, 60), (long, 2000, 500)):
            for i in range(count):
                rows.append((b * interval_s + (i + 0.5) * interval_s / count, prompt, output))
    return pd.DataFrame(rows, columns=["t", "prompt", "output"]).sort_values("t")


@pytest.mark.parametrize("source", ["azure_csv", "mooncake_jsonl"])
def test_request_traces_count_rates_per_class_and_bin(tmp_path, source):
    interval = 60.0
    per_bin = [(30, 6), (60, 12), (90, 0)]
    rows = _rows(per_bin, interval)
    path = tmp_path / "trace"
    if source == "azure_csv":
        stamps = pd.Timestamp("2026-11-20T00:00:00") + pd.to_timedelta(rows["t"], unit="s")
        pd.DataFrame(
            {
                "TIMESTAMP": stamps.astype(str),
                "ContextTokens": rows["prompt"],
                "GeneratedTokens": rows["output"],
            }
        ).to_csv(path, index=False)
    else:
        with path.open("w") as out:
            for t, prompt, output in rows.itertuples(index=False):
                out.write(
                    json.dumps({"timestamp": int(t * 1000), "input_length": prompt, "output_length": output})
                )
                out.write("\n")
    rates = read_rates(_two_class_request(), TrafficSpec(source=source, path=str(path), interval_s=interval))
    # bins are counted back from the newest request, so the first (partial) one is dropped
    assert rates.frame["short"].tolist() == pytest.approx([60 / interval, 90 / interval])
    assert rates.frame["long"].tolist() == pytest.approx([12 / interval, 0.0])
    assert rates.unmapped == 0


def test_rates_csv_resamples_and_refuses_nothing_silently(tmp_path):
    path = tmp_path / "rates.csv"
    times = pd.date_range("2026-11-20", periods=4, freq="30min").astype(str)
    pd.DataFrame(
        {
            "time": [*times, *times, times[0]],
            "class": ["short"] * 4 + ["long"] * 4 + ["other"],
            "rps": [1.0, 3.0, 5.0, 7.0, 2.0, 2.0, 4.0, 4.0, 99.0],
        }
    ).to_csv(path, index=False)
    rates = read_rates(_two_class_request(), TrafficSpec(source="rates_csv", path=str(path), interval_s=HOUR))
    # samples at 0, 30, 60, 90 min; hourly bins counted back from the last: (0, 30] min and (60, 90] min,
    # each the mean of its samples
    assert rates.frame["short"].tolist() == pytest.approx([(1.0 + 3.0) / 2, (5.0 + 7.0) / 2])
    assert rates.frame["long"].tolist() == pytest.approx([2.0, 4.0])
    assert rates.unmapped == 1


def test_forecast_report_plans_each_class_and_keeps_the_history():
    frame = pd.DataFrame({"chat": np.r_[np.full(24, 2.0), np.full(24, 3.0)]})
    report = forecast_classes(
        tiny_request(rate_rps=20.0), Rates(frame, HOUR, 100, 4), ForecastSpec(method="constant")
    )
    (chat,) = report.classes
    assert chat.planned_rps == pytest.approx(3.0)
    assert chat.previous_rps == 20.0
    assert len(chat.history_rps) == 48
    assert len(chat.forecast_rps) == 24
    assert report.unmapped_rows == 4


def test_a_missing_or_malformed_traffic_file_is_named(tmp_path):
    spec = TrafficSpec(source="azure_csv", path=str(tmp_path / "absent.csv"))
    with pytest.raises(InputError, match="no such traffic file") as caught:
        read_rates(_two_class_request(), spec)
    assert caught.value.field == "traffic.path"
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="TIMESTAMP"):
        read_rates(_two_class_request(), TrafficSpec(source="azure_csv", path=str(bad)))


def _rates_csv(path, rows: list[tuple]) -> TrafficSpec:
    pd.DataFrame(rows, columns=["time", "class", "rps"]).to_csv(path, index=False)
    return TrafficSpec(source="rates_csv", path=str(path), interval_s=HOUR)


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([(0, "short", 1.0), (60, "short", -5.0)], "line 3: rps '-5.0' is not a finite number >= 0"),
        ([(0, "short", float("inf"))], "line 2: rps 'inf'"),
        ([(0, "short", "abc")], "line 2: rps 'abc'"),
        ([("2026-11-20T00:00", "short", 1.0), ("yesterday", "short", 1.0)], "line 3: time 'yesterday'"),
    ],
)
def test_a_rates_csv_value_that_is_no_rate_is_refused_by_its_line(tmp_path, rows, says):
    """Read as 0 before: a negative or NaN rate became a class without traffic, and the re-plan promoted
    an empty plan; inf reached the solver; a string raised a TypeError (HTTP 500)."""
    with pytest.raises(InputError, match=re.escape(says)) as caught:
        read_rates(_two_class_request(), _rates_csv(tmp_path / "rates.csv", rows))
    assert caught.value.field == "traffic.path"


def test_traffic_that_maps_to_no_class_is_refused_not_planned_as_zero(tmp_path):
    spec = _rates_csv(tmp_path / "rates.csv", [(0, "Short", 5.0), (3600, "Short", 5.0)])
    with pytest.raises(InputError, match=r"none of its 2 row\(s\) maps to a class .*\['short', 'long'\]"):
        read_rates(_two_class_request(), spec)
    rows = _rows([(3, 1), (3, 1)], 60.0)
    path = tmp_path / "azure.csv"
    pd.DataFrame(
        {
            "TIMESTAMP": rows["t"],
            "ContextTokens": rows["prompt"],
            "GeneratedTokens": rows["output"],
            "model": "Llama-3.2-1B",
        }
    ).to_csv(path, index=False)
    spec = TrafficSpec(source="azure_csv", path=str(path), interval_s=60.0)
    with pytest.raises(InputError, match=r"maps to a class of the fleet \(its models: \['llama-3.2-1b'\]\)"):
        read_rates(_two_class_request(), spec)


def test_a_class_the_traffic_says_nothing_about_keeps_the_fleets_rate(tmp_path):
    spec = _rates_csv(tmp_path / "rates.csv", [(0, "short", 4.0), (1800, "short", 6.0)])
    rates = read_rates(_two_class_request(), spec)
    assert rates.unobserved == ["long"]
    request, report = replan_request(
        _two_class_request(), ReplanRequest(traffic=spec, forecast=ForecastSpec(method="constant"))
    )
    assert [w.rate_rps for w in request.workloads] == pytest.approx([5.0, 1.0])  # long: the fleet's 1.0
    assert report.classes[1].history_rps == []
    assert any("'long': the traffic file has no observation of it" in note for note in report.notes)


def test_a_trace_shorter_than_one_bin_is_its_rate_over_its_own_span(tmp_path):
    """One partial bin counted 10 minutes of requests as an hour's: a sixth of the rate. A trace shorter
    than a bin is one bin at (n - 1) / span; one instant has no rate."""
    rows = _rows([(30, 6)], 60.0)  # 36 requests, evenly spaced over one minute
    path = tmp_path / "azure.csv"
    frame = {"TIMESTAMP": rows["t"], "ContextTokens": rows["prompt"], "GeneratedTokens": rows["output"]}
    pd.DataFrame(frame).to_csv(path, index=False)
    rates = read_rates(_two_class_request(), TrafficSpec(source="azure_csv", path=str(path), interval_s=HOUR))
    span = rows["t"].max() - rows["t"].min()
    scale = 35 / (36 * span)
    assert rates.frame["short"].tolist() == pytest.approx([30 * scale])
    assert rates.frame["long"].tolist() == pytest.approx([6 * scale])
    assert sum(rates.frame.iloc[0]) == pytest.approx(36 / 60, rel=0.05)  # the minute's own rate
    instant = tmp_path / "instant.csv"
    instant.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n5,130,60\n5,130,60\n")
    with pytest.raises(InputError, match="spans 0 s: one instant has no rate"):
        read_rates(_two_class_request(), TrafficSpec(source="azure_csv", path=str(instant)))


def test_a_blank_or_nan_rate_is_no_sample(tmp_path):
    """Prometheus writes NaN for 0/0 and long exports leave cells empty: such a row is no sample (a NaN
    refused the whole file for a moment in session 25); a class with only such rows keeps its fleet rate."""
    spec = _rates_csv(
        tmp_path / "rates.csv",
        [(0, "short", 4.0), (1800, "short", float("nan")), (0, "long", float("nan")), (0, "other", "x")],
    )
    rates = read_rates(_two_class_request(), spec)
    assert rates.frame["short"].tolist() == pytest.approx([4.0])
    assert rates.unobserved == ["long"]
    assert rates.unmapped == 1


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (
            ['{"timestamp": 0, "input_length": 100, "output_length": 10}', "7"],
            "line 2: expected a JSON object",
        ),
        (["{timestamp: 0}"], "line 1: Expecting property name"),
        (
            ["", '{"timestamp": 0, "input_length": 1e300, "output_length": 10}'],
            "line 2: input_length '1e+300'",
        ),
        (['{"timestamp": "x", "input_length": 1, "output_length": 10}'], "line 1: timestamp 'x'"),
    ],
)
def test_a_malformed_mooncake_line_is_named(tmp_path, lines, says):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=re.escape(says)):
        read_rates(_two_class_request(), TrafficSpec(source="mooncake_jsonl", path=str(path)))


def test_a_forecast_beyond_any_rate_is_refused_before_the_solver():
    """1e300 rps planned reached HiGHS (inf: a segmentation fault) through structs.replace."""
    frame = pd.DataFrame({"chat": [2.0, 1e300]})
    with pytest.raises(InputError, match="'chat': the traffic forecasts 1e\\+300 rps") as caught:
        forecast_classes(tiny_request(), Rates(frame, HOUR, 2, 0), ForecastSpec(method="constant"))
    assert caught.value.field == "traffic.path"
