"""One latency-at-prompt interpolator (fleetplan/profiler/tables.py) for the solver and the simulator."""

import numpy as np
import pandas as pd
import pytest

from fleetplan.models.profile import LATENCY_COLUMNS, PERCENTILES
from fleetplan.profiler.latency import Z90, quantile_grid_ms, quantile_ms, quantile_params_array
from fleetplan.profiler.tables import from_frame, latency_at_prompt
from fleetplan.simulator.curves import CurveBook
from fleetplan.solver.candidates import interpolate_latency

PROMPTS = (128, 500, 1000)


def _table(holes: dict[tuple[int, int, str], float] | None = None):
    """One model on one device, batches 1 and 4, prompts 128/500/1000; holes: (batch, prompt, column) -> x."""
    rows = []
    for batch in (1, 4):
        for p in PROMPTS:
            base = 10.0 + p / 7.0 + 3.0 * batch
            rows.append(
                {
                    "model": "m",
                    "device": "d",
                    "tp": 1,
                    "batch": batch,
                    "prompt_tokens": p,
                    "ttft_ms_p50": base,
                    "ttft_ms_p90": 1.3 * base,
                    "ttft_ms_p99": 1.9 * base,
                    "tbt_ms_p50": 5.0 + batch + p / 300.0,
                    "tbt_ms_p90": 6.0 + batch + p / 300.0,
                    "tbt_ms_p99": 8.0 + batch + p / 300.0,
                }
            )
    frame = pd.DataFrame(rows)
    for (batch, p, column), value in (holes or {}).items():
        frame.loc[(frame["batch"] == batch) & (frame["prompt_tokens"] == p), column] = value
    return from_frame(frame, "t")


def _classes(prompts: list[int], percentile: int) -> pd.DataFrame:
    return pd.DataFrame({"model": "m", "prompt_tokens": prompts, "percentile": percentile})


def test_between_profiled_prompts_it_is_np_interp_exactly():
    table = _table()
    prompts = [128, 129, 333, 500, 777, 999, 1000]
    at = latency_at_prompt(table.frame, pd.DataFrame({"model": "m", "prompt_tokens": prompts}))
    assert len(at) == 2 * len(prompts)
    assert at["in_range"].all()
    for column in LATENCY_COLUMNS:
        for batch in (1, 4):
            rows = table.frame[table.frame["batch"] == batch]
            expected = np.interp(prompts, rows["prompt_tokens"].to_numpy(float), rows[column].to_numpy(float))
            assert at.loc[at["batch"] == batch, column].tolist() == expected.tolist()


def test_outside_the_profiled_range_is_nan_never_extrapolated():
    at = latency_at_prompt(_table().frame, pd.DataFrame({"model": "m", "prompt_tokens": [64, 2000]}))
    assert not at["in_range"].any()
    assert at[list(LATENCY_COLUMNS)].isna().all().all()


def test_a_missing_percentile_is_missing_only_between_its_neighbours():
    """p90 missing at prompt 1000 (batch 4): NaN for prompts in (500, 1000], untouched at or below 500."""
    table = _table({(4, 1000, "ttft_ms_p90"): np.nan})
    at = latency_at_prompt(table.frame, pd.DataFrame({"model": "m", "prompt_tokens": [300, 500, 750, 1000]}))
    b4 = at[at["batch"] == 4].set_index("prompt_tokens")
    assert np.isfinite(b4.loc[[300, 500], "ttft_ms_p90"]).all()
    assert b4.loc[[750, 1000], "ttft_ms_p90"].isna().all()
    assert np.isfinite(b4[["ttft_ms_p50", "ttft_ms_p99"]]).all().all()  # the other percentiles stand
    assert np.isfinite(at.loc[at["batch"] == 1, "ttft_ms_p90"]).all()  # and other batches


@pytest.mark.parametrize("prompt", [300, 500, 750])
def test_solver_and_simulator_read_the_same_latencies(prompt):
    """Whatever the holes, the solver's latency at a percentile is the simulator's figure for it."""
    table = _table({(4, 1000, "ttft_ms_p90"): np.nan, (1, 128, "tbt_ms_p99"): np.nan})
    book = CurveBook(table)
    simulator = book.points("m", "d", 1, prompt).set_index("batch")
    for q in PERCENTILES:
        solver = interpolate_latency(_classes([prompt], q), table).set_index("batch")
        for metric in ("ttft", "tbt"):
            got = simulator[f"{metric}_ms_p{q}"].to_numpy()
            want = solver.loc[simulator.index, f"{metric}_ms"].to_numpy()
            assert np.array_equal(got, want, equal_nan=True), (metric, q)


def test_simulator_curve_uses_the_percentiles_left():
    """At prompt 750 p90 of TTFT is missing at batch 4: the curve falls back to the p50->p99 slope there,
    exactly as for a table that never had p90 (docs/simulation.md, "Sampling")."""
    holed = CurveBook(_table({(4, 1000, "ttft_ms_p90"): np.nan})).curve("m", "d", 1, 750, "ttft", 4)
    without = CurveBook(_table({(b, p, "ttft_ms_p90"): np.nan for b in (1, 4) for p in PROMPTS}))
    assert holed == without.curve("m", "d", 1, 750, "ttft", 4)
    assert holed != CurveBook(_table()).curve("m", "d", 1, 750, "ttft", 4)


def test_quantile_grid_equals_quantile_ms_on_every_grid():
    """The capacity model's service grids (`quantile_grid_ms`: each point computed on its side of Z90 only)
    are the very values `quantile_ms` gives, bit for bit, with missing percentiles and grids past Z_CLIP."""
    rng = np.random.default_rng(3)
    p50 = rng.uniform(5.0, 500.0, 300)
    p90 = p50 * rng.uniform(1.0, 3.0, 300)
    p99 = p90 * rng.uniform(1.0, 3.0, 300)
    p90[::7], p99[::5] = np.nan, np.nan
    params = quantile_params_array(p50, p90, p99)
    grids = (np.arange(-5.0, 5.0 + 1e-9, 0.125), np.arange(-6.0, 6.5, 1.0), np.array([Z90]), np.array([-1.0]))
    for z in grids:
        expected = quantile_ms(params[:, None, :], z[None, :])
        assert np.array_equal(quantile_grid_ms(params, z), expected)


def test_the_simulator_says_a_prompt_is_outside_the_profiled_range_not_that_p50_is_missing():
    """Session 34's user test: a prompt of 8000 tokens on rows up to 2048 read "give the rows a p50", which
    they had."""
    from fleetplan.models.errors import ProfileMissing
    from fleetplan.profiler.store import ProfileStore

    table = ProfileStore().load("paper")
    rows = table.frame[(table.frame["model"] == "llama-3.2-1b") & (table.frame["device"] == "a6000ada")]
    top = int(rows["prompt_tokens"].max())
    book = CurveBook(table)
    assert book.curve("llama-3.2-1b", "a6000ada", 1, top, "ttft", 1)[1] is not None  # in range: a curve
    with pytest.raises(ProfileMissing, match=rf"prompt {4 * top} is outside the profiled prompt lengths"):
        book.curve("llama-3.2-1b", "a6000ada", 1, 4 * top, "ttft", 1)
