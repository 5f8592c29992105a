"""simulate(request, plan, table) -> SimulationReport: replay arrivals through a plan's pools.

The steps, each in its own module: arrivals (Poisson or trace) and route draws (arrivals.py), the plan as
runtime pools, instances and latency curves (pools.py, curves.py), service times through one seam
(service.py), the event loop (engine.py), and the metrics (report.py). docs/simulation.md has the semantics.
"""

import math
import time

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.simulation import SimulationReport
from fleetplan.profiler.tables import ProfileTable
from fleetplan.simulator.arrivals import Arrivals, draw_routes, poisson_arrivals, trace_arrivals
from fleetplan.simulator.engine import Engine
from fleetplan.simulator.pools import Fleet, build_fleet
from fleetplan.simulator.report import Run, Settings, build_report
from fleetplan.simulator.service import ProfileService, ServiceModel


def simulate(
    request: PlanRequest,
    plan: Plan,
    table: ProfileTable,
    *,
    duration_s: float = 600.0,
    warmup_s: float = 60.0,
    seed: int = 0,
    rate_scale: float = 1.0,
    trace=None,
    deterministic: bool = False,
    drain_s: float | None = None,
    keep_samples: bool = False,
) -> SimulationReport:
    """Replay arrivals through `plan` and measure what requests arriving in [warmup_s, warmup_s + duration_s)
    get. Arrivals continue for `drain_s` after the window (default: 3x the largest SLO'd request time, at
    least 30 s) so the measured requests finish under load; any still unfinished count as SLO misses.
    `deterministic` draws every latency at its p50 (z = 0): service is then exactly the profile's median.
    `keep_samples` puts every measured request's TTFT and mean TBT into the report (for distribution plots).
    """
    began = time.perf_counter()
    run = replay(
        request,
        plan,
        table,
        duration_s=duration_s,
        warmup_s=warmup_s,
        seed=seed,
        rate_scale=rate_scale,
        trace=trace,
        deterministic=deterministic,
        drain_s=drain_s,
        keep_samples=keep_samples,
    )
    return build_report(request, plan, run, began)


def replay(
    request: PlanRequest,
    plan: Plan,
    table: ProfileTable,
    *,
    duration_s: float = 600.0,
    warmup_s: float = 60.0,
    seed: int = 0,
    rate_scale: float = 1.0,
    trace=None,
    deterministic: bool = False,
    drain_s: float | None = None,
    keep_samples: bool = False,
    service: ServiceModel | None = None,
) -> Run:
    """The replay behind `simulate`, returning the per-request record (`Run`) instead of the report.

    `service` is the service-time seam (fleetplan/simulator/service.py): None is the profile's latency
    model (`ProfileService(deterministic)`), what `simulate` always uses; a test may pass another model
    (e.g. `ExponentialService`) to check the engine against closed forms.
    """
    if service is not None and deterministic:
        raise ValueError("deterministic applies to the profile's latency model; pass one or the other")
    settings = Settings(
        duration_s, warmup_s, _drain_s(request, drain_s), seed, rate_scale, deterministic, keep_samples
    )
    check_settings(settings)
    fleet = build_fleet(request, plan, table)
    streams = np.random.SeedSequence(seed).spawn(3)  # independent: arrivals, routes, latencies
    rng_arrivals, rng_routes, rng_latency = (np.random.default_rng(s) for s in streams)
    served = np.array([sum(r.rps for r in res.routes) for res in plan.workloads], float)
    if trace is None:
        arrivals = poisson_arrivals(request, served, rate_scale, settings.t_stop, rng_arrivals)
    else:
        arrivals = trace_arrivals(request, trace, served, rate_scale, settings.t_stop, settings.window)
    routes = draw_routes(arrivals.classes, fleet.route_cum, rng_routes)
    model = service if service is not None else ProfileService(deterministic)
    engine = _engine(fleet, arrivals, routes, model.bind(arrivals.classes.tolist(), rng_latency), settings)
    engine.run()
    return Run(
        settings=settings,
        source=arrivals.source,
        served=served,
        arrival=arrivals.times,
        classes=arrivals.classes,
        outputs=arrivals.outputs,
        t_start=np.array(engine.t_start, float),
        t_first=np.array(engine.t_first, float),
        t_done=np.array(engine.t_done, float),
        kv_ms=np.array(engine.kv_ms, float),
        d_wait=np.array(engine.d_wait, float),
        pools=fleet.pools,
        unrouted=arrivals.unrouted,
        events=engine.events,
        demand_rows=arrivals.demand_rows,
    )


# Poisson arrivals a `fleetplan simulate` window may draw (each costs ~200 bytes of the engine's
# per-request lists): about a gigabyte; paper.json's 56 RPS reach it after ~25 simulated hours. The CLI's
# window is the user's to choose; the gate's and verify's are the planner's and are not capped here
MAX_ARRIVALS = 5_000_000


def check_settings(settings: Settings) -> None:
    """InputError naming the setting unless the window can be simulated: finite, positive duration and
    rate scale, a warm-up of 0 or more, a seed numpy takes (a bad value was a ValueError from numpy)."""
    checks = (
        ("duration_s", settings.duration_s, math.isfinite(settings.duration_s) and settings.duration_s > 0),
        ("warmup_s", settings.warmup_s, math.isfinite(settings.warmup_s) and settings.warmup_s >= 0),
        ("rate_scale", settings.rate_scale, math.isfinite(settings.rate_scale) and settings.rate_scale > 0),
        ("seed", settings.seed, 0 <= settings.seed < 2**63),
    )
    for field, value, ok in checks:
        if not ok:
            raise InputError(
                f"{value!r} cannot be simulated: give a finite number > 0 (>= 0 for warmup_s and seed)",
                field=field,
            )


def expected_arrivals(request: PlanRequest, plan: Plan, window_s: float, rate_scale: float) -> float:
    """Poisson arrivals a replay of `plan` draws over `window_s` (warm-up and window) and its drain: the
    rates its routes carry, as replay draws them."""
    served = sum(route.rps for w in plan.workloads for route in w.routes)
    return served * rate_scale * (window_s + _drain_s(request, None))


def _engine(fleet: Fleet, arrivals: Arrivals, routes: np.ndarray, service, settings: Settings) -> Engine:
    """The engine over per-request lists: arrival, output tokens, first and decode pool, KV gigabits."""
    first_pool, decode_pool = _hops(fleet, arrivals.classes, routes)
    return Engine(
        arrival=arrivals.times.tolist(),
        outputs=arrivals.outputs.tolist(),
        first_pool=first_pool,
        decode_pool=decode_pool,
        kv_gbit=[fleet.kv_gbit[c] for c in arrivals.classes.tolist()],
        network=fleet.network,
        service=service,
        window=settings.window,
        t_stop=settings.t_stop,
    )


def _drain_s(request: PlanRequest, drain_s: float | None) -> float:
    """The given drain, or 3x the largest SLO'd request time (TTFT + output x TBT), at least 30 s."""
    if drain_s is not None:
        return drain_s
    longest = max((w.slo.ttft_ms + w.output_tokens * w.slo.tbt_ms) / 1e3 for w in request.workloads)
    return max(30.0, 3.0 * longest)


def _hops(fleet: Fleet, classes: np.ndarray, routes: np.ndarray) -> tuple[list, list]:
    """Per request, the first pool of its route and its decode pool (None when colocated)."""
    flat = [hop for per_class in fleet.routes for hop in per_class]
    offsets = np.cumsum([0] + [len(per_class) for per_class in fleet.routes])[:-1]
    index = (offsets[classes] + routes).tolist() if len(classes) else []
    return [flat[i][0] for i in index], [flat[i][1] for i in index]
