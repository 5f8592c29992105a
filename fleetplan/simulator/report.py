"""What a replay measured, as a SimulationReport (docs/simulation.md, "Metrics")."""

import time
from dataclasses import dataclass

import numpy as np

from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.simulation import ClassMetrics, PoolMetrics, SimulationReport
from fleetplan.simulator.pools import PoolState


@dataclass(frozen=True)
class Settings:
    """What the replay was asked for."""

    duration_s: float
    warmup_s: float
    drain_s: float
    seed: int
    rate_scale: float
    deterministic: bool
    keep_samples: bool

    @property
    def window(self) -> tuple[float, float]:
        """The measured window [warmup, warmup + duration)."""
        return self.warmup_s, self.warmup_s + self.duration_s

    @property
    def t_stop(self) -> float:
        return self.warmup_s + self.duration_s + self.drain_s


@dataclass(frozen=True)
class Run:
    """What one replay recorded: per request (in arrival order) its arrival (s), class, output tokens, prefill
    start, first token and completion times (s, NaN if never), KV transfer time (ms) and decode-slot wait
    (s); per pool its runtime state (busy and slot time); and the run's counts."""

    settings: Settings
    source: str
    served: np.ndarray  # per class: the plan's served rps
    arrival: np.ndarray
    classes: np.ndarray
    outputs: np.ndarray
    t_start: np.ndarray
    t_first: np.ndarray
    t_done: np.ndarray
    kv_ms: np.ndarray
    d_wait: np.ndarray
    pools: list[PoolState]
    unrouted: int
    events: int
    demand_rows: np.ndarray | None = None  # trace: per class, its rows in the window, served or not


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if len(values) else None


@dataclass(frozen=True)
class _PerRequest:
    """Derived per-request figures (ms) and masks."""

    measured: np.ndarray
    done: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray
    wait: np.ndarray

    @classmethod
    def of(cls, run: Run) -> "_PerRequest":
        lo, hi = run.settings.window
        out = run.outputs.astype(float)
        return cls(
            measured=(run.arrival >= lo) & (run.arrival < hi),
            done=np.isfinite(run.t_done),
            ttft=1e3 * (run.t_first - run.arrival),
            tbt=np.where(out > 1, 1e3 * (run.t_done - run.t_first) / np.maximum(out - 1, 1), 0.0),
            wait=1e3 * (run.t_start - run.arrival),
        )


@dataclass(frozen=True)
class _Demand:
    """One class's attainments: of admitted requests and of all offered demand, with the weights the fleet
    figures sum (Poisson: rps of demand and of SLO-met demand; trace: rows)."""

    admitted: float
    demand_rps: float
    of_demand: float
    demand: float
    met: float

    @classmethod
    def of(cls, rate_rps: float, run: Run, c: int, n_m: int, n_met: int) -> "_Demand":
        """A class the plan does not serve scores 0 on both; a served class with no measured arrival 1
        (nothing to miss). Poisson: of_demand = admitted x served / rate_rps (the unserved rest rejected
        upfront); trace: SLO-met rows / all its rows in the window."""
        s, served = run.settings, float(run.served[c])
        admitted = 0.0 if served <= 0 else (n_met / n_m if n_m else 1.0)
        if run.source == "poisson":
            demand = rate_rps * s.rate_scale
            of_demand = admitted * min(1.0, served / rate_rps) if rate_rps > 0 else 0.0
            return cls(admitted, demand, of_demand, demand, of_demand * demand)
        rows = int(run.demand_rows[c])
        of_demand = n_met / rows if rows else admitted
        return cls(admitted, rows / s.duration_s, of_demand, rows, n_met)


def class_metrics(
    request: PlanRequest, plan: Plan, run: Run, req: _PerRequest, c: int
) -> tuple[ClassMetrics, int, _Demand]:
    """One class: latency percentiles over its completed measured requests, attainments, goodput, waits;
    its number of SLO-met measured requests and its demand figures."""
    w, res = request.workloads[c], plan.workloads[c]
    s = run.settings
    m = req.measured & (run.classes == c)
    md = m & req.done
    met = md & (req.ttft <= w.slo.ttft_ms) & (req.tbt <= w.slo.tbt_ms)
    n_m, n_done, n_met = int(m.sum()), int(md.sum()), int(met.sum())
    q = w.slo.percentile
    tt, tb = req.ttft[md], req.tbt[md]
    slo_met = bool(
        n_done
        and n_done == n_m
        and np.percentile(tt, q) <= w.slo.ttft_ms
        and np.percentile(tb, q) <= w.slo.tbt_ms
    )
    decoded = md & np.isfinite(run.t_start)
    demand = _Demand.of(w.rate_rps, run, c, n_m, n_met)
    metrics = ClassMetrics(
        name=w.name,
        offered_rps=round(float(run.served[c]) * s.rate_scale, 6)
        if run.source == "poisson"
        else round(n_m / s.duration_s, 6),
        predicted_rps=float(res.served_rps),
        arrivals=n_m,
        completed=n_done,
        ttft_ms_p50=_pct(tt, 50),
        ttft_ms_p90=_pct(tt, 90),
        ttft_ms_p99=_pct(tt, 99),
        tbt_ms_p50=_pct(tb, 50),
        tbt_ms_p90=_pct(tb, 90),
        tbt_ms_p99=_pct(tb, 99),
        predicted_ttft_ms=max((r.ttft_ms for r in res.routes), default=None),
        predicted_tbt_ms=max((r.tbt_ms for r in res.routes), default=None),
        slo_percentile=q,
        slo_ttft_ms=w.slo.ttft_ms,
        slo_tbt_ms=w.slo.tbt_ms,
        attainment=round(demand.admitted, 6),
        slo_met=slo_met,
        goodput_rps=round(n_met / s.duration_s, 6),
        mean_queue_wait_ms=round(float(req.wait[decoded].mean()), 4) if decoded.any() else None,
        mean_decode_wait_ms=round(float(run.d_wait[md].mean()) * 1e3, 4) if n_done else None,
        mean_kv_transfer_ms=round(float(run.kv_ms[md].mean()), 4) if n_done else None,
        ttft_ms_samples=np.round(tt, 3).tolist() if s.keep_samples else None,
        tbt_ms_samples=np.round(tb, 3).tolist() if s.keep_samples else None,
        demand_rps=round(demand.demand_rps, 6),
        attainment_of_demand=round(demand.of_demand, 6),
    )
    return metrics, n_met, demand


def pool_metrics(rp: PoolState, duration_s: float) -> PoolMetrics:
    """One pool: predicted utilization next to simulated busy fraction and slot occupancy."""
    p = rp.pool
    n = max(len(rp.instances), 1)
    busy = sum(inst.busy for inst in rp.instances) / (n * duration_s)
    slots = sum(inst.slot_time for inst in rp.instances) / (n * p.batch * duration_s)
    return PoolMetrics(
        model=p.model,
        role=p.role,
        device=p.device,
        tp=p.tp,
        batch=p.batch,
        instances=p.instances,
        workload=p.workload,
        utilization_predicted=p.utilization,
        utilization_simulated=round(busy, 6),
        occupancy_simulated=round(slots, 6),
        group=p.group,
    )


def build_report(request: PlanRequest, plan: Plan, run: Run, began: float) -> SimulationReport:
    """The SimulationReport of a run; `began` (perf_counter) dates the wall time."""
    s = run.settings
    req = _PerRequest.of(run)
    per_class = [class_metrics(request, plan, run, req, c) for c in range(len(request.workloads))]
    classes = [metrics for metrics, _, _ in per_class]
    total_met = sum(n_met for _, n_met, _ in per_class)
    total_arrivals = int(req.measured.sum())
    if total_arrivals:
        attainment = total_met / total_arrivals
    else:  # nothing admitted: vacuous only if the plan serves something
        attainment = 1.0 if (run.served > 0).any() else 0.0
    if run.source == "poisson":
        demand = sum(d.demand for _, _, d in per_class)
        of_demand = sum(d.met for _, _, d in per_class) / demand if demand > 0 else 0.0
    else:  # every row in the window: admitted ones and unrouted ones (unserved class or no class)
        rows = total_arrivals + run.unrouted
        demand = rows / s.duration_s
        of_demand = total_met / rows if rows else attainment
    return SimulationReport(
        engine="heap",
        arrivals_source=run.source,
        duration_s=s.duration_s,
        warmup_s=s.warmup_s,
        drain_s=s.drain_s,
        seed=s.seed,
        rate_scale=s.rate_scale,
        deterministic=s.deterministic,
        offered_rps=round(total_arrivals / s.duration_s, 6),
        goodput_rps=round(total_met / s.duration_s, 6),
        predicted_goodput_rps=float(plan.slo_rps),
        attainment=round(attainment, 6),
        arrivals=total_arrivals,
        completed=int((req.measured & req.done).sum()),
        unrouted=run.unrouted,
        events=run.events,
        wall_ms=round(1e3 * (time.perf_counter() - began), 3),
        classes=classes,
        pools=[pool_metrics(rp, s.duration_s) for rp in run.pools],
        demand_rps=round(demand, 6),
        attainment_of_demand=round(of_demand, 6),
    )
