"""The discrete-event replay of a plan (fleetplan/simulator, docs/simulation.md)."""

from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.fleet import Device
from fleetplan.models.plan import Options, PlanRequest
from fleetplan.models.profile import ProfileRow, ProfilesSpec
from fleetplan.models.workload import Slo, Workload
from fleetplan.profiler.latency import quantile_params, sample_ms
from fleetplan.simulator import load_trace, map_trace_to_classes, simulate
from fleetplan.solver.pipeline import plan, resolve_profiles

ROOT = Path(__file__).resolve().parents[1]
PAPER = fixtures.request_path("paper")


def _paper(max_utilization: float | None = None) -> PlanRequest:
    request = msgspec.json.decode(PAPER.read_bytes(), type=PlanRequest)
    if max_utilization is not None:
        request = msgspec.structs.replace(request, options=Options(max_utilization=max_utilization))
    return request


@pytest.fixture(scope="module")
def paper_headroom():
    """The paper fixture planned with 40 % headroom (max_utilization 0.6): healthy at its planned rate."""
    request = _paper(0.6)
    return request, plan(request, with_baselines=False), resolve_profiles(request)


def _md1_request(service_ms: float, rate_rps: float) -> PlanRequest:
    """One device, one class of one-token outputs, batch 1, every percentile equal: a deterministic server."""
    rows = [
        ProfileRow(
            model="llama-3.2-1b",
            device="dev",
            tp=1,
            batch=1,
            prompt_tokens=p,
            ttft_ms_p50=service_ms,
            ttft_ms_p90=service_ms,
            ttft_ms_p99=service_ms,
            tbt_ms_p50=1.0,
            tbt_ms_p90=1.0,
            tbt_ms_p99=1.0,
        )
        for p in (64, 256)
    ]
    return PlanRequest(
        devices=[Device(name="dev", count=1)],
        workloads=[
            Workload(
                name="w",
                model="llama-3.2-1b",
                prompt_tokens=128,
                output_tokens=1,
                rate_rps=rate_rps,
                slo=Slo(ttft_ms=10_000.0, tbt_ms=100.0, percentile=90),
            )
        ],
        profiles=ProfilesSpec(rows=rows),
        options=Options(max_utilization=1.0, allow_disaggregated=False),
    )


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_single_deterministic_server_matches_md1_mean_wait(rho):
    service_s = 0.1
    request = _md1_request(service_s * 1e3, rho / service_s)
    result = plan(request, with_baselines=False)
    assert [(p.role, p.instances, p.batch) for p in result.pools] == [("colocated", 1, 1)]
    report = simulate(
        request,
        result,
        resolve_profiles(request),
        duration_s=40_000.0,
        warmup_s=200.0,
        seed=7,
        deterministic=True,
    )
    expected_ms = 1e3 * rho * service_s / (2 * (1 - rho))
    simulated_ms = report.classes[0].mean_queue_wait_ms
    assert simulated_ms == pytest.approx(expected_ms, rel=0.10), (simulated_ms, expected_ms)
    # TTFT = wait + D exactly: nothing else happens to a one-token request on a colocated batch-1 pool.
    assert report.pools[0].utilization_simulated == pytest.approx(rho, abs=0.02)


def test_overload_drops_attainment(paper_headroom):
    request, result, table = paper_headroom
    at_plan = simulate(request, result, table, duration_s=240.0, warmup_s=30.0, seed=1)
    doubled = simulate(request, result, table, duration_s=240.0, warmup_s=30.0, seed=1, rate_scale=2.0)
    assert at_plan.attainment >= 0.95
    assert doubled.attainment < at_plan.attainment - 0.20
    assert doubled.offered_rps == pytest.approx(2 * at_plan.offered_rps, rel=0.1)


def test_overload_of_default_plan_also_drops():
    request = _paper()
    result = plan(request, with_baselines=False)
    table = resolve_profiles(request)
    at_plan = simulate(request, result, table, duration_s=120.0, warmup_s=30.0, seed=3)
    doubled = simulate(request, result, table, duration_s=120.0, warmup_s=30.0, seed=3, rate_scale=2.0)
    assert doubled.attainment < at_plan.attainment - 0.20


def _strip(report):
    return msgspec.structs.replace(report, wall_ms=0.0)


def test_reproducible_by_seed(paper_headroom):
    request, result, table = paper_headroom
    kwargs = {"duration_s": 60.0, "warmup_s": 10.0}
    first = simulate(request, result, table, seed=11, **kwargs)
    again = simulate(request, result, table, seed=11, **kwargs)
    other = simulate(request, result, table, seed=12, **kwargs)
    assert msgspec.json.encode(_strip(first)) == msgspec.json.encode(_strip(again))
    assert msgspec.json.encode(_strip(first)) != msgspec.json.encode(_strip(other))
    assert [c.ttft_ms_p90 for c in first.classes] != [c.ttft_ms_p90 for c in other.classes]


def test_predicted_vs_simulated_goodput(paper_headroom):
    request, result, table = paper_headroom
    report = simulate(request, result, table, duration_s=300.0, warmup_s=30.0, seed=5)
    assert report.predicted_goodput_rps == pytest.approx(result.slo_rps)
    assert report.goodput_rps == pytest.approx(report.predicted_goodput_rps, rel=0.10)
    served = {w.name: w.served_rps for w in result.workloads}
    for c in report.classes:
        assert c.predicted_rps == pytest.approx(served[c.name])
        if c.arrivals:
            assert c.offered_rps == pytest.approx(served[c.name], abs=1e-6)  # rounded to 6 decimals
            assert c.completed == c.arrivals
    assert {p.role for p in report.pools} >= {"colocated"}
    assert all(0 <= p.utilization_simulated <= 1.0 + 1e-9 for p in report.pools)


def test_trace_rows_map_to_nearest_class(tmp_path, paper_headroom):
    request, result, table = paper_headroom
    csv = tmp_path / "trace.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    # 1b-short (128/128) is the nearest class for small prompts; 1024/128 for long ones; every model shares
    # the shapes, so the first class of each shape (the llama-3.2-1b ones) wins the tie.
    shapes = [(100, 120), (600, 130), (2000, 100), (130, 140)]
    stamps = [f"2023-11-16 18:15:{46 + i // 4:02d}.{(i % 4) * 25:02d}00000" for i in range(40)]
    for i, stamp in enumerate(stamps):
        p, o = shapes[i % 4]
        lines.append(f"{stamp},{p},{o}")
    csv.write_text("\n".join(lines) + "\n")
    frame = load_trace(csv)
    assert frame["t_s"].iloc[0] == 0.0
    assert frame["t_s"].iloc[-1] == pytest.approx(9.75)
    names = [request.workloads[i].name for i in map_trace_to_classes(request, frame)]
    assert names[:4] == ["1b-short", "1b-medium", "1b-long", "1b-short"]
    report = simulate(request, result, table, duration_s=20.0, warmup_s=0.0, trace=csv, seed=0)
    assert report.arrivals_source == "trace"
    assert report.arrivals == 40
    by_name = {c.name: c for c in report.classes}
    assert by_name["1b-short"].arrivals == 20
    assert by_name["1b-medium"].arrivals == 10
    assert by_name["1b-long"].arrivals == 10
    assert report.completed == 40


def test_quantile_sampler_reproduces_percentiles():
    params = quantile_params(10.0, 14.0, 20.0)
    assert sample_ms(params, 0.0) == pytest.approx(10.0)
    rng = np.random.default_rng(0)
    samples = np.array([sample_ms(params, z) for z in rng.standard_normal(200_000)])
    assert np.percentile(samples, [50, 90, 99]) == pytest.approx([10.0, 14.0, 20.0], rel=0.02)
    assert sample_ms(quantile_params(5.0, float("nan"), float("nan")), 3.0) == pytest.approx(5.0)


def test_trace_rows_naming_a_model_go_to_that_models_classes(paper_headroom):
    """With a `model` column a row may only take a class of its model (nearest among them); rows of a model
    with no class are unrouted. Without the column, the same shapes go to the first (llama-3.2-1b) classes."""
    request, result, table = paper_headroom
    shapes = [
        (100, 120, "llama-3.2-3b"),
        (600, 130, "mistral-7b"),
        (2000, 100, "llama-3.2-1b"),
        (130, 140, "gpt-x"),
    ]
    rows = [(0.25 * i, *shapes[i % 4]) for i in range(40)]
    frame = pd.DataFrame(rows, columns=["TIMESTAMP", "ContextTokens", "GeneratedTokens", "model"])
    mapped = map_trace_to_classes(request, load_trace(frame))
    names = [request.workloads[i].name if i >= 0 else None for i in mapped[:4]]
    assert names == ["3b-short", "mistral-medium", "1b-long", None]
    blind = map_trace_to_classes(request, load_trace(frame.drop(columns="model")))
    assert [request.workloads[i].name for i in blind[:4]] == ["1b-short", "1b-medium", "1b-long", "1b-short"]

    served = {w.name: w.served_rps > 0 for w in result.workloads}
    report = simulate(request, result, table, duration_s=20.0, warmup_s=0.0, trace=frame, seed=0)
    by_name = {c.name: c for c in report.classes}
    named = ("3b-short", "mistral-medium", "1b-long")
    for name in named:  # a class the plan does not serve gets nothing: its rows are unrouted
        assert by_name[name].arrivals == (10 if served[name] else 0)
    assert by_name["1b-short"].arrivals == 0
    assert report.unrouted == 10 + 10 * sum(not served[name] for name in named)
    assert report.arrivals == 10 * sum(served[name] for name in named)


@pytest.fixture(scope="module")
def with_unserved_class():
    """The paper fixture plus a class whose prompt is outside every profile: the plan cannot serve it."""
    request = _paper(0.6)
    too_long = msgspec.structs.replace(
        request.workloads[0], name="1b-too-long", prompt_tokens=4096, rate_rps=5.0
    )
    request = msgspec.structs.replace(request, workloads=[*request.workloads, too_long])
    result = plan(request, with_baselines=False)
    assert result.workloads[-1].served_rps == 0.0
    return request, result, resolve_profiles(request)


def test_an_unserved_class_shows_zero_attainment_and_its_demand(with_unserved_class):
    request, result, table = with_unserved_class
    report = simulate(request, result, table, duration_s=60.0, warmup_s=10.0, seed=2, rate_scale=1.5)
    unserved = report.classes[-1]
    assert unserved.arrivals == 0
    assert unserved.attainment == 0.0  # never 100% for demand the plan turns away
    assert unserved.attainment_of_demand == 0.0
    assert unserved.demand_rps == pytest.approx(5.0 * 1.5)
    assert not unserved.slo_met
    for c, w, res in zip(report.classes, request.workloads, result.workloads, strict=True):
        assert c.demand_rps == pytest.approx(w.rate_rps * 1.5)
        share = res.served_rps / w.rate_rps
        assert c.attainment_of_demand == pytest.approx(c.attainment * share, abs=2e-6)
    demand = sum(w.rate_rps for w in request.workloads) * 1.5
    assert report.demand_rps == pytest.approx(demand)
    met = sum(
        c.attainment * res.served_rps * 1.5 for c, res in zip(report.classes, result.workloads, strict=True)
    )
    assert report.attainment_of_demand == pytest.approx(met / demand, abs=1e-5)
    served = sum(res.served_rps for res in result.workloads) * 1.5
    assert report.attainment_of_demand <= served / demand + 1e-9 < 1.0


def test_trace_demand_counts_rows_the_plan_does_not_serve(with_unserved_class):
    request, result, table = with_unserved_class
    shapes = [(128, 128), (4000, 128)]  # 1b-short, and the unserved 1b-too-long
    frame = pd.DataFrame(
        [(0.5 * i, *shapes[i % 2]) for i in range(40)],
        columns=["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
    )
    report = simulate(request, result, table, duration_s=20.0, warmup_s=0.0, trace=frame, seed=0)
    by_name = {c.name: c for c in report.classes}
    assert report.unrouted == 20
    assert by_name["1b-too-long"].demand_rps == pytest.approx(20 / 20.0)
    assert by_name["1b-too-long"].attainment_of_demand == 0.0
    assert by_name["1b-short"].demand_rps == pytest.approx(20 / 20.0)
    assert report.demand_rps == pytest.approx(40 / 20.0)
    met = by_name["1b-short"].goodput_rps * 20.0
    assert report.attainment_of_demand == pytest.approx(met / 40)
    assert report.attainment == pytest.approx(met / 20)


def test_simulate_command_shows_both_attainments(with_unserved_class, tmp_path):
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    request, _, _ = with_unserved_class
    path = tmp_path / "request.json"
    path.write_bytes(msgspec.json.encode(request))
    out = CliRunner().invoke(main, ["simulate", str(path), "--duration", "20", "--warmup", "5"])
    assert out.exit_code == 0, out.output
    assert "of admitted requests" in out.output
    assert "of offered demand" in out.output
    row = next(line for line in out.output.splitlines() if line.startswith("1b-too-long"))
    assert row.split()[5:7] == ["0.0%", "0.0%"]  # attainment, of demand


def test_a_trace_row_naming_no_model_is_routed_by_its_shape(paper_headroom):
    """A blank `model` cell was the string "nan" and its row unrouted; " llama-3.2-1b" missed its model."""
    request, _, _ = paper_headroom
    frame = pd.DataFrame(
        [(0, 100, 120, None), (1, 600, 130, ""), (2, 2000, 100, " llama-3.2-1b")],
        columns=["TIMESTAMP", "ContextTokens", "GeneratedTokens", "model"],
    )
    mapped = map_trace_to_classes(request, load_trace(frame))
    assert [request.workloads[i].name for i in mapped] == ["1b-short", "1b-medium", "1b-long"]


def test_simulate_command_refuses_what_it_cannot_replay(tmp_path):
    """Each of these was a Python traceback (exit 1), or a replay of a plan of another request: 4 GPUs
    simulated for a fleet of 1."""
    from click.testing import CliRunner

    from fleetplan.api.cli import main
    from fleetplan.models.codec import encode

    runner = CliRunner()
    paper = fixtures.request_path("paper")
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(encode(plan(read_request(paper), with_baselines=False)))
    base = ["simulate", str(plan_file), "--request", str(paper), "--duration", "20"]
    empty, late = tmp_path / "empty.csv", tmp_path / "late.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    late.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,128,128\n1,128,128\n")
    cases = {
        ("--duration", "0"): "duration_s: 0.0 cannot be simulated",
        ("--rate-scale", "nan"): "rate_scale: nan cannot be simulated",
        ("--duration", "1e12"): "--duration: 5.6e+13 arrivals expected",
        ("--seed", "-1"): "seed: -1 cannot be simulated",
        ("--plot", str(tmp_path / "p.txt")): "a picture is one of .png, .svg, .pdf",
        ("--trace", str(empty)): "--trace: ",
        ("--trace", str(late)): "the trace spans 1 s and the measured window starts at 60 s",
        (
            "--request",
            str(fixtures.request_path("scarce_gpus")),
        ): "plan: the plan uses 4 a6000ada, the request has 1",
    }
    for args, says in cases.items():
        result = runner.invoke(main, [*base, *args])
        assert result.exit_code == 2, (args, result.output)
        assert says in result.stderr, (args, result.stderr)
