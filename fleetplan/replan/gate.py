"""The simulation gate: a new plan becomes current only if it keeps its promise (shared design note on
capacity: every class it serves meets its SLO percentile in the simulator) on seeds 0..seeds-1, at the
rates it was planned for (the forecast)."""

from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.store import GateReport, GateSeed, GateSpec
from fleetplan.profiler.tables import ProfileTable

# a class the plan serves below this RPS is not judged (nothing of it is simulated)
SERVED_MIN_RPS = 1e-9


def run_gate(request: PlanRequest, plan: Plan, table: ProfileTable, spec: GateSpec) -> GateReport:
    """Simulate `plan` on Poisson arrivals at its served rates, one replay per seed."""
    if not spec.simulate:
        return GateReport(simulated=False, passed=True, duration_s=0.0, seeds=[])
    from fleetplan.simulator import simulate

    served = {w.name: w.served_rps for w in plan.workloads}
    seeds = []
    for seed in range(spec.seeds):
        report = simulate(request, plan, table, duration_s=spec.duration_s, warmup_s=spec.warmup_s, seed=seed)
        failing = [
            _failure(c) for c in report.classes if served.get(c.name, 0.0) > SERVED_MIN_RPS and not c.slo_met
        ]
        seeds.append(GateSeed(seed=seed, passed=not failing, failing=failing))
    return GateReport(
        simulated=True, passed=all(s.passed for s in seeds), duration_s=spec.duration_s, seeds=seeds
    )


def _failure(metrics) -> str:
    """ "1b-short (p90 TTFT 212.3 ms vs 200, TBT 31.0 ms vs 50)": a class's simulated tail next to its SLO."""
    q = metrics.slo_percentile
    ttft = getattr(metrics, f"ttft_ms_p{q}")
    tbt = getattr(metrics, f"tbt_ms_p{q}")
    shown = ["n/a" if v is None else f"{v:.1f}" for v in (ttft, tbt)]
    return (
        f"{metrics.name} (p{q} TTFT {shown[0]} ms vs {metrics.slo_ttft_ms:g}, "
        f"TBT {shown[1]} ms vs {metrics.slo_tbt_ms:g})"
    )


def gate_reason(report: GateReport) -> str:
    failing = [f"seed {s.seed}: {', '.join(s.failing)}" for s in report.seeds if not s.passed]
    return "gate: the new plan breaks its promise in simulation: " + "; ".join(failing)


__all__ = ["gate_reason", "run_gate"]
