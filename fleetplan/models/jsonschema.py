"""The JSON Schema of the wire types: what decoding enforces, stated so that clients and fuzzers can see it.

`components(types)` is msgspec's own schema of the Structs (every per-field rule the decoder applies: types,
ranges, lengths, patterns, enums, required fields, `additionalProperties: false` for `forbid_unknown_fields`)
plus the cross-field rules of the Structs' `__post_init__` that JSON Schema can say (`CROSS_FIELD`). The rules
it cannot say are listed in `NOT_IN_SCHEMA` (docs/api.md): a body may satisfy the schema and still get a 400
naming the field.
"""

from typing import Any

import msgspec

REF = "#/components/schemas/{name}"

_FIGURE = {"type": "number"}  # a non-null figure (its range is ProfileRow's own)


def _one_figure(metric: str) -> dict[str, Any]:
    """At least one of the metric's percentile columns is given and not null."""
    return {
        "anyOf": [
            {"required": [f"{metric}_ms_p{q}"], "properties": {f"{metric}_ms_p{q}": _FIGURE}}
            for q in (50, 90, 99)
        ]
    }


# Struct name -> schema keywords added to its msgspec schema (they hold together with it: allOf semantics).
CROSS_FIELD: dict[str, dict[str, Any]] = {
    # ProfilesSpec.__post_init__: exactly one of `set` and `rows` (null counts as absent)
    "ProfilesSpec": {
        "oneOf": [
            {"required": ["set"], "properties": {"set": {"type": "string"}, "rows": {"type": "null"}}},
            {"required": ["rows"], "properties": {"rows": {"type": "array"}, "set": {"type": "null"}}},
        ]
    },
    # ModelSpec.__post_init__: kv_bytes_per_token, or the three fields it is derived from
    "ModelSpec": {
        "anyOf": [
            {"required": ["kv_bytes_per_token"], "properties": {"kv_bytes_per_token": {"type": "integer"}}},
            {
                "required": ["layers", "kv_heads", "head_dim"],
                "properties": {k: {"type": "integer"} for k in ("layers", "kv_heads", "head_dim")},
            },
        ]
    },
    # Options.__post_init__: not both route kinds switched off
    "Options": {
        "not": {
            "required": ["allow_colocated", "allow_disaggregated"],
            "properties": {"allow_colocated": {"const": False}, "allow_disaggregated": {"const": False}},
        }
    },
    # Axis.__post_init__: `values`, or all of start/stop/num (null counts as absent); a request-wide parameter
    # or a device parameter with its device
    "Axis": {
        "properties": {
            "param": {"pattern": r"^(budget_per_hour|demand_scale|slo_scale|(count|max_count|price):.+)$"}
        },
        "oneOf": [
            {
                "required": ["values"],
                "properties": {
                    "values": {"type": "array", "minItems": 1, "items": {"minimum": 0}},
                    "start": {"type": "null"},
                    "stop": {"type": "null"},
                    "num": {"type": "null"},
                },
            },
            {
                "required": ["start", "stop", "num"],
                "properties": {
                    "values": {"type": "null"},
                    "start": {"type": "number", "minimum": 0},
                    "stop": {"type": "number", "minimum": 0},
                    "num": {"type": "integer"},
                },
            },
        ],
    },
    # ProfileStore: an uploaded set's name is one directory name (no '/')
    "ProfileUpload": {"properties": {"name": {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._:+-]*$"}}},
    # WhatIfRequest.__post_init__: one or two axes
    "WhatIfRequest": {"properties": {"axes": {"minItems": 1, "maxItems": 2}}},
}

# The rules a JSON Schema cannot state (they compare values across fields or need the server's data); a body
# that breaks one gets a 400 (or a 422 for profile data) naming the field.
NOT_IN_SCHEMA = (
    "names unique within devices, workloads and models",
    "links name known devices, each (source, target) pair once",
    "every workload's model is in the catalog or in the request's models",
    "options.baseline_device names a device of the request",
    "a device's max_count >= its count",
    "the profile set exists and, for inline rows, has the percentile columns the SLOs use (422)",
    "what-if: demand_scale and slo_scale values > 0, count values whole numbers",
    "what-if: axes differ, name devices of the base request, at most 2,000 grid points, max_count >= count",
    "an upload's name is not a bundled set's (409)",
)


def _merge(schema: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`schema` with `extra`'s keywords; `properties` are merged per property (keywords added)."""
    merged = dict(schema)
    for key, value in extra.items():
        if key == "properties":
            properties = dict(merged.get("properties", {}))
            for name, rule in value.items():
                base = properties.get(name, {})
                # a nullable property is anyOf[its schema, null]: the rule is for the non-null branch
                if "anyOf" in base and rule.keys() <= {"pattern", "minItems", "maxItems", "maximum"}:
                    branches = [dict(b, **rule) if b.get("type") != "null" else b for b in base["anyOf"]]
                    properties[name] = {**base, "anyOf": branches}
                else:
                    properties[name] = {**base, **rule}
            merged["properties"] = properties
        else:
            merged[key] = value
    return merged


def components(types: list[type]) -> dict[str, dict[str, Any]]:
    """The component schemas of `types` and every Struct they contain, keyed by class name."""
    _, found = msgspec.json.schema_components(types, ref_template=REF)
    for name, extra in CROSS_FIELD.items():
        if name in found:
            found[name] = _merge(found[name], extra)
    upload = found.get("ProfileUpload")
    if upload is not None:
        # an upload's rows are checked as a profile table: each row has a TTFT and a TBT figure
        rows = dict(upload["properties"]["rows"])
        rows["items"] = {"allOf": [rows["items"], _one_figure("ttft"), _one_figure("tbt")]}
        found["ProfileUpload"] = _merge(upload, {"properties": {"rows": rows}})
    return found


__all__ = ["CROSS_FIELD", "NOT_IN_SCHEMA", "REF", "components"]
