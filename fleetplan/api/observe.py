"""Observability: Prometheus metrics, a request id on every request, structured (JSON) logs.

`RequestMiddleware` (one raw ASGI middleware) stamps each request with its arrival time and a request
id (the client's `X-Request-ID` when it is a sane token, else a new one), echoes the id back, counts the
request by route template and status, times it, and logs one access line. `GET /metrics` serves the
app's own registry (one per app, so tests can build many apps) in the Prometheus text format.
"""

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from litestar import Response, get
from litestar.datastructures import State
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Litestar appends "; charset=utf-8" to a text/* media type itself: prometheus_client's own charset would
# then appear twice, a Content-Type Go's mime parser (Prometheus's scraper) refuses
METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")

# scope["state"] keys
ARRIVED_KEY = "fleetplan.arrived"
REQUEST_ID_KEY = "fleetplan.request_id"
REQUEST_ID_HEADER = "x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
access_log = logging.getLogger("fleetplan.access")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_GAP_BUCKETS = (0, 1e-6, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1)


class Metrics:
    """Every metric the service exports, in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fleetplan_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "fleetplan_http_request_seconds",
            "HTTP request latency, arrival to last byte",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # `kind`: plan (POST /plan), whatif (POST /whatif), replan (POST /fleets/{name}/replan): each holds
        # a solve slot (only plans were counted before session 25)
        self.solve_seconds = Histogram(
            "fleetplan_solve_seconds",
            "Wall time of a solve in its worker",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.gap = Histogram(
            "fleetplan_plan_mip_gap", "Plan.mip_gap of answered plans", buckets=_GAP_BUCKETS, registry=r
        )
        self.status = Counter("fleetplan_plans", "Plans answered, by Plan.status", ["status"], registry=r)
        self.outcomes = Counter(
            "fleetplan_solves",
            "Solves by kind and outcome (plan, timeout, error, disconnected)",
            ["kind", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge("fleetplan_solves_in_flight", "Solves running in worker processes", registry=r)
        self.queued = Gauge("fleetplan_solves_queued", "Requests waiting for a solver slot", registry=r)
        self.finishing = Gauge(
            "fleetplan_candidate_builds_finishing",
            "Workers finishing a candidate build past their request's deadline (each holds a slot)",
            registry=r,
        )
        self.rejected = Counter(
            "fleetplan_solves_rejected",
            "Requests refused at once (503 + Retry-After): queue full",
            ["kind"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


@get(
    "/metrics",
    summary="Prometheus metrics",
    tags=["service"],
    include_in_schema=True,
    media_type=METRICS_MEDIA_TYPE,
)
async def metrics_endpoint(state: State) -> Response[bytes]:
    metrics: Metrics = state.metrics
    solves = state.solves
    metrics.in_flight.set(solves.running)
    metrics.queued.set(solves.waiting)
    metrics.finishing.set(solves.finishing)
    return Response(content=metrics.render(), media_type=METRICS_MEDIA_TYPE)


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            if _SANE_ID.match(text):
                return text
            break
    return uuid.uuid4().hex


def request_middleware(app: ASGIApp) -> ASGIApp:
    """An ASGI middleware factory; create_app wraps Litestar's whole handler with it (router and exception
    handler), so that every request, a 404 or 405 too, gets its access line, metric and request id."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        began = time.monotonic()
        rid = _request_id(scope)
        state = scope.setdefault("state", {})  # type: ignore[typeddict-item]
        state[ARRIVED_KEY] = began
        state[REQUEST_ID_KEY] = rid
        token = request_id_var.set(rid)
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}  # type: ignore[typeddict-item]
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            _record(scope, status, time.monotonic() - began)
            request_id_var.reset(token)

    return middleware


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` with its control characters escaped (\x0d): a request path is the client's, and a CR LF in it
    (`/fleets/y%0d%0aFORGED`) started a forged line in the text log."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _record(scope: Scope, status: int, seconds: float) -> None:
    route = scope.get("path_template") or "unmatched"  # type: ignore[call-overload]
    method = scope.get("method", "")  # type: ignore[call-overload]
    app_state = scope["app"].state  # type: ignore[typeddict-item]
    metrics: Metrics | None = getattr(app_state, "metrics", None)
    if metrics is not None:  # labels from a bounded set: a client picks the method and path of a 404/405
        label = method if method in KNOWN_METHODS else "other"
        metrics.requests.labels(label, route, str(status)).inc()
        metrics.latency.labels(label, route).observe(seconds)
    access_log.info(
        "%s %s %s %.1f ms",
        printable(method),
        printable(scope.get("path", "")),  # type: ignore[call-overload]
        status,
        seconds * 1e3,
        extra={"method": method, "route": route, "status": status, "ms": round(seconds * 1e3, 1)},
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and any structured extras.
    Authorization headers never reach a log line (nothing logs headers)."""

    _EXTRAS = ("method", "route", "status", "ms")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            # RFC 3339 in UTC with milliseconds: sortable and unambiguous across hosts and time zones
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id_var.get(),
        }
        entry.update({k: getattr(record, k) for k in self._EXTRAS if hasattr(record, k)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get() or "-"
        return True


def configure_logging(log_format: str, level: str) -> dict[str, Any]:
    """A logging dictConfig for uvicorn and fleetplan: JSON lines or text, each with the request id."""
    formatter = (
        {"()": JsonFormatter}
        if log_format == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"}
    )
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "main",
        "filters": ["rid"],
        "stream": "ext://sys.stderr",
    }
    loggers = {
        name: {"handlers": ["main"], "level": level.upper(), "propagate": False}
        for name in ("fleetplan", "uvicorn", "alembic")  # alembic: the migrations run at start-up
    }
    loggers["uvicorn.access"] = {
        "handlers": [],
        "level": "WARNING",
        "propagate": False,
    }  # ours is fleetplan.access
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"rid": {"()": RequestIdFilter}},
        "formatters": {"main": formatter},
        "handlers": {"main": handler},
        "loggers": loggers,
    }


__all__ = [
    "ARRIVED_KEY",
    "JsonFormatter",
    "Metrics",
    "configure_logging",
    "metrics_endpoint",
    "request_middleware",
]
