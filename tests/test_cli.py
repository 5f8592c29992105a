"""The `fleetplan` command line through click's CliRunner: table and JSON output, exit codes and the
"error: <field>: <reason>" line for bad input, the profiles listing, and lazy imports."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from click.testing import CliRunner
from test_api import inline_request, write_store

from fleetplan import fixtures
from fleetplan.api.cli import main
from fleetplan.models.errors import SolverFailure
from fleetplan.models.plan import Plan


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def write_request(tmp_path: Path, body: dict[str, Any] | str, name: str = "request.json") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def test_plan_prints_tables(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["plan", str(write_request(tmp_path, inline_request()))])
    assert result.exit_code == 0, result.output + result.stderr
    out = result.stdout
    first = out.splitlines()[0]
    for part in ("status optimal", "SLO RPS", "demand", "bound", "gap", "cost", "/h", "solve"):
        assert part in first, first
    for title in ("Classes", "Pools", "Devices", "Links (Gbit/s)", "Baselines"):
        assert f"\n{title}\n" in out
    assert re.search(r"gpu/tp1/b\d -> acc/tp1/b\d", out), out
    assert "prefill" in out
    assert "decode" in out
    assert "gpu -> acc" in out
    assert "gpu_only (gpu)" in out
    assert "greedy" in out


def test_plan_json_is_a_plan(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["plan", "--json", str(write_request(tmp_path, inline_request()))])
    assert result.exit_code == 0, result.output + result.stderr
    plan = msgspec.json.decode(result.stdout, type=Plan)
    assert plan.status == "optimal"
    assert plan.demand_rps == 20.0


def test_time_limit_overrides_the_file(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetplan import solver

    def report(request: Any, *args: object, **kwargs: object) -> None:  # runs in the forked child
        raise SolverFailure(f"saw {request.options.time_limit_s}")

    monkeypatch.setattr(solver, "plan", report)
    path = write_request(tmp_path, inline_request())
    seen = runner.invoke(main, ["plan", "--time-limit", "2.5", str(path)])
    assert seen.stderr == "error: saw 2.5\n"

    result = runner.invoke(main, ["plan", "--time-limit", "0", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: options.time_limit_s: Expected `float` > 0.0")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["devices"][0].update(count=-1), "devices[0].count: Expected `int` >= 0"),
        (lambda b: b["links"][0].update(target="b"), "links[0].target: unknown device 'b'"),
        (
            lambda b: b["workloads"][0].update(rate_rpss=1),
            "workloads[0].rate_rpss: unknown field",
        ),
        (lambda b: b.update(profiles={"set": "nope"}), "profiles.set: unknown profile set 'nope'"),
    ],
    ids=["negative count", "unknown link target", "unknown field", "unknown profile set"],
)
def test_bad_file_exits_2_naming_the_field(
    runner: CliRunner, tmp_path: Path, mutate: Any, field: str
) -> None:
    body = inline_request()
    mutate(body)
    result = runner.invoke(main, ["plan", str(write_request(tmp_path, body))])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {field}"), result.stderr
    assert result.stdout == ""


def test_nan_in_file_names_the_field(runner: CliRunner, tmp_path: Path) -> None:
    text = json.dumps(inline_request()).replace('"tbt_ms_p90": 14', '"tbt_ms_p90": NaN', 1)
    result = runner.invoke(main, ["plan", str(write_request(tmp_path, text))])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: profiles.rows[0].tbt_ms_p90: NaN and Infinity are not JSON")


def test_unreadable_or_malformed_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(main, ["plan", str(tmp_path / "absent.json")])
    assert missing.exit_code == 2
    assert (
        "no such file, and no bundled request of that name (bundled: infeasible, link_bound" in missing.stderr
    )
    malformed = runner.invoke(main, ["plan", str(write_request(tmp_path, '{"devices": ['))])
    assert malformed.exit_code == 2
    assert malformed.stderr.startswith("error: malformed JSON")


def test_solver_failure_exits_1(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetplan import solver

    def fail(request: object, *args: object, **kwargs: object) -> None:
        raise SolverFailure("found no plan within time_limit_s=5", field="options.time_limit_s")

    monkeypatch.setattr(solver, "plan", fail)
    result = runner.invoke(main, ["plan", str(write_request(tmp_path, inline_request()))])
    assert result.exit_code == 1
    assert result.stderr == "error: options.time_limit_s: found no plan within time_limit_s=5\n"


def test_rich_and_plain_renderers_show_the_same_rows() -> None:
    pytest.importorskip("rich")
    from fleetplan.api.render import render_plain, render_rich
    from fleetplan.models.codec import decode_request
    from fleetplan.solver import plan

    result = plan(decode_request(json.dumps(inline_request())))
    plain, rich = io.StringIO(), io.StringIO()
    render_plain(result, plain)
    render_rich(result, rich)
    for text in (plain.getvalue(), rich.getvalue()):
        assert "Baselines" in text
        assert "greedy" in text
        assert "plan / baseline" in text


def test_profiles_lists_sets(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETPLAN_PROFILE_STORE", str(write_store(tmp_path / "store")))
    result = runner.invoke(main, ["profiles"])
    assert result.exit_code == 0, result.stderr
    (line,) = [row for row in result.stdout.splitlines() if row.startswith("tiny ")]
    assert "8 rows" in line
    assert "two devices" in line

    as_json = runner.invoke(main, ["profiles", "--json"])
    assert "tiny" in [m["name"] for m in json.loads(as_json.stdout)]


def test_serve_runs_uvicorn_on_the_app(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from litestar import Litestar

    calls = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, **kwargs: calls.append(server.config))
    result = runner.invoke(main, ["serve", "--host", "0.0.0.0", "--port", "8123"])
    assert result.exit_code == 0, result.stderr
    (config,) = calls
    assert isinstance(config.app, Litestar)
    assert config.host == "0.0.0.0"
    assert config.port == 8123


def test_help_is_fast_because_imports_are_lazy() -> None:
    """`fleetplan --help` imports neither the solver (pandas, highspy) nor the web stack."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from fleetplan.api.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\n"
        "assert result.exit_code == 0 and 'plan' in result.output\n"
        "heavy = ('fleetplan.solver', 'pandas', 'highspy', 'litestar', 'uvicorn', 'rich')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_calibrate_then_estimate_a_sibling(tmp_path):
    """profile (analytic) -> calibrate -> a sibling device estimated with the fitted factors."""
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    runner = CliRunner()
    store = tmp_path / "store"
    grid = ["--models", "llama-3.1-8b", "--batches", "1,4,16", "--prompts", "128,512,1024", "--no-progress"]
    profile = ["profile", "--backend", "analytic", "--out", str(store), *grid]
    made = runner.invoke(main, [*profile, "--device", "a100", "--name", "a100-set"])
    assert made.exit_code == 0, made.output
    factors = tmp_path / "cal.json"
    fitted = runner.invoke(main, ["calibrate", "a100-set", "--store", str(store), "--out", str(factors)])
    assert fitted.exit_code == 0, fitted.output
    assert "| a100 | gpu | 9 |" in fitted.output
    sibling = runner.invoke(
        main, [*profile, "--device", "h100", "--name", "h100-set", "--calibration", str(factors)]
    )
    assert sibling.exit_code == 0, sibling.output
    assert "analytic:h100:calibrated-a100" in (store / "h100-set" / "profile.csv").read_text()
    missing = runner.invoke(main, ["calibrate", "nope", "--store", str(store)])
    assert missing.exit_code == 2
    assert "profiles.set" in missing.output


def test_merge_sets_from_two_machines(tmp_path):
    from click.testing import CliRunner

    from fleetplan.api.cli import main
    from fleetplan.profiler.store import ProfileStore, bundled_root

    runner = CliRunner()
    store = tmp_path / "store"
    grid = ["--models", "llama-3.1-8b", "--batches", "1,4", "--prompts", "128,512", "--no-progress"]
    profile = ["profile", "--backend", "analytic", "--out", str(store), *grid]
    for device in ("a100", "l4"):
        made = runner.invoke(main, [*profile, "--device", device, "--name", device])
        assert made.exit_code == 0, made.output
    # an estimate runs no batches: its manifest does not claim measured ones (session 34)
    description = ProfileStore([store]).manifest("a100").description
    assert description.endswith("estimated, no batches run"), description
    merged = runner.invoke(main, ["merge", "a100", "l4", "--name", "fleet", "--out", str(store)])
    assert merged.exit_code == 0, merged.output
    table = ProfileStore([bundled_root(), store]).load("fleet")
    assert sorted(table.frame["device"].unique()) == ["a100", "l4"]
    assert len(table.frame) == 8
    clash = runner.invoke(main, ["merge", "a100", "fleet", "--name", "again", "--out", str(store)])
    assert clash.exit_code == 2
    assert "the same point is in two sets: llama-3.1-8b/a100/" in clash.output
    # each set's own row numbers (the combined table's named rows 'fleet' did not have: session 34)
    stored = ProfileStore([bundled_root(), store])
    a100, fleet = stored.load("a100").frame, stored.load("fleet").frame
    key = ["model", "device", "tp", "batch", "prompt_tokens"]
    first = a100.sort_values(key).iloc[0]
    in_fleet = int(np.flatnonzero((fleet[key] == first[key]).all(axis=1).to_numpy())[0])
    assert f"set 'a100' row {first.name}, set 'fleet' row {in_fleet})" in clash.output, clash.output


def test_engine_options_reach_the_engine_and_bad_ones_are_named(tmp_path):
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    args = "profile --backend analytic --device a100 --models llama-3.1-8b --batches 1 --prompts 128".split()
    result = CliRunner().invoke(
        main, [*args, "--no-progress", "--out", str(tmp_path), "--engine-option", "nonsense=1"]
    )
    assert result.exit_code == 2
    assert "engine_option" in result.output


def test_simulate_a_request_and_a_saved_plan(tmp_path):
    import json

    from click.testing import CliRunner

    from fleetplan.api.cli import main

    runner = CliRunner()
    request = fixtures.request_path("paper")
    direct = runner.invoke(main, ["simulate", str(request), "--duration", "60", "--warmup", "10", "--json"])
    assert direct.exit_code == 0, direct.output
    report = json.loads(direct.output)
    assert report["arrivals"] > 0
    assert 0.0 <= report["attainment"] <= 1.0
    saved = tmp_path / "plan.json"
    planned = runner.invoke(main, ["plan", str(request), "--json", "--time-limit", "60"])
    assert planned.exit_code == 0
    saved.write_text(planned.output)
    again = runner.invoke(
        main,
        ["simulate", str(saved), "--request", str(request), "--duration", "60", "--warmup", "10", "--json"],
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["predicted_goodput_rps"] == report["predicted_goodput_rps"]
    table = runner.invoke(main, ["simulate", str(request), "--duration", "30", "--warmup", "5"])
    assert "attainment" in table.output
    assert "1b-short" in table.output
    # each pool once: same-shape pools at another headroom carry their group (scarce_gpus runs two inf2
    # decode pools of one shape; their rows read alike before)
    scarce = runner.invoke(main, ["simulate", "scarce_gpus", "--duration", "30", "--warmup", "5", "--json"])
    pools = json.loads(scarce.output)["pools"]
    keys = [(p["role"], p["model"], p["device"], p["tp"], p["batch"], p["group"]) for p in pools]
    assert len(set(keys)) == len(keys)
    grouped = [p for p in pools if p["group"]]
    assert grouped
    shown = runner.invoke(main, ["simulate", "scarce_gpus", "--duration", "30", "--warmup", "5"]).output
    assert all(f"{p['device']}/tp{p['tp']}/b{p['batch']}#{p['group']}" in shown for p in grouped)
    # a saved plan without its request: said so, not "status: unknown field"
    alone = runner.invoke(main, ["simulate", str(saved)])
    assert alone.exit_code == 2
    assert f"{saved} is a Plan, not a PlanRequest; replay it with the request it answers" in alone.output


def test_simulate_plot_draws_distributions_against_the_slos(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (make test installs it)")
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    request = fixtures.request_path("paper")
    png = tmp_path / "dist.png"
    result = CliRunner().invoke(
        main, ["simulate", str(request), "--duration", "30", "--warmup", "5", "--plot", str(png)]
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_a_bundled_request_is_taken_by_name(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetplan plan paper` plans the bundled request when no file of that name exists; a file wins."""
    monkeypatch.chdir(tmp_path)
    by_name = runner.invoke(main, ["plan", "paper", "--json", "--time-limit", "60"])
    assert by_name.exit_code == 0, by_name.output
    by_path = runner.invoke(
        main, ["plan", str(fixtures.request_path("paper")), "--json", "--time-limit", "60"]
    )
    assert msgspec.json.decode(by_name.stdout)["slo_rps"] == msgspec.json.decode(by_path.stdout)["slo_rps"]
    (tmp_path / "paper").write_text('{"devices": [')
    shadowed = runner.invoke(main, ["plan", "paper"])
    assert shadowed.exit_code == 2
    assert shadowed.stderr.startswith("error: malformed JSON")


def test_version_comes_from_the_package_metadata(runner: CliRunner) -> None:
    from importlib.metadata import version

    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"fleetplan, version {version('fleetplan')}"


def test_a_request_file_that_is_not_utf8_exits_2_with_its_offset(runner: CliRunner, tmp_path: Path) -> None:
    """It raised UnicodeDecodeError, and `plan` then died of an UnboundLocalError on WorkerCrashed (its
    import sat after read_request in the try): two tracebacks, exit 1."""
    path = tmp_path / "bad.json"
    path.write_bytes(json.dumps(inline_request()).encode().replace(b'"chat"', b'"ch\xffat"', 1))
    result = runner.invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: the JSON is not UTF-8: byte(s) b'\\xff' at offset")


def test_profile_refuses_a_bad_name_or_output_before_measuring(runner: CliRunner, tmp_path: Path) -> None:
    """Each was a traceback once the first point had been measured, or left a resume file behind."""
    base = ["profile", "--backend", "analytic", "--device", "l4", "--models", "llama-3.1-8b"]
    base += ["--batches", "1", "--prompts", "512"]
    cases = {
        ("--out", str(tmp_path / "s"), "--name", "a/b"): "error: name: 'a/b' cannot name a profile set",
        ("--out", str(tmp_path / "s"), "--name", "paper"): "error: name: 'paper' is a bundled profile set",
        ("--out", str(tmp_path / "file" / "s")): "error: out: cannot make",
    }
    (tmp_path / "file").write_text("")
    for args, says in cases.items():
        result = runner.invoke(main, [*base, *args])
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith(says), result.stderr
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())  # no resume file left


def test_plan_shows_the_simulation_verify_asked_for(runner: CliRunner, tmp_path: Path) -> None:
    """`verify: "simulate"` ran the simulation, but only --json showed it."""
    body = json.loads(fixtures.request_path("scarce_gpus").read_text())
    body["verify"] = "simulate"
    # the fixture's 10 s is a wall-clock budget for the plan and its simulation together, which a loaded
    # 2-core machine (the suite's own workers beside it) can overrun; this test is about what is shown
    body["options"]["time_limit_s"] = 60
    result = runner.invoke(main, ["plan", str(write_request(tmp_path, json.dumps(body))), "--plain"])
    assert result.exit_code == 0, result.output
    assert "simulation (verify: simulate)" in result.stdout
    assert "of offered demand" in result.stdout


def test_the_plan_table_says_what_to_buy_and_when_the_cost_is_not_proven(
    runner: CliRunner, tmp_path: Path
) -> None:
    """Session 34's capacity-planner test: the table view had no `bought` column (only the JSON said what
    to buy), and a cost tie-break stopped at a 3% gap printed as "gap 0.00%" (the goodput's gap)."""
    from fleetplan.api.render import render_plain, summary_line

    def render_plan_text(plan: Plan) -> str:
        out = io.StringIO()
        render_plain(plan, out)
        return out.getvalue()

    result = runner.invoke(main, ["plan", str(write_request(tmp_path, inline_request())), "--json"])
    plan = msgspec.json.decode(result.stdout, type=Plan)
    assert "tie-break gap" not in summary_line(plan)
    assert "bought" not in render_plan_text(plan)  # nothing purchasable: the column stays away
    devices = [msgspec.structs.replace(plan.devices[0], used=5, available=4, bought=1), *plan.devices[1:]]
    solver = msgspec.structs.replace(plan.solver, tie_break_gap=0.0297)
    shown = msgspec.structs.replace(plan, devices=devices, solver=solver)
    assert "cost " in summary_line(shown)
    assert "(not proven cheapest: tie-break gap 2.97%)" in summary_line(shown)
    table = render_plan_text(shown)
    assert re.search(rf"{plan.devices[0].name}\s+5/4\s+1\n", table), table
    assert re.search(r"device\s+used/available\s+bought", table)


def test_profile_options_refuse_an_empty_item_and_a_file_that_is_not_a_calibration(
    runner: CliRunner, tmp_path: Path
) -> None:
    """Session 34's profiler test: `--prompts 128,,512` passed silently, and a wrong --calibration file read
    "error: name: unknown field", as if about --name."""
    base = ["profile", "--backend", "analytic", "--device", "h100", "--models", "llama-3.1-8b"]
    base += ["--batches", "1", "--out", str(tmp_path), "--no-progress"]
    typo = runner.invoke(main, [*base, "--prompts", "128,,512"])
    assert typo.exit_code == 2
    assert "error: --prompts: '128,,512' has an empty item" in typo.output
    wrong = tmp_path / "manifest.json"
    wrong.write_text('{"name": "x", "base": {}}')
    refused = runner.invoke(main, [*base, "--prompts", "128", "--calibration", str(wrong)])
    assert refused.exit_code == 2
    assert f"error: --calibration: {wrong} is not a calibration" in refused.output
    assert "unknown field" in refused.output
