"""What a discrete-event replay of a plan reports (docs/simulation.md).

Latencies in milliseconds, rates in requests/s, times in seconds. A percentile is null where no request of
the class completed in the measured window.
"""

from typing import Literal

from fleetplan.models.base import Base, Name


class ClassMetrics(Base):
    """One workload class, simulated next to what the plan predicts.

    Per-request SLO rule: a request meets its SLO when it completes inside the run, its TTFT <= slo.ttft_ms
    and its mean inter-token gap ((done - first token) / (output_tokens - 1), 0 for one-token outputs)
    <= slo.tbt_ms. `slo_met` says whether the class's own percentile definition holds: p_q(TTFT) <=
    slo.ttft_ms and p_q(TBT) <= slo.tbt_ms, every measured request completed.

    Two attainments (docs/simulation.md, "Metrics"):
    - `attainment`: of *admitted* requests, the fraction of measured arrivals (arrived in the measured
      window) meeting the rule; a request still queued when the run ends counts as a miss.
    - `attainment_of_demand`: of *all offered demand* (the class's `rate_rps` x rate_scale, or for a trace
      every row of the class in the window): demand the plan does not serve counts as missed.
    A class the plan does not serve has 0.0 for both (never 1.0).
    """

    name: Name
    offered_rps: float
    predicted_rps: float
    arrivals: int
    completed: int
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    ttft_ms_p99: float | None
    tbt_ms_p50: float | None
    tbt_ms_p90: float | None
    tbt_ms_p99: float | None
    predicted_ttft_ms: float | None
    predicted_tbt_ms: float | None
    slo_percentile: int
    slo_ttft_ms: float
    slo_tbt_ms: float
    attainment: float
    slo_met: bool
    goodput_rps: float
    mean_queue_wait_ms: float | None
    mean_decode_wait_ms: float | None
    mean_kv_transfer_ms: float | None
    # per completed measured request, only when simulate(keep_samples=True) (e.g. for plots)
    ttft_ms_samples: list[float] | None = None
    tbt_ms_samples: list[float] | None = None
    # offered demand and the attainment of all of it (always set by the simulator; None in older reports)
    demand_rps: float | None = None
    attainment_of_demand: float | None = None


class PoolMetrics(Base):
    """One pool of the plan. `utilization_simulated` is the busy-time fraction of its instances (prefilling
    or stepping); `occupancy_simulated` the time-averaged fraction of batch slots in use, the closer analogue
    of the solver's `utilization_predicted` (capacity used at full batches)."""

    model: Name
    role: Literal["prefill", "decode", "colocated"]
    device: Name
    tp: int
    batch: int
    instances: int
    workload: Name | None
    utilization_predicted: float
    utilization_simulated: float
    occupancy_simulated: float
    group: int = 0  # the plan pool's `group` (Pool.group): tells same-shape pools at other headroom apart


class SimulationReport(Base):
    """A replay of one plan: per class, per pool and fleet-wide, simulated next to predicted.

    `offered_rps`, `arrivals` and `attainment` count the *admitted* requests (measured window);
    `demand_rps` and `attainment_of_demand` all offered demand, served or not (see ClassMetrics).
    """

    engine: Literal["heap", "simpy"]
    arrivals_source: Literal["poisson", "trace"]
    duration_s: float
    warmup_s: float
    drain_s: float
    seed: int
    rate_scale: float
    deterministic: bool
    offered_rps: float
    goodput_rps: float
    predicted_goodput_rps: float
    attainment: float
    arrivals: int
    completed: int
    unrouted: int
    events: int
    wall_ms: float
    classes: list[ClassMetrics]
    pools: list[PoolMetrics]
    # always set by the simulator; None in older reports
    demand_rps: float | None = None
    attainment_of_demand: float | None = None


__all__ = ["ClassMetrics", "PoolMetrics", "SimulationReport"]
