"""The OpenAPI document at /schema/openapi.json states what this server's validation enforces.

Litestar writes the paths, parameters and responses; its schemas of msgspec Structs lose rules (a nullable
field's bounds, `additionalProperties: false`), so every Struct component is replaced by
models.jsonschema's (msgspec's own schema plus the cross-field rules JSON Schema can state), and this
server's caps are written in (`maxItems` of devices, workloads, links and profile rows; the largest and
smallest `time_limit_s`, and `time_limit_s` required when the cap is below its default). docs/api.md
lists the rules no schema can state.
"""

import copy
import re
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin

from fleetplan.api.auth import OPEN_PATHS, is_write
from fleetplan.api.settings import Settings
from fleetplan.models import jsonschema
from fleetplan.models.plan import Options


def _structs() -> dict[str, type[msgspec.Struct]]:
    """Every fleetplan Struct by class name (the name Litestar gives its component)."""
    found: dict[str, type[msgspec.Struct]] = {}
    pending = list(msgspec.Struct.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("fleetplan."):
            found[cls.__name__] = cls
    return found


def _non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of a nullable property (anyOf[X, null]), else the property itself."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") != "null":
            return branch  # type: ignore[no-any-return]
    return schema


def apply_caps(schemas: dict[str, Any], settings: Settings) -> None:
    """Write the server's per-request caps (fleetplan/api/service.py checks them: 422) into the schemas."""
    request = schemas.get("PlanRequest")
    if request is not None:
        props = request["properties"]
        props["devices"]["maxItems"] = settings.max_devices
        props["workloads"]["maxItems"] = settings.max_workloads
        props["links"]["maxItems"] = settings.max_links
    if "ProfilesSpec" in schemas:
        _non_null(schemas["ProfilesSpec"]["properties"]["rows"])["maxItems"] = settings.max_profile_rows
    if "ProfileUpload" in schemas:
        schemas["ProfileUpload"]["properties"]["rows"]["maxItems"] = settings.max_profile_rows
    options = schemas.get("Options")
    if options is not None:
        limit = options["properties"]["time_limit_s"]
        limit["maximum"] = min(limit.get("maximum", settings.max_time_limit_s), settings.max_time_limit_s)
        if settings.min_time_limit_s > 0:
            limit.pop("exclusiveMinimum", None)
            limit["minimum"] = settings.min_time_limit_s
        if Options().time_limit_s > settings.max_time_limit_s:
            # the default is over this server's cap: a request must give its own time limit
            limit.pop("default", None)
            options["required"] = sorted({*options.get("required", []), "time_limit_s"})
            options.pop("default", None)
            if request is not None:
                request["required"] = sorted({*request["required"], "options"})
                request["properties"]["options"].pop("default", None)


def _integer_bounds(document: dict[str, Any]) -> None:
    """Litestar writes an integer parameter's bounds as floats (500.0): write them as integers."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                schema = parameter.get("schema", {})
                if schema.get("type") == "integer":
                    for key in ("minimum", "maximum"):
                        if isinstance(schema.get(key), float) and schema[key].is_integer():
                            schema[key] = int(schema[key])


PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
# what POST /whatif answers besides JSON: `Accept: text/csv`, or `?plot=` as SVG or PNG
WHATIF_MEDIA = {
    "text/csv": {"schema": {"type": "string", "description": "One row per point (whatif.to_csv)."}},
    "image/svg+xml": {"schema": {"type": "string", "description": "The picture `?plot=` names."}},
    "image/png": {"schema": {"type": "string", "format": "binary", "description": "The same, as PNG."}},
}


RETRY_AFTER = {
    "description": "Seconds to wait before trying again (a busy server, a deadline, a shutdown)",
    "schema": {"type": "integer", "minimum": 0},
}


def _responses(document: dict[str, Any], settings: Settings, writes: frozenset[tuple[str, str]]) -> None:
    """What Litestar's declarations cannot say: every error is a Problem (its own 400 for a bad path
    parameter was declared as application/json), POST /whatif also answers CSV and pictures, with
    FLEETPLAN_READ_AUTH every read but /health may answer 401; the bearer scheme on the routes that take the
    token, and Retry-After on every 503."""
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            for status, response in responses.items():
                if status[:1] in "45" and set(response.get("content", {})) != set(PROBLEM):
                    response["content"] = copy.deepcopy(PROBLEM)
            if path == "/whatif" and method == "post" and "200" in responses:
                responses["200"].setdefault("content", {}).update(copy.deepcopy(WHATIF_MEDIA))
            if settings.read_auth and method == "get" and path not in OPEN_PATHS and "401" not in responses:
                responses["401"] = {
                    "description": "Missing or invalid bearer token",
                    "content": copy.deepcopy(PROBLEM),
                }
            needs = (path, method) in writes or (settings.read_auth and path not in OPEN_PATHS)
            if needs:  # the routes that take the token: say how it is given (anonymous writes: or none)
                anonymous = (
                    (path, method) in writes and settings.allow_anonymous_writes and not settings.api_token
                )
                operation["security"] = [{}, {"bearer": []}] if anonymous else [{"bearer": []}]
            if "503" in responses:
                responses["503"].setdefault("headers", {})["Retry-After"] = copy.deepcopy(RETRY_AFTER)
    document.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "FLEETPLAN_API_TOKEN, as `Authorization: Bearer <token>` (docs/api.md)",
    }


def refine(
    document: dict[str, Any], settings: Settings, writes: frozenset[tuple[str, str]] = frozenset()
) -> dict[str, Any]:
    """`document` (Litestar's) with every fleetplan Struct's schema replaced, the caps written in, and
    the responses Litestar cannot declare (_responses)."""
    document = copy.deepcopy(document)
    _integer_bounds(document)
    _responses(document, settings, writes)
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    structs = _structs()
    wire = [structs[name] for name in sorted(schemas) if name in structs]
    schemas.update(jsonschema.components(wire))
    apply_caps(schemas, settings)
    _answers_complete(document, schemas)
    return document


def _refs(node: Any) -> set[str]:
    """Component names `node` refers to ($ref), at any depth."""
    if isinstance(node, dict):
        found = {node["$ref"].rpartition("/")[2]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _answers_complete(document: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Every property of a component only the server writes (reachable from no request body or parameter)
    is `required`: msgspec encodes every field, defaults included, so an answer always has them all, and a
    client generated from the schema should not see `Point.binding` or `DeviceUse.bought` as optional."""
    taken: set[str] = set()
    pending = set()
    for item in document.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict):
                pending |= _refs(operation.get("requestBody", {})) | _refs(operation.get("parameters", []))
    while pending:
        name = pending.pop()
        if name not in taken and name in schemas:
            taken.add(name)
            pending |= _refs(schemas[name])
    for name, schema in schemas.items():
        if name not in taken and name != "Problem" and "properties" in schema:
            schema["required"] = list(schema["properties"])


class ContractJson(JsonRenderPlugin):
    """Serves /schema/openapi.json refined (made once, on the first request)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self._rendered: bytes | None = None

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:  # type: ignore[type-arg]
        if self._rendered is None:
            writes = write_operations(request.app)
            self._rendered = self.render_json(request, refine(openapi_schema, self.settings, writes))
        return self._rendered


def write_operations(app: Any) -> frozenset[tuple[str, str]]:
    """(path, lower-case method) of every route marked as a write (auth.is_write): those need the token."""
    return frozenset(
        (
            re.sub(r"\{(\w+):[^}]+\}", r"{\1}", route.path),
            method.lower(),
        )  # "/fleets/{name:str}" as OpenAPI writes it
        for route in app.routes
        for handler in getattr(route, "route_handlers", ())
        if is_write(handler)
        for method in handler.http_methods
    )


__all__ = ["ContractJson", "apply_caps", "refine"]
