"""A Plan as tables for a terminal: rich when it is installed, aligned plain text otherwise.

`plan_report` turns a Plan into neutral sections (title, headers, rows); the two renderers only lay
them out, so both show the same figures.
"""

from collections.abc import Sequence
from typing import IO

from fleetplan.models.plan import Plan, PoolRef, Route

Row = Sequence[str]


class Section:
    """One table of the report."""

    def __init__(self, title: str, headers: Row, rows: list[Row], note: str | None = None) -> None:
        self.title = title
        self.headers = headers
        self.rows = rows
        self.note = note


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else ("-" if value <= 0 else "inf")


def pool_label(ref: PoolRef) -> str:
    return f"{ref.device}/tp{ref.tp}/b{ref.batch}"


def route_label(route: Route) -> str:
    """ "a6000ada/tp1/b4 -> inf2/tp1/b4" (disaggregated) or "colocated a6000ada/tp1/b4"."""
    if route.colocated is not None:
        return f"colocated {pool_label(route.colocated)}"
    prefill = pool_label(route.prefill) if route.prefill else "?"
    decode = pool_label(route.decode) if route.decode else "?"
    return f"{prefill} -> {decode}"


def summary_line(plan: Plan) -> str:
    served = plan.slo_rps / plan.demand_rps if plan.demand_rps > 0 else None
    return (
        f"status {plan.status} ({plan.objective})  |  SLO RPS {_num(plan.slo_rps)} / {_num(plan.demand_rps)}"
        f" demand ({_pct(served)})  |  bound {_num(plan.bound_rps)}  |  gap {_pct(plan.mip_gap, 2)}"
        f"  |  cost {_num(plan.cost_per_hour)}/h  |  solve {_num(plan.solver.solve_ms, 1)} ms"
        f" (build {_num(plan.solver.build_ms, 1)} ms, {plan.solver.backend})"
    )


def plan_report(plan: Plan) -> list[Section]:
    """The sections of the table view, in reading order."""
    routes: list[Row] = []
    for w in plan.workloads:
        share = f"{_num(w.served_rps)}/{_num(w.served_rps + w.unserved_rps)}"
        reason = w.reason or ""
        if not w.routes:
            routes.append([w.name, share, "-", "-", "-", "-", reason])
        for i, r in enumerate(w.routes):
            first = i == 0
            routes.append([
                w.name if first else "",
                share if first else "",
                route_label(r),
                _num(r.rps),
                _num(r.ttft_ms, 1),
                _num(r.tbt_ms, 1),
                reason if first else "",
            ])
    pools: list[Row] = [
        [p.role, p.model + (f" ({p.workload})" if p.workload else ""), p.device, str(p.tp), str(p.batch),
         str(p.instances), _pct(p.utilization)]
        for p in plan.pools
    ]
    devices: list[Row] = [[d.name, f"{d.used}/{d.available}"] for d in plan.devices]
    links: list[Row] = [
        [f"{link.source} -> {link.target}", _num(link.gbps), _num(link.budget_gbps)] for link in plan.links
    ]
    sections = [
        Section("Classes", ["class", "served/demand", "route", "rps", "TTFT ms", "TBT ms", "reason"], routes),
        Section("Pools", ["role", "model", "device", "tp", "batch", "instances", "utilization"], pools),
        Section("Devices", ["device", "used/available"], devices),
    ]
    if links:
        sections.append(Section("Links (Gbit/s)", ["link", "KV traffic", "budget"], links))
    if plan.baselines is not None:
        gpu, greedy = plan.baselines.gpu_only, plan.baselines.greedy
        sections.append(
            Section(
                "Baselines",
                ["baseline", "SLO RPS", "plan / baseline", "note"],
                [
                    [
                        f"gpu_only ({gpu.device or 'none'})",
                        _num(gpu.slo_rps),
                        _ratio(plan.slo_rps, gpu.slo_rps),
                        gpu.reason or "",
                    ],
                    ["greedy", _num(greedy.slo_rps), _ratio(plan.slo_rps, greedy.slo_rps), ""],
                ],
            )
        )
    return sections


def footer_lines(plan: Plan) -> list[str]:
    lines = [f"profile set {plan.profile_set.name} (sha256 {plan.profile_set.sha256[:12]})"]
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines


def render_plain(plan: Plan, out: IO[str]) -> None:
    """Aligned columns, no colour: for terminals without rich and for logs."""
    out.write(summary_line(plan) + "\n")
    for section in plan_report(plan):
        out.write(f"\n{section.title}\n")
        table = [list(section.headers), *[list(r) for r in section.rows]]
        widths = [max(len(row[i]) for row in table) for i in range(len(section.headers))]
        for n, row in enumerate(table):
            line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            out.write(line.rstrip() + "\n")
            if n == 0:
                out.write("  ".join("-" * width for width in widths) + "\n")
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


__all__ = ["plan_report", "render", "render_plain", "render_rich", "route_label", "summary_line"]
