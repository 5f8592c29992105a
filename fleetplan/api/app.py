"""The HTTP service: `create_app()` wires the routes, the error mapping and the profile store.

POST /plan decodes the body with models.codec (the one decoding door, the same as the CLI's and the
fixtures'), runs solver.plan in a worker thread under a deadline, and answers the Plan. The body is
declared as `data: PlanRequest` so that the OpenAPI document shows the contract; `CodecBody` is the
Litestar DTO that makes that declaration decode through models.codec instead of Litestar's own
conversion, which is lax (it takes "4" for an int) and reports every error at the key "data".
"""

import os
from collections.abc import Generator
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any

import anyio
import anyio.to_thread
import msgspec
from litestar import Litestar, Request, get, post
from litestar.datastructures import State
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Reference, Schema
from litestar.params import Body, Parameter, QueryParameter
from litestar.typing import FieldDefinition

from fleetplan import __version__
from fleetplan.api.errors import PROBLEM_JSON, problem_response
from fleetplan.api.schemas import Health, Problem, ProfileSetSummary
from fleetplan.models.codec import convert, decode, decode_request
from fleetplan.models.errors import InputError, ProfileMissing, SolverFailure
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.profile import ProfileSetManifest, ProfileUpload
from fleetplan.profiler.store import ProfileStore
from fleetplan.solver import plan as solve

VERSION = __version__


def solve_deadline_s(request: PlanRequest) -> float:
    """How long POST /plan waits for solver.plan: HiGHS overshoots its time limit by 5-20%, and the
    baselines and verification run after it, so the limit gets 50% plus 2 s of slack."""
    return request.options.time_limit_s * 1.5 + 2.0


class _CodecDTO:
    """No transfer model is generated: the Struct is both the wire type and the domain type; decoding is
    models.codec's (subclasses say which type)."""

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[DTOFieldDefinition, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: Any = None
    ) -> None:
        """Nothing to generate: decoding is models.codec's."""

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any
    ) -> Reference | Schema:
        return schema_creator.for_field_definition(field_definition)  # type: ignore[no-any-return]


class CodecBody(_CodecDTO, AbstractDTO[PlanRequest]):
    """Decode the request body with models.codec.decode_request; document it as PlanRequest.

    Litestar calls `decode_bytes` with the raw body; errors are models.errors.InputError, which
    fleetplan/api/errors.py maps like every other planner error.
    """

    def decode_bytes(self, value: bytes) -> PlanRequest:
        return decode_request(value)

    def decode_builtins(self, value: dict[str, Any]) -> PlanRequest:
        return convert(value, PlanRequest)


class UploadBody(_CodecDTO, AbstractDTO[ProfileUpload]):
    """Decode a POST /profiles body with models.codec.decode (errors name the field: "rows[3].tp")."""

    def decode_bytes(self, value: bytes) -> ProfileUpload:
        return decode(value, ProfileUpload)

    def decode_builtins(self, value: dict[str, Any]) -> ProfileUpload:
        return convert(value, ProfileUpload)


def _problems(*statuses: int) -> dict[int, ResponseSpec]:
    described = {
        400: "The body does not decode or breaks a rule; `field` names the offending input.",
        409: "A profile set of that name exists; send ?replace=true to replace it.",
        415: "The body is not declared as JSON (content-type application/json or a +json type).",
        422: "A profile set, or profile rows the request needs, do not exist.",
        500: "A planner bug (a plan failed verification, or an unexpected error); logged.",
        503: "The solver gave no plan within the time limit (POST /plan), or no writable profile store is "
        "configured (POST /profiles).",
    }
    return {
        status: ResponseSpec(data_container=Problem, description=described[status], media_type=PROBLEM_JSON)
        for status in statuses
    }


@post(
    "/plan",
    status_code=200,
    dto=CodecBody,
    return_dto=None,
    summary="Plan a fleet",
    description="Decode a PlanRequest, solve the placement MILP, verify the plan, and return it.",
    responses=_problems(400, 415, 422, 500, 503),
    tags=["planning"],
)
async def post_plan(
    data: Annotated[PlanRequest, Body(media_type=RequestEncodingType.JSON)], state: State
) -> Plan:
    store: ProfileStore = state.store
    deadline = solve_deadline_s(data)
    with anyio.move_on_after(deadline) as scope:
        plan = await anyio.to_thread.run_sync(
            partial(_solve, data, store), abandon_on_cancel=True, limiter=state.solve_limiter
        )
    if scope.cancelled_caught:
        msg = (
            f"no plan within {deadline:g} s (time_limit_s={data.options.time_limit_s:g} plus slack; "
            "the solver overran or the server is busy); retry, or lower time_limit_s"
        )
        raise SolverFailure(msg, field="options.time_limit_s")
    return plan


def _solve(request: PlanRequest, store: ProfileStore) -> Plan:
    """What the worker thread runs (a seam the tests replace to simulate hangs and bugs)."""
    return solve(request, store)


@get("/profiles", sync_to_thread=True, summary="List profile sets", tags=["profiles"])
def list_profiles(state: State) -> list[ProfileSetSummary]:
    store: ProfileStore = state.store
    summaries = []
    for name in store.names():
        manifest = store.manifest(name)
        summaries.append(
            ProfileSetSummary(
                name=name, description=manifest.description, rows=manifest.rows, sha256=manifest.sha256
            )
        )
    return summaries


@get(
    "/profiles/{name:str}",
    sync_to_thread=True,
    summary="One profile set's manifest",
    responses={404: ResponseSpec(data_container=Problem, description="No such set", media_type=PROBLEM_JSON)},
    tags=["profiles"],
)
def get_profile(
    name: Annotated[str, Parameter(description="A set's name, as GET /profiles lists it")], state: State
) -> ProfileSetManifest:
    store: ProfileStore = state.store
    if name not in store.names():
        raise NotFoundException(f"unknown profile set {name!r}; known sets: {store.names()}")
    return store.manifest(name)


@post(
    "/profiles",
    status_code=201,
    dto=UploadBody,
    return_dto=None,
    sync_to_thread=True,
    summary="Upload a profile set",
    description=(
        "Validate a ProfileUpload (types, then the profile-table checks) and store it atomically in the "
        "writable profile store; answers the stored manifest. An existing name is refused (409) unless "
        "`replace=true`, and even then is replaced only after validation succeeds."
    ),
    responses=_problems(400, 409, 415, 503),
    tags=["profiles"],
)
def post_profiles(
    data: Annotated[ProfileUpload, Body(media_type=RequestEncodingType.JSON)],
    state: State,
    replace: Annotated[bool, QueryParameter(description="Replace an existing set of that name")] = False,
) -> ProfileSetManifest:
    store: ProfileStore = state.store
    return upload_profile_set(store, data, replace=replace)


def upload_profile_set(store: ProfileStore, upload: ProfileUpload, *, replace: bool) -> ProfileSetManifest:
    """Check the rows as a profile table (errors become 400s naming `rows` and the bad row numbers, which
    are the upload's own indices) and save the set; nothing is written unless every check passes."""
    import pandas as pd

    from fleetplan.profiler.tables import check_rows_have_latencies

    frame = pd.DataFrame(msgspec.to_builtins(upload.rows))
    manifest = ProfileSetManifest(
        name=upload.name,
        description=upload.description,
        sha256="",
        rows=0,
        generator="POST /profiles",
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        sources=upload.sources,
    )
    try:
        check_rows_have_latencies(frame)
        return store.save(upload.name, frame, manifest, replace=replace)
    except ProfileMissing as error:  # a table check: the upload's rows are at fault, so a 400
        raise InputError(error.message, field="rows") from error


def require_json_body(request: Request) -> None:
    """A body must say it is JSON (`application/json`, or any `+json` type): `text/plain`, a form or no
    content-type is refused with 415 before decoding. A web page may send those three cross-site without a
    CORS preflight; refusing them keeps a browser on another origin from posting plans or profile sets to
    a local server."""
    if request.method not in {"POST", "PUT", "PATCH"}:
        return
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    shown = media or "none"
    raise HTTPException(status_code=415, detail=f"content-type: {shown}; send the body as application/json")


@get("/health", summary="Liveness and version", tags=["service"])
async def health() -> Health:
    return Health(status="ok", version=VERSION)


def create_app(
    store: ProfileStore | None = None,
    *,
    max_concurrent_solves: int | None = None,
    database_url: str | None = None,
) -> Litestar:
    """The service. `store` defaults to the bundled sets plus $FLEETPLAN_PROFILE_STORE, which is also
    where POST /profiles writes (`store.writable`; without one, uploads answer 503).

    `max_concurrent_solves` (default: the CPU count) bounds the worker threads running solver.plan;
    a request waiting for one counts against its deadline. `database_url`: the store of fleets, plans and
    runs (fleetplan/api/fleets.py; default $FLEETPLAN_DATABASE_URL, else the user's SQLite file).
    """
    from fleetplan.api.fleets import StoreHandle, fleets_router, open_store_at_startup
    from fleetplan.api.whatif import post_whatif  # it builds on this module's DTO base

    limit = max_concurrent_solves or os.cpu_count() or 1

    def on_startup(app: Litestar) -> None:
        # a CapacityLimiter binds to the running event loop, so it is made at startup
        app.state.solve_limiter = anyio.CapacityLimiter(limit)

    return Litestar(
        route_handlers=[
            post_plan,
            post_whatif,
            post_profiles,
            list_profiles,
            get_profile,
            health,
            fleets_router,
        ],
        state=State({"store": store or ProfileStore(), "fleet_store": StoreHandle(database_url)}),
        on_startup=[on_startup, open_store_at_startup],
        before_request=require_json_body,
        exception_handlers={Exception: problem_response},
        openapi_config=OpenAPIConfig(
            title="fleetplan",
            version=VERSION,
            path="/schema",
            description="Placement planner for LLM serving fleets (docs/api.md).",
        ),
        debug=False,
    )


__all__ = [
    "CodecBody",
    "UploadBody",
    "create_app",
    "require_json_body",
    "solve_deadline_s",
    "upload_profile_set",
]
