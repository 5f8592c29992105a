"""schemathesis against the app's own OpenAPI document, in process (ASGI), over every operation; the schema
states what validation enforces; hypothesis garbage through the decoders.

The bounded run is bench/fuzz.py's harness with a few examples per operation (the bench runs >= 1,000
requests): never a 500, every status documented for its operation, every body conforming to its schema,
and at least a third of the generated POST /plan requests answered 2xx (they reach the solver). The
PlanRequest bodies get `repair_plan_request` (the cross-field references no JSON Schema can state);
docs/api.md ("The schema states what validation enforces") says which rules those are.
"""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient

from fleetplan.api.app import create_app
from fleetplan.api.settings import Settings
from fleetplan.models.codec import decode, decode_request
from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest
from fleetplan.models.profile import ProfileUpload
from fleetplan.profiler.store import ProfileStore, bundled_root

pytest.importorskip("schemathesis", reason="the test extra (make test installs it)")
from bench.fuzz import repair_plan_request, run, summarize  # noqa: E402

EXAMPLES_PER_OPERATION = 12
PAPER = Path(__file__).resolve().parent.parent / "fleetplan" / "fixtures" / "requests" / "paper.json"


def test_every_operation_conforms_never_500s_and_plans_reach_the_solver() -> None:
    per_operation, seconds = run(EXAMPLES_PER_OPERATION)
    summary = summarize(per_operation)
    assert len(per_operation) >= 16, sorted(per_operation)  # every operation of the document
    assert summary["server_errors_500"] == 0, {k: t.statuses for k, t in per_operation.items()}
    violations = [v for t in per_operation.values() for v in t.violations]
    assert not violations, violations
    assert summary["plan_requests"] >= EXAMPLES_PER_OPERATION // 2
    refusals = per_operation["POST /plan"].refusals
    assert summary["plan_2xx"] * 3 >= summary["plan_requests"], (summary, dict(refusals))
    for tally in per_operation.values():  # a 503 is a busy server or a time limit, with Retry-After
        assert set(tally.statuses) <= {200, 201, 204, 400, 401, 403, 404, 409, 413, 415, 422, 503}


def test_repair_keeps_a_consistent_request_as_it_is() -> None:
    body = json.loads(PAPER.read_text())
    assert repair_plan_request(body) == body


def test_repair_makes_cross_field_references_consistent() -> None:
    body = json.loads(PAPER.read_text())
    body["devices"].append(dict(body["devices"][0], max_count=1))  # a duplicate name, max_count < count
    body["links"] = [{"source": "nowhere", "target": "inf2", "gbps": 1.0}]
    body["workloads"][0]["model"] = "not-a-model"
    body["options"] = {"baseline_device": "nowhere", "time_limit_s": 5}
    with pytest.raises(InputError):
        decode_request(json.dumps(body))
    repaired = repair_plan_request(body)
    request = decode_request(json.dumps(repaired))  # every cross-field rule holds now
    assert [d.name for d in request.devices] == ["a6000ada", "inf2", "tpu-v5e", "a6000ada-2"]
    assert request.devices[3].max_count == request.devices[3].count
    assert request.links[0].source in {d.name for d in request.devices}
    assert request.workloads[0].model in {"llama-3.2-1b", "llama-3.2-3b", "mistral-7b"}  # in the paper set
    assert [w.rate_rps for w in request.workloads] == [w["rate_rps"] for w in body["workloads"]]


def _schema(settings: Settings) -> dict:
    store = ProfileStore([bundled_root()])
    with TestClient(create_app(store, settings=settings)) as client:
        return client.get("/schema/openapi.json").json()["components"]["schemas"]


def test_the_schema_states_the_rules_and_this_servers_caps() -> None:
    schemas = _schema(Settings(max_devices=7, max_time_limit_s=5, min_time_limit_s=1))
    request, options = schemas["PlanRequest"], schemas["Options"]
    assert request["additionalProperties"] is False  # unknown fields are refused
    assert request["properties"]["devices"]["maxItems"] == 7
    limit = options["properties"]["time_limit_s"]
    assert (limit["minimum"], limit["maximum"]) == (1, 5)
    assert "time_limit_s" in options["required"]  # the default 10 s is over this server's cap
    assert "options" in request["required"]
    nullable = schemas["Device"]["properties"]["network_gbps"]["anyOf"][0]
    assert nullable["exclusiveMinimum"] == 0  # a nullable field keeps its bounds
    assert "oneOf" in schemas["ProfilesSpec"]  # set xor rows
    assert schemas["Workload"]["properties"]["weight"]["exclusiveMinimum"] == 0
    defaults = _schema(Settings())["Options"]
    assert "time_limit_s" not in defaults.get("required", [])


def test_a_time_limit_below_the_servers_floor_is_422_naming_it() -> None:
    body = json.loads(PAPER.read_text())
    body["options"] = {"time_limit_s": 0.01}
    app = create_app(ProfileStore([bundled_root()]), settings=Settings(min_time_limit_s=0.5))
    with TestClient(app) as client:
        answer = client.post("/plan", json=body)
    assert answer.status_code == 422
    assert answer.json()["field"] == "options.time_limit_s"
    assert "min_time_limit_s=0.5 (FLEETPLAN_MIN_TIME_LIMIT_S)" in answer.json()["detail"]


def test_a_time_limit_the_solve_uses_up_is_a_plan_or_a_503_never_a_500() -> None:
    """paper.json under 13.94 $/h: its goodput MIP takes about 1 s, so a 1 s limit is used up and the
    window guard has no time left. That once raised ValueError inside plan() (Options refuses a limit of
    0 s): a 500 for every request whose MILP used its whole time limit. Now the time-limited plan, or,
    where what follows the solver runs past the request's wall-clock budget, the 503 problem that says
    so (a server floor of 0 s lets the limit through)."""
    body = json.loads(PAPER.read_text())
    body["options"] = {"time_limit_s": 1.0, "budget_per_hour": 13.94}
    app = create_app(ProfileStore([bundled_root()]), settings=Settings(min_time_limit_s=0.0))
    with TestClient(app) as client:
        answer = client.post("/plan", json=body)
    if answer.status_code == 503:
        assert answer.json()["type"] == "urn:fleetplan:problem:deadline-exceeded", answer.text
        assert answer.json()["field"] == "options.time_limit_s"
    else:
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] in ("optimal", "feasible")
        assert answer.json()["cost_per_hour"] <= 13.94 + 1e-9


def test_an_integer_field_takes_a_whole_float_and_refuses_a_fraction_or_a_string() -> None:
    body = json.loads(PAPER.read_text())
    body["devices"][0]["count"] = 4.0  # JSON Schema's integer: 4.0 is 4
    assert decode_request(json.dumps(body)).devices[0].count == 4
    for value, got in ((4.5, "float"), ("4", "str")):
        body["devices"][0]["count"] = value
        with pytest.raises(InputError) as refused:
            decode_request(json.dumps(body))
        assert refused.value.field == "devices[0].count"
        assert f"got `{got}`" in refused.value.message


_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    ).map(lambda v: json.dumps(v).encode()),
)


@given(_GARBAGE)
@settings(max_examples=150, deadline=None)
def test_decoders_refuse_garbage_with_an_input_error(data: bytes) -> None:
    for type_ in (PlanRequest, ProfileUpload):
        reason = "decoded"
        try:
            decode(data, type_)
        except InputError as error:  # the only exception a decoder may raise
            reason = str(error)
        assert reason  # a reason, never an empty message
