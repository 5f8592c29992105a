"""The HTTP service: `create_app()` wires the routes, the error mapping and the profile store.

POST /plan decodes the body with models.codec (the one decoding door, the same as the CLI's and the
fixtures'), runs solver.plan in a warm worker process under a deadline (fleetplan/api/workers.py), and
answers the Plan. The body is declared as `data: PlanRequest` so that the OpenAPI document shows the
contract; `CodecBody` is the Litestar DTO that makes that declaration decode through models.codec instead
of Litestar's own conversion, which is lax (it takes "4" for an int) and reports every error at the key
"data".
"""

import logging
import time
from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from litestar import Litestar, Request, Response, Router, get, head, post, route
from litestar.datastructures import State
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.enums import HttpMethod, RequestEncodingType
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import RedocRenderPlugin
from litestar.openapi.spec import Reference, Schema
from litestar.params import Body, Parameter, QueryParameter
from litestar.typing import FieldDefinition

from fleetplan import __version__
from fleetplan.api.auth import auth_guard
from fleetplan.api.errors import PROBLEM_JSON, problem_response
from fleetplan.api.observe import ARRIVED_KEY, Metrics, metrics_endpoint, request_middleware
from fleetplan.api.openapi import ContractJson
from fleetplan.api.schemas import Health, Problem, ProfileSetSummary
from fleetplan.api.service import check_plan_limits, check_upload_limits, upload_profile_set
from fleetplan.api.settings import Settings, load_settings
from fleetplan.api.workers import Solved, SolvePool, server_context
from fleetplan.models.codec import convert, decode, decode_request
from fleetplan.models.errors import ClientGone, DeadlineExceeded, NotFound, ServerBusy
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.profile import ProfileSetManifest, ProfileUpload
from fleetplan.profiler.store import ProfileStore, bundled_root

VERSION = __version__
LOG = logging.getLogger("fleetplan.api")
T = TypeVar("T")
# the work's deadline is this long before time_limit_s ends: after it the child is killed and reaped
# (a 5,000-class request's child holds ~1 GB to tear down) and the answer encoded and sent. Measured
# (bench/bounds.py, load average 8.8): the answer leaves 0.11-0.14 s after the deadline; 0.2 s keeps
# every answer within time_limit_s itself
SEND_RESERVE_S = 0.2


# A JSON body larger than this (bytes) is decoded in a worker thread (check_body).
OFF_LOOP_BYTES = 64 * 1024
# (body, value) that check_body decoded for this request's task; the DTO returns it for those very bytes
_decoded_early: ContextVar[tuple[bytes, Any] | None] = ContextVar("fleetplan_decoded_early", default=None)


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

    @staticmethod
    def decode_body(value: bytes) -> Any:
        """The body as the handler's type, by models.codec (each subclass names its decoder)."""
        raise NotImplementedError

    def decode_bytes(self, value: bytes) -> Any:
        """`decode_body(value)`, or what check_body already decoded from these very bytes off the loop."""
        early = _decoded_early.get()
        if early is not None and early[0] is value:
            return early[1]
        return self.decode_body(value)


class CodecBody(_CodecDTO, AbstractDTO[PlanRequest]):
    """Decode the request body with models.codec.decode_request; document it as PlanRequest.

    Litestar calls `decode_bytes` with the raw body (`decode_body`, from a thread where it is large:
    check_body); errors are models.errors.InputError, which
    fleetplan/api/errors.py maps like every other planner error.
    """

    @staticmethod
    def decode_body(value: bytes) -> PlanRequest:
        return decode_request(value)

    def decode_builtins(self, value: dict[str, Any]) -> PlanRequest:
        return convert(value, PlanRequest)


class UploadBody(_CodecDTO, AbstractDTO[ProfileUpload]):
    """Decode a POST /profiles body with models.codec.decode (errors name the field: "rows[3].tp")."""

    @staticmethod
    def decode_body(value: bytes) -> ProfileUpload:
        return decode(value, ProfileUpload)

    def decode_builtins(self, value: dict[str, Any]) -> ProfileUpload:
        return convert(value, ProfileUpload)


def _problems(*statuses: int) -> dict[int, ResponseSpec]:
    described = {
        400: "The body does not decode or breaks a rule; `field` names the offending input.",
        401: "A missing or invalid `Authorization: Bearer` token (writes, and reads under "
        "FLEETPLAN_READ_AUTH); the answer carries `WWW-Authenticate: Bearer`.",
        403: "Writes are disabled on this server (no API token configured, anonymous writes off).",
        406: "`Accept` names no form the route answers in (POST /whatif: JSON, CSV, or with ?plot= SVG "
        "or PNG).",
        404: "A stored fleet, plan or run of that name or id does not exist.",
        409: "A profile set of that name exists (send ?replace=true), or the name is a bundled set's.",
        413: "The body is larger than the server's cap (FLEETPLAN_MAX_BODY_BYTES).",
        415: "The body is not declared as JSON (content-type application/json or a +json type).",
        422: "The request is over one of the server's caps (`field` names it, `detail` names the setting), "
        "or a profile set, or profile rows the request needs, do not exist.",
        500: "A planner bug (a plan failed verification, or an unexpected error); logged.",
        503: "No plan within options.time_limit_s (the work was stopped), every solver slot is busy and the "
        "queue is full (both with `Retry-After`), no writable profile store is configured "
        "(POST /profiles), or the database of fleets is unreachable or not migrated.",
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
    description=(
        "Decode a PlanRequest, solve the placement MILP, verify the plan, and return it. "
        "`options.time_limit_s` bounds the whole request (queue wait included) in wall-clock time."
    ),
    responses=_problems(400, 401, 403, 413, 415, 422, 500, 503),
    tags=["planning"],
)
async def post_plan(
    data: Annotated[PlanRequest, Body(media_type=RequestEncodingType.JSON)], request: Request, state: State
) -> Response[Plan]:
    """The Plan; its `Server-Timing: plan;dur=<ms>` header is the time solver.plan took in the worker (the
    rest of the client's wall time is HTTP, decoding, the worker's pipe and encoding)."""
    arrived = request.scope.get("state", {}).get(ARRIVED_KEY) or time.monotonic()
    check_plan_limits(data, state.settings)
    at = arrived + data.options.time_limit_s - SEND_RESERVE_S
    plan, work_s = await plan_until(state, data, at, request)
    return Response(plan, headers={"Server-Timing": f"plan;dur={work_s * 1e3:.3f}"})


async def plan_until(state: State, data: PlanRequest, at: float, request: Request) -> Solved:
    """state.solves.run, cancelled (its worker killed) if the client disconnects first; counted."""
    solved = await counted_solve(state, "plan", request, lambda: state.solves.run(data, state.store, at))
    if solved is None:
        raise ClientGone("the client disconnected; its solve was stopped")
    metrics: Metrics = state.metrics
    plan: Plan = solved.result
    metrics.status.labels(plan.status).inc()
    if plan.mip_gap is not None:
        metrics.gap.observe(plan.mip_gap)
    return solved


async def counted_solve(
    state: State, kind: str, request: Request, work: Callable[[], Awaitable[T]]
) -> T | None:
    """until_disconnect(request, work) for work that holds a solve slot, counted in the metrics by `kind`
    (plan, whatif, replan): its wall time, its outcome, or its refusal (503 at once)."""
    metrics: Metrics = state.metrics
    began = time.monotonic()
    try:
        done = await until_disconnect(request, work)
    except ServerBusy:
        metrics.rejected.labels(kind).inc()
        raise
    except Exception as error:
        metrics.solve_seconds.labels(kind).observe(time.monotonic() - began)
        metrics.outcomes.labels(kind, "timeout" if isinstance(error, DeadlineExceeded) else "error").inc()
        raise
    metrics.solve_seconds.labels(kind).observe(time.monotonic() - began)
    metrics.outcomes.labels(kind, "disconnected" if done is None else "plan").inc()
    return done


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """`await work()`, cancelled if the client disconnects first (then None): work in a SolvePool child
    is killed by the cancellation. Its exception is raised as itself, not in an ExceptionGroup."""
    result: T | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_disconnect, request, group.cancel_scope)
        try:
            result = await work()
        except Exception as failed:
            error = failed
        group.cancel_scope.cancel()
    if error is not None:
        try:
            raise error
        finally:  # this frame -> error -> its traceback -> this frame: a cycle that kept every refused
            error = None  # request's decoded body alive until a rare full collection (RSS 0.5 -> 1.75 GB)
    return result


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """The body is read, so the next ASGI message is the client's disconnect (if it comes first)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


@route("/", http_method=[HttpMethod.OPTIONS], include_in_schema=False)
async def profiles_options() -> Response[None]:
    """OPTIONS /profiles, registered first: Litestar's own OPTIONS answer is made with the first handler
    registered on a path, so its Allow header would list only GET or only POST."""
    return Response(content=None, status_code=204, headers={"Allow": "GET, OPTIONS, POST"})


@get("/", sync_to_thread=True, summary="List profile sets", tags=["profiles"])
def list_profiles(state: State) -> list[ProfileSetSummary]:
    """Every readable set; a set whose manifest cannot be read is logged and left out (GET
    /profiles/{name} names its error), so that one damaged set does not fail the listing."""
    store: ProfileStore = state.store
    named, broken = store.manifests()
    for line in broken:
        LOG.warning("GET /profiles leaves out %s", line)
    return [
        ProfileSetSummary(name=name, description=m.description, rows=m.rows, sha256=m.sha256)
        for name, m in named
    ]


@get(
    "/{name:str}",
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
        raise NotFound(f"unknown profile set {name!r}; known sets: {store.names()}", field="name")
    return store.manifest(name)


@post(
    "/",
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
    responses=_problems(400, 401, 403, 409, 413, 415, 422, 503),
    tags=["profiles"],
    opt={"write": True},
)
def post_profiles(
    data: Annotated[ProfileUpload, Body(media_type=RequestEncodingType.JSON)],
    state: State,
    replace: Annotated[bool, QueryParameter(description="Replace an existing set of that name")] = False,
) -> ProfileSetManifest:
    check_upload_limits(data, state.settings)
    return upload_profile_set(state.store, data, replace=replace)


async def check_body(request: Request) -> None:
    """Before a handler decodes its body (Litestar's before_request, in the task that then runs the DTO).

    A body must say it is JSON (`application/json`, or any `+json` type): `text/plain`, a form or no
    content-type is refused with 415 before decoding. A web page may send those three cross-site without a
    CORS preflight; refusing them keeps a browser on another origin from posting plans or profile sets to
    a local server.

    A JSON body over OFF_LOOP_BYTES is decoded here, in a worker thread, by the handler's DTO
    (`_CodecDTO.decode_body`: ~210 ms for 8 MB of inline profile rows, of which the duplicate-key check,
    in Python, is two thirds), so that the event loop keeps answering other requests (/health among them)
    while such bodies arrive; the DTO then returns that value for these bytes. Reading and decoding here
    raise what the DTO would (413 over the cap, a client gone, a 400 naming the field)."""
    if request.method not in {"POST", "PUT", "PATCH"}:
        return
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        detail = f"content-type: {media or 'none'}; send the body as application/json"
        raise HTTPException(status_code=415, detail=detail)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) <= OFF_LOOP_BYTES:
        return
    dto = request.route_handler.resolve_data_dto()
    if not (isinstance(dto, type) and issubclass(dto, _CodecDTO)):
        return
    body = await request.body()
    if len(body) > OFF_LOOP_BYTES:
        _decoded_early.set((body, await anyio.to_thread.run_sync(dto.decode_body, body)))


@get("/health", summary="Liveness and version", tags=["service"])
async def health() -> Health:
    return Health(status="ok", version=VERSION)


@head("/health", summary="Liveness, without a body (load balancers' HEAD checks)", tags=["service"])
async def health_head() -> None:
    """HEAD /health: 200 with no body (it was a 405, which a HEAD health check reads as down)."""


def default_store(settings: Settings) -> ProfileStore:
    """The bundled sets plus the writable store of `settings.profile_store` (or $FLEETPLAN_PROFILE_STORE)."""
    if settings.profile_store:
        writable = Path(settings.profile_store)
        return ProfileStore([bundled_root(), writable], writable=writable)
    return ProfileStore()


def create_app(
    store: ProfileStore | None = None,
    *,
    settings: Settings | None = None,
    max_concurrent_solves: int | None = None,
    pool: SolvePool | None = None,
    database_url: str | None = None,
) -> Litestar:
    """The service. `settings` default to the environment's (fleetplan/api/settings.py); `store` to the
    bundled sets plus the settings' writable profile store, which is where POST /profiles writes (without
    one, uploads answer 503). `max_concurrent_solves` overrides the setting; `pool` replaces the solve
    pool (tests use one whose children fork from the test process). `database_url`: the store of fleets,
    plans and runs (fleetplan/api/fleets.py; default the settings', else the user's SQLite file).
    """
    from fleetplan.api.fleets import fleets_router, open_store_at_startup
    from fleetplan.api.whatif import post_whatif  # it builds on this module's DTO base

    settings = settings or load_settings()
    solves = pool or _solve_pool(settings, max_concurrent_solves)
    on_startup, on_shutdown = _pool_hooks(solves)
    app = Litestar(
        route_handlers=[
            post_plan,
            Router("/profiles", route_handlers=[profiles_options, list_profiles, post_profiles, get_profile]),
            health,
            health_head,
            metrics_endpoint,
            post_whatif,
            fleets_router,
        ],
        state=_app_state(store, settings, solves, database_url),
        on_startup=[on_startup, open_store_at_startup],
        on_shutdown=[on_shutdown],
        before_request=check_body,
        guards=[auth_guard],
        request_max_body_size=settings.max_body_bytes,
        exception_handlers={Exception: problem_response},
        openapi_config=_openapi_config(settings),
        debug=False,
    )
    # around Litestar's router and its exception handler rather than in `middleware=[...]`, which wraps
    # matched routes only: a 404 or 405 then had no access line, no metric and no X-Request-ID
    app.asgi_handler = request_middleware(app.asgi_handler)
    return app


def _solve_pool(settings: Settings, max_concurrent_solves: int | None) -> SolvePool:
    """A SolvePool of the settings' slots (or `max_concurrent_solves`), queue and Retry-After cap; a
    candidate build past its request's deadline may take as long again as the longest time limit."""
    slots = max_concurrent_solves or settings.max_concurrent_solves
    return SolvePool(
        slots=slots,
        queue=settings.max_queued_solves,
        context=server_context,
        max_retry_after_s=settings.keep_alive_s - 5,
        finish_limit_s=settings.max_time_limit_s,
    )


def _pool_hooks(
    solves: SolvePool,
) -> tuple[Callable[[Litestar], Awaitable[None]], Callable[[Litestar], None]]:
    """The app's startup hook (warm the pool's workers, off the loop) and shutdown hook (kill every solve)."""

    async def on_startup(app: Litestar) -> None:
        await anyio.to_thread.run_sync(solves.warm)

    def on_shutdown(app: Litestar) -> None:
        solves.kill_all()  # queued and running solves end now; their requests answer 503

    return on_startup, on_shutdown


def _app_state(
    store: ProfileStore | None, settings: Settings, solves: SolvePool, database_url: str | None
) -> State:
    """The handlers' shared state: profile store, settings, solve pool, metrics and the fleets' store."""
    from fleetplan.api.fleets import StoreHandle

    return State(
        {
            "store": store or default_store(settings),
            "settings": settings,
            "solves": solves,
            "metrics": Metrics(),
            "fleet_store": StoreHandle(database_url or settings.database_url),
        }
    )


def _openapi_config(settings: Settings) -> OpenAPIConfig:
    """The OpenAPI document at /schema, and with this server's rules at /schema/openapi.json."""
    return OpenAPIConfig(
        title="fleetplan",
        version=VERSION,
        path="/schema",
        description="Placement planner for LLM serving fleets (docs/api.md).",
        # /schema: the rendered document; /schema/openapi.json: the document with this server's rules
        render_plugins=[RedocRenderPlugin(), ContractJson(settings)],
    )


__all__ = [
    "CodecBody",
    "UploadBody",
    "create_app",
    "default_store",
    "check_body",
    "upload_profile_set",
]
