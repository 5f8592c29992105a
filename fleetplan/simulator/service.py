"""Service times: the one seam between the event loop and the latency model (docs/simulation.md).

The engine never computes a latency itself. It asks a `ServiceTimes` for the duration of a prefill batch
(`prefill_s`: the batch's TTFT) and of one decode step (`step_s`: TBT), passing the pool, the requests taking
part and their number n. A `ServiceModel` builds that object for one run from the requests' class indices
and the run's latency random stream.

- `ProfileService` (production, the default of `simulate`): the profile's percentiles through the
  piecewise-lognormal model of fleetplan/profiler/latency.py, one standard-normal draw per call, a batch
  mixing classes taking the mean of its members' latencies at n.
- `ExponentialService` (closed-form checks only): exponentially distributed times with a fixed mean,
  whatever the pool, batch or class, so that one-token requests on batch-1 instances form an M/M/c-type
  system (tests/test_simulator_closed_forms.py).
"""

from math import exp
from typing import Protocol

import numpy as np

from fleetplan.profiler.latency import Z90, Z_CLIP
from fleetplan.simulator.pools import PoolState

BLOCK = 1 << 16  # random draws are made in blocks of this size


class ServiceTimes(Protocol):
    """Durations (seconds) for one run. `members` are request indices, n = len(members)."""

    def prefill_s(self, pool: PoolState, members: list[int], n: int) -> float: ...

    def step_s(self, pool: PoolState, members: list[int], n: int) -> float: ...


class ServiceModel(Protocol):
    """Makes the `ServiceTimes` of one run."""

    def bind(self, request_class: list[int], rng: np.random.Generator) -> ServiceTimes: ...


class ProfileService:
    """The profile's latency model; `deterministic` puts every draw at z = 0 (every latency at its p50)."""

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic

    def bind(self, request_class: list[int], rng: np.random.Generator) -> "_ProfileTimes":
        return _ProfileTimes(request_class, rng, self.deterministic)


class _ProfileTimes:
    """One standard-normal draw z per call (from blocks of BLOCK, clipped to |z| <= Z_CLIP); the latency is
    `sample_ms` of fleetplan/profiler/latency.py in seconds, inlined here because it is the hot path."""

    __slots__ = ("cls", "deterministic", "pos", "rng", "zbuf")

    def __init__(self, request_class: list[int], rng: np.random.Generator, deterministic: bool) -> None:
        self.cls = request_class
        self.rng = rng
        self.deterministic = deterministic
        self.zbuf: list[float] = []
        self.pos = 0

    def prefill_s(self, pool: PoolState, members: list[int], n: int) -> float:
        return self._latency_s(pool, pool.ttft, members, n)

    def step_s(self, pool: PoolState, members: list[int], n: int) -> float:
        return self._latency_s(pool, pool.tbt, members, n)

    def _latency_s(self, pool: PoolState, curves, members: list[int], n: int) -> float:
        if self.deterministic:
            z = 0.0
        else:
            if self.pos >= len(self.zbuf):
                self.zbuf = np.clip(self.rng.standard_normal(BLOCK), -Z_CLIP, Z_CLIP).tolist()
                self.pos = 0
            z = self.zbuf[self.pos]
            self.pos += 1
        if pool.single:
            l50, s_lo, l90, s_hi = curves[0][n]
            return exp(l50 + s_lo * z) if z <= Z90 else exp(l90 + s_hi * (z - Z90))
        local = pool.classes
        cls = self.cls
        total = 0.0
        for r in members:
            l50, s_lo, l90, s_hi = curves[local[cls[r]]][n]
            total += exp(l50 + s_lo * z) if z <= Z90 else exp(l90 + s_hi * (z - Z90))
        return total / n


class ExponentialService:
    """Exponential service times: prefill batches with mean `prefill_mean_s`, decode steps with mean
    `step_mean_s` (default: the prefill mean), independent of pool, class and n. For closed-form tests."""

    def __init__(self, prefill_mean_s: float, step_mean_s: float | None = None) -> None:
        self.prefill_mean_s = prefill_mean_s
        self.step_mean_s = prefill_mean_s if step_mean_s is None else step_mean_s

    def bind(self, request_class: list[int], rng: np.random.Generator) -> "_ExponentialTimes":
        return _ExponentialTimes(rng, self.prefill_mean_s, self.step_mean_s)


class _ExponentialTimes:
    __slots__ = ("buf", "pos", "prefill_mean_s", "rng", "step_mean_s")

    def __init__(self, rng: np.random.Generator, prefill_mean_s: float, step_mean_s: float) -> None:
        self.rng = rng
        self.prefill_mean_s = prefill_mean_s
        self.step_mean_s = step_mean_s
        self.buf: list[float] = []
        self.pos = 0

    def _unit(self) -> float:
        if self.pos >= len(self.buf):
            self.buf = self.rng.standard_exponential(BLOCK).tolist()
            self.pos = 0
        self.pos += 1
        return self.buf[self.pos - 1]

    def prefill_s(self, pool: PoolState, members: list[int], n: int) -> float:
        return self.prefill_mean_s * self._unit()

    def step_s(self, pool: PoolState, members: list[int], n: int) -> float:
        return self.step_mean_s * self._unit()
