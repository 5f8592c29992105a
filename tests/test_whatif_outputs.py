"""The what-if outputs as a reader sees them: the pictures (which curves are drawn, where, how they read) and
the CLI's table, on synthetic sweeps (no solves; the files themselves are checked in tests/test_whatif.py)."""

import matplotlib.colors
import msgspec
import pytest

from fleetplan.models.whatif import BaselinePoint, Point, PointBaselines, WhatIfResult, WhatIfSolver
from fleetplan.whatif.frontier import frontier
from fleetplan.whatif.plots import devices_figure, frontier_figure, heatmap_figure, pyplot


def point(
    coords: dict[str, float], rps: float, cost: float, demand: float, gpu=(1.0, 1.0), greedy=(2.0, 2.0)
):
    return Point(
        coords=coords,
        status="optimal",
        slo_rps=rps,
        demand_rps=demand,
        cost_per_hour=cost,
        mip_gap=0.0,
        devices={"gpu": int(cost), "tpu": 1},
        baselines=PointBaselines(
            gpu_only=BaselinePoint(slo_rps=gpu[0], cost_per_hour=gpu[1]),
            greedy=BaselinePoint(slo_rps=greedy[0], cost_per_hour=greedy[1]),
        ),
    )


def result(axes: list[str], points: list[Point]) -> WhatIfResult:
    solver = WhatIfSolver(
        backend="highs", executor="serial", workers=1, candidates_built=1, solves=1, reused=0
    )
    return WhatIfResult(axes=axes, points=points, frontier=frontier(points), solver=solver, wall_ms=1.0)


@pytest.fixture
def plt():
    plt = pyplot()
    yield plt
    plt.close("all")


def legend_texts(figure) -> list[str]:
    return [t.get_text() for legend in figure.legends for t in legend.get_texts()]


def test_a_budget_sweep_draws_baselines_as_steps_and_a_panel_against_the_budget(plt):
    sweep = result(
        ["budget_per_hour"],
        [
            point({"budget_per_hour": 2}, 3.0, 2.0, 10, gpu=(1.0, 1.0), greedy=(2.0, 2.0)),
            point({"budget_per_hour": 4}, 6.0, 4.0, 10, gpu=(1.5, 2.0), greedy=(2.5, 3.0)),
            point({"budget_per_hour": 6}, 8.0, 6.0, 10, gpu=(1.5, 2.0), greedy=(5.0, 6.0)),
        ],
    )
    figure = frontier_figure(sweep, plt)
    by_cost, by_budget = figure.axes
    assert by_cost.get_xlabel() == "cost of the devices in use, $/h"
    assert by_budget.get_xlabel() == "budget, $/h"
    # every curve a step: what a spend or a budget buys holds until more buys more (a straight line made
    # the greedy baseline look better than the plan between two points)
    curves = [line for ax in figure.axes for line in ax.get_lines() if line.get_linestyle() != "--"]
    assert curves
    assert {line.get_drawstyle() for line in curves} == {"steps-post"}
    # the baselines at each budget, on the budget panel: GPU-only holds 1.5 from 4 $/h on
    gpu = next(line for line in by_budget.get_lines() if line.get_label() == "GPU-only baseline")
    assert list(gpu.get_xdata()) == [2, 4, 6]
    assert list(gpu.get_ydata()) == [1.0, 1.5, 1.5]
    texts = legend_texts(figure)
    for name in ("GPU-only baseline", "greedy baseline", "Pareto frontier (plan)", "demand (10 req/s)"):
        assert name in texts
    assert not by_cost.get_legend()  # one legend below the panels, over no data


def test_two_axes_give_each_scenario_its_own_frontier(plt):
    # at 5 $/h the 1x scenario's best plan (8 req/s) is beaten by the 1.5x scenario's (12 req/s): one
    # frontier across the scenarios drops it, each scenario's own keeps it
    points = [
        point({"budget_per_hour": b, "demand_scale": s}, rps, cost, 10 * s)
        for b, s, rps, cost in [
            (3, 1.0, 5.0, 3.0),
            (3, 1.5, 6.0, 3.0),
            (5, 1.0, 8.0, 5.0),
            (5, 1.5, 12.0, 5.0),
        ]
    ]
    sweep = result(["budget_per_hour", "demand_scale"], points)
    assert 2 not in sweep.frontier
    figure = frontier_figure(sweep, plt)
    by_cost = figure.axes[0]
    steps = [line for line in by_cost.get_lines() if line.get_linewidth() == 1.6]
    drawn = {
        matplotlib.colors.to_hex(line.get_color()): list(zip(line.get_xdata(), line.get_ydata(), strict=True))
        for line in steps
    }
    assert drawn[matplotlib.colors.to_hex("C0")] == [(3.0, 5.0), (5.0, 8.0)]
    assert drawn[matplotlib.colors.to_hex("C1")] == [(3.0, 6.0), (5.0, 12.0)]
    texts = legend_texts(figure)
    assert {"demand scale 1", "demand scale 1.5", "greedy baseline", "GPU-only baseline"} <= set(texts)
    # each scenario's demand in its colour, none drawn as the largest for all
    levels = {line.get_ydata()[0] for line in by_cost.get_lines() if line.get_linestyle() == "--"}
    assert levels == {10.0, 15.0}


def test_a_demand_sweep_draws_the_demand_along_its_axis(plt):
    points = [point({"demand_scale": s}, min(10 * s, 12.0), 6.0, 10 * s) for s in (0.5, 1.0, 1.5)]
    figure = frontier_figure(result(["demand_scale"], points), plt)
    by_scale = figure.axes[1]
    assert by_scale.get_xlabel() == "demand scale, x the base rates"
    assert list(by_scale.get_xticks()) == [0.5, 1.0, 1.5]
    demand = next(line for line in by_scale.get_lines() if line.get_label() == "demand")
    assert list(demand.get_ydata()) == [5.0, 10.0, 15.0]


def test_devices_ticks_sit_at_the_swept_values_on_one_scale_with_the_legend_outside(plt):
    points = [
        point({"budget_per_hour": b, "demand_scale": s}, 1.0, cost, 10)
        for b, s, cost in [(8, 1, 3.0), (14, 1, 9.0), (8, 2, 5.0), (14, 2, 15.0)]
    ]
    figure = devices_figure(result(["budget_per_hour", "demand_scale"], points), plt)
    first, second = figure.axes
    assert list(first.get_xticks()) == [8, 14]
    assert first.get_ylim() == second.get_ylim()  # sharey: 16 devices reads as 16 in both
    assert first.get_legend() is None
    assert legend_texts(figure) == ["gpu", "tpu"]
    assert second.get_title() == "demand scale = 2"


def test_heatmap_values_are_dark_on_light_cells_and_white_on_dark(plt):
    points = [
        point({"budget_per_hour": b, "demand_scale": s}, rps, 1.0, 10)
        for b, s, rps in [(1, 1, 1.0), (2, 1, 5.0), (1, 2, 6.0), (2, 2, 20.0)]
    ]
    figure = heatmap_figure(result(["budget_per_hour", "demand_scale"], points), plt)
    colours = {t.get_text(): matplotlib.colors.to_hex(t.get_color()) for t in figure.axes[0].texts}
    assert colours["20.0"] == "#000000"  # the colour map's yellow end
    assert colours["1.0"] == "#ffffff"  # its dark purple end


def test_the_points_table_tells_no_gain_from_not_asked_and_shows_the_baselines():
    import fleetplan.api.cli  # noqa: F401  (cli_whatif builds on it)
    from fleetplan.api.cli_whatif import render_points

    asked = point({"budget_per_hour": 2}, 3.0, 2.0, 10, gpu=(1.25, 1.0), greedy=(2.5, 2.0))
    asked = msgspec.structs.replace(asked, marginal_rps={"gpu": 0.0, "tpu": 0.0})
    gains = msgspec.structs.replace(
        asked, coords={"budget_per_hour": 4}, marginal_rps={"gpu": 0.5, "tpu": 0.0}
    )
    unasked = msgspec.structs.replace(asked, coords={"budget_per_hour": 6}, marginal_rps={})
    lines = render_points(result(["budget_per_hour"], [asked, gains, unasked])).splitlines()
    header = lines[0].split()
    assert header[-4:] == ["marginal_rps", "gpu_only", "greedy", "F"]
    cells = [line.split() for line in lines[1:4]]
    column = header.index("marginal_rps") + 1  # the devices cell holds two words
    assert [row[column] for row in cells] == ["0", "gpu=0.50", "-"]
    assert [row[column + 1 : column + 3] for row in cells] == [["1.25", "2.50"]] * 3
    assert "(0: none adds any, -: not asked)" in lines[-1]


def test_a_min_cost_point_the_fleet_cannot_serve_in_full_is_on_the_frontier_when_nothing_beats_it():
    """Its plan is the max-goodput one it falls back to (status `infeasible`): 109 RPS at 35.85 $/h that no
    other point beat showed grey (session 34's planner test)."""
    points = [
        point({"demand_scale": 1.0}, 60.0, 30.0, 60.0),
        msgspec.structs.replace(point({"demand_scale": 2.0}, 109.0, 35.85, 120.0), status="infeasible"),
    ]
    assert frontier(points) == [0, 1]


def test_an_axis_grid_has_no_float_dust_and_many_scenarios_get_distinct_colours(plt):
    from fleetplan.models.whatif import Axis

    assert Axis(param="price:inf2", start=0.6, stop=1.6, num=11).grid()[6] == 1.2  # not 1.2000000000000002
    scenarios = [0.5 + 0.1 * k for k in range(12)]
    points = [point({"budget_per_hour": b, "price:tpu": p}, b, b, 10) for p in scenarios for b in (1.0, 2.0)]
    figure = frontier_figure(result(["budget_per_hour", "price:tpu"], points), plt)
    plans = [line for line in figure.axes[0].get_lines() if line.get_linewidth() == 1.6]
    colours = {matplotlib.colors.to_hex(line.get_color()) for line in plans}
    assert len(plans) == len(colours) == 12  # C{k % 10} gave the 1st and the 11th one colour
    assert "on the 12 scenarios' frontiers" in figure.texts[0].get_text()


def _slow_points(ctx, chunk, done=None):
    """A task for LocalProcesses: each point takes a little while and is reported as it ends."""
    import time

    for _ in chunk:
        time.sleep(ctx)
        if done is not None:
            done(1)
    return len(chunk)


def test_local_processes_report_points_as_they_finish_not_chunks():
    """Session 34's planner test: the bar moved by whole chunks (~37 of 220 points at a time)."""
    from fleetplan.whatif.executors import LocalProcesses

    calls: list[int] = []
    chunks = [list(range(0, 8)), list(range(8, 16))]
    results = LocalProcesses(2).run(_slow_points, 0.1, chunks, calls.append)
    assert results == [8, 8]
    assert sum(calls) == 16  # every point once
    assert len(calls) >= 4  # in steps smaller than a chunk (8 points), as the workers go
    assert max(calls) < 8
