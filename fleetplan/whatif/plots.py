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
from fleetplan.whatif.frontier import frontier as pareto

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
# how it reads in a legend or title
_SHORT = {
    "budget_per_hour": "budget",
    "demand_scale": "demand scale",
    "slo_scale": "SLO scale",
    "count": "{device} owned",
    "max_count": "{device} max_count",
    "price": "{device} price",
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
    with plt.rc_context({"svg.fonttype": "none"}):  # SVG text as text: searchable, selectable, smaller
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


def short_label(param: str) -> str:
    """An axis parameter as a legend or title reads it ("demand scale", "tpu-v5e owned")."""
    kind, _, device = param.partition(":")
    return _SHORT[kind].format(device=device)


def _series_axis(result: WhatIfResult) -> str | None:
    """The axis whose values tell the frontier picture's curves apart: with two axes the one that is not the
    budget (the second where neither or both are); with one axis none (one curve)."""
    if len(result.axes) != 2:
        return None
    first, second = result.axes
    return first if second == "budget_per_hour" and first != "budget_per_hour" else second


def _along(result: WhatIfResult) -> str:
    """The axis the second panel of the frontier picture runs along: the one that is not _series_axis."""
    series = _series_axis(result)
    return next(a for a in result.axes if a != series) if series is not None else result.axes[0]


def _groups(result: WhatIfResult) -> list[tuple[str | None, list[int]]]:
    """(legend label, indices of the points with a plan, in order along _along) per curve of the frontier
    picture: one per value of _series_axis, so that each scenario gets its own frontier and baselines, never
    one across them."""
    points, along = result.points, _along(result)
    solved = sorted(_solved(points), key=lambda i: points[i].coords[along])
    axis = _series_axis(result)
    if axis is None:
        return [(None, solved)]
    values = sorted({points[i].coords[axis] for i in solved})
    label = short_label(axis)
    return [(f"{label} {v:g}", [i for i in solved if points[i].coords[axis] == v]) for v in values]


def _colours(group: int, many: int) -> dict[str, Any]:
    """Colours of one curve group of `many` (0 or 1: a single group): one per series for a single group;
    one per group for several (the series then differ by line style and marker)."""
    if not many:
        return {"plan": "tab:blue", "gpu_only": "tab:red", "greedy": "tab:orange", "points": "0.6"}
    return dict.fromkeys(("plan", "gpu_only", "greedy", "points"), _group_colour(group, many))


def _group_colour(group: int, many: int) -> Any:
    """The colour of scenario `group` of `many`: the ten of the default cycle while they last, else a
    continuous map (C{k % 10} gave the 1st and 11th scenario one colour)."""
    if many <= 10:
        return f"C{group}"
    import matplotlib

    return matplotlib.colormaps["viridis"](group / max(many - 1, 1))


# (field, legend label, marker, line style when groups share a colour)
_BASELINES = (("gpu_only", "GPU-only baseline", "v", "-."), ("greedy", "greedy baseline", "s", ":"))
# axes along which a value holds until the next buys more (steps); along the others, points joined
_STEPPED = ("budget_per_hour", "count", "max_count")


def _curve(ax: Any, pairs: list[tuple[float, float]], steps: bool, **style: Any) -> None:
    """(x, SLO RPS) pairs in order of x as a step curve (each value holds from its x to the next: what a
    spend or a budget buys holds until more buys more, so no straight line suggests values between) or,
    along an axis without that meaning, as points joined by lines."""
    if pairs:
        x, y = zip(*sorted(pairs), strict=True)
        if steps:
            ax.step(x, y, where="post", **style)
        else:
            ax.plot(x, y, **style)


def frontier_figure(result: WhatIfResult, plt: Any) -> Any:
    """Two panels: SLO RPS against the cost of the devices in use (every point, the frontier marked and
    joined, both baselines at what they spend), and against the swept axis (the budget where it is one:
    plan and baselines at each budget). With two axes one curve group per value of the other axis."""
    points = result.points
    groups = _groups(result)
    many = len(groups) > 1
    along = _along(result)
    figure, (by_cost, by_axis) = plt.subplots(1, 2, figsize=(13.5, 5.4), layout="constrained")
    shown = 0
    for k, (label, rows) in enumerate(groups):
        colours = _colours(k, len(groups) if many else 0)
        shown += _frontier_group(by_cost, points, rows, label, colours, many, result.frontier)
        _axis_group(by_axis, points, rows, label, colours, many, along)
        _demand((by_cost, by_axis), points, rows, along, colours["plan"] if many else None)
    top = max(p.demand_rps for p in points) * 1.08 or None
    for ax in (by_cost, by_axis):
        ax.set_ylabel("SLO-compliant goodput, req/s")
        ax.set_ylim(bottom=0, top=top)
        ax.grid(True, alpha=0.3)
    by_cost.set_xlim(left=0)
    by_cost.set_xlabel("cost of the devices in use, $/h")
    by_cost.set_title("against cost: the Pareto frontier", fontsize="medium")
    by_axis.set_xlabel(axis_label(along))
    _ticks_at(by_axis, np.array([p.coords[along] for p in points]))
    budget = along == "budget_per_hour"
    what = "against the budget: what each budget buys" if budget else f"along {short_label(along)}: each plan"
    by_axis.set_title(what, fontsize="medium")
    _frontier_legend(figure, (by_cost, by_axis), many)
    names = " x ".join(short_label(a) for a in result.axes)
    where = f"the {len(groups)} scenarios' frontiers" if many else "the frontier"
    figure.suptitle(f"What-if over {names}: {len(points)} points, {shown} distinct plans on {where}")
    return figure


def _frontier_group(ax, points, rows, label, colours, many, frontier) -> int:
    """One scenario's points, frontier and baselines in cost space; the number of distinct frontier plans."""
    if not rows:
        return 0
    ax.scatter(
        [points[i].cost_per_hour for i in rows],
        [points[i].slo_rps for i in rows],
        s=14,
        color=colours["points"],
        alpha=0.45 if many else 1.0,
        zorder=2,
        label=None if many else "plan at a point",
    )
    if points[rows[0]].baselines is not None:

        def spent(name: str) -> list[tuple[float, float]]:
            base = [getattr(points[i].baselines, name) for i in rows]
            return [(b.cost_per_hour, b.slo_rps) for b in base]

        _baseline_curves(ax, spent, True, colours, many, 3.5)
    # one scenario: the answer's own frontier; several: each its own, never one across them
    mine = set(rows)
    on = [rows[j] for j in pareto([points[i] for i in rows])] if many else [i for i in frontier if i in mine]
    pairs = sorted({(points[i].cost_per_hour, points[i].slo_rps) for i in on})
    _curve(ax, pairs, True, color=colours["plan"], linewidth=1.6, zorder=3)
    if pairs:
        x, y = zip(*pairs, strict=True)
        text = label or "Pareto frontier (plan)"
        ax.scatter(x, y, s=40, color=colours["plan"], edgecolor="black", zorder=4, label=text)
    return len(pairs)


def _axis_group(ax, points, rows, label, colours, many, along) -> None:
    """One scenario's plan and baselines along the swept axis (steps along a budget or a device count)."""
    steps = along.partition(":")[0] in _STEPPED
    at = [points[i].coords[along] for i in rows]
    plan = [(x, points[i].slo_rps) for x, i in zip(at, rows, strict=True)]
    text = label or ("plan at each budget" if along == "budget_per_hour" else "plan")
    _curve(ax, plan, steps, color=colours["plan"], linewidth=1.6, marker="o", markersize=3, label=text)
    if not rows or points[rows[0]].baselines is None:
        return

    def served(name: str) -> list[tuple[float, float]]:
        return [(x, getattr(points[i].baselines, name).slo_rps) for x, i in zip(at, rows, strict=True)]

    _baseline_curves(ax, served, steps, colours, many, 3)


def _baseline_curves(ax, pairs_of, steps: bool, colours, many: bool, size: float) -> None:
    """Both baselines' curves, `pairs_of(name)` their (x, SLO RPS): each in its colour (several scenarios:
    the scenario's, told apart by line style and marker), named in the legend once."""
    for name, text, marker, dashes in _BASELINES:
        _curve(
            ax,
            pairs_of(name),
            steps,
            color=colours[name],
            linestyle=dashes if many else "-",
            linewidth=1.1,
            marker=marker,
            markersize=size,
            label=None if many else text,
        )


def _demand(axes, points, rows, along, colour: str | None) -> None:
    """A scenario's demand, dashed: a level line on both panels where it is one value, else a curve along
    the axis (a demand_scale axis) and nothing on the cost panel. `colour` None: the only scenario, grey
    and named in the legend (several share the proxy entry _frontier_legend adds)."""
    if not rows:
        return
    demand = [points[i].demand_rps for i in rows]
    style = {"color": colour or "0.3", "linestyle": "--", "linewidth": 0.9}
    if max(demand) - min(demand) <= 1e-9 * max(1.0, max(demand)):
        label = None if colour else f"demand ({demand[0]:g} req/s)"
        for ax in axes:
            ax.axhline(demand[0], label=label, **style)
        return
    axes[1].plot([points[i].coords[along] for i in rows], demand, label=None if colour else "demand", **style)


def _frontier_legend(figure, axes, many) -> None:
    """One legend below the panels, where it covers no data: the series (each named once) and, with several
    scenarios, which colour is which and which line style is which baseline."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in labels:
                handles.append(handle)
                labels.append(text)
    if many:
        for _, text, marker, dashes in _BASELINES:
            handles.append(Line2D([], [], color="0.3", linestyle=dashes, marker=marker, markersize=3.5))
            labels.append(text)
        handles.append(Line2D([], [], color="0.3", linestyle="--", linewidth=0.9))
        labels.append("demand (the scenario's colour)")
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize="small")


def _ticks_at(ax: Any, values: np.ndarray) -> None:
    """x ticks at the swept values where there are few enough to read (else matplotlib's own)."""
    values = np.unique(values)
    if len(values) <= 12:
        ax.set_xticks(values, [f"{v:g}" for v in values])


def devices_figure(result: WhatIfResult, plt: Any) -> Any:
    """Devices in use per type, stacked, along the first axis (one panel per value of a second axis, at
    most six, on one y scale)."""
    points = result.points
    first = result.axes[0]
    seconds = sorted({p.coords[result.axes[1]] for p in points}) if len(result.axes) == 2 else [None]
    seconds = seconds[:: max(1, -(-len(seconds) // 6))]
    names = list(points[0].devices)
    size = (min(5.5 + 3.2 * len(seconds), 19), 4.8)
    figure, axes = plt.subplots(
        1, len(seconds), figsize=size, squeeze=False, sharey=True, layout="constrained"
    )
    colours = plt.get_cmap("tab10")
    for ax, second in zip(axes[0], seconds, strict=True):
        mine = [p for p in points if second is None or p.coords[result.axes[1]] == second]
        x = np.array([p.coords[first] for p in mine])
        _device_bars(ax, mine, x, names, colours)
        _ticks_at(ax, x)
        ax.set_xlabel(axis_label(first))
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, axis="y", alpha=0.3)
        if second is not None:
            ax.set_title(f"{short_label(result.axes[1])} = {second:g}", fontsize="medium")
    axes[0][0].set_ylabel("devices in use, count")
    bought_any = any(any(p.bought.values()) for p in points)
    title = "device (hatched: bought)" if bought_any else "device"
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper", fontsize="small", title=title)
    figure.suptitle("Devices per type in each point's plan")
    return figure


def _device_bars(ax: Any, mine: list[Point], x: np.ndarray, names: list[str], colours: Any) -> None:
    """One panel's stacked bars: devices in use per type, the bought ones hatched."""
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
            if np.isfinite(value):  # dark text on the colour map's light end, white on its dark end
                red, green, blue, _ = image.cmap(image.norm(value))
                light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5  # perceived brightness
                colour = "black" if light else "white"
                ax.text(col, row, f"{value:.1f}", ha="center", va="center", color=colour, fontsize="small")
    ax.set_title("SLO-compliant goodput over both axes")
    return figure
