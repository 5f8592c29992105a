"""The profiling harness with fake engines (no torch): percentiles, interruption and resume, the analytic
engine, and a set the solver plans from."""

import json
from pathlib import Path

import numpy as np
import pytest

from fleetplan.models.codec import convert
from fleetplan.models.errors import InputError, ProfileMissing
from fleetplan.models.plan import PlanRequest
from fleetplan.models.profile import ProfileGrid
from fleetplan.profiler.engines import get_engine
from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.runner import RunInterrupted, partial_path, run_grid
from fleetplan.profiler.stats import latency_columns, percentiles_ms
from fleetplan.profiler.store import ProfileStore
from fleetplan.profiler.tables import monotone_warnings

GAP_S = 0.002


class FakeEngine:
    """ttft = 0.01 * batch * prompt / 128 s (+ 1 ms per request index), gaps constant; counts its calls."""

    name = "fake"

    def __init__(self, interrupt_on: int | None = None) -> None:
        self.calls: list[tuple[str, int, int, int, int]] = []
        self.interrupt_on = interrupt_on

    def describe(self) -> dict[str, str]:
        return {"engine": "fake", "versions": "fake 1.0", "host": "testhost"}

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        self.calls.append((model, tp, batch, prompt_tokens, output_tokens))
        if self.interrupt_on is not None and len(self.calls) == self.interrupt_on:
            raise KeyboardInterrupt
        base = 0.01 * batch * prompt_tokens / 128
        return [RequestTiming(base + 0.001 * i, (GAP_S,) * (output_tokens - 1)) for i in range(batch)]

    def close(self) -> None:
        pass


def grid(**overrides: object) -> ProfileGrid:
    fields = {
        "device": "cpu",
        "models": ["m1"],
        "batches": [1, 2],
        "prompts": [128, 256],
        "output_tokens": 4,
        "warmup": 2,
        "runs": 3,
    }
    return convert({**fields, **overrides}, ProfileGrid)


def expected_ttft_ms(batch: int, prompt: int, q: int) -> float:
    base = 0.01 * batch * prompt / 128
    return float(np.percentile([(base + 0.001 * i) * 1e3 for i in range(batch)] * 3, q))


# --- percentile reduction -----------------------------------------------------------------------------------


def test_percentiles_match_numpy() -> None:
    rng = np.random.default_rng(0)
    samples = rng.lognormal(-4, 0.5, size=997)
    got = percentiles_ms(samples)
    want = np.percentile(samples * 1e3, [50, 90, 99])
    assert [got[50], got[90], got[99]] == pytest.approx(want.tolist(), rel=1e-12)


def test_latency_columns_pool_every_request_and_gap() -> None:
    batches = [[RequestTiming(0.1, (0.01, 0.02)), RequestTiming(0.3, (0.03,))], [RequestTiming(0.2, (0.04,))]]
    columns = latency_columns(batches)
    assert columns["ttft_ms_p50"] == pytest.approx(np.percentile([100, 300, 200], 50))
    assert columns["tbt_ms_p99"] == pytest.approx(np.percentile([10, 20, 30, 40], 99))


def test_no_samples_or_nan_is_an_error_never_a_figure() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentiles_ms([])
    with pytest.raises(ValueError, match="NaN"):
        percentiles_ms([0.1, float("nan")])
    with pytest.raises(ValueError, match="tbt: no samples"):
        latency_columns([[RequestTiming(0.1, ())]])


# --- runs ---------------------------------------------------------------------------------------------------


def test_fake_engine_run_gives_expected_percentiles(tmp_path: Path) -> None:
    engine = FakeEngine()
    result = run_grid(engine, grid(), tmp_path, "fake-cpu")
    assert len(engine.calls) == 4 * (2 + 3)  # 4 points x (warmup + runs)
    assert result.done_now == 4
    assert result.resumed == 0
    assert not result.missing
    assert not partial_path(tmp_path, "fake-cpu").exists()

    store = ProfileStore([tmp_path])
    table = store.load("fake-cpu")
    frame = table.frame.set_index(["batch", "prompt_tokens"])
    for batch in (1, 2):
        for prompt in (128, 256):
            row = frame.loc[(batch, prompt)]
            for q in (50, 90, 99):
                assert row[f"ttft_ms_p{q}"] == pytest.approx(expected_ttft_ms(batch, prompt, q), rel=1e-5)
                assert row[f"tbt_ms_p{q}"] == pytest.approx(GAP_S * 1e3)
            assert row["source"] == "measured:fake:cpu"

    manifest = store.manifest("fake-cpu")
    assert manifest.sha256 == table.sha256
    assert manifest.rows == 4
    assert manifest.sources["engine"] == "fake"
    assert manifest.sources["device"] == "cpu"
    assert manifest.sources["host"] == "testhost"
    assert manifest.sources["engine.versions"] == "fake 1.0"
    assert json.loads(manifest.sources["grid"])["batches"] == [1, 2]
    assert (tmp_path / "fake-cpu").is_symlink()


def test_interrupt_keeps_finished_points_and_rerun_resumes(tmp_path: Path) -> None:
    per_point = 2 + 3
    engine = FakeEngine(interrupt_on=2 * per_point + 1)  # dies in the third point's first batch
    with pytest.raises(RunInterrupted) as caught:
        run_grid(engine, grid(), tmp_path, "fake-cpu")
    assert caught.value.kept == 2
    assert caught.value.total == 4
    assert isinstance(caught.value, KeyboardInterrupt)
    partial = partial_path(tmp_path, "fake-cpu")
    lines = partial.read_text().splitlines()
    assert "header" in json.loads(lines[0])
    assert len(lines) == 3
    assert ProfileStore([tmp_path]).names() == []  # nothing stored yet

    again = FakeEngine()
    result = run_grid(again, grid(), tmp_path, "fake-cpu")
    assert result.resumed == 2
    assert result.done_now == 2
    assert len(again.calls) == 2 * per_point  # finished points were not measured again
    assert {c[2:4] for c in again.calls} == {(2, 128), (2, 256)}
    assert ProfileStore([tmp_path]).load("fake-cpu").frame.shape[0] == 4
    assert not partial.exists()


def test_a_second_run_of_one_set_is_refused_while_the_first_holds_it(tmp_path: Path) -> None:
    """Two runs of one set appended to one resume file (each skipping what it had read, both saving): the
    second is refused at once, naming the resume file; another set, or the same one afterwards, runs."""
    import fcntl

    from fleetplan.models.errors import ProfileRunBusy

    with open(tmp_path / ".run-fake-cpu", "a") as held:  # as a running `fleetplan profile` holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        engine = FakeEngine()
        busy = "another profiler run of set 'fake-cpu' is in progress"
        with pytest.raises(ProfileRunBusy, match=busy) as caught:
            run_grid(engine, grid(), tmp_path, "fake-cpu")
        assert str(partial_path(tmp_path, "fake-cpu")) in str(caught.value)
        assert engine.calls == []  # nothing measured
        assert not partial_path(tmp_path, "fake-cpu").exists()  # no resume file started
        assert run_grid(FakeEngine(), grid(), tmp_path, "other").done_now == 4
    assert run_grid(FakeEngine(), grid(), tmp_path, "fake-cpu").done_now == 4


def test_torn_last_line_is_measured_again(tmp_path: Path) -> None:
    with pytest.raises(RunInterrupted):
        run_grid(FakeEngine(interrupt_on=2 * 5 + 1), grid(), tmp_path, "s")
    partial = partial_path(tmp_path, "s")
    partial.write_text(partial.read_text() + '{"point": ["m1", 1, 2, 1')  # crash mid-write
    again = FakeEngine()
    assert run_grid(again, grid(), tmp_path, "s").resumed == 2


def test_rerun_with_another_grid_names_the_difference_or_restarts(tmp_path: Path) -> None:
    with pytest.raises(RunInterrupted):
        run_grid(FakeEngine(interrupt_on=6), grid(), tmp_path, "s")
    with pytest.raises(InputError, match=r"runs: 3 then, 5 now.*--restart") as caught:
        run_grid(FakeEngine(), grid(runs=5), tmp_path, "s")
    assert caught.value.field == "grid"
    engine = FakeEngine()
    result = run_grid(engine, grid(runs=5), tmp_path, "s", restart=True)
    assert result.resumed == 0
    assert len(engine.calls) == 4 * (2 + 5)


def test_a_resume_with_another_engine_setup_is_refused(tmp_path: Path) -> None:
    """Session 34's profiler test: a run resumed with `--engine-option seed=7` kept 8 rows measured with seed
    0 and the manifest said seed 7 for all (only the engine's name and the grid were compared)."""

    class Seeded(FakeEngine):
        def __init__(self, seed: int, interrupt_on: int | None = None) -> None:
            super().__init__(interrupt_on)
            self.seed = seed

        def describe(self) -> dict[str, str]:
            return {**super().describe(), "prompts": f"random token ids (seed {self.seed})"}

    with pytest.raises(RunInterrupted):
        run_grid(Seeded(0, interrupt_on=6), grid(), tmp_path, "s")
    with pytest.raises(InputError, match=r"engine setup \(prompts: 'random token ids \(seed 0\)' then, "):
        run_grid(Seeded(7), grid(), tmp_path, "s")
    resumed = run_grid(Seeded(0), grid(), tmp_path, "s")  # the same setup resumes
    assert (resumed.resumed, resumed.done_now) == (1, 3)


def test_failed_run_never_replaces_the_last_good_set(tmp_path: Path) -> None:
    run_grid(FakeEngine(), grid(), tmp_path, "s")
    good = ProfileStore([tmp_path]).load("s").sha256

    class ZeroGaps(FakeEngine):
        def run_batch(self, *args: int) -> list[RequestTiming]:  # type: ignore[override]
            return [RequestTiming(t.ttft_s, (0.0,) * len(t.gaps_s)) for t in super().run_batch(*args)]

    with pytest.raises(ProfileMissing, match=r"m1/cpu/tp1/b1/p128: .*tbt_ms_p50"):
        run_grid(ZeroGaps(), grid(runs=4), tmp_path, "s", restart=True)
    assert ProfileStore([tmp_path]).load("s").sha256 == good


def test_monotone_warnings_name_the_rows(tmp_path: Path) -> None:
    class Backwards(FakeEngine):
        def run_batch(self, model: str, tp: int, batch: int, prompt: int, out: int) -> list[RequestTiming]:
            return [RequestTiming(1.0 / prompt, (0.01 / batch,) * (out - 1)) for _ in range(batch)]

    result = run_grid(Backwards(), grid(), tmp_path, "s")
    text = "\n".join(result.warnings)
    assert "ttft_ms_p50 falls as prompt_tokens grows: rows" in text
    assert "m1/cpu/tp1/b1/p256" in text
    assert "tbt_ms_p50 falls more than 20% as batch grows" in text
    assert monotone_warnings(ProfileStore([tmp_path]).load("s").frame) == result.warnings


# --- analytic engine ----------------------------------------------------------------------------------------


def test_analytic_engine_set_plans(tmp_path: Path) -> None:
    engines = {d: get_engine("analytic", device=d) for d in ("a6000ada", "inf2")}
    for device, engine in engines.items():
        g = grid(device=device, models=["llama-3.2-1b"], batches=[1, 4], prompts=[128, 512], warmup=0, runs=1)
        run_grid(engine, g, tmp_path / "one", f"an-{device}")
    # both devices in one set: merge the two stored frames through the store's own save
    store = ProfileStore([tmp_path / "one"])
    import pandas as pd

    merged = pd.concat([store.load("an-a6000ada").frame, store.load("an-inf2").frame])
    manifest = store.manifest("an-inf2")
    store.save("analytic-both", merged, manifest)

    request = convert(
        {
            "devices": [
                {"name": "a6000ada", "count": 2, "cost_per_hour": 1.0, "network_gbps": 25, "kind": "gpu"},
                {"name": "inf2", "count": 2, "cost_per_hour": 0.5, "network_gbps": 25},
            ],
            "links": [{"source": "a6000ada", "target": "inf2", "gbps": 50}],
            "workloads": [
                {
                    "name": "chat",
                    "model": "llama-3.2-1b",
                    "prompt_tokens": 512,
                    "output_tokens": 128,
                    "rate_rps": 2.0,
                    "slo": {"ttft_ms": 2000, "tbt_ms": 100, "percentile": 90},
                },
            ],
            "profiles": {"set": "analytic-both"},
            "options": {"time_limit_s": 5},
        },
        PlanRequest,
    )
    from fleetplan.solver import plan

    result = plan(request, ProfileStore([tmp_path / "one"]))
    assert result.profile_set.name == "analytic-both"
    assert result.slo_rps > 0


def test_analytic_engine_rejects_unknown_device_and_model(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown device 'nope'") as caught:
        get_engine("analytic", device="nope")
    assert caught.value.field == "device"
    engine = get_engine("analytic", device="l4")
    with pytest.raises(InputError, match="unknown model 'nope-7b'"):
        run_grid(engine, grid(device="l4", models=["nope-7b"]), tmp_path, "s")
    assert not partial_path(tmp_path, "s").exists()  # rejected before any work


def test_analytic_points_that_do_not_fit_are_listed_not_filled(tmp_path: Path) -> None:
    engine = get_engine("analytic", device="l4")  # 24 GB: a 70B model never fits
    g = grid(device="l4", models=["llama-3.2-1b", "llama-3.1-70b"], batches=[1], prompts=[128], runs=1)
    result = run_grid(engine, g, tmp_path, "s")
    assert result.missing == [("llama-3.1-70b", 1, 1, 128)]
    assert any("llama-3.1-70b/l4/tp1/b1/p128" in w for w in result.warnings)
    assert ProfileStore([tmp_path]).load("s").frame.shape[0] == 1


# --- the `fleetplan profile` command ------------------------------------------------------------------------


def test_cli_profile_analytic_writes_a_listed_set(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    runner = CliRunner()
    args = [
        *"profile --backend analytic --device inf2 --models llama-3.2-1b,llama-3.1-70b".split(),
        *"--batches 1,4 --prompts 128,512".split(),
        *["--out", str(tmp_path), "--name", "est", "--no-progress"],
    ]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "wrote profile set 'est' (4 rows" in result.stdout
    assert "4 grid point(s) have no row (not filled): llama-3.1-70b/inf2/tp1/b1/p128" in result.stderr
    listed = runner.invoke(main, ["profiles", "--store", str(tmp_path)])
    assert any(line.startswith("est ") and "4 rows" in line for line in listed.stdout.splitlines())
    assert ProfileStore([tmp_path]).manifest("est").sources["engine"] == "analytic"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--batches", "1,x"], "error: batches: expected comma-separated integers"),
        (["--batches", "1,0"], "error: batches[1]: Expected `int` >= 1"),
        (["--batches", "1,1"], "error: batches: duplicate value(s) ['1']"),
        (["--device", "nope"], "error: device: unknown device 'nope'"),
        (["--backend", "magic"], "error: backend: unknown engine 'magic'"),
        (["--backend", "openai"], "error: endpoint: --backend openai needs --endpoint URL"),
    ],
)
def test_cli_profile_bad_input_exits_2(tmp_path: Path, extra: list[str], says: str) -> None:
    from click.testing import CliRunner

    from fleetplan.api.cli import main

    base = {
        "--backend": "analytic",
        "--device": "inf2",
        "--models": "llama-3.2-1b",
        "--batches": "1",
        "--prompts": "128",
    }
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        base[flag] = value
    args = ["profile", *[x for kv in base.items() for x in kv], "--out", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(says), result.stderr


def test_cli_profile_interrupt_exits_130_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import fleetplan.profiler.engines
    from fleetplan.api.cli import main

    engines = iter([FakeEngine(interrupt_on=2 * 5 + 1), FakeEngine()])
    monkeypatch.setattr(fleetplan.profiler.engines, "get_engine", lambda name, **options: next(engines))
    args = [
        *"profile --backend fake --device cpu --models m1 --batches 1,2 --prompts 128,256".split(),
        *"--output-tokens 4 --warmup 2 --runs 3".split(),
        *["--out", str(tmp_path), "--no-progress"],
    ]
    runner = CliRunner()
    first = runner.invoke(main, args)
    assert first.exit_code == 130, first.output
    assert "interrupted: 2 of 4 points kept in" in first.stderr
    assert "rerun the same command" in first.stderr
    second = runner.invoke(main, args)
    assert second.exit_code == 0, second.output
    assert "2 resumed from an earlier run" in second.stdout
    assert ProfileStore([tmp_path]).load("fake-cpu").frame.shape[0] == 4
