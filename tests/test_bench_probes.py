"""bench/route_tails.py (a plan split into one class per route, misses counted route by route),
bench/load_slack.py (where a plan breaks as its arrivals grow) and bench/uniform_seeds.py (the uniform
plans on more seeds)."""

import pytest

from bench.route_tails import misses, per_class, split
from bench.uniform_seeds import at_rho, first_break, render
from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import plan


@pytest.fixture(scope="module")
def paper():
    request = read_request(fixtures.request_path("paper"))
    return request, plan(request, with_baselines=False)


def test_a_split_plan_has_one_class_per_route_at_its_rate(paper):
    request, result = paper
    split_request, split_plan, where = split(request, result)
    routes = [route for served in result.workloads for route in served.routes]
    assert len(split_request.workloads) == len(split_plan.workloads) == len(where) == len(routes)
    for workload, served, (w, r) in zip(split_request.workloads, split_plan.workloads, where, strict=True):
        original = request.workloads[w]
        route = result.workloads[w].routes[r]
        assert served.routes == [route]
        assert workload.rate_rps == served.served_rps == route.rps
        assert (workload.model, workload.prompt_tokens, workload.output_tokens, workload.slo) == (
            original.model,
            original.prompt_tokens,
            original.output_tokens,
            original.slo,
        )
    assert split_plan.pools == result.pools
    assert sum(w.rate_rps for w in split_request.workloads) == pytest.approx(result.slo_rps, rel=1e-9)


def test_misses_are_counted_per_route_and_summed_per_class(paper):
    request, result = paper
    routes = misses(request, result, seeds=[0], duration=60.0)
    assert len(routes) == sum(len(served.routes) for served in result.workloads)
    assert all(row["measured"] > 0 for row in routes)
    assert all(0 <= row["ttft_misses"] <= row["measured"] for row in routes)
    classes = per_class(routes)
    assert {c["class"] for c in classes} == {w.name for w in result.workloads if w.routes}
    for c in classes:
        mine = [row for row in routes if row["class"] == c["class"]]
        assert c["measured"] == sum(row["measured"] for row in mine)
        assert c["ttft_miss"] == pytest.approx(sum(row["ttft_misses"] for row in mine) / c["measured"])
        assert c["worst_route_ttft_miss"] == max(row["ttft_miss"] for row in mine)
        assert c["ttft_miss"] <= c["worst_route_ttft_miss"] + 1e-12


def test_load_slack_finds_where_a_plan_breaks(paper):
    from bench.load_slack import evaluate, summary

    request, result = paper
    row = evaluate(("paper", request, [2.0], [0], 120.0))
    # at twice its planned arrivals the busiest decode pool (about 0.97 of its full-batch rate) overloads
    assert row["slo_rps"] == pytest.approx(result.slo_rps)
    assert row["held"] == 1.0
    assert row["breaks_at"] == 2.0
    assert row["broken_tbt"] + row["broken_ttft"] > 0
    assert row["busiest"]["decode"] == max(p.utilization for p in result.pools if p.role == "decode")
    total = summary([row])
    assert total["held"] == {"1.0": 1}
    assert total["broken_tbt"] == row["broken_tbt"]


def test_uniform_seeds_finds_the_break_of_an_overloaded_uniform_plan_and_summarises(paper):
    """bench/uniform_seeds.py: paper.json's flat plan at rho 0.95 (the fidelity bench found it unsafe on seed
    0) breaks a served class on seed 0; the summary counts a request as at least its uniform plan only when
    it is, on the seeds that chose it and on all of them, and the ratios divide the default's objective."""
    request, _ = paper
    hot = at_rho(request, 0.95)
    assert (hot.options.capacity_model, hot.options.max_utilization) == ("flat", 0.95)
    broke = first_break(hot, plan(hot, with_baselines=False), [0])
    assert broke is not None
    assert broke[0] == 0
    assert broke[1] in {w.name for w in request.workloads}
    rows = [
        {"request": "a", "rho": 0.5, "uniform": 10.0, "breaks": None, "safe_rho": 0.5, "safe_uniform": 10.0,
         "default": 11.0},
        {"request": "b", "rho": 0.6, "uniform": 10.0, "breaks": {"seed": 11, "class": "c"}, "safe_rho": 0.5,
         "safe_uniform": 8.0, "default": 9.0},
    ]  # fmt: skip
    text, summary = render(rows, list(range(3, 15)))
    assert summary["uniform_breaks_beyond_0_2"] == ["b"]
    assert summary["default_at_least_uniform"] == 1
    assert summary["default_at_least_uniform_all_seeds"] == 2
    assert summary["geomean_default_over_uniform"] == pytest.approx((1.1 * 0.9) ** 0.5)
    assert summary["geomean_default_over_uniform_all_seeds"] == pytest.approx((1.1 * 9 / 8) ** 0.5)
    assert "seed 11: c" in text
