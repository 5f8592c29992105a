"""The store's HTTP routes: fleets, plans, runs and replan over a real SQLite file, problem+json errors,
write routes marked for the auth guard, and the schema documenting them."""

import logging

import pytest
from litestar.testing import TestClient
from store_helpers import tiny_request

from fleetplan.api.app import create_app
from fleetplan.api.settings import Settings
from fleetplan.models.codec import to_builtins

TOKEN = "fleet-writer-token"

QUICK = {"gate": {"seeds": 1, "duration_s": 20.0, "warmup_s": 5.0}}


@pytest.fixture
def client(tmp_path):
    app = create_app(database_url=f"sqlite:///{tmp_path / 'api.db'}", settings=Settings(api_token=TOKEN))
    with TestClient(app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def test_store_writes_need_the_token_and_reads_do_not(client):
    body = to_builtins(tiny_request())
    anonymous = client.put("/fleets/tiny", json=body, headers={"Authorization": ""})
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"].startswith("application/problem+json")
    wrong = client.put("/fleets/tiny", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert client.get("/fleets", headers={"Authorization": ""}).status_code == 200
    replan = client.post("/fleets/tiny/replan", json={}, headers={"Authorization": ""})
    assert replan.status_code == 401


def test_fleet_plan_and_run_routes(client):
    body = to_builtins(tiny_request())
    put = client.put("/fleets/tiny", json=body)
    assert put.status_code == 200
    assert put.json()["version"] == 1
    assert client.put("/fleets/tiny", json=body).json()["version"] == 1
    assert [f["name"] for f in client.get("/fleets").json()] == ["tiny"]
    assert client.get("/fleets/tiny").json()["request"] == put.json()["request"]

    missing = client.get("/fleets/tiny/plans/current")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")

    run = client.post("/fleets/tiny/replan", json=QUICK)
    assert run.status_code == 200
    assert run.json()["status"] == "promoted"
    current = client.get("/fleets/tiny/plans/current").json()
    assert current["id"] == run.json()["plan_id"]
    assert client.get(f"/plans/{current['id']}").json()["plan"] == current["plan"]
    assert [p["id"] for p in client.get("/fleets/tiny/plans").json()] == [current["id"]]
    runs = client.get("/fleets/tiny/runs?limit=1").json()
    assert [r["id"] for r in runs] == [run.json()["id"]]
    assert client.get(f"/runs/{run.json()['id']}").json()["diff"] == run.json()["diff"]
    # every REPLAN field is optional, so no body at all is the default re-plan (it was a 400, "body:
    # empty; send a PlanRequest as JSON")
    again = client.post("/fleets/tiny/replan", content=b"", headers={"content-type": "application/json"})
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "unchanged"


def test_store_errors_are_problems_naming_the_field(client):
    bad_name = client.put("/fleets/-bad", json=to_builtins(tiny_request()))
    assert bad_name.status_code == 400
    assert bad_name.json()["field"] == "name"
    client.put("/fleets/tiny", json=to_builtins(tiny_request()))
    bad_moves = client.post("/fleets/tiny/replan", json={"max_moves": -1})
    assert bad_moves.status_code == 400
    assert bad_moves.json()["field"] == "max_moves"
    # a REPLAN that no data can make right is refused before a run is recorded (it was a `failed` run)
    no_traffic = client.post("/fleets/tiny/replan", json={"forecast": {"method": "constant"}})
    assert no_traffic.status_code == 400
    assert no_traffic.json()["field"] == "forecast"
    assert client.get("/fleets/tiny/runs").json() == []
    unknown = client.post("/fleets/nope/replan", json={})
    assert unknown.status_code == 404
    assert "unknown fleet 'nope'" in unknown.json()["detail"]
    assert client.get("/runs/999").status_code == 404
    assert client.get("/fleets/tiny/plans?limit=0").status_code == 400


def test_write_routes_are_marked_and_documented(client):
    app = client.app
    marked = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            if any(p in route.path for p in ("/fleets", "/plans/", "/runs/")):
                marked[(route.path, *sorted(handler.http_methods))] = handler.opt.get("write", False)
    assert marked[("/fleets/{name:str}", "PUT")] is True
    assert marked[("/fleets/{name:str}/replan", "POST")] is True
    assert not any(v for k, v in marked.items() if "GET" in k)
    paths = client.get("/schema/openapi.json").json()["paths"]
    for path in ("/fleets", "/fleets/{name}", "/fleets/{name}/replan", "/runs/{run_id}", "/plans/{plan_id}"):
        assert path in paths


def test_a_replan_with_every_solve_slot_busy_answers_503_at_once(client):
    assert client.put("/fleets/tiny", json=to_builtins(tiny_request())).status_code == 200
    pool = client.app.state.solves  # the pool POST /plan and POST /whatif share
    pool.running, pool.queue = pool.slots, 0  # as if every slot solved and nothing may queue
    try:
        busy = client.post("/fleets/tiny/replan", json={})
    finally:
        pool.running = 0
    assert busy.status_code == 503
    assert busy.headers["content-type"].startswith("application/problem+json")
    assert int(busy.headers["Retry-After"]) >= 1
    assert client.get("/fleets/tiny/runs").json() == []  # refused before any run was recorded


def test_an_unreachable_database_at_start_up_leaves_the_planner_serving():
    """With FLEETPLAN_DATABASE_URL unreachable the server did not start at all (exit 3), /plan included."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("fleetplan.api").addHandler(handler)
    app = create_app(
        settings=Settings(allow_anonymous_writes=True),
        database_url="postgresql+psycopg://fleetplan:secret@127.0.0.1:1/none",  # nothing listens on port 1
    )
    with TestClient(app=app) as client:
        assert client.get("/health").status_code == 200
        planned = client.post("/plan", json=to_builtins(tiny_request()))
        assert planned.status_code == 200, planned.text
        fleets = client.get("/fleets")
        assert fleets.status_code == 503
        assert fleets.json()["type"].endswith("store-unavailable")
        assert "secret" not in fleets.text
    logging.getLogger("fleetplan.api").removeHandler(handler)
    logged = "\n".join(r.getMessage() for r in records)
    assert "store unavailable at start-up" in logged
    assert "fleetplan:***@127.0.0.1:1/none" in logged
    assert "secret" not in logged
    # each store request during the outage is one named WARNING line, not an ERROR with a traceback (four
    # requests logged about 600 lines, session 34's user test)
    outage = [r for r in records if "GET /fleets -> 503" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in outage] == [("WARNING", None)]
