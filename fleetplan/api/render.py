"""A Plan, or a SimulationReport, as tables for a terminal: rich when it is installed, aligned plain text
otherwise.

`plan_report` and `simulation_report` turn a result into neutral sections (title, headers, rows); the
renderers only lay them out, so both show the same figures.
"""

from collections.abc import Sequence
from typing import IO

from fleetplan.models.plan import Baselines, Plan, PoolRef, Route
from fleetplan.models.simulation import ClassMetrics, SimulationReport

Row = Sequence[str]


class Section:
    """One table of the report."""

    def __init__(self, title: str, headers: Row, rows: list[Row], note: str | None = None) -> None:
        self.title = title
        self.headers = headers
        self.rows = rows
        self.note = note


def _num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value:,.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # "-0.00" reads 0.00


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else ("-" if value <= 0 else "inf")


def pool_label(ref: PoolRef) -> str:
    """ "inf2/tp1/b4", and "inf2/tp1/b4#1" for a second group of that shape run at a lower headroom."""
    return f"{ref.device}/tp{ref.tp}/b{ref.batch}" + (f"#{ref.group}" if ref.group else "")


def route_label(route: Route) -> str:
    """ "a6000ada/tp1/b4 -> inf2/tp1/b4" (disaggregated) or "colocated a6000ada/tp1/b4"."""
    if route.colocated is not None:
        return f"colocated {pool_label(route.colocated)}"
    prefill = pool_label(route.prefill) if route.prefill else "?"
    decode = pool_label(route.decode) if route.decode else "?"
    return f"{prefill} -> {decode}"


_OBJECTIVE_LABELS = {
    "weighted_rps": ("weighted objective", 2),
    "min_fraction": ("objective: min served fraction", 4),
    "cost_per_hour": ("objective: cost per hour", 2),
    "devices": ("objective: devices", 2),
}


def objective_text(plan: Plan) -> str:
    """The bound, labelled with its units: "bound 45.94" for plain RPS, "(weighted objective 52.30, bound
    52.30)" when a weight differs from 1 (slo_rps is then unweighted), else the objective solved. A plan the
    pooled credit raised (solver/pooled.py) says that the bound is the MILP's, which the credit may pass."""
    credited = " (MILP; + pooled credit)" if _pooled(plan) else ""
    if plan.objective_unit in _OBJECTIVE_LABELS:
        label, digits = _OBJECTIVE_LABELS[plan.objective_unit]
        bound = f"bound {_num(plan.objective_bound, digits)}{credited}"
        text = f"{label} {_num(plan.objective_value, digits)}, {bound}"
        return f" ({text})" if plan.objective_unit == "weighted_rps" else f"  |  {text}"
    return f"  |  bound {_num(plan.bound_rps)}{credited}"


def _pooled(plan: Plan) -> bool:
    stages = plan.solver.stages if plan.solver is not None else None
    return bool(stages) and any(s.step == "pooled" for s in stages)


def summary_line(plan: Plan) -> str:
    served = plan.slo_rps / plan.demand_rps if plan.demand_rps > 0 else None
    return (
        f"status {plan.status} ({plan.objective})  |  SLO RPS {_num(plan.slo_rps)} / {_num(plan.demand_rps)}"
        f" demand ({_pct(served)}){objective_text(plan)}  |  gap {_pct(plan.mip_gap, 2)}"
        f"  |  cost {_num(plan.cost_per_hour)}/h{_cost_gap(plan)}"
        f"  |  solve {_num(plan.solver.solve_ms, 1)} ms"
        f" (build {_num(plan.solver.build_ms, 1)} ms, {plan.solver.backend})"
    )


PROVEN_GAP = 1.0001e-4  # a tie-break gap at or below the default mip_rel_gap reads as proven


def _cost_gap(plan: Plan) -> str:
    """ " (not proven cheapest: tie-break gap 2.97%)" where the cost tie-break stopped above the request's
    gap, which `gap` (the goodput's) does not show: another plan of the same goodput may cost less."""
    gap = plan.solver.tie_break_gap if plan.solver is not None else None
    if gap is None or gap <= PROVEN_GAP:
        return ""
    return f" (not proven cheapest: tie-break gap {_pct(gap, 2)})"


def plan_report(plan: Plan) -> list[Section]:
    """The sections of the table view, in reading order; the devices table says what to buy where a
    type is purchasable (`bought`)."""
    buying = any(d.bought for d in plan.devices)
    devices: list[Row] = [
        [d.name, f"{d.used}/{d.available}", *([str(d.bought)] if buying else [])] for d in plan.devices
    ]
    links: list[Row] = [
        [f"{link.source} -> {link.target}", _num(link.gbps), _num(link.budget_gbps)] for link in plan.links
    ]
    sections = [
        Section(
            "Classes",
            ["class", "served/demand", "route", "rps", "TTFT ms", "TBT ms", "reason"],
            _class_rows(plan),
        ),
        Section(
            "Pools",
            ["role", "model", "device", "tp", "batch", "instances", "utilization", "headroom"],
            _pool_rows(plan),
        ),
        Section("Devices", ["device", "used/available", *(["bought"] if buying else [])], devices),
    ]
    if links:
        sections.append(Section("Links (Gbit/s)", ["link", "KV traffic", "budget"], links))
    if plan.baselines is not None:
        sections.append(_baselines_section(plan.slo_rps, plan.baselines))
    return sections


def _class_rows(plan: Plan) -> list[Row]:
    """One row per route of each class (its name, share and reason on the first), or a row of dashes for a
    class without routes."""
    routes: list[Row] = []
    for w in plan.workloads:
        share = f"{_num(w.served_rps)}/{_num(w.served_rps + w.unserved_rps)}"
        reason = w.reason or ""
        if not w.routes:
            routes.append([w.name, share, "-", "-", "-", "-", reason])
        for i, r in enumerate(w.routes):
            first = i == 0
            routes.append(
                [
                    w.name if first else "",
                    share if first else "",
                    route_label(r),
                    _num(r.rps),
                    _num(r.ttft_ms, 1),
                    _num(r.tbt_ms, 1),
                    reason if first else "",
                ]
            )
    return routes


def _pool_rows(plan: Plan) -> list[Row]:
    """One row per pool: role, model (and class), device (and group), shape, instances, utilization."""
    return [
        [
            p.role,
            p.model + (f" ({p.workload})" if p.workload else ""),
            p.device + (f"#{p.group}" if p.group else ""),
            str(p.tp),
            str(p.batch),
            str(p.instances),
            _pct(p.utilization),
            _pct(p.headroom),
        ]
        for p in plan.pools
    ]


def _baselines_section(slo_rps: float, baselines: Baselines) -> Section:
    """The plan's SLO RPS (`slo_rps`) against the GPU-only and greedy baselines'."""
    gpu, greedy = baselines.gpu_only, baselines.greedy
    return Section(
        "Baselines",
        ["baseline", "SLO RPS", "plan / baseline", "note"],
        [
            [
                f"gpu_only ({gpu.device or 'none'})",
                _num(gpu.slo_rps),
                _ratio(slo_rps, gpu.slo_rps),
                gpu.reason or "",
            ],
            ["greedy", _num(greedy.slo_rps), _ratio(slo_rps, greedy.slo_rps), ""],
        ],
    )


def footer_lines(plan: Plan) -> list[str]:
    lines = [f"profile set {plan.profile_set.name} (sha256 {plan.profile_set.sha256[:12]})"]
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines


def write_sections(sections: list[Section], out: IO[str]) -> None:
    """Each section as a titled table of aligned plain-text columns."""
    for section in sections:
        out.write(f"\n{section.title}\n")
        table = [list(section.headers), *[list(r) for r in section.rows]]
        widths = [max(len(row[i]) for row in table) for i in range(len(section.headers))]
        for n, row in enumerate(table):
            line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            out.write(line.rstrip() + "\n")
            if n == 0:
                out.write("  ".join("-" * width for width in widths) + "\n")


def render_plain(plan: Plan, out: IO[str]) -> None:
    """Aligned columns, no colour: for terminals without rich and for logs."""
    out.write(summary_line(plan) + "\n")
    write_sections(plan_report(plan), out)
    out.write("\n" + "\n".join(footer_lines(plan)) + "\n")


def render_rich(plan: Plan, out: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, highlight=False)
    console.print(summary_line(plan), markup=False)
    for section in plan_report(plan):
        table = Table(title=section.title, title_justify="left", show_edge=False)
        for header in section.headers:
            table.add_column(header, overflow="fold")
        for row in section.rows:
            table.add_row(*row)
        console.print()
        console.print(table)
    console.print()
    for line in footer_lines(plan):
        console.print(line, markup=False)


def render(plan: Plan, out: IO[str], *, plain: bool = False) -> None:
    """The table view: rich if installed (and not `plain`), else plain text."""
    if not plain:
        try:
            import rich  # noqa: F401
        except ImportError:
            plain = True
    (render_plain if plain else render_rich)(plan, out)
    if plan.simulation is not None:  # `verify: "simulate"`: its report, which only --json showed before
        out.write("\nsimulation (verify: simulate)\n")
        render_simulation(plan.simulation, out)


# --- a simulation (fleetplan simulate) ---------------------------------------------------------------------


def simulation_summary(report: SimulationReport) -> list[str]:
    """What was run, then both attainments: of the admitted requests and of all offered demand."""
    of_demand = "-" if report.attainment_of_demand is None else _pct(report.attainment_of_demand)
    lines = [
        f"simulated {report.duration_s:g} s ({report.arrivals_source} arrivals, seed {report.seed}, "
        f"rate x{report.rate_scale:g}): {report.events:,} events in {report.wall_ms:,.0f} ms",
        f"attainment {_pct(report.attainment)} of admitted requests ({_num(report.offered_rps)} RPS "
        f"admitted), {of_demand} of offered demand ({_num(report.demand_rps)} RPS)",
        f"goodput {_num(report.goodput_rps)} RPS simulated vs {_num(report.predicted_goodput_rps)} predicted",
    ]
    if report.unrouted:
        lines.append(f"{report.unrouted:,} trace rows in the window had no served class (unrouted)")
    return lines


def _at_percentile(c: ClassMetrics, metric: str) -> float | None:
    return getattr(c, f"{metric}_ms_p{c.slo_percentile}")


def simulation_report(report: SimulationReport) -> list[Section]:
    """Per class (latencies at the class's SLO percentile) and per pool, simulated next to predicted."""
    classes = [
        [
            c.name,
            _num(c.demand_rps),
            _num(c.offered_rps),
            _num(c.goodput_rps),
            _num(c.predicted_rps),
            _pct(c.attainment),
            _pct(c.attainment_of_demand),
            f"p{c.slo_percentile}",
            f"{_num(_at_percentile(c, 'ttft'), 1)} / {c.slo_ttft_ms:g}",
            f"{_num(_at_percentile(c, 'tbt'), 1)} / {c.slo_tbt_ms:g}",
            _num(c.mean_queue_wait_ms, 1),
            "yes" if c.slo_met else "no",
        ]
        for c in report.classes
    ]
    pools = [
        [
            f"{p.role} {p.workload or p.model} {p.device}/tp{p.tp}/b{p.batch}"
            + (f"#{p.group}" if p.group else "")
            + f" x{p.instances}",
            _pct(p.utilization_predicted),
            _pct(p.utilization_simulated),
            _pct(p.occupancy_simulated),
        ]
        for p in report.pools
    ]
    headers = ["class", "demand", "admitted", "goodput", "predicted", "attainment", "of demand", "pct"]
    headers += ["TTFT ms / SLO", "TBT ms / SLO", "queue ms", "SLO met"]
    title = "classes (RPS; attainment of admitted requests and of all offered demand)"
    return [
        Section(title, headers, classes),
        Section("pools", ["pool", "util predicted", "util simulated", "slot occupancy"], pools),
    ]


def render_simulation(report: SimulationReport, out: IO[str]) -> None:
    """The simulate command's table view (plain text)."""
    out.write("\n".join(simulation_summary(report)) + "\n")
    write_sections(simulation_report(report), out)


__all__ = [
    "plan_report",
    "render",
    "render_plain",
    "render_rich",
    "render_simulation",
    "route_label",
    "simulation_report",
    "simulation_summary",
    "summary_line",
]
