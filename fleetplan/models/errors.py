"""One exception hierarchy for the whole planner; fleetplan/api/errors.py maps it once to HTTP."""


class PlannerError(Exception):
    """Base of every error the planner raises on purpose.

    `field` is the path of the offending input ("workloads[2].slo.tbt_ms") when there is one, so that a
    client can point at it; `status_code` is the HTTP status the API answers with.
    """

    status_code = 422
    title = "Invalid planning input"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InputError(PlannerError):
    """The request or a file does not decode or breaks a cross-field rule."""

    status_code = 400
    title = "Invalid request"


class NotAcceptable(InputError):
    """The client's `Accept` names no form the route can answer in (POST /whatif: JSON or CSV, or with
    `?plot=` SVG or PNG)."""

    status_code = 406
    title = "Not acceptable"


class ProfileMissing(PlannerError):
    """A profile set, or rows a request needs from it, do not exist."""

    status_code = 422
    title = "Missing profile data"


class SolverFailure(PlannerError):
    """The solver gave no usable answer (time limit without incumbent, numerical trouble, or a proof that
    no plan meets the constraints: `proven_infeasible`, where more time would not help)."""

    status_code = 503
    title = "Solver gave no plan"
    proven_infeasible = False


class PlanVerificationError(PlannerError):
    """A plan broke a constraint when recomputed from the plan alone: a bug, never the user's fault."""

    status_code = 500
    title = "Plan failed verification"


class NotFound(PlannerError):
    """A stored fleet, plan, run or profile set of that name or id does not exist."""

    status_code = 404
    title = "Not found"


class StoreUnavailable(PlannerError):
    """The database cannot be reached or is not migrated (`fleetplan db upgrade`)."""

    status_code = 503
    title = "Store unavailable"


class LimitExceeded(PlannerError):
    """A request is over one of the service's caps (devices, workloads, links, profile rows, time limit):
    a 422 whose message names the cap and its setting."""

    status_code = 422
    title = "Request over a service limit"


class DeadlineExceeded(SolverFailure):
    """The request's wall-clock budget (options.time_limit_s) ran out before a plan was ready; its work was
    stopped. A 503: a smaller request or a longer time limit may succeed."""

    title = "No plan within the time limit"


class ServerBusy(SolverFailure):
    """Every solver slot is busy and the queue in front of them is full (or would not start the request in
    time): a 503 with `Retry-After`, answered at once."""

    title = "Server busy"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, field=None)
        self.retry_after_s = retry_after_s


class Unauthorized(PlannerError):
    """No valid `Authorization: Bearer` token for a route that needs one (401)."""

    status_code = 401
    title = "Unauthorized"


class Forbidden(PlannerError):
    """Writes are switched off on this server (no token configured, anonymous writes off) (403)."""

    status_code = 403
    title = "Forbidden"


class ClientGone(SolverFailure):
    """The client disconnected before its plan was ready (or before its body was read); its work was
    stopped. Nobody reads the answer: its status is 499, "client closed request" as nginx logs it, so that
    the access log and the metrics tell it from the server's own 5xx (a body cut short was a 500)."""

    status_code = 499
    title = "Client disconnected"


class ProfileSetExists(PlannerError):
    """A set of that name exists and the caller did not ask to replace it, or the name is a bundled set's."""

    status_code = 409
    title = "Profile set exists"


class ProfileRunBusy(PlannerError):
    """Another run of the profiler holds the set's resume file (`fleetplan profile` of the same set and
    store directory, in this or another process)."""

    status_code = 409
    title = "Profile run in progress"


class StoreNotWritable(PlannerError):
    """No writable store root is configured (the bundled fixtures are read-only)."""

    status_code = 503
    title = "No writable profile store"


class EndpointError(PlannerError):
    """The server behind an engine endpoint refused, failed or answered something unusable."""

    status_code = 502
    title = "Engine endpoint failed"
