"""The production service's guards: settings, bearer auth on writes, caps (413/422), the bounded solve pool
(503 + Retry-After, killed children), metrics and request ids.

Nothing here solves a real plan except one tiny inline request; hangs are simulated by replacing
workers.plan_in_child in children forked from the test process.
"""

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from litestar.testing import TestClient
from test_api import ROWS, assert_problem, inline_request, post

import fleetplan.api.fleets
import fleetplan.api.whatif
import fleetplan.api.workers
from fleetplan.api.app import create_app
from fleetplan.api.auth import check_token
from fleetplan.api.settings import Settings, SettingsError, load_settings
from fleetplan.api.workers import SolvePool, cli_context
from fleetplan.models.codec import decode, decode_request
from fleetplan.models.errors import DeadlineExceeded, Forbidden, ServerBusy, Unauthorized
from fleetplan.models.whatif import WhatIfRequest
from fleetplan.profiler.store import ProfileStore, bundled_root

TOKEN = "s3cret-token"


def upload_body(name: str = "mine") -> dict[str, Any]:
    return {"name": name, "description": "test", "rows": ROWS}


# --- settings ------------------------------------------------------------------------------------------


def test_settings_defaults_are_the_safe_ones() -> None:
    s = load_settings(environ={})
    assert s.host == "127.0.0.1"
    assert s.api_token is None
    assert not s.allow_anonymous_writes
    assert not s.writes_open
    assert s.max_concurrent_solves == (os.cpu_count() or 1)


def test_settings_precedence_file_then_env_then_overrides(tmp_path: Path) -> None:
    file = tmp_path / "fleetplan.toml"
    file.write_text('port = 9000\nmax_workloads = 10\nlog_format = "json"\n')
    env = {
        "FLEETPLAN_PORT": "9100",
        "FLEETPLAN_ALLOW_ANONYMOUS_WRITES": "1",
        "FLEETPLAN_SETTINGS_FILE": str(file),
    }
    s = load_settings(environ=env, port=None, host="0.0.0.0")
    assert (s.port, s.max_workloads, s.log_format, s.host) == (9100, 10, "json", "0.0.0.0")
    assert s.allow_anonymous_writes is True
    assert load_settings(environ=env, port=9200).port == 9200


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FLEETPLAN_PORT": "eighty"}, "port (FLEETPLAN_PORT)"),
        ({"FLEETPLAN_MAX_WORKLOADS": "0"}, "max_workloads (FLEETPLAN_MAX_WORKLOADS)"),
        ({"FLEETPLAN_LOG_FORMAT": "xml"}, "log_format (FLEETPLAN_LOG_FORMAT)"),
    ],
)
def test_a_bad_setting_names_itself(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError, match=f"^{says.replace('(', '[(]').replace(')', '[)]')}"):
        load_settings(environ=env)


def test_a_bad_setting_names_the_file_it_came_from_and_limits_that_refuse_every_plan(tmp_path: Path) -> None:
    """Session 34's operator test: a bad value from the TOML file named the environment variable, and
    min_time_limit_s above max_time_limit_s started a server that refused every plan."""
    file = tmp_path / "s.toml"
    file.write_text("max_queued_solves = -3\n")
    with pytest.raises(
        SettingsError, match=rf"^max_queued_solves \(settings file {file}\): Expected `int` >= 0"
    ):
        load_settings(environ={}, file=file)
    with pytest.raises(SettingsError, match=r"^max_queued_solves \(command line\)"):
        load_settings(environ={}, max_queued_solves=-1)
    file.write_text("min_time_limit_s = 100\nmax_time_limit_s = 60\n")
    with pytest.raises(SettingsError, match="is above max_time_limit_s .* no time limit would be accepted"):
        load_settings(environ={}, file=file)
    with pytest.raises(SettingsError, match=r"min_time_limit_s \(FLEETPLAN_MIN_TIME_LIMIT_S\) = 90"):
        load_settings(environ={"FLEETPLAN_MIN_TIME_LIMIT_S": "90"})  # above the default 60 s cap
    assert load_settings(environ={"FLEETPLAN_MIN_TIME_LIMIT_S": "60"}).min_time_limit_s == 60


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "s.json"
    file.write_text('{"max_workload": 3}')
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings(environ={}, file=file)


def test_the_token_never_shows_in_the_settings_repr() -> None:
    assert TOKEN not in repr(Settings(api_token=TOKEN))


# --- auth ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "presented", "write", "outcome"),
    [
        (Settings(), None, False, None),  # reads open by default
        (Settings(), TOKEN, True, Forbidden),  # no token configured: writes refused, whatever is sent
        (Settings(allow_anonymous_writes=True), None, True, None),
        (Settings(api_token=TOKEN), None, True, Unauthorized),
        (Settings(api_token=TOKEN), TOKEN + "x", True, Unauthorized),
        (Settings(api_token=TOKEN), TOKEN, True, None),
        (Settings(api_token=TOKEN, read_auth=True), None, False, Unauthorized),
        (Settings(api_token=TOKEN, read_auth=True), TOKEN, False, None),
        (Settings(read_auth=True), None, False, Forbidden),
    ],
)
def test_check_token(settings: Settings, presented: str | None, write: bool, outcome: type | None) -> None:
    if outcome is None:
        check_token(settings, presented, write=write)
    else:
        with pytest.raises(outcome):
            check_token(settings, presented, write=write)


@pytest.fixture
def token_client(tmp_path: Path) -> Iterator[TestClient]:
    store = ProfileStore([bundled_root()], writable=tmp_path)
    settings = Settings(api_token=TOKEN, max_body_bytes=20_000, max_workloads=2, max_profile_rows=8)
    with TestClient(app=create_app(store, settings=settings)) as client:
        yield client


def _upload(client: TestClient, body: dict[str, Any], token: str | None, query: str = "") -> Any:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return client.post(f"/profiles{query}", content=json.dumps(body), headers=headers)


def test_writes_need_the_token_and_the_token_is_not_echoed(token_client: TestClient, tmp_path: Path) -> None:
    missing = _upload(token_client, upload_body(), None)
    assert_problem(missing, 401, "Authorization")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = _upload(token_client, upload_body(), "not-it")
    assert_problem(wrong, 401, "Authorization", says="not valid")
    assert "not-it" not in wrong.text
    assert TOKEN not in wrong.text
    assert not (tmp_path / "mine").exists()  # nothing stored by the refused writes
    ok = _upload(token_client, upload_body(), TOKEN)
    assert ok.status_code == 201, ok.text
    assert (tmp_path / "mine" / "profile.csv").is_file()
    # reads stay open
    assert token_client.get("/profiles/mine").status_code == 200


def test_writes_are_refused_without_a_configured_token(tmp_path: Path) -> None:
    store = ProfileStore([bundled_root()], writable=tmp_path)
    with TestClient(app=create_app(store, settings=Settings())) as client:
        assert_problem(_upload(client, upload_body(), "anything"), 403, says="no API token is configured")
    assert list(tmp_path.iterdir()) == []


def test_a_bundled_set_cannot_be_overwritten(token_client: TestClient) -> None:
    response = _upload(token_client, upload_body("paper"), TOKEN, "?replace=true")
    assert_problem(response, 409, "name", says="bundled profile set")


# --- caps ----------------------------------------------------------------------------------------------


def test_an_oversized_body_is_413_naming_the_cap(token_client: TestClient) -> None:
    response = post(token_client, b"[" + b"0," * 20_000 + b"0]")
    assert_problem(response, 413, says="20000 bytes")


def test_a_request_over_a_cap_is_422_naming_the_cap(token_client: TestClient) -> None:
    body = inline_request()
    body["workloads"] = [dict(body["workloads"][0], name=f"c{i}") for i in range(3)]
    assert_problem(
        post(token_client, body), 422, "workloads", says="max_workloads=2 (FLEETPLAN_MAX_WORKLOADS)"
    )
    body = inline_request()
    body["profiles"]["rows"] = ROWS + [dict(ROWS[0], prompt_tokens=4096)]  # 9 rows > 8
    assert_problem(post(token_client, body), 422, "profiles.rows", says="max_profile_rows=8")
    body = inline_request()
    body["options"]["time_limit_s"] = 61
    assert_problem(post(token_client, body), 422, "options.time_limit_s", says="max_time_limit_s=60")
    rows9 = upload_body()
    rows9["rows"] = ROWS + [dict(ROWS[0], prompt_tokens=4096)]
    assert_problem(_upload(token_client, rows9, TOKEN), 422, "rows", says="max_profile_rows=8")


# --- the solve pool ------------------------------------------------------------------------------------


def _hang(request: object, store: object, deadline: object) -> None:
    time.sleep(60)


def _request(limit: float) -> Any:
    body = inline_request()
    body["options"]["time_limit_s"] = limit
    return decode_request(json.dumps(body))


def test_a_full_queue_is_refused_at_once_and_timed_out_children_are_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", _hang)
    pool = SolvePool(slots=1, queue=1, context=cli_context)
    outcomes: dict[str, Any] = {}

    async def one(name: str, delay: float) -> None:
        await anyio.sleep(delay)
        began = time.monotonic()
        try:
            await pool.run(_request(1.0), None, time.monotonic() + 1.0)
        except (ServerBusy, DeadlineExceeded) as error:
            outcomes[name] = (error, time.monotonic() - began)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(one, "running", 0)
            group.start_soon(one, "queued", 0.2)
            group.start_soon(one, "refused", 0.4)

    anyio.run(main)
    running, running_s = outcomes["running"]
    assert isinstance(running, DeadlineExceeded)
    assert running_s < 1.5
    refused, refused_s = outcomes["refused"]
    assert isinstance(refused, ServerBusy)
    assert refused_s < 0.1  # at once, not after a wait
    assert refused.retry_after_s >= 1
    queued, _ = outcomes["queued"]  # waited for the slot and then ran out of its own budget
    assert isinstance(queued, ServerBusy | DeadlineExceeded)
    assert pool.running == pool.waiting == 0
    assert not pool._children  # every child reaped


def test_a_burst_is_admitted_up_to_slots_plus_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five requests in the same instant, one slot, a queue of one: two are admitted, three refused at
    once (admission counts the requests admitted before that have not yet acquired their slot)."""
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", _hang)
    pool = SolvePool(slots=1, queue=1, context=cli_context, max_retry_after_s=7)
    outcomes: list[Exception] = []

    async def one() -> None:
        try:
            await pool.run(_request(0.5), None, time.monotonic() + 0.5)
        except (ServerBusy, DeadlineExceeded) as error:
            outcomes.append(error)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(one)

    pool.mean_solve_s = 0.01  # no refusal for the expected wait: only for the full queue
    anyio.run(main)
    refused = [e for e in outcomes if isinstance(e, ServerBusy) and "requests are queued" in e.message]
    assert len(refused) == 3, [e.message for e in outcomes]
    assert pool.running == pool.waiting == 0
    pool.mean_solve_s = 100.0  # a long estimate: Retry-After is capped below the keep-alive
    assert pool.retry_after_s() == 7


def test_busy_answer_is_503_with_retry_after(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pool = SolvePool(slots=1, queue=0, context=cli_context)
    pool.running = 1  # as if a solve held the only slot
    with TestClient(app=create_app(ProfileStore([bundled_root()]), settings=Settings(), pool=pool)) as client:
        response = post(client, inline_request())
        problem = assert_problem(response, 503, says="solver slots are busy")
        assert int(response.headers["retry-after"]) >= 1
        assert problem["type"].endswith("server-busy")
        metrics = client.get("/metrics").text
    assert 'fleetplan_solves_rejected_total{kind="plan"} 1.0' in metrics


# --- metrics and request ids ---------------------------------------------------------------------------


def test_metrics_and_request_ids(tmp_path: Path) -> None:
    with TestClient(app=create_app(ProfileStore([bundled_root()]), settings=Settings())) as client:
        ok = post(client, inline_request())
        assert ok.status_code == 200, ok.text
        assert len(ok.headers["x-request-id"]) == 32  # generated
        mine = client.get("/health", headers={"X-Request-ID": "abc-123"})
        assert mine.headers["x-request-id"] == "abc-123"
        odd = client.get("/health", headers={"X-Request-ID": "bad id\twith spaces"})
        assert odd.headers["x-request-id"] != "bad id\twith spaces"
        scraped = client.get("/metrics")
        text = scraped.text
    # one charset: Go's mime.ParseMediaType (Prometheus's scraper) refuses a repeated parameter, and
    # Litestar's own charset had doubled prometheus_client's
    media_type, *params = (part.strip() for part in scraped.headers["content-type"].split(";"))
    assert media_type == "text/plain"
    assert sorted(params) == ["charset=utf-8", "version=1.0.0"]
    assert 'fleetplan_http_requests_total{method="POST",route="/plan",status="200"} 1.0' in text
    assert 'fleetplan_http_requests_total{method="GET",route="/health",status="200"} 2.0' in text
    assert 'fleetplan_plans_total{status="optimal"} 1.0' in text
    assert 'fleetplan_solve_seconds_count{kind="plan"} 1.0' in text
    assert 'fleetplan_solves_total{kind="plan",outcome="plan"} 1.0' in text
    assert "fleetplan_plan_mip_gap_count 1.0" in text
    assert "fleetplan_solves_in_flight 0.0" in text
    assert "fleetplan_candidate_builds_finishing 0.0" in text


def test_every_planner_error_has_its_slug_and_status_in_the_one_map() -> None:
    import fleetplan.models.errors as errors_module
    from fleetplan.api.errors import ERRORS
    from fleetplan.models.errors import PlannerError

    classes = {
        c for c in vars(errors_module).values() if isinstance(c, type) and issubclass(c, PlannerError)
    } - {PlannerError}
    assert classes <= ERRORS.keys(), classes - ERRORS.keys()
    assert len({slug for slug, _ in ERRORS.values()}) == len(ERRORS)  # slugs are unique
    assert all(status == cls.status_code for cls, (_, status) in ERRORS.items())


# --- what-if and re-plan in killable workers --------------------------------------------------------------


def _hang_writing_pid(*args: Any) -> None:
    """A worker that never finishes: writes its pid where the test finds it, then sleeps."""
    Path(os.environ["FLEETPLAN_TEST_PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def hanging(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("FLEETPLAN_TEST_PID_FILE", str(pid_file))
    monkeypatch.setattr(fleetplan.api.workers, "whatif_in_child", _hang_writing_pid)
    monkeypatch.setattr(fleetplan.api.whatif, "whatif_in_child", _hang_writing_pid)
    monkeypatch.setattr(fleetplan.api.fleets, "replan_in_child", _hang_writing_pid)
    return pid_file


def _timed_sweep(body: dict, settings: Settings) -> tuple[SolvePool, Any, float]:
    """POST /whatif `body` to a server with one solve slot; the pool, the answer and its wall seconds."""
    pool = SolvePool(slots=1, queue=1, context=cli_context)  # fork: the child runs the patched function
    app = create_app(ProfileStore([bundled_root()]), settings=settings, pool=pool)
    with TestClient(app) as client:
        began = time.monotonic()
        answer = client.post(
            "/whatif", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        return pool, answer, time.monotonic() - began


def test_a_whatif_sweep_is_killed_at_its_deadline(hanging: Path) -> None:
    base = inline_request()
    base["options"]["time_limit_s"] = 0.5
    body = {"base": base, "axes": [{"param": "demand_scale", "values": [1.0]}], "marginal": False}
    budget = fleetplan.api.whatif.whatif_deadline_s(decode(json.dumps(body).encode(), WhatIfRequest))
    pool, answer, took = _timed_sweep(body, Settings())
    assert_problem(answer, 503, "base.options.time_limit_s", says="the sweep was stopped")
    assert budget - 0.5 < took < budget + 2
    assert _gone(int(hanging.read_text()))  # the sweep's process ended with the answer
    assert pool.running == 0
    assert not pool._children


def test_a_long_sweep_is_killed_at_the_servers_max_sweep_s(hanging: Path) -> None:
    """A 2,000-point grid's deadline was hours (POST /plan's per plan times its plans): one client held a
    solve slot that long, and every other plan was refused."""
    base = inline_request()
    base["options"]["time_limit_s"] = 1
    axes = [{"param": "demand_scale", "start": 0.5, "stop": 1.5, "num": 40}]
    axes.append({"param": "slo_scale", "start": 1.0, "stop": 2.0, "num": 50})
    body = {"base": base, "axes": axes, "marginal": False}
    assert fleetplan.api.whatif.whatif_deadline_s(decode(json.dumps(body).encode(), WhatIfRequest)) > 3600
    pool, answer, took = _timed_sweep(body, Settings(max_sweep_s=1.5))
    assert_problem(answer, 503, "base.options.time_limit_s", says="the server's max_sweep_s is 1.5")
    assert took < 1.5 + 2
    assert _gone(int(hanging.read_text()))
    assert pool.running == 0


def test_a_replan_is_killed_at_its_deadline_and_its_run_marked_failed(
    hanging: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(fleetplan.api.fleets, "REPLAN_GATE_S", 1.0)
    settings = Settings(allow_anonymous_writes=True, max_time_limit_s=1, min_time_limit_s=0.5)
    budget = fleetplan.api.fleets.replan_budget_s(settings)  # 2 x 1 s + 1 s
    pool = SolvePool(slots=1, queue=1, context=cli_context)
    app = create_app(settings=settings, pool=pool, database_url=f"sqlite:///{tmp_path / 'fleets.db'}")
    fleet = inline_request()
    fleet["options"]["time_limit_s"] = 1
    with TestClient(app) as client:
        assert client.put("/fleets/f", json=fleet).status_code == 200
        began = time.monotonic()
        answer = client.post("/fleets/f/replan", json={})
        took = time.monotonic() - began
        runs = client.get("/fleets/f/runs").json()
    assert_problem(answer, 503, says="did not finish within 3 s")
    assert budget - 0.5 < took < budget + 2
    assert _gone(int(hanging.read_text()))
    assert [(r["status"], r["reason"].split(":")[0]) for r in runs] == [("failed", "stopped")]
    assert not pool._children


def test_json_logs_are_one_object_per_line_for_the_migrations_too(capsys) -> None:
    """`serve` with FLEETPLAN_LOG_FORMAT=json wrote Alembic's start-up lines (the migrations) as plain text,
    one of them over four lines, through the root logger's default format."""
    import logging.config

    from fleetplan.api.observe import configure_logging

    loggers = [logging.getLogger(n) for n in ("fleetplan", "uvicorn", "uvicorn.access", "alembic")]
    saved = [(logger.handlers[:], logger.propagate, logger.level) for logger in loggers]
    logging.config.dictConfig(configure_logging("json", "info"))
    try:
        logging.getLogger("alembic.runtime.migration").info(
            "Running upgrade 0001 -> 0002, runs' owner\nand beat"
        )
        logging.getLogger("fleetplan.api").warning("store unavailable")
    finally:  # the loggers as they were: the other tests of this process read them
        for logger, (handlers, propagate, level) in zip(loggers, saved, strict=True):
            logger.handlers[:] = handlers
            logger.propagate, logger.level = propagate, level
    lines = capsys.readouterr().err.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["logger"] for r in records] == ["alembic.runtime.migration", "fleetplan.api"]
    assert records[0]["message"] == "Running upgrade 0001 -> 0002, runs' owner\nand beat"
    # RFC 3339 in UTC with milliseconds (it had neither zone nor sub-seconds: session 34's operator test)
    stamp = datetime.fromisoformat(records[1]["time"])
    assert stamp.utcoffset() == timedelta(0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", records[1]["time"])
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 60


def test_a_refused_request_is_freed_without_the_cycle_collector() -> None:
    """until_disconnect kept the error it re-raised in a local: frame -> error -> traceback -> frame, so
    each 503 held its decoded body until a full collection (RSS grew 0.5 -> 1.75 GB under refused 8 MB
    bodies)."""
    import gc
    import weakref

    import anyio

    from fleetplan.api.app import until_disconnect
    from fleetplan.models.errors import ServerBusy

    class Body:
        pass

    refs: list[weakref.ref] = []

    class Client:
        async def receive(self) -> dict:
            await anyio.sleep_forever()
            return {}

    async def refused() -> None:
        body = Body()
        refs.append(weakref.ref(body))
        raise ServerBusy("every solve slot is busy")

    async def call() -> None:
        try:
            await until_disconnect(Client(), refused)  # type: ignore[arg-type]
        except ServerBusy:
            pass

    gc.disable()
    try:
        anyio.run(call)
        assert refs[0]() is None  # freed by reference counting alone
    finally:
        gc.enable()


def test_a_path_cannot_forge_a_line_in_the_text_access_log() -> None:
    """`/fleets/y%0d%0aFORGED-LINE` wrote `FORGED-LINE 400 1.1 ms` as a line of its own."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("fleetplan.access").addHandler(handler)
    try:
        with TestClient(app=create_app(ProfileStore([bundled_root()]), settings=Settings())) as client:
            client.get("/fleets/y%0d%0aFORGED-LINE")
    finally:
        logging.getLogger("fleetplan.access").removeHandler(handler)
    lines = [r.getMessage() for r in records if "FORGED" in r.getMessage()]
    assert lines
    assert all("\n" not in line and "\r" not in line for line in lines)
    assert "/fleets/y\\x0d\\x0aFORGED-LINE" in lines[0]


def test_a_body_cut_short_by_the_client_is_a_499_not_a_500() -> None:
    """Litestar's "client disconnected prematurely" was answered (to nobody), logged and counted as a 500,
    so 5xx alerts fired on clients that hung up."""
    from types import SimpleNamespace

    from litestar.exceptions import InternalServerException

    from fleetplan.api.errors import problem_response

    request = SimpleNamespace(method="POST", url=SimpleNamespace(path="/plan"))
    answer = problem_response(request, InternalServerException("client disconnected prematurely"))  # type: ignore[arg-type]
    assert answer.status_code == 499
    assert answer.content.type.endswith(":client-gone")
    other = problem_response(request, InternalServerException("something else"))  # type: ignore[arg-type]
    assert other.status_code == 500


def test_unmatched_routes_and_methods_are_observed_with_bounded_labels() -> None:
    """A 404 or 405 bypassed the request middleware (it wrapped matched routes only): no access line, no
    metric, no X-Request-ID. Counted now, a client's made-up methods share one label."""
    with TestClient(app=create_app(ProfileStore([bundled_root()]), settings=Settings())) as client:
        missing = client.get("/nope", headers={"X-Request-ID": "abc123"})
        assert (missing.status_code, missing.headers["x-request-id"]) == (404, "abc123")
        for method in ("FROB", "XYZZY"):
            assert client.request(method, "/plan").status_code == 405
        text = client.get("/metrics").text
    assert 'fleetplan_http_requests_total{method="GET",route="unmatched",status="404"} 1.0' in text
    assert 'fleetplan_http_requests_total{method="other",route="unmatched",status="405"} 2.0' in text
