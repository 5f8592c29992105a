"""`fleetplan serve`: uvicorn with a shutdown that drains the solve pool.

On SIGTERM or Ctrl-C uvicorn stops accepting connections and waits up to `shutdown_grace_s` for the
in-flight requests. This server also tells the solve pool at once: requests still waiting for a solver
slot are answered 503 (with Retry-After) straight away instead of running out the grace period, running
solves may finish within it, and whatever still runs when it ends is killed with its request.
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
        super().handle_exit(sig, frame)


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


__all__ = ["DrainingServer", "serve"]
