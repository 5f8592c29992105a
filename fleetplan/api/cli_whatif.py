"""`fleetplan whatif`: a thin shell over fleetplan.whatif.run_whatif (the same function POST /whatif calls).

Exit codes as `fleetplan plan`: 0 success, 2 bad input, 1 the planner failed.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleetplan.api.cli import _fail, _request_path, writable_dir
from fleetplan.progress import progress_bar

if TYPE_CHECKING:
    from fleetplan.models.whatif import PointBaselines, WhatIfRequest, WhatIfResult


def parse_axis(text: str) -> dict:
    """`PARAM=START:STOP:NUM` (inclusive, evenly spaced) or `PARAM=V1,V2,...` -> an Axis as builtins."""
    param, sep, spec = text.partition("=")
    if not sep or not param or not spec:
        msg = f"{text!r}: give PARAM=START:STOP:NUM or PARAM=V1,V2,..."
        raise click.BadParameter(msg, param_hint="--axis")
    try:
        if ":" in spec and "," not in spec:
            parts = spec.split(":")
            if len(parts) != 3:
                msg = f"{text!r}: a range is START:STOP:NUM (three numbers), got {len(parts)}"
                raise click.BadParameter(msg, param_hint="--axis")
            start, stop, num = parts
            return {"param": param, "start": float(start), "stop": float(stop), "num": int(num)}
        return {"param": param, "values": [float(v) for v in spec.split(",")]}
    except ValueError as error:
        raise click.BadParameter(f"{text!r}: {error}", param_hint="--axis") from error


def _whatif_request(file: Path, axes: tuple[str, ...], baselines: bool, marginal: bool) -> "WhatIfRequest":
    """REQUEST is a PlanRequest (the base; --axis required) or a whole WhatIfRequest (--axis replaces its
    axes when given); either way decoded through models.codec."""
    import json

    from fleetplan.models.codec import convert, read_request, to_builtins
    from fleetplan.models.errors import InputError
    from fleetplan.models.whatif import WhatIfRequest

    try:
        raw = json.loads(file.read_bytes())
    except (OSError, ValueError):
        raw = None
    if isinstance(raw, dict) and "base" in raw:
        body = raw
    else:
        body = {"base": to_builtins(read_request(file))}
    if axes:
        body["axes"] = [parse_axis(a) for a in axes]
    if "axes" not in body:
        raise InputError("give at least one --axis PARAM=START:STOP:NUM or PARAM=V1,V2", field="axes")
    body.setdefault("baselines", baselines)
    body.setdefault("marginal", marginal)
    return convert(body, WhatIfRequest)


@click.command("whatif")
@click.argument("file", metavar="REQUEST", callback=_request_path)
@click.option(
    "--axis",
    "axes",
    multiple=True,
    metavar="PARAM=SPEC",
    help="budget_per_hour, demand_scale, slo_scale, count:DEV, max_count:DEV or price:DEV, "
    "= START:STOP:NUM or V1,V2,...; once or twice (a grid).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the WhatIfResult as JSON (POST /whatif's body).")
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write one row per point to FILE ('-': stdout).",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write frontier, devices (and for two axes heatmap) as .png and .svg to DIR.",
)
@click.option("--workers", type=int, metavar="N", help="Local worker processes (default: the CPU count).")
@click.option("--scheduler", metavar="tcp://HOST:PORT", help="Run the points on this Dask scheduler.")
@click.option("--baselines/--no-baselines", default=True, show_default=True, help="Both baselines per point.")
@click.option(
    "--marginal/--no-marginal",
    default=True,
    show_default=True,
    help="SLO RPS of one more device per type, per point.",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar (stderr).")
def whatif_command(
    file: Path,
    axes: tuple[str, ...],
    as_json: bool,
    csv_path: Path | None,
    plot_dir: Path | None,
    workers: int | None,
    scheduler: str | None,
    baselines: bool,
    marginal: bool,
    progress: bool,
) -> None:
    """Sweep the request in REQUEST (a file or a bundled example) over one or two axes: per point the
    plan's SLO RPS, cost, devices, binding limits and marginal RPS per device; the Pareto frontier."""
    from fleetplan.models.codec import encode
    from fleetplan.models.errors import InputError, PlannerError
    from fleetplan.whatif import run_whatif, to_csv
    from fleetplan.whatif.executors import make_executor
    from fleetplan.whatif.plots import write_plots

    try:
        if as_json and csv_path is not None and str(csv_path) == "-":  # one document on stdout, not two
            raise InputError("--json and --csv - both write to stdout; give --csv a file", field="--csv")
        request = _whatif_request(file, axes, baselines, marginal)
        _check_writable(csv_path, plot_dir)  # before the sweep, not after it
        executor = make_executor(workers, scheduler)
        with progress_bar("what-if points", progress) as update:
            result = run_whatif(request, executor, progress=update)
        if plot_dir is not None:
            for path in write_plots(result, plot_dir):
                click.echo(f"wrote {path}", err=True)
    except PlannerError as error:
        _fail(error)
    if csv_path is not None:
        text = to_csv(result)
        if str(csv_path) == "-":
            click.echo(text, nl=False)
        else:
            csv_path.write_text(text)
            click.echo(f"wrote {csv_path}", err=True)
    if as_json:
        import msgspec

        click.echo(msgspec.json.format(encode(result), indent=2).decode())
    elif csv_path is None or str(csv_path) != "-":
        click.echo(render_points(result), nl=False)


def _check_writable(csv_path: Path | None, plot_dir: Path | None) -> None:
    """InputError naming --plot or --csv when the directory cannot be made or the file's folder is not
    one this process can write (found after the sweep, that was a traceback and the sweep lost)."""
    if plot_dir is not None:
        writable_dir(plot_dir, "--plot")
    if csv_path is not None and str(csv_path) != "-":
        writable_dir(csv_path.parent, "--csv")


def _baselines(base: "PointBaselines | None") -> list[str]:
    """A point's GPU-only and greedy SLO RPS cells ("-" where the point has none)."""
    if base is None:
        return ["-", "-"]
    return [f"{base.gpu_only.slo_rps:.2f}", f"{base.greedy.slo_rps:.2f}"]


def render_points(result: "WhatIfResult") -> str:
    """One aligned line per point: coordinates, status, SLO RPS, cost, devices, binding, marginal RPS (the
    devices one more of which adds SLO RPS; 0 where none does, - where not asked), both baselines' SLO RPS
    where the sweep has them; `*` marks the frontier."""
    on = set(result.frontier)
    with_baselines = bool(result.points) and result.points[0].baselines is not None
    header = [*result.axes, "status", "slo_rps", "demand", "cost/h", "devices", "binding", "marginal_rps"]
    header += ["gpu_only", "greedy"] if with_baselines else []
    header.append("F")
    rows = [header]
    for i, p in enumerate(result.points):
        used = p.devices.items()
        gains = " ".join(f"{n}={v:.2f}" for n, v in p.marginal_rps.items() if v > 0)
        base = p.baselines
        rows.append(
            [
                *(f"{p.coords[a]:g}" for a in result.axes),
                p.status,
                f"{p.slo_rps:.2f}",
                f"{p.demand_rps:.2f}",
                f"{p.cost_per_hour:.2f}",
                " ".join(f"{n}={u}" + (f"(+{p.bought[n]})" if p.bought.get(n) else "") for n, u in used),
                ",".join(p.binding) or "-",
                gains or ("0" if p.marginal_rps else "-"),
                *(_baselines(base) if with_baselines else []),
                "*" if i in on else "",
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    s = result.solver
    lines.append(
        f"{len(result.points)} points in {result.wall_ms / 1e3:.1f} s on {s.executor} ({s.workers} workers): "
        f"{s.solves} solves, {s.reused} reused plans; * = Pareto frontier (cost vs SLO RPS); marginal_rps: "
        "SLO RPS one more device of a type adds (0: none adds any, -: not asked)"
    )
    return "\n".join(lines) + "\n"
