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


class ProfileMissing(PlannerError):
    """A profile set, or rows a request needs from it, do not exist."""

    status_code = 422
    title = "Missing profile data"


class SolverFailure(PlannerError):
    """The solver gave no usable answer (time limit without incumbent, numerical trouble)."""

    status_code = 503
    title = "Solver gave no plan"


class PlanVerificationError(PlannerError):
    """A plan broke a constraint when recomputed from the plan alone: a bug, never the user's fault."""

    status_code = 500
    title = "Plan failed verification"


class NotFound(PlannerError):
    """A stored fleet, plan or run of that name or id does not exist."""

    status_code = 404
    title = "Not found"


class StoreUnavailable(PlannerError):
    """The database cannot be reached or is not migrated (`fleetplan db upgrade`)."""

    status_code = 503
    title = "Store unavailable"
