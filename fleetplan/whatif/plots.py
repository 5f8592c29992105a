"""Pictures of a sweep (matplotlib, Agg backend): the frontier, devices per type, and a heatmap.

Each function returns the picture as PNG or SVG bytes; write_plots writes them all to a directory.
`pyplot()` is the one lazy matplotlib import the project's plots share (api/plots.py too), so that the
service and the CLI start without loading matplotlib.
"""

import io
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.models.whatif import Point, WhatIfResult

Format = Literal["png", "svg"]
PLOTS = ("frontier", "devices", "heatmap")
# how each axis parameter reads on a plot axis, with its unit
_LABELS = {
    "budget_per_hour": "budget, $/h",
    "demand_scale": "demand scale, x the base rates",
    "slo_scale": "SLO scale, x the base TTFT and TBT SLOs",
    "count": "{device} owned, devices",
    "max_count": "{device} max_count, devices",
    "price": "{device} price, $/h per device",
}
_DPI = 110


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed), imported on first use."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # a core dependency; only a broken install gets here
        msg = "plotting needs matplotlib: pip install matplotlib"
        raise InputError(msg, field="plot") from error
    return plt


def axis_label(param: str) -> str:
    kind, _, device = param.partition(":")
    return _LABELS[kind].format(device=device)


def render(result: WhatIfResult, kind: str, fmt: Format) -> bytes:
    """One picture of `result` as bytes; InputError (field `plot`) for an unknown kind, or a heatmap of a
    one-axis sweep."""
    draw = {"frontier": frontier_figure, "devices": devices_figure, "heatmap": heatmap_figure}.get(kind)
    if draw is None:
        msg = f"unknown plot {kind!r}; one of {', '.join(PLOTS)}"
        raise InputError(msg, field="plot")
    if not result.points:
        raise InputError("the sweep has no points to plot", field="plot")
    plt = pyplot()
    figure = draw(result, plt)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=_DPI)
    plt.close(figure)
    return buffer.getvalue()


def write_plots(result: WhatIfResult, directory: Path) -> list[Path]:
    """frontier.png/.svg, devices.png/.svg and, for two axes, heatmap.png/.svg in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    kinds = PLOTS if len(result.axes) == 2 else PLOTS[:2]
    written = []
    for kind in kinds:
        for fmt in ("png", "svg"):
            path = directory / f"{kind}.{fmt}"
            path.write_bytes(render(result, kind, fmt))  # type: ignore[arg-type]
            written.append(path)
    return written


def _solved(points: list[Point]) -> list[int]:
    return [i for i, p in enumerate(points) if p.status in ("optimal", "feasible", "infeasible")]


def frontier_figure(result: WhatIfResult, plt: Any) -> Any:
    """SLO RPS against cost: every point, the frontier marked and joined, both baselines as curves (each
    at what it spends at every point), and the demand as a dashed line."""
    points = result.points
    figure, ax = plt.subplots(figsize=(8, 5.2), constrained_layout=True)
    solved = _solved(points)
    cost = np.array([points[i].cost_per_hour for i in solved])
    rps = np.array([points[i].slo_rps for i in solved])
    ax.scatter(cost, rps, s=18, color="0.65", label="plan at a point", zorder=2)
    if points[0].baselines is not None:
        for name, colour, marker in (("gpu_only", "tab:red", "v"), ("greedy", "tab:orange", "s")):
            pairs = sorted(
                (getattr(points[i].baselines, name).cost_per_hour, getattr(points[i].baselines, name).slo_rps)
                for i in solved
            )
            if pairs:
                x, y = zip(*pairs, strict=True)
                label = "GPU-only baseline" if name == "gpu_only" else "greedy baseline"
                ax.plot(x, y, color=colour, marker=marker, markersize=3.5, linewidth=1.2, label=label)
    on = sorted(result.frontier, key=lambda i: (points[i].cost_per_hour, points[i].slo_rps))
    if on:
        fx = [points[i].cost_per_hour for i in on]
        fy = [points[i].slo_rps for i in on]
        ax.step(fx, fy, where="post", color="tab:blue", linewidth=1.6, zorder=3)
        label = "Pareto frontier (plan)"
        ax.scatter(fx, fy, s=42, color="tab:blue", edgecolor="black", zorder=4, label=label)
    demand = max(p.demand_rps for p in points)
    ax.axhline(demand, color="0.3", linestyle="--", linewidth=0.9, label=f"demand ({demand:g} req/s)")
    ax.set_xlabel("cost of the devices in use, $/h")
    ax.set_ylabel("SLO-compliant goodput, req/s")
    ax.set_ylim(bottom=0, top=demand * 1.08 if demand > 0 else None)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(f"What-if over {', '.join(result.axes)}: {len(points)} points, {len(on)} on the frontier")
    return figure


def devices_figure(result: WhatIfResult, plt: Any) -> Any:
    """Devices in use per type, stacked, along the first axis (one panel per value of a second axis, at
    most six)."""
    points = result.points
    first = result.axes[0]
    seconds = sorted({p.coords[result.axes[1]] for p in points}) if len(result.axes) == 2 else [None]
    seconds = seconds[:: max(1, -(-len(seconds) // 6))]
    names = list(points[0].devices)
    size = (min(5 + 3.2 * len(seconds), 18), 4.8)
    figure, axes = plt.subplots(1, len(seconds), figsize=size, squeeze=False, constrained_layout=True)
    colours = plt.get_cmap("tab10")
    for ax, second in zip(axes[0], seconds, strict=True):
        mine = [p for p in points if second is None or p.coords[result.axes[1]] == second]
        x = np.array([p.coords[first] for p in mine])
        width = 0.8 * (np.min(np.diff(np.unique(x))) if len(np.unique(x)) > 1 else 1.0)
        bottom = np.zeros(len(mine))
        for k, name in enumerate(names):
            used = np.array([p.devices.get(name, 0) for p in mine], float)
            ax.bar(x, used, width=width, bottom=bottom, color=colours(k % 10), label=name)
            bought = np.array([p.bought.get(name, 0) for p in mine], float)
            if bought.any():
                ax.bar(
                    x,
                    bought,
                    width=width,
                    bottom=bottom + used - bought,
                    color="none",
                    hatch="//",
                    edgecolor="black",
                    linewidth=0,
                )
            bottom += used
        ax.set_xlabel(axis_label(first))
        ax.set_ylabel("devices in use, count")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, axis="y", alpha=0.3)
        if second is not None:
            ax.set_title(f"{axis_label(result.axes[1])} = {second:g}", fontsize="medium")
    bought_any = any(any(p.bought.values()) for p in points)
    title = "device (hatched: bought)" if bought_any else "device"
    axes[0][0].legend(loc="upper left", fontsize="small", title=title)
    figure.suptitle("Devices per type in each point's plan")
    return figure


def heatmap_figure(result: WhatIfResult, plt: Any) -> Any:
    """SLO RPS over the two axes, one cell per point, the value written in cells when there are few."""
    if len(result.axes) != 2:
        raise InputError("heatmap needs a sweep over two axes", field="plot")
    points = result.points
    a, b = result.axes
    xs = sorted({p.coords[a] for p in points})
    ys = sorted({p.coords[b] for p in points})
    grid = np.full((len(ys), len(xs)), np.nan)
    for p in points:
        grid[ys.index(p.coords[b]), xs.index(p.coords[a])] = p.slo_rps
    figure, ax = plt.subplots(figsize=(8, 5.5), constrained_layout=True)
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
    figure.colorbar(image, ax=ax, label="SLO-compliant goodput, req/s")
    for axis, values, label in ((ax.xaxis, xs, axis_label(a)), (ax.yaxis, ys, axis_label(b))):
        step = max(1, len(values) // 10)
        axis.set_ticks(range(0, len(values), step))
        axis.set_ticklabels([f"{v:g}" for v in values[::step]])
        axis.set_label_text(label)
    if grid.size <= 80:
        for (row, col), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(col, row, f"{value:.1f}", ha="center", va="center", color="white", fontsize="small")
    ax.set_title("SLO-compliant goodput over both axes")
    return figure
