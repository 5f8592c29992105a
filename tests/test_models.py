"""Every edge decodes through models.codec: bad input raises InputError naming the field and the reason."""

import json

import pytest

from fleetplan.models.codec import decode_request, encode
from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest


def body(**changes) -> dict:
    base = {
        "devices": [{"name": "gpu", "count": 2, "network_gbps": 25}, {"name": "acc", "count": 4}],
        "workloads": [
            {
                "name": "a",
                "model": "llama-3.2-1b",
                "prompt_tokens": 512,
                "output_tokens": 64,
                "rate_rps": 3,
                "slo": {"ttft_ms": 300, "tbt_ms": 40},
            },
        ],
    }
    base.update(changes)
    return base


def error_of(data: dict | str) -> InputError:
    raw = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(InputError) as caught:
        decode_request(raw)
    return caught.value


def test_defaults_fill_a_minimal_request():
    request = decode_request(json.dumps(body()))
    assert request.profiles.set == "paper"
    assert request.options.objective == "max_goodput"
    assert request.model_specs()["llama-3.2-1b"].kv_bytes == 32768


def test_round_trip_is_lossless():
    request = decode_request(json.dumps(body(links=[{"source": "gpu", "target": "acc", "gbps": 5}])))
    assert decode_request(encode(request)) == request


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"devices": [{"name": "gpu", "count": -1}]}, "devices[0].count", ">= 0"),
        ({"devices": [{"name": "gpu", "count": 1}, {"name": "gpu", "count": 2}]}, "devices", "duplicate"),
        (
            {"links": [{"source": "gpu", "target": "tpu", "gbps": 1}]},
            "links[0].target",
            "unknown device 'tpu'",
        ),
        ({"options": {"max_utilization": 1.5}}, "options.max_utilization", "<= 1"),
        ({"options": {"time_limit_s": 0}}, "options.time_limit_s", "> 0.0"),
        ({"options": {"time_limit_s": 601}}, "options.time_limit_s", "<= 600"),
        ({"options": {"baseline_device": "tpu"}}, "options.baseline_device", "unknown device"),
        ({"options": {"batch_sizes": []}}, "options.batch_sizes", "empty; give at least one item"),
        ({"models": [{"name": "x"}]}, "models[0].kv_bytes_per_token", "needs it"),
        ({"profiles": {"set": "paper", "rows": []}}, "profiles.rows", "empty; give at least one profile row"),
        ({"profiles": {}}, "profiles", "exactly one"),
        ({"workloads": []}, "workloads", "empty; give at least one workload class"),
        ({"kv_budget_gbps": -1}, "kv_budget_gbps", ">= 0"),
    ],
)
def test_bad_fields_are_named(changes, field, fragment):
    error = error_of(body(**changes))
    assert error.field == field
    assert fragment in error.message


def test_unknown_model_and_percentile_and_misspelt_field():
    workload = body()["workloads"][0]
    assert error_of(body(workloads=[{**workload, "model": "gpt-9"}])).field == "workloads[0].model"
    wrong_q = {**workload, "slo": {"ttft_ms": 1, "tbt_ms": 1, "percentile": 95}}
    wrong = error_of(body(workloads=[wrong_q]))
    assert (wrong.field, wrong.message) == (
        "workloads[0].slo.percentile",
        "Invalid enum value 95; one of 50, 90, 99",
    )
    misspelt = {**workload, "rate_rpss": 3}
    error = error_of(body(workloads=[misspelt]))
    assert error.field == "workloads[0].rate_rpss"  # the unknown field itself, not its object
    # and what its object takes, the likeliest meant first (a new user had to read the OpenAPI schema)
    assert error.message == (
        "unknown field; did you mean 'rate_rps'? "
        "(fields: name, model, prompt_tokens, output_tokens, rate_rps, slo, weight)"
    )


def test_nan_and_infinity_name_their_field():
    raw = json.dumps(body(devices=[{"name": "gpu", "count": 2, "network_gbps": float("nan")}]))
    assert error_of(raw).field == "devices[0].network_gbps"
    huge = json.dumps(body()).replace('"rate_rps": 3', '"rate_rps": 1e999')
    assert error_of(huge).field == "workloads[0].rate_rps"


def test_malformed_json_is_an_input_error():
    assert "malformed JSON" in error_of("{not json").message
    # where it broke as an editor shows it, msgspec's "JSON is malformed" not repeated
    trailing = error_of('{\n  "devices": [{"name": "x",}]}')
    assert trailing.message == "malformed JSON: trailing comma in object at line 2, column 28 (byte 29)"


def test_request_type_is_frozen():
    request = decode_request(json.dumps(body()))
    with pytest.raises(AttributeError):
        request.devices = []  # type: ignore[misc]
    assert isinstance(request, PlanRequest)
