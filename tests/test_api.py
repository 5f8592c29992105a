"""The HTTP service through Litestar's TestClient: happy paths, the OpenAPI document, and problem+json
answers for bad input (each naming the field), plus a "never 500" sweep over mutated bodies.

Requests use inline profile rows, so nothing here depends on the bundled profile sets; a temporary store
with one set ("tiny") stands in for them.
"""

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient

import fleetplan.api.workers
from fleetplan import fixtures
from fleetplan.api.app import create_app
from fleetplan.api.errors import PROBLEM_JSON
from fleetplan.api.settings import Settings
from fleetplan.api.workers import SolvePool, cli_context
from fleetplan.models.codec import locate_non_finite
from fleetplan.models.errors import PlanVerificationError
from fleetplan.models.plan import Plan
from fleetplan.profiler.store import ProfileStore

# gpu prefills fast but decodes too slowly for the 12 ms TBT SLO; acc decodes fast but prefills too slowly
# for the 300 ms TTFT SLO: the only way to serve the class is gpu prefill -> acc decode.
_LATENCIES = {  # (device, batch, prompt_tokens): (ttft_ms_p90, tbt_ms_p90)
    ("gpu", 1, 128): (20, 14),
    ("gpu", 1, 1024): (100, 16),
    ("gpu", 4, 128): (50, 18),
    ("gpu", 4, 1024): (300, 20),
    ("acc", 1, 128): (600, 8),
    ("acc", 1, 1024): (2000, 10),
    ("acc", 4, 128): (1500, 11),
    ("acc", 4, 1024): (5000, 14),
}
ROWS = [
    {"model": "m1", "device": d, "tp": 1, "batch": b, "prompt_tokens": p, "ttft_ms_p90": t, "tbt_ms_p90": s}
    for (d, b, p), (t, s) in _LATENCIES.items()
]


def inline_request() -> dict[str, Any]:
    """A small valid request (fresh copy) whose plan routes gpu -> acc."""
    return {
        "devices": [
            {"name": "gpu", "count": 2, "cost_per_hour": 1.0, "network_gbps": 25, "kind": "gpu"},
            {"name": "acc", "count": 2, "cost_per_hour": 0.5, "network_gbps": 25},
        ],
        "links": [{"source": "gpu", "target": "acc", "gbps": 50}],
        "models": [{"name": "m1", "kv_bytes_per_token": 65536}],
        "workloads": [
            {
                "name": "chat",
                "model": "m1",
                "prompt_tokens": 512,
                "output_tokens": 128,
                "rate_rps": 20.0,
                "slo": {"ttft_ms": 300, "tbt_ms": 12, "percentile": 90},
            },
        ],
        "profiles": {"rows": copy.deepcopy(ROWS)},
        "options": {"time_limit_s": 30},
    }


def write_store(root: Path, name: str = "tiny") -> Path:
    """A profile store directory holding one set built from ROWS."""
    columns = list(ROWS[0])
    csv = ",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in ROWS)
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "profile.csv").write_text(csv)
    manifest = {
        "name": name,
        "description": "two devices, one model, for the API tests",
        "sha256": hashlib.sha256(csv.encode()).hexdigest(),
        "rows": len(ROWS),
        "generator": "tests/test_api.py",
        "created": "2025-11-22",
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def client(store_root: Path) -> Iterator[TestClient]:
    # anonymous writes on: POST /profiles reaches its content-type check and its 503 (no writable store)
    app = create_app(ProfileStore([store_root]), settings=Settings(allow_anonymous_writes=True))
    with TestClient(app=app) as test_client:
        yield test_client


def post(client: TestClient, body: dict[str, Any] | bytes | str) -> Any:
    content = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post("/plan", content=content, headers={"content-type": "application/json"})


def assert_problem(response: Any, status: int, field: str | None = None, *, says: str | None = None) -> dict:
    """An RFC 9457 body with `status`; `field` both as the member and at the front of `detail`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    problem = response.json()
    assert {"type", "title", "status", "detail"} <= problem.keys()
    assert problem["status"] == status
    if field is not None:
        assert problem.get("field") == field, problem
        assert problem["detail"].startswith(f"{field}: "), problem
    if says is not None:
        assert says in problem["detail"], problem
    return problem


# --- happy paths ----------------------------------------------------------------------------------------


def test_plan_inline_rows_routes_gpu_to_acc(client: TestClient) -> None:
    started = time.perf_counter()
    response = post(client, inline_request())
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    plan = msgspec.json.decode(response.content, type=Plan)
    assert plan.status == "optimal"
    assert plan.profile_set.name == "inline"
    assert 0 < plan.slo_rps <= plan.demand_rps == 20.0
    routes = [r for w in plan.workloads for r in w.routes]
    assert routes
    assert all(
        r.prefill and r.decode and r.prefill.device == "gpu" and r.decode.device == "acc" for r in routes
    )
    # time_limit_s is a wall-clock bound on the whole request (the service's promise, not a speed goal)
    assert elapsed < inline_request()["options"]["time_limit_s"] + 1, f"POST /plan took {elapsed:.2f} s"


def test_plan_uses_the_store_in_app_state(client: TestClient) -> None:
    body = inline_request() | {"profiles": {"set": "tiny"}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    assert response.json()["profile_set"]["name"] == "tiny"


def test_plan_bundled_paper_request_when_present() -> None:
    """The default example against the bundled sets (skipped until they exist)."""
    root = fixtures.root()
    path = root / "requests" / "paper.json"
    if not path.is_file() or not (root / "profiles" / "paper" / "profile.csv").is_file():
        pytest.skip(
            "fleetplan/fixtures/requests/paper.json or the bundled 'paper' profile set is not there yet"
        )
    body = json.loads(path.read_bytes())
    body["options"]["time_limit_s"] = 60  # a wall-clock budget now: room for a loaded test machine
    with TestClient(app=create_app()) as bundled:
        response = bundled.post("/plan", json=body)
    assert response.status_code == 200, response.text
    assert msgspec.json.decode(response.content, type=Plan).profile_set.name == "paper"


def test_health(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert isinstance(body["version"], str)
    assert body["version"]


def test_profiles_list_and_manifest(client: TestClient) -> None:
    listed = client.get("/profiles")
    assert listed.status_code == 200
    (tiny,) = [s for s in listed.json() if s["name"] == "tiny"]
    assert tiny["rows"] == len(ROWS)
    assert len(tiny["sha256"]) == 64
    assert tiny["description"]

    manifest = client.get("/profiles/tiny")
    assert manifest.status_code == 200
    assert manifest.json()["generator"] == "tests/test_api.py"


def test_unknown_profile_set_manifest_is_404(client: TestClient) -> None:
    """The store's own not-found problem, naming the field, like an unknown fleet's (it was Litestar's
    about:blank without a field)."""
    problem = assert_problem(client.get("/profiles/nope"), 404, "name", says="unknown profile set 'nope'")
    assert problem["type"] == "urn:fleetplan:problem:not-found"


def test_openapi_documents_plan_request_and_plan(client: TestClient) -> None:
    assert client.get("/schema").status_code == 200
    response = client.get("/schema/openapi.json")
    assert response.status_code == 200
    document = response.json()
    schemas = document["components"]["schemas"]
    assert {"PlanRequest", "Plan", "Problem"} <= schemas.keys()
    assert {"devices", "workloads", "profiles", "options"} <= schemas["PlanRequest"]["properties"].keys()
    operation = document["paths"]["/plan"]["post"]
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body_schema == {"$ref": "#/components/schemas/PlanRequest"}
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Plan"}
    assert PROBLEM_JSON in operation["responses"]["400"]["content"]


# --- bad input: 4xx problem+json naming the field ------------------------------------------------------


def _mutate(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    body = inline_request()
    change(body)
    return body


BAD_BODIES = {
    "negative count": (
        _mutate(lambda b: b["devices"][0].update(count=-1)),
        400,
        "devices[0].count",
        "Expected `int` >= 0",
    ),
    "huge latency in inline rows": (
        _mutate(lambda b: b["profiles"]["rows"][0].update(ttft_ms_p90=1e300)),
        400,
        "profiles.rows[0].ttft_ms_p90",
        "Expected `float` <",
    ),
    "zero latency in inline rows": (
        _mutate(lambda b: b["profiles"]["rows"][3].update(tbt_ms_p90=0)),
        400,
        "profiles.rows[3].tbt_ms_p90",
        "Expected `float` > 0",
    ),
    "unknown model in a workload": (
        _mutate(lambda b: b["workloads"][0].update(model="llama-9")),
        400,
        "workloads[0].model",
        "unknown model 'llama-9'",
    ),
    "link to an unknown device": (
        _mutate(lambda b: b["links"][0].update(target="b")),
        400,
        "links[0].target",
        "unknown device 'b'",
    ),
    "duplicate device names": (
        _mutate(lambda b: b["devices"].append(dict(b["devices"][0]))),
        400,
        "devices",
        "duplicate name",
    ),
    "percentile 95": (
        _mutate(lambda b: b["workloads"][0]["slo"].update(percentile=95)),
        400,
        "workloads[0].slo.percentile",
        "95",
    ),
    "misspelt rate_rpss": (
        _mutate(lambda b: b["workloads"][0].update(rate_rpss=b["workloads"][0].pop("rate_rps"))),
        400,
        "workloads[0].rate_rpss",
        "unknown field",
    ),
    "empty workloads": (
        _mutate(lambda b: b.update(workloads=[])),
        400,
        "workloads",
        "give at least one workload",
    ),
    "string for a number": (
        _mutate(lambda b: b["workloads"][0].update(rate_rps="20")),
        400,
        "workloads[0].rate_rps",
        "Expected `float`",
    ),
    "both set and rows": (
        _mutate(lambda b: b["profiles"].update(set="tiny")),
        400,
        "profiles",
        "exactly one of",
    ),
    "time limit out of range": (
        _mutate(lambda b: b["options"].update(time_limit_s=0)),
        400,
        "options.time_limit_s",
        "> 0.0",
    ),
    "unknown profile set": (
        _mutate(lambda b: b.update(profiles={"set": "nope"})),
        422,
        "profiles.set",
        "unknown profile set 'nope'",
    ),
    "percentile the rows lack": (
        _mutate(lambda b: b["workloads"][0]["slo"].update(percentile=99)),
        422,
        "workloads[0].slo.percentile",
        "ttft_ms_p99",
    ),
}


@pytest.mark.parametrize(("body", "status", "field", "says"), BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_input_is_a_problem_naming_the_field(
    client: TestClient, body: dict[str, Any], status: int, field: str, says: str
) -> None:
    assert_problem(post(client, body), status, field, says=says)


def test_a_repeated_key_is_refused_not_silently_the_last(client: TestClient) -> None:
    """{"rate_rps": 1, "rate_rps": ...}: msgspec would keep the last; the API refuses the body instead."""
    text = json.dumps(inline_request())
    assert '"rate_rps": ' in text
    twice = text.replace('"rate_rps": ', '"rate_rps": 1, "rate_rps": ', 1)
    assert_problem(post(client, twice), 400, "rate_rps", says="duplicate key(s) ['rate_rps']")
    nested = text.replace('"percentile": ', '"percentile": 90, "percentile": ', 1)
    assert_problem(post(client, nested), 400, "percentile", says="duplicate key")
    assert post(client, text).status_code == 200  # the same body with each key once is planned


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_latency_names_the_field(client: TestClient, literal: str) -> None:
    text = json.dumps(inline_request()).replace('"ttft_ms_p90": 100', f'"ttft_ms_p90": {literal}', 1)
    assert literal in text
    assert_problem(post(client, text), 400, "profiles.rows[1].ttft_ms_p90", says="not JSON numbers")


def test_out_of_range_number_names_the_field(client: TestClient) -> None:
    text = json.dumps(inline_request()).replace('"rate_rps": 20.0', '"rate_rps": 1e400', 1)
    assert_problem(post(client, text), 400, "workloads[0].rate_rps")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"devices": [', "malformed JSON"),
        ("{'devices': []}", "malformed JSON"),
        ("[]", "Expected `object`"),
        ("null", "Expected `object`"),
        ("\x00\xff", "malformed JSON"),
    ],
    ids=["truncated", "single quotes", "array", "null", "binary"],
)
def test_malformed_json_is_400(client: TestClient, content: str, says: str) -> None:
    assert_problem(post(client, content), 400, says=says)


def test_empty_body_is_400(client: TestClient) -> None:
    assert_problem(post(client, b""), 400, "body", says="empty")


def test_unknown_route_and_method_are_problems(client: TestClient) -> None:
    assert_problem(client.get("/nope"), 404, says="/nope")
    response = client.get("/plan")
    assert_problem(response, 405, says="GET")
    assert "POST" in response.headers["allow"]


def test_locate_non_finite() -> None:
    assert locate_non_finite('{"a": [1, {"b": NaN}]}') == "a[1].b"
    assert locate_non_finite('{"a": 1}') is None
    assert locate_non_finite("{not json") is None


# --- failures inside the planner -------------------------------------------------------------------------


def _hang_writing_pid(pid_file: Path, request: object, store: object, deadline: object) -> None:
    pid_file.write_text(str(os.getpid()))
    time.sleep(60)


def _explode(request: object, store: object, deadline: object) -> None:
    raise RuntimeError("secret internals")


def _broken(request: object, store: object, deadline: object) -> None:
    raise PlanVerificationError("device 'gpu' used 3 > 2 available", field="devices[0].count")


@pytest.fixture
def forking_client(store_root: Path) -> Iterator[TestClient]:
    """Workers fork from the test process: a workers.plan_in_child monkeypatched with a module-level
    function (jobs travel pickled, functions by name) runs in the worker."""
    # workers forked from a long pytest process count its pages as their own: no memory cap here (a worker
    # over it would be replaced where a test expects it kept)
    pool = SolvePool(slots=1, queue=1, context=cli_context, max_worker_rss_mib=1e6)
    with TestClient(app=create_app(ProfileStore([store_root]), pool=pool)) as test_client:
        yield test_client


def test_solve_past_the_deadline_is_503_and_its_process_is_killed(
    forking_client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", partial(_hang_writing_pid, pid_file))
    body = inline_request()
    body["options"] = {"time_limit_s": 2}
    started = time.perf_counter()
    with caplog.at_level("WARNING", logger="fleetplan.api"):
        response = post(forking_client, body)
    assert time.perf_counter() - started < 3, "the handler waited past the time limit"
    assert_problem(response, 503, "options.time_limit_s", says="no plan within time_limit_s=2")
    assert int(response.headers["retry-after"]) >= 1
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped: no work of the request runs on
        os.kill(child, 0)
    # an expected time-out is one WARNING line, not an ERROR with a traceback
    records = [r for r in caplog.records if r.name == "fleetplan.api"]
    assert records
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in records)


def _slow_first_build(built: Path, request: Any, store: Any, deadline: Any) -> Any:
    """The first call builds its candidate tables for 2 s (reporting the stage as solver.plan does) and
    marks them built; a later call, the tables there, plans."""
    if not built.exists():
        deadline.enter("candidates")
        time.sleep(2.0)
        built.write_text(str(os.getpid()))
        deadline.enter("solve")
        deadline.check("candidate generation")
    from fleetplan import solver

    return solver.plan(request, store, deadline=deadline)


def test_tables_that_outlast_the_time_limit_are_finished_and_the_retry_plans(
    forking_client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plan whose candidate build outlasts its time limit is answered 503 at its deadline, saying so,
    and the build finishes in its worker; the retry (the same worker, parked idle) plans."""
    built = tmp_path / "built"
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", partial(_slow_first_build, built))
    body = inline_request()
    body["options"] = {"time_limit_s": 1}
    started = time.perf_counter()
    response = post(forking_client, body)
    assert time.perf_counter() - started < 1.8, "the handler waited for the build"
    assert_problem(response, 503, "options.time_limit_s", says="building this fleet's candidate tables")
    assert int(response.headers["retry-after"]) >= 1
    assert not built.exists()
    assert "fleetplan_candidate_builds_finishing 1.0" in forking_client.get("/metrics").text
    for _ in range(100):  # the build ends about 1 s after the answer
        if built.exists():
            break
        time.sleep(0.05)
    builder = int(built.read_text())
    time.sleep(0.3)  # its answer (the deadline's error) is read and the worker parked
    body["options"] = {"time_limit_s": 10}
    again = post(forking_client, body)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "optimal"
    os.kill(builder, 0)  # the worker that built is alive, kept
    assert "fleetplan_candidate_builds_finishing 0.0" in forking_client.get("/metrics").text


def test_unexpected_error_is_a_generic_500(
    forking_client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", _explode)
    problem = assert_problem(post(forking_client, inline_request()), 500)
    assert "secret" not in json.dumps(problem)
    assert "secret internals" in caplog.text  # logged


def test_plan_verification_error_is_500(forking_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleetplan.api.workers, "plan_in_child", _broken)
    problem = assert_problem(post(forking_client, inline_request()), 500, "devices[0].count")
    assert problem["type"].endswith("plan-verification-failed")


# --- never a 500 -----------------------------------------------------------------------------------------

_PATHS: list[tuple[str | int, ...]] = [
    ("devices",),
    ("devices", 0),
    ("devices", 0, "name"),
    ("devices", 0, "count"),
    ("devices", 0, "network_gbps"),
    ("devices", 1, "cost_per_hour"),
    ("links",),
    ("links", 0, "gbps"),
    ("links", 0, "source"),
    ("models",),
    ("models", 0, "kv_bytes_per_token"),
    ("workloads", 0, "prompt_tokens"),
    ("workloads", 0, "output_tokens"),
    ("workloads", 0, "rate_rps"),
    ("workloads", 0, "slo"),
    ("workloads", 0, "slo", "ttft_ms"),
    ("workloads", 0, "weight"),
    ("profiles",),
    ("profiles", "rows"),
    ("profiles", "rows", 0, "tp"),
    ("profiles", "rows", 2, "batch"),
    ("profiles", "rows", 4, "prompt_tokens"),
    ("options",),
    ("options", "objective"),
    ("options", "batch_sizes"),
    ("options", "max_utilization"),
    ("options", "budget_per_hour"),
    ("options", "baseline_device"),
    ("kv_budget_gbps",),
]
_VALUES: list[object] = [None, -1, 0, 1, 1e11, "x", "", [], {}, True, [1], 10**30, "min_cost"]
_DELETE = object()


def _set(body: Any, path: tuple[str | int, ...], value: object) -> Any:
    body = copy.deepcopy(body)
    *parents, last = path
    node = body
    for key in parents:
        node = node[key]
    if value is _DELETE:
        if isinstance(node, dict):
            node.pop(last, None)
        else:
            del node[last]
    else:
        node[last] = value
    return body


MUTATIONS = {
    f"{'.'.join(map(str, path))}={'<delete>' if value is _DELETE else json.dumps(value)}": _set(
        inline_request(), path, value
    )
    for path in _PATHS
    for value in [*_VALUES, _DELETE]
}


@pytest.mark.parametrize("body", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_mutated_body_never_500(client: TestClient, body: dict[str, Any]) -> None:
    response = post(client, body)
    if response.status_code == 200:
        msgspec.json.decode(response.content, type=Plan)
    else:
        problem = assert_problem(response, response.status_code)
        assert 400 <= response.status_code < 500, problem


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(_PATHS), value=_json)
def test_random_value_anywhere_never_500(
    client: TestClient, path: tuple[str | int, ...], value: object
) -> None:
    response = post(client, _set(inline_request(), path, value))
    assert response.status_code < 500, response.text


def test_plan_with_verify_simulate_attaches_the_simulation():
    from litestar.testing import TestClient

    from fleetplan.api.app import create_app

    body = json.loads(fixtures.request_path("paper").read_text())
    body["verify"] = "simulate"
    body["options"]["time_limit_s"] = 60  # a wall-clock budget now: room for a loaded test machine
    with TestClient(app=create_app()) as client:
        response = client.post("/plan", json=body)
    assert response.status_code == 200, response.text
    simulation = response.json()["simulation"]
    assert simulation["predicted_goodput_rps"] == pytest.approx(response.json()["slo_rps"], rel=1e-6)
    assert {c["name"] for c in simulation["classes"]} == {w["name"] for w in body["workloads"]}
    body["verify"] = "yes"
    with TestClient(app=create_app()) as client:
        bad = client.post("/plan", json=body)
    assert bad.status_code == 400
    assert bad.json()["field"] == "verify"


# --- content types: a body must say it is JSON --------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/plan", {"content-type": "text/plain"}),
        ("/plan", {"content-type": "application/x-www-form-urlencoded"}),
        ("/plan", {"content-type": "multipart/form-data; boundary=x"}),
        ("/plan", {}),
        ("/profiles", {"content-type": "text/plain;charset=UTF-8"}),
    ],
)
def test_a_body_that_is_not_declared_json_is_refused_before_decoding(client, path, headers):
    """What a browser may send cross-site without a CORS preflight never reaches the solver or the store."""
    body = fixtures.request_path("paper").read_bytes()
    response = client.post(path, content=body, headers=headers)
    problem = assert_problem(response, 415, says="application/json")
    shown = headers.get("content-type", "none").split(";")[0]
    assert shown in problem["detail"]


@pytest.mark.parametrize(
    "media", ["application/json", "application/json; charset=utf-8", "application/plan+json"]
)
def test_json_media_types_are_accepted(client, media):
    body = fixtures.request_path("paper").read_bytes()
    response = client.post("/plan", content=body, headers={"content-type": media})
    # decoded and checked: this module's store has no 'paper' set, which the request names
    assert_problem(response, 422, "profiles.set")


@pytest.mark.parametrize("path", ["/plan", "/whatif", "/profiles"])
def test_a_body_that_is_not_utf8_is_a_400_not_a_500(client: TestClient, path: str) -> None:
    """msgspec raised UnicodeDecodeError on a string holding byte 0xff, which no handler turned into a
    problem: every JSON endpoint answered 500."""
    paper = json.loads(fixtures.request_path("paper").read_text())
    body = {
        "/plan": paper,
        "/whatif": {"base": paper, "axes": [{"param": "budget_per_hour", "values": [10.0]}]},
        "/profiles": {"name": "x", "description": "d", "rows": []},
    }[path]
    old, new = ('"d"', '"d\udcff"') if path == "/profiles" else ("a6000ada", "a6000\udcffada")
    raw = json.dumps(body).replace(old, new, 1)
    content = raw.encode("utf-8", "surrogateescape")
    assert b"\xff" in content
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert_problem(response, 400, says="the JSON is not UTF-8: byte(s) b'\\xff' at offset")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"links": []}, "devices"),
        ({"devices": [{"name": "a", "count": 1}], "workloads": [{}]}, "workloads[0].name"),
    ],
)
def test_a_missing_required_field_is_named_as_the_field(client: TestClient, body: dict, field: str) -> None:
    """A missing top-level field came back with no `field` member ("Object missing required field
    `devices`"), a nested one as its parent object (workloads[0])."""
    assert_problem(post(client, body), 400, field, says="required field missing")


def test_openapi_declares_every_error_as_a_problem_and_every_whatif_answer() -> None:
    """Found by an audit against the contract: GET /profiles/{name}'s 400 was declared application/json,
    POST /whatif's 200 only as JSON (it answers CSV, SVG and PNG too), and under FLEETPLAN_READ_AUTH no
    read declared its 401."""
    with TestClient(app=create_app(settings=Settings(read_auth=True, api_token="t"))) as guarded:
        document = guarded.get("/schema/openapi.json", headers={"Authorization": "Bearer t"}).json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status[0] in "45":
                    assert list(response["content"]) == [PROBLEM_JSON], (method, path, status)
            if method == "get" and path != "/health":
                assert "401" in operation["responses"], path
    answers = document["paths"]["/whatif"]["post"]["responses"]["200"]["content"]
    assert set(answers) == {"application/json", "text/csv", "image/svg+xml", "image/png"}


def test_a_deeply_nested_body_after_a_whole_float_is_a_400(client: TestClient) -> None:
    """The whole-float retry decoded the body untyped, and 1,000 nested arrays raised RecursionError: 500."""
    body = '{"devices": [{"name": "a", "count": 1.0}], "zzz": ' + "[" * 5000 + "]" * 5000 + "}"
    assert_problem(post(client, body), 400)


def test_many_repeated_keys_are_named_once_each(client: TestClient) -> None:
    """The duplicate-key check counted every key against the whole list (quadratic: 120,000 keys held the
    event loop 4 s, /health included); it names each repeated key once."""
    paper = json.dumps(json.loads(fixtures.request_path("paper").read_text()))
    body = paper.replace('"rate_rps": 16.0', ", ".join(['"rate_rps": 16.0'] * 20_000), 1)
    assert_problem(post(client, body), 400, "rate_rps", says="duplicate key(s) ['rate_rps']")


def _padded(rows: int) -> dict[str, Any]:
    """inline_request() with `rows` more (valid) profile rows of m1 on gpu at other prompt lengths."""
    body = inline_request()
    extra = {"model": "m1", "device": "gpu", "tp": 1, "batch": 1, "ttft_ms_p90": 500.0, "tbt_ms_p90": 20.0}
    body["profiles"]["rows"] += [{**extra, "prompt_tokens": 4096 + k} for k in range(rows)]
    return body


def test_a_large_body_is_decoded_off_the_event_loop(client: TestClient, monkeypatch) -> None:
    """A body over OFF_LOOP_BYTES is decoded (duplicate-key check included) in a worker thread before the
    handler, and the DTO takes that value instead of decoding again; a small one on the loop, once.
    Measured (bench/large_bodies.py: 8 concurrent 7.4 MB bodies against `fleetplan serve`): /health's
    worst answer 1.43-1.69 s -> 0.46-0.59 s (docs/api.md, "Large bodies")."""
    import asyncio

    from fleetplan.api import app as app_module
    from fleetplan.models.codec import decode_request

    calls: list[bool] = []

    def recording(value: bytes):
        try:
            asyncio.get_running_loop()
            calls.append(True)  # on the event loop
        except RuntimeError:
            calls.append(False)  # in a worker thread
        return decode_request(value)

    monkeypatch.setattr(app_module.CodecBody, "decode_body", staticmethod(recording))
    large = json.dumps(_padded(2000))
    assert len(large) > app_module.OFF_LOOP_BYTES
    response = post(client, large)
    assert response.status_code == 200, response.text
    assert calls == [False]
    calls.clear()
    small = json.dumps(inline_request())
    assert len(small) < app_module.OFF_LOOP_BYTES
    assert post(client, small).status_code == 200
    assert calls == [True]


def test_a_large_bad_body_is_a_problem_naming_the_field(client: TestClient) -> None:
    body = _padded(2000)
    body["profiles"]["rows"][1500]["tp"] = 0
    assert_problem(post(client, body), 400, "profiles.rows[1500].tp")
    text = json.dumps(_padded(2000)).replace('"rate_rps": 20.0', '"rate_rps": 20.0, "rate_rps": 100.0', 1)
    assert_problem(post(client, text), 400, "rate_rps", says="duplicate key(s) ['rate_rps']")


def test_verify_simulate_without_p50_rows_is_a_422_naming_the_profiles(client: TestClient) -> None:
    """Rows with p90 only plan, but the simulator draws from p50 and p90: `verify: "simulate"` on them
    raised ValueError in the worker (a 500)."""
    body = inline_request()
    body["verify"] = "simulate"
    assert_problem(post(client, body), 422, "profiles", says="the simulator draws each latency from its p50")


def test_openapi_lists_every_field_of_an_answer_as_required(client: TestClient) -> None:
    """msgspec writes every field, defaults included: a component only the server writes says so, so that a
    generated client does not type `Point.binding` or `DeviceUse.bought` as optional (session 34's audit).
    What clients send keeps its defaults optional."""
    schemas = client.get("/schema/openapi.json").json()["components"]["schemas"]
    for name in ("Plan", "DeviceUse", "Point", "WhatIfResult", "Run", "SimulationReport"):
        assert sorted(schemas[name]["required"]) == sorted(schemas[name]["properties"]), name
    assert "options" not in schemas["PlanRequest"]["required"]
    assert "time_limit_s" not in schemas["Options"].get("required", [])
    # and an answer has them all
    plan = post(client, inline_request()).json()
    assert set(plan) == set(schemas["Plan"]["properties"])
    assert set(plan["devices"][0]) == set(schemas["DeviceUse"]["properties"])


def test_openapi_says_which_routes_take_the_bearer_token_and_that_503s_carry_retry_after() -> None:
    """Session 34's operator test: the document had no securitySchemes (bearer auth was invisible to a
    generated client) and declared no Retry-After on its 503s."""
    for chosen, reads in ((Settings(), False), (Settings(read_auth=True, api_token="t0k"), True)):
        with TestClient(app=create_app(settings=chosen)) as client:
            document = client.get("/schema/openapi.json", headers={"authorization": "Bearer t0k"}).json()
        assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        secured = {
            (method, path)
            for path, item in document["paths"].items()
            for method, operation in item.items()
            if operation.get("security") == [{"bearer": []}]
        }
        writes = {("post", "/profiles"), ("put", "/fleets/{name}"), ("post", "/fleets/{name}/replan")}
        assert writes <= secured
        assert (("post", "/plan") in secured) == reads  # reads take it only under FLEETPLAN_READ_AUTH
        assert ("get", "/health") not in secured
        assert "Retry-After" in document["paths"]["/plan"]["post"]["responses"]["503"]["headers"]


def test_head_health_answers_200_without_a_token() -> None:
    """Load balancers often check with HEAD; it was a 405 (session 34's operator test), read as down."""
    with TestClient(app=create_app(settings=Settings(read_auth=True, api_token="t0k"))) as client:
        answer = client.head("/health")
        assert answer.status_code == 200
        assert answer.content == b""
        assert client.get("/fleets").status_code == 401  # the rest still takes the token
