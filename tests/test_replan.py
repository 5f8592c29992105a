"""The nightly re-plan on an SQLite file: unchanged inputs, a faster decode device under max_moves,
failing re-plans that keep the last good plan, `fleetplan replan` on the paper fleet with an Azure trace."""

from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from store_helpers import QUICK_GATE, faster_inf2_decode, paper_rows, tiny_request

from fleetplan import fixtures
from fleetplan.api.cli import main
from fleetplan.api.cli_store import exit_code
from fleetplan.models.codec import convert, encode, read_request
from fleetplan.models.profile import ProfilesSpec
from fleetplan.models.store import ReplanRequest, Run
from fleetplan.replan import replan
from fleetplan.store import open_repository

GATE_ARGS = ["--gate-seeds", "1", "--gate-duration", "20", "--gate-warmup", "5"]


@pytest.fixture
def repo(tmp_path):
    repository = open_repository(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    yield repository
    repository.engine.dispose()


def _moves(before, after) -> int:
    """Instances added or removed, recounted from the two plans' pools (not through replan.diff)."""
    key = lambda p: (p.model, p.role, p.device, p.tp, p.batch)  # noqa: E731
    old, new = Counter(), Counter()
    for pool in before.pools:
        old[key(pool)] += pool.instances
    for pool in after.pools:
        new[key(pool)] += pool.instances
    return sum(abs(new[k] - old[k]) for k in set(old) | set(new))


def _decode(plan, device: str) -> int:
    return sum(p.instances for p in plan.pools if p.role == "decode" and p.device == device)


def test_unchanged_inputs_give_an_empty_diff_and_exit_0(tmp_path):
    runner = CliRunner()
    env = {"FLEETPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    request_file = tmp_path / "tiny.json"
    request_file.write_bytes(encode(tiny_request()))
    put = runner.invoke(main, ["fleet", "put", "tiny", str(request_file)], env=env)
    assert put.exit_code == 0, put.output
    assert "version 1" in put.output
    first = runner.invoke(main, ["replan", "tiny", *GATE_ARGS], env=env)
    assert first.exit_code == 0, first.output
    assert "PROMOTED" in first.output
    second = runner.invoke(main, ["replan", "tiny", *GATE_ARGS, "--json"], env=env)
    assert second.exit_code == 0, second.output
    run = msgspec.json.decode(second.stdout, type=Run)
    assert run.status == "unchanged"
    assert run.diff.moves == 0
    assert (run.diff.pools, run.diff.devices, run.diff.classes) == ([], [], [])
    assert run.diff.slo_rps.before == run.diff.slo_rps.after == pytest.approx(20.0)
    assert run.plan_id == run.previous_plan_id


@pytest.mark.parametrize("max_moves", [4, None])
def test_a_faster_decode_device_moves_decode_there_within_max_moves(repo, max_moves):
    repo.put_fleet("tiny", tiny_request())
    first = replan(repo, "tiny", ReplanRequest(gate=QUICK_GATE))
    assert first.status == "promoted"
    before = repo.get_plan(first.plan_id).plan
    assert _decode(before, "inf2") == 0  # inf2's 5.7 ms decode step breaks the 5 ms TBT SLO
    assert _decode(before, "a6000ada") > 4
    faster = ProfilesSpec(rows=convert(faster_inf2_decode(paper_rows()).to_dict("records"), list))
    order = ReplanRequest(profiles=faster, max_moves=max_moves, gate=QUICK_GATE)
    second = replan(repo, "tiny", order)
    assert second.status == "promoted", second.reason
    after = repo.current_plan("tiny").plan
    assert _decode(after, "inf2") > 0  # decode moved to the faster, cheaper device
    assert after.slo_rps == pytest.approx(before.slo_rps)
    assert after.cost_per_hour < before.cost_per_hour
    assert second.diff.moves == _moves(before, after)
    if max_moves is None:
        assert second.diff.moves > 4  # without the limit the re-plan moves more than the limit allows
    else:
        assert 0 < second.diff.moves <= max_moves


def test_failing_replans_leave_the_last_good_plan_current(repo):
    repo.put_fleet("tiny", tiny_request())
    good = replan(repo, "tiny", ReplanRequest(gate=QUICK_GATE))
    assert good.status == "promoted"

    unknown = replan(repo, "tiny", ReplanRequest(profiles=ProfilesSpec(set="no-such-set"), gate=QUICK_GATE))
    assert unknown.status == "failed"
    assert "no-such-set" in unknown.reason
    assert exit_code(unknown) == 1

    # every pool planned at 100% of its capacity: queues grow without bound and the gate says no
    repo.put_fleet("tiny", tiny_request(rate_rps=30.0, max_utilization=1.0))
    overloaded = replan(repo, "tiny", ReplanRequest(gate=QUICK_GATE))
    assert overloaded.status == "kept", overloaded.reason
    assert not overloaded.gate.passed
    assert overloaded.reason.startswith("gate:")
    assert exit_code(overloaded) == 3
    assert repo.get_plan(overloaded.plan_id).state == "candidate"

    # fewer devices than the plan in force uses, and no move allowed: no plan, the current one stays
    shrunk = tiny_request()
    devices = [msgspec.structs.replace(d, count=2) if d.name == "a6000ada" else d for d in shrunk.devices]
    repo.put_fleet("tiny", msgspec.structs.replace(shrunk, devices=devices))
    limited = replan(repo, "tiny", ReplanRequest(max_moves=0, gate=QUICK_GATE))
    assert limited.status == "kept"
    assert "max_moves=0" in limited.reason
    assert exit_code(limited) == 3

    current = repo.current_plan("tiny")
    assert current.id == good.plan_id
    assert current.state == "current"
    assert [r.status for r in repo.list_runs("tiny")] == ["kept", "kept", "failed", "promoted"]


def _azure_trace(path: Path, request, seconds: float) -> None:
    """Evenly spaced requests of every class at its rate, with its exact shape and model."""
    frames = []
    for w in request.workloads:
        count = int(round(w.rate_rps * seconds))
        times = (np.arange(count) + 0.5) / w.rate_rps
        frames.append(
            pd.DataFrame(
                {
                    "t": times,
                    "ContextTokens": w.prompt_tokens,
                    "GeneratedTokens": w.output_tokens,
                    "model": w.model,
                }
            )
        )
    trace = pd.concat(frames).sort_values("t", kind="stable")
    stamps = pd.Timestamp("2026-11-22T00:00:00") + pd.to_timedelta(trace.pop("t"), unit="s")
    trace.insert(0, "TIMESTAMP", stamps.astype(str))
    trace.to_csv(path, index=False)


def test_cli_replan_of_the_paper_fleet_with_an_azure_trace(tmp_path):
    runner = CliRunner()
    env = {"FLEETPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'paper.db'}"}
    paper = fixtures.request_path("paper")
    request = read_request(paper)
    trace = tmp_path / "azure.csv"
    _azure_trace(trace, request, seconds=240.0)
    assert runner.invoke(main, ["fleet", "put", "paper", str(paper)], env=env).exit_code == 0
    args = [
        "replan",
        "paper",
        "--traffic",
        str(trace),
        "--interval",
        "60",
        "--forecast",
        "constant",
        *GATE_ARGS,
    ]
    table = runner.invoke(main, args, env=env)
    assert table.exit_code == 0, table.output
    text = table.stdout
    assert "PROMOTED" in text
    header = next(line for line in text.splitlines() if line.startswith("model"))
    assert header.split() == ["model", "role", "device", "tp", "batch", "before", "after", "change"]
    assert "slo_rps" in text
    assert "forecast (constant, 24 h, q0.95)" in text
    plans = runner.invoke(main, ["plans", "paper", "--json"], env=env)
    (stored,) = msgspec.json.decode(plans.stdout)
    # every pool of the stored plan is a row of the table, with its instances as "after"
    for pool in stored["plan"]["pools"]:
        assert any(
            line.split()[:3] == [pool["model"], pool["role"], pool["device"]] for line in text.splitlines()
        ), pool
    # the forecast is the observed rate of the last minute: each class's rate, within one request
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("forecast ("))
    forecast_rows = {
        line.split()[0]: line.split() for line in lines[start + 3 : start + 3 + len(request.workloads)]
    }
    for w in request.workloads:
        assert float(forecast_rows[w.name][-1]) == pytest.approx(w.rate_rps, abs=1 / 60 + 1e-9)

    as_json = runner.invoke(main, [*args, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    run = msgspec.json.decode(as_json.stdout, type=Run)
    assert run.status == "unchanged"
    assert run.fleet == "paper"
    assert run.forecast.method == "constant"
    assert [c.name for c in run.forecast.classes] == [w.name for w in request.workloads]
    assert run.diff.moves == 0


def _store_with(tmp_path, sets: dict[str, tuple[pd.DataFrame, str]]):
    from fleetplan.models.profile import ProfileSetManifest
    from fleetplan.profiler.store import ProfileStore, bundled_root

    root = tmp_path / "profiles"
    store = ProfileStore([bundled_root(), root], writable=root)
    for name, (frame, created) in sets.items():
        manifest = ProfileSetManifest(
            name=name, description="test", sha256="", rows=0, generator="test", created=created
        )
        store.save(name, frame, manifest)
    return store


def test_profiles_null_takes_the_newest_set_that_covers_the_fleet(tmp_path):
    """REPLAN `profiles: null`: the newest stored set with every model and device of the fleet; a newer set
    that lacks a fleet device does not count, and without a newer covering set the fleet keeps its own."""
    from fleetplan.replan.service import newest_profiles

    rows = paper_rows().assign(source="test")
    only_a6000 = rows[rows["device"] == "a6000ada"]
    store = _store_with(
        tmp_path,
        {
            "mine": (rows, "2026-11-01"),
            "newer": (faster_inf2_decode(rows), "2026-11-20"),
            "newest-partial": (only_a6000, "2026-11-22"),
        },
    )
    fleet = msgspec.structs.replace(tiny_request(), profiles=ProfilesSpec(set="mine"))
    assert newest_profiles(fleet, store) == ProfilesSpec(set="newer")
    newer_fleet = msgspec.structs.replace(fleet, profiles=ProfilesSpec(set="newer"))
    assert newest_profiles(newer_fleet, store) == ProfilesSpec(set="newer")
    inline = tiny_request()
    assert newest_profiles(inline, store) is inline.profiles
