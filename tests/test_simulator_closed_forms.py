"""The simulator engine against closed forms and an independent reference (docs/simulation.md, Validation).

The profile-driven latency model cannot produce exponential service times, so these tests replace it through
the engine's one service-time seam (`replay(..., service=ExponentialService(mean))`); everything else
(arrivals, join-shortest-queue, per-instance FIFO queues, the event loop) is the production engine.

- M/M/1 (one instance, batch 1, one-token requests): the Erlang C waiting-time tail with c = 1,
  P(W > t) = rho exp(-(mu - lambda) t), within 5% at rho 0.5 and 0.8.
- c = 2, 3 instances: the simulator dispatches each request on arrival to the shortest of c per-instance
  queues (JSQ), which is not a central M/M/c queue. The waits must equal, exactly, those of an independent
  JSQ reference fed the same arrival and service times; and the Erlang C tail is pinned as *not* holding
  (JSQ's tail is heavier), so a change of dispatch semantics cannot go unnoticed.
- M/D/1 (the profile's flat service, `ProfileService(deterministic=True)`): Erlang's waiting-time formula;
  the capacity model's exact wait and its pooled credit against the simulated tails.
"""

import math
from collections import deque

import numpy as np
import pytest

from fleetplan.models.fleet import Device
from fleetplan.models.plan import Options, PlanRequest
from fleetplan.models.profile import ProfileRow, ProfilesSpec
from fleetplan.models.workload import Slo, Workload
from fleetplan.simulator import replay
from fleetplan.simulator.service import ExponentialService, ProfileService
from fleetplan.solver import capacity
from fleetplan.solver.pipeline import plan, resolve_profiles

MU = 10.0  # services per second per instance (mean service 100 ms)


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load a = lambda / mu (a < c)."""
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail)


def _request(c: int) -> PlanRequest:
    """c devices, one class of one-token requests, batch 1 only; demand twice what c instances serve, so the
    plan provisions every device (the simulated load is then set by rate_scale)."""
    rows = [
        ProfileRow(
            model="llama-3.2-1b",
            device="dev",
            tp=1,
            batch=1,
            prompt_tokens=p,
            ttft_ms_p50=1e3 / MU,
            ttft_ms_p90=1e3 / MU,
            ttft_ms_p99=1e3 / MU,
            tbt_ms_p50=1.0,
            tbt_ms_p90=1.0,
            tbt_ms_p99=1.0,
        )
        for p in (64, 256)
    ]
    workload = Workload(
        name="w",
        model="llama-3.2-1b",
        prompt_tokens=128,
        output_tokens=1,
        rate_rps=2 * c * MU,
        slo=Slo(ttft_ms=60_000.0, tbt_ms=100.0, percentile=90),
    )
    return PlanRequest(
        devices=[Device(name="dev", count=c)],
        workloads=[workload],
        profiles=ProfilesSpec(rows=rows),
        options=Options(max_utilization=1.0, allow_disaggregated=False),
    )


_PLANS: dict[int, tuple] = {}


def _planned(c: int):
    if c not in _PLANS:
        request = _request(c)
        result = plan(request, with_baselines=False)
        assert [(p.role, p.instances, p.batch) for p in result.pools] == [("colocated", c, 1)]
        _PLANS[c] = (request, result, resolve_profiles(request))
    return _PLANS[c]


def _replay(c: int, rho: float, duration_s: float, seed: int, service) -> tuple[np.ndarray, object]:
    """Replay at offered load rho per instance; the run and the measured requests' mask."""
    request, result, table = _planned(c)
    scale = rho * c * MU / result.workloads[0].served_rps
    run = replay(
        request,
        result,
        table,
        duration_s=duration_s,
        warmup_s=50.0,
        seed=seed,
        rate_scale=scale,
        service=service,
    )
    lo, hi = run.settings.window
    return (run.arrival >= lo) & (run.arrival < hi), run


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_one_instance_matches_the_erlang_c_tail(rho):
    """M/M/1: P(W > t) = rho exp(-(mu - lambda) t) at t = 0, 1, 2, 3 mean services (P >= 0.11)."""
    measured, run = _replay(1, rho, 20_000.0, seed=3, service=ExponentialService(1 / MU))
    waits = (run.t_start - run.arrival)[measured]
    assert np.isfinite(waits).all()
    lam = rho * MU
    for t in (0.0, 0.1, 0.2, 0.3):
        expected = erlang_c(1, lam / MU) * math.exp(-(MU - lam) * t)
        simulated = float((waits > t).mean())
        assert simulated == pytest.approx(expected, rel=0.05), (t, simulated, expected)
    assert float(waits.mean()) == pytest.approx(rho / (MU - lam), rel=0.10)  # M/M/1 mean wait


class _Recorded:
    """A ServiceModel wrapper that keeps each prefill's duration by request (batch 1: one request each)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.prefill: dict[int, float] = {}

    def bind(self, request_class, rng):
        times = self.inner.bind(request_class, rng)
        prefill = self.prefill

        class Times:
            def prefill_s(self, pool, members, n):
                dt = times.prefill_s(pool, members, n)
                prefill[members[0]] = dt
                return dt

            def step_s(self, pool, members, n):
                return times.step_s(pool, members, n)

        return Times()


def jsq_reference(arrival: list[float], service: list[float], c: int) -> list[float]:
    """Waits under join-shortest-queue over c FIFO servers (count in system, ties to the lowest index)."""
    in_system = [deque() for _ in range(c)]  # departure times of the requests at each server
    free_at = [0.0] * c
    waits = []
    for t, s in zip(arrival, service, strict=True):
        for departures in in_system:
            while departures and departures[0] <= t:
                departures.popleft()
        k = min(range(c), key=lambda j: len(in_system[j]))
        start = max(t, free_at[k])
        free_at[k] = start + s
        in_system[k].append(free_at[k])
        waits.append(start - t)
    return waits


@pytest.mark.parametrize("c", [2, 3])
def test_several_instances_are_join_shortest_queue_exactly(c):
    recorded = _Recorded(ExponentialService(1 / MU))
    _, run = _replay(c, 0.8, 2_000.0, seed=5, service=recorded)
    started = np.isfinite(run.t_start)
    service = [recorded.prefill.get(r, 0.0) for r in range(len(run.arrival))]
    expected = np.array(jsq_reference(run.arrival.tolist(), service, c))
    assert started.sum() > 0.99 * len(started)
    assert np.array_equal((run.t_start - run.arrival)[started], expected[started])


@pytest.mark.parametrize("c", [2, 3])
def test_several_instances_queue_per_instance_not_centrally(c):
    """JSQ is not M/M/c: at rho 0.5 the simulated P(W > 2/mu) is well above the Erlang C tail (+50% at c = 2,
    about 3x at c = 3; docs/simulation.md). Erlang C with c = instances would promise too much here."""
    rho, t = 0.5, 0.2
    measured, run = _replay(c, rho, 10_000.0, seed=1, service=ExponentialService(1 / MU))
    waits = (run.t_start - run.arrival)[measured]
    lam = rho * c * MU
    erlang = erlang_c(c, lam / MU) * math.exp(-(c * MU - lam) * t)
    assert float((waits > t).mean()) > 1.3 * erlang


@pytest.mark.parametrize(
    ("c", "rho", "duration_s"),
    [(2, 0.5, 10_000.0), (2, 0.8, 10_000.0), (3, 0.5, 10_000.0), (3, 0.8, 10_000.0), (8, 0.8, 3_000.0)],
)
def test_pooled_wait_model_bounds_the_simulated_jsq_tail(c, rho, duration_s):
    """The capacity model's credit for c instances (solver/pooled.py): an arrival waits with the Erlang C
    probability C(c, c rho) and then an exponential wait of mean (1 / mu) queue_stretch(rho, c) =
    (1 / mu) (1 + rho / (c (1 - rho))): its own server's residual and 1 / c of the pool's queue. Against the
    simulator's JSQ it must be conservative at every t from 0 to 5 mean services, and strictly below the
    single-instance tail rho exp(-(1 - rho) mu t) (or it would be no credit at all)."""
    measured, run = _replay(c, rho, duration_s, seed=2, service=ExponentialService(1 / MU))
    waits = (run.t_start - run.arrival)[measured]
    pooled = float(capacity.pooled_wait_prob(np.array([rho]), np.array([c]))[0])
    assert pooled == pytest.approx(erlang_c(c, c * rho), rel=1e-9)
    assert pooled < rho
    stretch = float(capacity.queue_stretch(np.array([rho]), np.array([c]))[0])
    assert stretch == pytest.approx(1 + rho / (c * (1 - rho)))
    assert float(capacity.queue_stretch(np.array([rho]), None)[0]) == pytest.approx(1 / (1 - rho))
    for t in (0.0, 0.1, 0.2, 0.3, 0.5):
        model = pooled * math.exp(-t * MU / stretch)
        simulated = float((waits > t).mean())
        assert simulated <= model, (t, simulated, model)
        if t > 0:
            assert model < rho * math.exp(-(1 - rho) * MU * t)


def test_one_instance_of_deterministic_service_is_the_md1_wait():
    """M/D/1 in the simulator (the profile's flat 100 ms prefill, batch 1) against Erlang's formula for the
    waiting time, P(W <= t) = (1 - rho) sum_{k <= t / D} (lambda (k D - t))^k / k! e^{-lambda (k D - t)},
    within 5% of each tail probability (all >= 0.09) at rho 0.5; the capacity model's wait
    (capacity.queue_tail, Benes's form) is that formula too, to its cells' rounding, and never below it."""
    rho, d = 0.5, 1 / MU
    measured, run = _replay(1, rho, 20_000.0, seed=4, service=ProfileService(deterministic=True))
    waits = (run.t_start - run.arrival)[measured]
    grid = capacity.service_grid(np.array([[1e3 * d] * 3]))
    wait = capacity.QueueWait(np.array([rho]), np.array([1 / (1 - rho)]), np.ones(1), np.zeros(1, bool))
    for t in (0.0, 0.05, 0.1, 0.15):
        lam = rho / d
        below = (1 - rho) * sum(
            (lam * (k * d - t)) ** k / math.factorial(k) * math.exp(-lam * (k * d - t))
            for k in range(int(t / d + 1e-9) + 1)
        )
        simulated = float((waits > t).mean())
        assert simulated == pytest.approx(1 - below, rel=0.05), (t, simulated, 1 - below)
        if t > 0:  # (at t = 0 the limit is the service itself, which the grid may round above it)
            model = float(capacity.queue_tail(grid, np.array([1e3 * (d + t)]), wait)[0])
            assert 1 - below - 1e-9 <= model <= 1 - below + 0.01, (t, model, 1 - below)


@pytest.mark.parametrize(("c", "rho"), [(2, 0.5), (2, 0.8), (3, 0.8), (8, 0.8)])
def test_pooled_wait_model_bounds_the_simulated_jsq_tail_of_deterministic_service(c, rho):
    """The pooled credit with deterministic service (the profile's flat 100 ms): C(c, c rho) times the sum of
    N >= 1 uniform residuals, N geometric of mean queue_stretch(rho, c), must stay above the simulator's JSQ
    waiting-time tail at every t from 0 to 3 services. A request queued at its own instance waits whole
    services there, not residuals: the bound is checked, not assumed."""
    measured, run = _replay(c, rho, 4_000.0, seed=6, service=ProfileService(deterministic=True))
    waits = (run.t_start - run.arrival)[measured]
    grid = capacity.service_grid(np.array([[1e3 / MU] * 3]))
    servers = np.array([c])
    wait = capacity.QueueWait(
        capacity.pooled_wait_prob(np.array([rho]), servers),
        capacity.queue_stretch(np.array([rho]), servers),
        np.ones(1),
        np.zeros(1, bool),
    )
    for t in (0.001, 0.05, 0.1, 0.15, 0.2, 0.3):
        model = float(capacity.queue_tail(grid, np.array([1e3 * (1 / MU + t)]), wait)[0])
        simulated = float((waits > t).mean())
        assert simulated <= model, (t, simulated, model)
