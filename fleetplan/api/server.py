"""`fleetplan serve`: uvicorn with a shutdown that drains the solve pool.

On SIGTERM or Ctrl-C uvicorn stops accepting connections and waits up to `shutdown_grace_s` for the
in-flight requests. This server also tells the solve pool at once: requests still waiting for a solver
slot are answered 503 (with Retry-After) straight away instead of running out the grace period, running
solves may finish within it, and whatever still runs ANSWER_S before it ends is killed, its request
answered 503 while uvicorn still lets it answer.
"""

import asyncio
from types import FrameType
from typing import Any

import uvicorn
from litestar import Litestar

from fleetplan.api.observe import configure_logging
from fleetplan.api.settings import Settings


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose exit signal also drains the app's solve pool (in the event loop's thread)."""

    loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        app = self.config.app
        if self.loop is not None and isinstance(app, Litestar):
            self.loop.call_soon_threadsafe(app.state.solves.drain)
            if not self.should_exit:  # the first signal: the grace period starts now
                at = kill_at(self.config.timeout_graceful_shutdown)
                self.loop.call_soon_threadsafe(self.loop.call_later, at, app.state.solves.kill_all)
        super().handle_exit(sig, frame)


# how long before the grace period ends the solves still running are killed: uvicorn cancels the request
# tasks when it ends, before the app's shutdown hook runs, so a solve killed only then had no answer at all
# (the client saw the connection drop); killed a little earlier, its request answers 503 with Retry-After
ANSWER_S = 0.5


def kill_at(grace_s: float | None) -> float:
    """Seconds after the exit signal at which the running solves are killed: ANSWER_S before the grace
    period ends (at most half of it); never, in effect, without a grace period limit."""
    if grace_s is None:
        return float("inf")
    return max(grace_s - min(ANSWER_S, grace_s / 2), 0.0)


def serve(app: Litestar, settings: Settings) -> None:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=configure_logging(settings.log_format, settings.log_level),
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        timeout_keep_alive=settings.keep_alive_s,
    )
    DrainingServer(config).run()


__all__ = ["ANSWER_S", "DrainingServer", "kill_at", "serve"]
