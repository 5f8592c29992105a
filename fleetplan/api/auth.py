"""Bearer-token auth as one Litestar guard, applied app-wide.

A route that stores something is marked `opt={"write": True}` (POST /profiles; the store's routes mark
theirs the same way). A write needs `Authorization: Bearer <FLEETPLAN_API_TOKEN>`, compared in constant
time. With no token configured, writes are refused (403) unless `FLEETPLAN_ALLOW_ANONYMOUS_WRITES=1`.
Reads are open unless `FLEETPLAN_READ_AUTH=1`, which puts them behind the same token (GET /health stays
open for probes). A missing or wrong token is a 401 with `WWW-Authenticate: Bearer`; the token itself is
never logged or echoed.
"""

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from fleetplan.api.settings import Settings
from fleetplan.models.errors import Forbidden, Unauthorized

OPEN_PATHS = frozenset({"/health"})


def is_write(handler: BaseRouteHandler) -> bool:
    return bool(handler.opt.get("write", False))


def _bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    header = connection.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _unauthorized(message: str) -> Unauthorized:
    error = Unauthorized(message, field="Authorization")
    error.headers = {"WWW-Authenticate": 'Bearer realm="fleetplan"'}  # type: ignore[attr-defined]
    return error


def check_token(settings: Settings, presented: str | None, *, write: bool) -> None:
    """Raise Unauthorized/Forbidden unless `presented` may make this kind of request under `settings`."""
    if write and settings.api_token is None:
        if settings.allow_anonymous_writes:
            return
        msg = (
            "writes are disabled on this server: no API token is configured "
            "(set FLEETPLAN_API_TOKEN, or FLEETPLAN_ALLOW_ANONYMOUS_WRITES=1 on a trusted host)"
        )
        raise Forbidden(msg)
    if not write and not settings.read_auth:
        return
    if settings.api_token is None:  # read_auth on but no token: every read is refused
        msg = "FLEETPLAN_READ_AUTH is on but no FLEETPLAN_API_TOKEN is configured; nothing can be read"
        raise Forbidden(msg)
    if presented is None:
        raise _unauthorized("missing `Authorization: Bearer <token>`")
    if not hmac.compare_digest(presented.encode(), settings.api_token.encode()):
        raise _unauthorized("the bearer token is not valid")


def auth_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Litestar guard: every route goes through it; the route's `opt` says whether it writes."""
    if connection.scope["path"] in OPEN_PATHS:
        return
    settings: Settings = connection.app.state.settings
    check_token(settings, _bearer(connection), write=is_write(handler))


__all__ = ["auth_guard", "check_token", "is_write"]
