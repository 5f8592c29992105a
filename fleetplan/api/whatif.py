"""POST /whatif: a thin shell over fleetplan.whatif.run_whatif (the same function the CLI calls).

The answer's form follows `Accept` and `?plot=`: JSON (the WhatIfResult), `text/csv` (one row per
point), or with `?plot=frontier|devices|heatmap` the picture as `image/svg+xml` (default) or `image/png`.
"""

import time
from typing import Annotated, Any

import anyio.to_thread
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.datastructures.headers import Accept
from litestar.dto import AbstractDTO
from litestar.enums import RequestEncodingType
from litestar.openapi import ResponseSpec
from litestar.params import Body, QueryParameter

from fleetplan.api.app import _CodecDTO, _problems, counted_solve
from fleetplan.api.observe import ARRIVED_KEY
from fleetplan.api.service import check_plan_limits
from fleetplan.api.workers import SolvePool, whatif_in_child
from fleetplan.models.codec import convert, decode, encode
from fleetplan.models.errors import ClientGone, DeadlineExceeded, InputError, NotAcceptable
from fleetplan.models.plan import PlanRequest
from fleetplan.models.whatif import WhatIfRequest, WhatIfResult
from fleetplan.profiler.store import ProfileStore

CSV = "text/csv"
JSON = "application/json"
PNG = "image/png"
SVG = "image/svg+xml"


class WhatIfBody(_CodecDTO, AbstractDTO[WhatIfRequest]):
    """Decode a POST /whatif body with models.codec.decode (errors name the field: "axes[0].param")."""

    @staticmethod
    def decode_body(value: bytes) -> WhatIfRequest:
        return decode(value, WhatIfRequest)

    def decode_builtins(self, value: dict[str, Any]) -> WhatIfRequest:
        return convert(value, WhatIfRequest)


def solve_deadline_s(request: PlanRequest) -> float:
    """How long one plan of a sweep may take: its time limit, plus 50% and 2 s for HiGHS's overshoot, the
    baselines and verification that run after it."""
    return request.options.time_limit_s * 1.5 + 2.0


def whatif_deadline_s(request: WhatIfRequest) -> float:
    """A deadline for the whole sweep: POST /plan's per plan, for every plan the sweep may solve (each
    point, and one more per device type for the marginal values)."""
    per_point = 1 + (len(request.base.devices) if request.marginal else 0)
    return solve_deadline_s(request.base) * request.size() * per_point


def _form(accept: str, plot: str | None) -> str:
    """The media type to answer, by `Accept` (its q-values and wildcards; none: the first form): with
    `plot` SVG or PNG, else JSON or CSV. NotAcceptable (406) where Accept takes none of them."""
    offered = [SVG, PNG] if plot is not None else [JSON, CSV]
    if not accept.strip():
        return offered[0]
    chosen = Accept(accept).best_match(offered)
    if chosen is None:
        what = f"?plot={plot} answers" if plot is not None else "without ?plot= this route answers"
        hint = "" if plot is not None else "; a picture needs ?plot=frontier|devices|heatmap"
        msg = f"{accept!r} takes none of what {what}: {' or '.join(offered)}{hint}"
        raise NotAcceptable(msg, field="accept")
    return chosen


@post(
    "/whatif",
    status_code=200,
    dto=WhatIfBody,
    return_dto=None,
    summary="Sweep a request over one or two axes",
    description=(
        "Plan the base request at every grid point (budget_per_hour, demand_scale, slo_scale, count:D, "
        "max_count:D, price:D): per point the plan's SLO RPS, cost, devices, binding limits, marginal RPS "
        "of one more device per type and both baselines; the Pareto frontier in cost vs SLO RPS. "
        "`Accept: text/csv` answers one row per point; `?plot=frontier|devices|heatmap` the picture "
        "(`Accept: image/svg+xml` or `image/png`)."
    ),
    responses={
        **_problems(400, 401, 406, 413, 415, 422, 500, 503),
        200: ResponseSpec(data_container=WhatIfResult, description="The sweep (JSON, CSV or a picture)."),
    },
    tags=["planning"],
)
async def post_whatif(
    data: Annotated[WhatIfRequest, Body(media_type=RequestEncodingType.JSON)],
    state: State,
    request: Request,
    plot: Annotated[
        str | None, QueryParameter(description="frontier, devices or heatmap: answer that picture")
    ] = None,
) -> Response[bytes]:
    from fleetplan.whatif import to_csv
    from fleetplan.whatif.plots import PLOTS, render

    if plot is not None and plot not in PLOTS:
        raise InputError(f"unknown plot {plot!r}; one of {', '.join(PLOTS)}", field="plot")
    if plot == "heatmap" and len(data.axes) != 2:
        raise InputError("heatmap needs a sweep over two axes", field="plot")
    check_plan_limits(data.base, state.settings, at="base.")
    form = _form(request.headers.get("accept", ""), plot)
    store: ProfileStore = state.store
    pool: SolvePool = state.solves
    budget = min(whatif_deadline_s(data), state.settings.max_sweep_s)
    arrived = request.scope.get("state", {}).get(ARRIVED_KEY) or time.monotonic()
    msg = (
        f"no answer within {budget:g} s (the server's max_sweep_s is {state.settings.max_sweep_s:g}); the "
        "sweep was stopped. Sweep fewer points or lower time_limit_s"
    )
    timed_out = DeadlineExceeded(msg, field="base.options.time_limit_s")
    # the sweep runs in a child holding one solve slot: killed at the deadline or when the client goes
    result: WhatIfResult | None = await counted_solve(
        state,
        "whatif",
        request,
        lambda: pool.call(whatif_in_child, (data, store), arrived + budget, budget, timed_out),
    )
    if result is None:
        raise ClientGone("the client disconnected; its sweep was stopped")
    if plot is not None:
        body = await anyio.to_thread.run_sync(render, result, plot, "png" if form == PNG else "svg")
        return Response(content=body, media_type=form)
    if form == CSV:
        return Response(content=to_csv(result).encode(), media_type=CSV)
    return Response(content=encode(result), media_type=JSON)


__all__ = ["post_whatif"]
