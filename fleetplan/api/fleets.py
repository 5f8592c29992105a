"""HTTP routes of the store: fleets, plans, runs and re-plans (the contract's "Fleets, plans and runs").

Thin handlers over fleetplan.store.Repository and fleetplan.replan.replan, the same functions the CLI calls.
Routes that write carry `opt={"write": True}` (the service's auth guard requires a token on them). The
database is opened, and migrated, at server start when a URL is configured ($FLEETPLAN_DATABASE_URL or
create_app's `database_url`), else at the first store request (the default SQLite file).
"""

import logging
import os
import threading
import time
from functools import partial
from typing import Annotated, Any

import anyio
import anyio.to_thread
from litestar import Litestar, Request, Response, Router, get, post, put, route
from litestar.datastructures import State
from litestar.dto import AbstractDTO
from litestar.enums import HttpMethod, RequestEncodingType
from litestar.params import Body, Parameter, QueryParameter

from fleetplan.api.app import _CodecDTO, _problems, counted_solve
from fleetplan.api.observe import ARRIVED_KEY
from fleetplan.api.service import check_plan_limits
from fleetplan.api.settings import Settings
from fleetplan.api.workers import SolvePool, replan_in_child
from fleetplan.models.base import NAME_PATTERN
from fleetplan.models.codec import convert, decode, decode_request
from fleetplan.models.errors import ClientGone, DeadlineExceeded, NotFound, ServerBusy, StoreUnavailable
from fleetplan.models.plan import PlanRequest
from fleetplan.models.store import FleetRecord, PlanRecord, ReplanRequest, Run
from fleetplan.replan.service import check_order
from fleetplan.store.engine import DATABASE_ENV
from fleetplan.store.repository import Repository

WRITE = {"write": True}
# a re-plan's simulation gate gets this long after its solve's budget (replan_budget_s)
REPLAN_GATE_S = 120.0
LOG = logging.getLogger("fleetplan.api")
TAGS = ["fleets"]
READ_PROBLEMS = _problems(400, 401, 404, 503)  # 400: a bad path or paging parameter
WRITE_PROBLEMS = _problems(400, 401, 403, 404, 413, 415, 422, 503)  # 422: over a cap (PUT)
Limit = Annotated[int, QueryParameter(ge=1, le=500, description="Page size")]
# ids are 64-bit database integers: a larger one names nothing (400, not a 500). 2**62, not 2**63 - 1: the
# OpenAPI document carries the bound as a JSON number, and 2**63 - 1 is no double (it rounds up to 2**63)
ID_MAX = 2**62
# a 64-bit database integer too (the fuzzer found a 500 on a larger offset)
Offset = Annotated[int, QueryParameter(ge=0, le=ID_MAX, description="Items to skip (newest first)")]
FleetName = Annotated[
    str, Parameter(description="The fleet's name", min_length=1, max_length=128, pattern=NAME_PATTERN)
]
PlanId = Annotated[int, Parameter(ge=1, le=ID_MAX, description="A stored plan's id")]
RunId = Annotated[int, Parameter(ge=1, le=ID_MAX, description="A run's id")]


class StoreHandle:
    """Opens the repository once (migrating it), on first use or at startup; safe across worker threads."""

    def __init__(self, url: str | None = None, repository: Repository | None = None) -> None:
        self.url = url
        self._repository = repository
        self._lock = threading.Lock()

    def get(self) -> Repository:
        with self._lock:
            if self._repository is None:
                from fleetplan.store import open_repository

                self._repository = open_repository(self.url, migrate=True)
            return self._repository

    @property
    def configured(self) -> bool:
        return self.url is not None or bool(os.environ.get(DATABASE_ENV))


def open_store_at_startup(app: Litestar) -> None:
    """Apply the migrations at server start when a database is configured (on_startup hook). A database
    that cannot be used then is logged, not fatal: POST /plan, /whatif and /profiles do not need it, and
    the store routes answer 503 `store-unavailable` (trying the database again on each request) until it
    can be (before, the server did not start, and took the planner down with the store)."""
    handle: StoreHandle = app.state.fleet_store
    if handle.configured:
        try:
            handle.get()
        except StoreUnavailable as error:
            LOG.error("store unavailable at start-up; its routes answer 503 until it is reachable: %s", error)


class FleetBody(_CodecDTO, AbstractDTO[PlanRequest]):
    """A PUT /fleets/{name} body: a PlanRequest decoded by models.codec."""

    @staticmethod
    def decode_body(value: bytes) -> PlanRequest:
        return decode_request(value)

    def decode_builtins(self, value: dict[str, Any]) -> PlanRequest:
        return convert(value, PlanRequest)


class ReplanBody(_CodecDTO, AbstractDTO[ReplanRequest]):
    """A REPLAN body (every field optional; `{}` is the default re-plan)."""

    @staticmethod
    def decode_body(value: bytes) -> ReplanRequest:
        return decode(value, ReplanRequest) if value.strip() else ReplanRequest()

    def decode_builtins(self, value: dict[str, Any]) -> ReplanRequest:
        return convert(value, ReplanRequest)


def _repo(state: State) -> Repository:
    handle: StoreHandle = state.fleet_store
    return handle.get()


@route("/fleets/{name:str}", http_method=[HttpMethod.OPTIONS], include_in_schema=False)
async def fleet_options() -> Response[None]:
    """OPTIONS /fleets/{name}, registered first: Litestar answers OPTIONS with the first handler registered on
    a path, so its Allow header would list only PUT (as for /profiles in api/app.py)."""
    return Response(content=None, status_code=204, headers={"Allow": "GET, OPTIONS, PUT"})


@put(
    "/fleets/{name:str}",
    dto=FleetBody,
    return_dto=None,
    sync_to_thread=True,
    opt=WRITE,
    status_code=200,
    summary="Store a fleet (a new version when the request changed)",
    responses=WRITE_PROBLEMS,
    tags=TAGS,
)
def put_fleet(
    name: FleetName, data: Annotated[PlanRequest, Body(media_type=RequestEncodingType.JSON)], state: State
) -> FleetRecord:
    check_plan_limits(data, state.settings)  # a stored fleet is re-planned by this server: its caps hold
    return _repo(state).put_fleet(name, data)


@get("/fleets", sync_to_thread=True, summary="List fleets", tags=TAGS, responses=READ_PROBLEMS)
def list_fleets(state: State, limit: Limit = 100, offset: Offset = 0) -> list[FleetRecord]:
    return _repo(state).list_fleets(limit, offset)


@get(
    "/fleets/{name:str}",
    sync_to_thread=True,
    summary="One fleet, newest version",
    tags=TAGS,
    responses=READ_PROBLEMS,
)
def get_fleet(name: FleetName, state: State) -> FleetRecord:
    return _repo(state).get_fleet(name)


@get(
    "/fleets/{name:str}/plans",
    sync_to_thread=True,
    summary="A fleet's plans, newest first",
    tags=TAGS,
    responses=READ_PROBLEMS,
)
def list_plans(name: FleetName, state: State, limit: Limit = 20, offset: Offset = 0) -> list[PlanRecord]:
    return _repo(state).list_plans(name, limit, offset)


@get(
    "/fleets/{name:str}/plans/current",
    sync_to_thread=True,
    summary="A fleet's current plan",
    tags=TAGS,
    responses=READ_PROBLEMS,
)
def current_plan(name: FleetName, state: State) -> PlanRecord:
    record = _repo(state).current_plan(name)
    if record is None:
        raise NotFound(f"fleet {name!r} has no current plan yet; POST /fleets/{name}/replan", field="name")
    return record


@get(
    "/plans/{plan_id:int}", sync_to_thread=True, summary="One stored plan", tags=TAGS, responses=READ_PROBLEMS
)
def get_plan(plan_id: PlanId, state: State) -> PlanRecord:
    return _repo(state).get_plan(plan_id)


@post(
    "/fleets/{name:str}/replan",
    dto=ReplanBody,
    return_dto=None,
    opt=WRITE,
    status_code=200,
    summary="Re-plan a fleet",
    description=(
        "Solve with the newest profiles and forecast traffic, churn-limited, gate the plan in simulation and "
        "promote it in one transaction; answers the RUN (status promoted, unchanged, kept or failed)."
    ),
    responses=WRITE_PROBLEMS,
    tags=TAGS,
)
async def post_replan(
    name: FleetName,
    state: State,
    request: Request,
    data: Annotated[ReplanRequest | None, Body(media_type=RequestEncodingType.JSON)] = None,
) -> Run:
    """An empty body is the default REPLAN (every field is optional). The re-plan runs in a child process
    holding one of the server's solve slots (the pool POST /plan and POST /whatif use): a busy server
    answers 503 with Retry-After before any run is recorded; the child is killed when `replan_budget_s`
    ends or the client disconnects, and its run is marked failed."""
    data = data or ReplanRequest()
    check_order(data)  # what this installation cannot do: a 400 before any run is recorded
    pool: SolvePool = state.solves
    budget = replan_budget_s(state.settings)
    at = (request.scope.get("state", {}).get(ARRIVED_KEY) or time.monotonic()) + budget
    try:
        pool.admit(budget, at)
    except ServerBusy:
        state.metrics.rejected.labels("replan").inc()
        raise
    repository = await anyio.to_thread.run_sync(_repo, state)
    run = await anyio.to_thread.run_sync(partial(repository.start_run, name, dry_run=data.dry_run))
    if run.status != "running":  # refused: another re-plan of this fleet is alive (docs/store.md)
        return run
    msg = f"the re-plan did not finish within {budget:g} s (replan_budget_s) and was stopped"
    timed_out = DeadlineExceeded(msg)
    args = (_url_for_child(repository), run, data, state.store)
    try:
        done: Run | None = await counted_solve(
            state, "replan", request, lambda: pool.call(replan_in_child, args, at, budget, timed_out)
        )
    except Exception as error:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_fail_if_running, repository, run.id, f"stopped: {error}")
        raise
    if done is None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_fail_if_running, repository, run.id, "stopped: the client left")
        raise ClientGone("the client disconnected; its re-plan was stopped")
    return done


def replan_budget_s(settings: Settings) -> float:
    """How long a re-plan may take over HTTP: its solve (at most max_time_limit_s, the cap of every stored
    fleet's time limit) and its fallbacks, then the simulation gate (REPLAN_GATE_S)."""
    return 2 * settings.max_time_limit_s + REPLAN_GATE_S


def _url_for_child(repository: Repository) -> str:
    """The database URL a child opens its own connection with (no connection crosses a fork)."""
    return repository.engine.url.render_as_string(hide_password=False)


def _fail_if_running(repository: Repository, run_id: int, reason: str) -> None:
    """A killed child leaves its run "running": mark it failed (unless the child finished it first)."""
    if repository.get_run(run_id).status == "running":
        repository.finish_run(run_id, status="failed", reason=reason)


@get(
    "/fleets/{name:str}/runs",
    sync_to_thread=True,
    summary="A fleet's re-plan runs, newest first",
    tags=TAGS,
    responses=READ_PROBLEMS,
)
def list_runs(name: FleetName, state: State, limit: Limit = 20, offset: Offset = 0) -> list[Run]:
    return _repo(state).list_runs(name, limit, offset)


@get("/runs/{run_id:int}", sync_to_thread=True, summary="One re-plan run", tags=TAGS, responses=READ_PROBLEMS)
def get_run(run_id: RunId, state: State) -> Run:
    return _repo(state).get_run(run_id)


fleets_router = Router(
    path="/",
    route_handlers=[
        fleet_options,
        put_fleet,
        list_fleets,
        get_fleet,
        list_plans,
        current_plan,
        get_plan,
        post_replan,
        list_runs,
        get_run,
    ],
)

__all__ = ["StoreHandle", "fleets_router", "open_store_at_startup"]
