"""ETS forecasts through statsforecast (the `forecast` extra) on synthetic series with known answers, and
`method: "ets"` without statsforecast: a 400 / exit 1 naming the extra, before any run is recorded."""

import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient
from store_helpers import QUICK_GATE, tiny_request

from fleetplan.api.app import create_app
from fleetplan.api.cli import main
from fleetplan.api.settings import Settings
from fleetplan.models.codec import encode, to_builtins
from fleetplan.models.errors import InputError
from fleetplan.models.store import ForecastSpec, ReplanRequest, TrafficSpec
from fleetplan.replan import replan
from fleetplan.replan.forecast import ets_available, forecast_classes, forecast_path
from fleetplan.replan.traffic import Rates
from fleetplan.store import open_repository

HOUR = 3600.0
needs_statsforecast = pytest.mark.skipif(
    not ets_available(),
    reason="statsforecast is not installed (pip install 'fleetplan[forecast]': statsforecast 2.0.1 with "
    "fugue 0.9.4; statsforecast >= 2.1 and fugue >= 0.9.5 require pandas < 3, 2.0.2-2.0.3 scipy < 1.16)",
)


def _ets(history, steps=24, interval_s=HOUR):
    return forecast_path(np.asarray(history, float), steps, ForecastSpec(method="ets"), interval_s)


@needs_statsforecast
def test_ets_on_a_constant_series_forecasts_the_constant():
    path, note = _ets(np.full(72, 4.0))
    np.testing.assert_allclose(path, 4.0, rtol=1e-6)
    assert note is None


@needs_statsforecast
def test_ets_on_a_trend_continues_the_line():
    """y_t = 3 + 0.5 t, three days hourly: an additive trend fits it exactly (unlike EWMA, which lags)."""
    t = np.arange(72, dtype=float)
    path, _ = _ets(3.0 + 0.5 * t)
    np.testing.assert_allclose(path, 3.0 + 0.5 * np.arange(72, 96), atol=1e-2)


@needs_statsforecast
def test_ets_on_a_daily_cycle_continues_the_cycle():
    """10 + 5 sin(2 pi t / 24) over four days of hourly bins: the next day is the same cycle; the planned
    rate at quantile 1 is the peak, 15."""
    t = np.arange(96 + 24, dtype=float)
    cycle = 10.0 + 5.0 * np.sin(2 * np.pi * t / 24.0)
    path, note = _ets(cycle[:96])
    assert note is None
    np.testing.assert_allclose(path, cycle[96:], atol=1e-2)
    assert path.max() == pytest.approx(15.0, abs=1e-2)
    # without its season (a day and a half: no two full days to fit one on) the cycle is lost
    plain, plain_note = _ets(cycle[:36])
    assert "fewer than two days observed" in plain_note
    assert np.abs(plain - cycle[36:60]).max() > 1.0


@needs_statsforecast
def test_ets_with_bins_too_short_for_its_season_says_so():
    """A day of 15-minute bins is 96 bins; statsforecast's ETS fits no season over 24 bins."""
    frame = pd.DataFrame({"chat": np.full(4 * 96, 2.0)})
    report = forecast_classes(tiny_request(), Rates(frame, 900.0, 100, 0), ForecastSpec(method="ets"))
    assert report.classes[0].planned_rps == pytest.approx(2.0, rel=1e-6)
    assert report.notes == [
        "ets: fitted without a daily season (a day of 900 s bins is 96 bins, not 2 to 24)"
    ]


@pytest.fixture
def without_statsforecast(monkeypatch):
    """statsforecast made unimportable (a None entry in sys.modules makes `import` raise ImportError)."""
    for name in [m for m in sys.modules if m == "statsforecast" or m.startswith("statsforecast.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "statsforecast", None)
    monkeypatch.setitem(sys.modules, "statsforecast.models", None)
    assert not ets_available()


def _rates_csv(path) -> str:
    hours = np.arange(48)
    pd.DataFrame({"time": hours * HOUR, "class": "chat", "rps": 20.0}).to_csv(path, index=False)
    return str(path)


def test_ets_without_statsforecast_is_refused_before_any_run(tmp_path, without_statsforecast):
    repo = open_repository(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    repo.put_fleet("tiny", tiny_request())
    traffic = TrafficSpec(source="rates_csv", path=_rates_csv(tmp_path / "rates.csv"))
    order = ReplanRequest(traffic=traffic, forecast=ForecastSpec(method="ets"))
    with pytest.raises(InputError, match=r"pip install 'fleetplan\[forecast\]'") as caught:
        replan(repo, "tiny", order)
    assert caught.value.field == "forecast.method"
    assert repo.list_runs("tiny") == []
    repo.engine.dispose()

    # the CLI: exit 1, the extra named on stderr
    request_file = tmp_path / "tiny.json"
    request_file.write_bytes(encode(tiny_request()))
    env = {"FLEETPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    runner = CliRunner()
    assert runner.invoke(main, ["fleet", "put", "tiny", str(request_file)], env=env).exit_code == 0
    argv = ["replan", "tiny", "--traffic", traffic.path, "--traffic-format", "rates_csv", "--forecast", "ets"]
    result = runner.invoke(main, argv, env=env)
    assert result.exit_code == 1
    assert "fleetplan[forecast]" in result.stderr

    # HTTP: 400 problem+json naming the field
    token = "t"
    app = create_app(database_url=f"sqlite:///{tmp_path / 'api.db'}", settings=Settings(api_token=token))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        assert client.put("/fleets/tiny", json=to_builtins(tiny_request())).status_code == 200
        body = {"traffic": to_builtins(traffic), "forecast": {"method": "ets"}}
        answer = client.post("/fleets/tiny/replan", json=body)
        assert answer.status_code == 400
        assert answer.headers["content-type"].startswith("application/problem+json")
        problem = answer.json()
        assert "fleetplan[forecast]" in problem["detail"]
        assert "forecast.method" in str(problem)
        assert client.get("/fleets/tiny/runs").json() == []


@needs_statsforecast
def test_a_replan_with_an_ets_forecast_plans_the_forecast_rate(tmp_path):
    """Two days of a daily cycle between 10 and 20 rps for the one class: ETS continues the cycle, and the
    rate planned (quantile 1) is its peak, 20 rps."""
    hours = np.arange(48)
    rps = 15.0 + 5.0 * np.sin(2 * np.pi * hours / 24.0)
    path = tmp_path / "rates.csv"
    pd.DataFrame({"time": hours * HOUR, "class": "chat", "rps": rps}).to_csv(path, index=False)
    repo = open_repository(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    repo.put_fleet("tiny", tiny_request(rate_rps=5.0))
    order = ReplanRequest(
        traffic=TrafficSpec(source="rates_csv", path=str(path)),
        forecast=ForecastSpec(method="ets", quantile=1.0),
        gate=QUICK_GATE,
    )
    run = replan(repo, "tiny", order)
    assert run.status == "promoted", run.reason
    (chat,) = run.forecast.classes
    assert chat.planned_rps == pytest.approx(20.0, abs=0.05)
    assert run.forecast.notes == []
    assert repo.current_plan("tiny").request.workloads[0].rate_rps == chat.planned_rps
    repo.engine.dispose()
