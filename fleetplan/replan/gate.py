"""The simulation gate: a new plan becomes current only if it keeps its promise (shared design note on
capacity: every class it serves meets its SLO percentile in the simulator) on seeds 0..seeds-1, at the
rates it was planned for (the forecast)."""

from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.simulation import ClassMetrics
from fleetplan.models.store import GateReport, GateSeed, GateSpec
from fleetplan.profiler.tables import ProfileTable

# a class the plan serves below this RPS is not judged (nothing of it is simulated)
SERVED_MIN_RPS = 1e-9
# A percentile resting on fewer measured requests beyond it than this is noted as thin: the tail fraction
# of k requests scatters by about 1 / sqrt(k) (14% at 50); a 4 RPS class's p90 over the default 540
# measured seconds rests on ~216, over 15 s on ~6 (docs/simulation.md, "How long a gate must simulate")
THIN_TAIL = 50


def run_gate(request: PlanRequest, plan: Plan, table: ProfileTable, spec: GateSpec) -> GateReport:
    """Simulate `plan` on Poisson arrivals at its served rates, one replay per seed."""
    if not spec.simulate:
        return GateReport(simulated=False, passed=True, duration_s=0.0, seeds=[])
    from fleetplan.simulator import simulate

    served = {w.name: w.served_rps for w in plan.workloads}
    seeds = []
    for seed in range(spec.seeds):
        report = simulate(request, plan, table, duration_s=spec.duration_s, warmup_s=spec.warmup_s, seed=seed)
        judged = [c for c in report.classes if served.get(c.name, 0.0) > SERVED_MIN_RPS]
        failing = [_failure(c) for c in judged if not c.slo_met]
        thin = [c.name for c in judged if beyond_percentile(c) < THIN_TAIL]
        seeds.append(GateSeed(seed=seed, passed=not failing, failing=failing, thin=thin))
    return GateReport(
        simulated=True, passed=all(s.passed for s in seeds), duration_s=spec.duration_s, seeds=seeds
    )


def beyond_percentile(metrics: ClassMetrics) -> float:
    """How many of the class's measured requests lie beyond its SLO percentile: (1 - q / 100) x arrivals."""
    return (1.0 - metrics.slo_percentile / 100.0) * metrics.arrivals


def _failure(metrics: ClassMetrics) -> str:
    """ "1b-short (p90 TTFT 212.3 ms vs 200, TBT 31.0 ms vs 50)": a class's simulated tail next to its SLO;
    a thin one (THIN_TAIL) says on how many requests beyond the percentile."""
    q = metrics.slo_percentile
    ttft = getattr(metrics, f"ttft_ms_p{q}")
    tbt = getattr(metrics, f"tbt_ms_p{q}")
    shown = ["n/a" if v is None else f"{v:.1f}" for v in (ttft, tbt)]
    beyond = beyond_percentile(metrics)
    on = f"; on {beyond:.0f} requests beyond p{q}" if beyond < THIN_TAIL else ""
    return (
        f"{metrics.name} (p{q} TTFT {shown[0]} ms vs {metrics.slo_ttft_ms:g}, "
        f"TBT {shown[1]} ms vs {metrics.slo_tbt_ms:g}{on})"
    )


def gate_reason(report: GateReport) -> str:
    failing = [f"seed {s.seed}: {', '.join(s.failing)}" for s in report.seeds if not s.passed]
    return "gate: the new plan breaks its promise in simulation: " + "; ".join(failing)


def thin_note(report: GateReport) -> str | None:
    """One line naming the classes whose verdict rested on few requests (on any seed), or None."""
    names = sorted({name for s in report.seeds for name in s.thin})
    if not names:
        return None
    return (
        f"gate: short window: {len(names)} class(es) judged on fewer than {THIN_TAIL} requests beyond their "
        f"percentile ({', '.join(names)}); the promise is judged over 600 s (docs/simulation.md)"
    )


__all__ = ["THIN_TAIL", "beyond_percentile", "gate_reason", "run_gate", "thin_note"]
