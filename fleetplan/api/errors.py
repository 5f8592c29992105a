"""The one mapping from exceptions to RFC 9457 problem details (`application/problem+json`).

Every error the service answers with goes through `problem_for`: the planner's own hierarchy
(models.errors.PlannerError, whose subclasses carry their HTTP status), Litestar's HTTP exceptions
(unknown route, wrong method, oversized body, a missing body), and anything else, which is a bug: it is
logged with its traceback and answered with a generic 500 that leaks nothing.
"""

import logging
from http import HTTPStatus
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from fleetplan.api.schemas import Problem
from fleetplan.models.errors import (
    ClientGone,
    DeadlineExceeded,
    EndpointError,
    Forbidden,
    InputError,
    LimitExceeded,
    NotAcceptable,
    NotFound,
    PlannerError,
    PlanVerificationError,
    ProfileMissing,
    ProfileRunBusy,
    ProfileSetExists,
    ServerBusy,
    SolverFailure,
    StoreNotWritable,
    StoreUnavailable,
    Unauthorized,
)

PROBLEM_JSON = "application/problem+json"
PROBLEM_TYPE = "urn:fleetplan:problem:{slug}"

logger = logging.getLogger("fleetplan.api")

# Every PlannerError subclass -> (the `type` slug clients can switch on, its HTTP status): the one map
# (docs/api.md lists it; tests/test_service.py checks that every subclass is in it).
ERRORS: dict[type[PlannerError], tuple[str, int]] = {
    cls: (slug, cls.status_code)
    for cls, slug in [
        (InputError, "invalid-request"),
        (NotAcceptable, "not-acceptable"),
        (ProfileMissing, "profile-missing"),
        (LimitExceeded, "over-limit"),
        (Unauthorized, "unauthorized"),
        (Forbidden, "forbidden"),
        (ProfileSetExists, "profile-set-exists"),
        (StoreNotWritable, "store-not-writable"),
        (SolverFailure, "solver-failure"),
        (DeadlineExceeded, "deadline-exceeded"),
        (ServerBusy, "server-busy"),
        (ClientGone, "client-gone"),
        (PlanVerificationError, "plan-verification-failed"),
        (NotFound, "not-found"),
        (StoreUnavailable, "store-unavailable"),
        (EndpointError, "profiling-endpoint-error"),
        (ProfileRunBusy, "profile-run-busy"),
    ]
}
_SLUGS = {cls: slug for cls, (slug, _) in ERRORS.items()}


def problem_for(exc: BaseException, request: Request[Any, Any, Any] | None = None) -> Problem:
    """The problem details for `exc`: 4xx name the field and the reason, 5xx never leak internals."""
    if isinstance(exc, PlannerError):
        return _planner_problem(exc)
    if isinstance(exc, ValidationException):
        return _validation_problem(exc)
    if isinstance(exc, HTTPException):
        return _http_problem(exc, request)
    return Problem(
        type=PROBLEM_TYPE.format(slug="internal-error"),
        title="Internal server error",
        status=500,
        detail="the planner failed unexpectedly; the error has been logged",
    )


def _planner_problem(exc: PlannerError) -> Problem:
    slug = next((_SLUGS[c] for c in type(exc).__mro__ if c in _SLUGS), "planner-error")
    return Problem(
        type=PROBLEM_TYPE.format(slug=slug),
        title=exc.title,
        status=exc.status_code,
        detail=str(exc),  # "field: reason" when the error has a field
        field=exc.field,
    )


def _validation_problem(exc: ValidationException) -> Problem:
    """Litestar's own request validation (only parameters and a missing body reach it: the body itself
    is decoded by models.codec). Its messages may end in msgspec's " - at `$.path`"."""
    field: str | None = None
    reason = exc.detail
    extra = exc.extra if isinstance(exc.extra, list) else []
    if extra and isinstance(extra[0], dict):
        first = extra[0]
        if first.get("source") == "body" or first.get("key") == "data":
            # the one body check Litestar makes before models.codec runs: the body is empty
            field, reason = "body", "empty; send a PlanRequest as JSON"
        else:
            message = str(first.get("message", exc.detail))
            reason, _, at = message.partition(" - at `$")
            key = str(first.get("key") or "")
            path = at.rstrip("`").lstrip(".")
            field = ".".join(p for p in (key, path) if p) or None
    return Problem(
        type=PROBLEM_TYPE.format(slug="invalid-request"),
        title=InputError.title,
        status=400,
        detail=f"{field}: {reason}" if field else reason,
        field=field,
    )


def _http_problem(exc: HTTPException, request: Request[Any, Any, Any] | None) -> Problem:
    status = exc.status_code
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    if status >= 500:
        detail = "the server failed unexpectedly; the error has been logged"
    elif status == 413 and request is not None:
        cap = request.app.state.settings.max_body_bytes
        detail = (
            f"body: larger than this server's cap of {cap} bytes (max_body_bytes, FLEETPLAN_MAX_BODY_BYTES)"
        )
    elif exc.detail and exc.detail != phrase:
        detail = exc.detail  # a handler's own words, e.g. "unknown profile set 'x'"
    elif status == 404 and request is not None:
        detail = f"no resource at {request.method} {request.url.path}"
    elif status == 405 and request is not None:
        detail = f"{request.method} is not allowed on {request.url.path}"
    else:
        detail = exc.detail or phrase
    return Problem(type="about:blank", title=phrase, status=status, detail=detail)


# what Litestar raises when the client hangs up before its body is read
_CUT_SHORT = "client disconnected prematurely"


def problem_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    """Litestar exception handler (registered for `Exception`, so it sees everything)."""
    if isinstance(exc, HTTPException) and exc.status_code == 500 and exc.detail == _CUT_SHORT:
        exc = ClientGone("the client disconnected before its body was read")
    problem = problem_for(exc, request)
    if isinstance(exc, SolverFailure | StoreUnavailable):
        # an expected outcome (a time limit without a plan, a busy server, a database down or not
        # migrated: named in the problem, docs/store.md): one line, no traceback
        logger.warning("%s %s -> %s: %s", request.method, request.url.path, problem.status, exc)
    elif problem.status >= 500:
        # PlanVerificationError is a planner bug too: keep its traceback next to the generic ones
        logger.error("%s %s -> %s: %s", request.method, request.url.path, problem.status, exc, exc_info=exc)
    headers = dict(getattr(exc, "headers", None) or {})  # e.g. Allow on 405, WWW-Authenticate on 401
    if isinstance(exc, SolverFailure) and problem.status == 503:
        headers["Retry-After"] = str(getattr(exc, "retry_after_s", 1))
    return Response(content=problem, status_code=problem.status, media_type=PROBLEM_JSON, headers=headers)


__all__ = ["ERRORS", "PROBLEM_JSON", "problem_for", "problem_response"]
