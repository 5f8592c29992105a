"""Calibration: least-squares fit of the estimator's factors to measured rows, per device, and siblings."""

import msgspec
import numpy as np
import pandas as pd
import pytest

from fleetplan.models.errors import InputError
from fleetplan.models.hardware import HARDWARE
from fleetplan.models.workload import CATALOG, ModelSpec
from fleetplan.profiler import tables
from fleetplan.profiler.analytic import Efficiency, KindFactors, estimate_rows
from fleetplan.profiler.calibrate import (
    PARAMETERS,
    PUBLIC_FIGURES,
    Calibration,
    Figure,
    estimate_figures,
    fit,
    fit_figures,
    report,
)

MODELS = ("llama-3.2-1b", "llama-3.1-8b", "mistral-7b")
BATCHES = [1, 2, 4, 8, 16, 32]
PROMPTS = [128, 256, 512, 1024, 2048]
# Factors unlike the GPU defaults (0.28, 0.86, 0.5 ms, 0.5 ms, 0.066, 0.12): a vLLM-like datacenter stack.
TRUTH = msgspec.structs.replace(
    Efficiency().kinds["gpu"],
    compute_eff=0.6,
    mem_eff=0.7,
    prefill_overhead_ms=2.0,
    decode_overhead_ms=1.5,
    j90=0.05,
    j99=0.2,
)


def with_gpu(factors: KindFactors, tag: str = "truth") -> Efficiency:
    """Every GPU on `factors`: the kind's, and no per-device defaults (the A100's and H100's)."""
    base = Efficiency()
    return msgspec.structs.replace(base, kinds={**base.kinds, "gpu": factors}, devices={}, tag=tag)


def measured(device: str, factors: KindFactors = TRUTH, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Rows `estimate_rows` gives under `factors`, each row's latencies scaled by lognormal(0, noise) noise
    (one draw per row and metric, applied to all three percentiles so they stay ordered)."""
    rows = []
    for model in MODELS:
        rows += estimate_rows(CATALOG[model], HARDWARE[device], [1, 2], BATCHES, PROMPTS, with_gpu(factors))
    frame = pd.DataFrame(msgspec.to_builtins(rows))
    rng = np.random.default_rng(seed)
    for metric in ("ttft", "tbt"):
        scale = rng.lognormal(0.0, noise, len(frame)) if noise else np.ones(len(frame))
        for q in (50, 90, 99):
            frame[f"{metric}_ms_p{q}"] *= scale
    frame["source"] = f"measured:{device}"
    return frame


def assert_factors_close(got: KindFactors, want: KindFactors, rel: float) -> None:
    for name in (*PARAMETERS, "j90", "j99"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=rel), name


# (a) exact rows -> the factors come back and the fit error is ~0 ------------------------------------


def test_fit_recovers_known_factors_from_noiseless_rows() -> None:
    calibration = fit(measured("a100"))
    assert set(calibration.devices) == {"a100"}
    a100 = calibration.devices["a100"]
    assert_factors_close(a100.factors, TRUTH, rel=1e-3)
    # comm factors are not fitted: they stay at the base calibration.
    assert (a100.factors.comm_eff, a100.factors.step_us) == (TRUTH.comm_eff, TRUTH.step_us)
    assert a100.rows == a100.ttft_rows == a100.tbt_rows == len(measured("a100"))
    # Only the rows' rounding to 0.001 ms is left.
    assert max(a100.ttft_rms, a100.tbt_rms) < 1e-4
    assert max(a100.ttft_max, a100.tbt_max) < 1e-3
    assert a100.unconstrained == []
    assert a100.jitter_measured
    assert a100.models == sorted(MODELS)


def test_fit_accepts_a_profile_table_and_round_trips_as_json() -> None:
    table = tables.from_frame(measured("a100"), "a100-measured")
    calibration = fit(table)
    assert_factors_close(calibration.devices["a100"].factors, TRUTH, rel=1e-3)
    decoded = msgspec.json.decode(msgspec.json.encode(calibration), type=Calibration)
    assert decoded == calibration


# (b) noisy rows -> reported RMS ~ the noise, factors close ---------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_noise_shows_up_as_fit_error_and_factors_stay_close(seed: int) -> None:
    noise = 0.05
    a100 = fit(measured("a100", noise=noise, seed=seed)).devices["a100"]
    for rms in (a100.ttft_rms, a100.tbt_rms):
        assert rms == pytest.approx(noise, rel=0.2)
    assert max(a100.ttft_max, a100.tbt_max) > 2 * noise  # the tail of 180 draws
    assert a100.factors.compute_eff == pytest.approx(TRUTH.compute_eff, rel=0.05)
    assert a100.factors.mem_eff == pytest.approx(TRUTH.mem_eff, rel=0.05)
    assert a100.factors.prefill_overhead_ms == pytest.approx(TRUTH.prefill_overhead_ms, rel=0.25)
    assert a100.factors.decode_overhead_ms == pytest.approx(TRUTH.decode_overhead_ms, rel=0.25)
    # The percentiles were scaled with their p50, so the spread is still exact.
    assert a100.factors.j99 == pytest.approx(TRUTH.j99, rel=1e-3)


# (c) fit one GPU, estimate a sibling -----------------------------------------------------------------


def test_a100_calibration_estimates_an_h100() -> None:
    calibration = fit(measured("a100", noise=0.03, seed=3))
    eff = calibration.efficiency("h100")
    assert calibration.source_for("h100").device == "a100"
    assert eff.kinds["gpu"] == calibration.devices["a100"].factors
    assert eff.factors(HARDWARE["h100"]) == calibration.devices["a100"].factors  # not the default H100's
    assert eff.kinds["tpu"] == Efficiency().kinds["tpu"]  # kinds nobody measured keep the base factors
    model = CATALOG["llama-3.1-8b"]
    h100 = estimate_rows(model, HARDWARE["h100"], [1], BATCHES, PROMPTS, eff)
    a100 = estimate_rows(model, HARDWARE["a100"], [1], BATCHES, PROMPTS, calibration.efficiency("a100"))
    assert len(h100) == len(a100) == len(BATCHES) * len(PROMPTS)
    assert {row.source for row in h100} == {"analytic:h100:calibrated-a100"}
    for fast, slow in zip(h100, a100, strict=True):
        assert (fast.batch, fast.prompt_tokens) == (slow.batch, slow.prompt_tokens)
        assert fast.ttft_ms_p50 < slow.ttft_ms_p50
        assert fast.tbt_ms_p50 < slow.tbt_ms_p50
        assert fast.ttft_ms_p50 <= fast.ttft_ms_p90 <= fast.ttft_ms_p99
    # The calibrated A100 estimate reproduces the "measurements" far better than the gpu kind's factors.
    truth = estimate_rows(model, HARDWARE["h100"], [1], BATCHES, PROMPTS, with_gpu(TRUTH))
    default = estimate_rows(
        model, HARDWARE["h100"], [1], BATCHES, PROMPTS, with_gpu(Efficiency().kinds["gpu"])
    )

    def worst(rows: list) -> float:
        return max(abs(r.ttft_ms_p50 / t.ttft_ms_p50 - 1) for r, t in zip(rows, truth, strict=True))

    assert worst(h100) < 0.05 < 0.5 < worst(default)


def test_nearest_measured_sibling_wins_and_unmeasured_kinds_are_refused() -> None:
    frame = pd.concat([measured("a100"), measured("l4")], ignore_index=True)
    calibration = fit(frame)
    assert calibration.source_for("h100").device == "a100"  # HBM datacenter part
    assert calibration.source_for("a10g").device == "l4"  # closer in FLOPS and bandwidth than an A100
    assert calibration.efficiency("l4").tag == "calibrated-l4"
    assert calibration.efficiency().tag == "calibrated"
    with pytest.raises(InputError, match="no measured device of kind 'tpu'.*'tpu-v5e'"):
        calibration.efficiency("tpu-v5e")
    with pytest.raises(InputError, match="'b200'"):
        calibration.efficiency("b200")


# (d) unknown devices and models are named -----------------------------------------------------------


def test_unknown_device_is_an_input_error_naming_it() -> None:
    frame = measured("a100")
    frame.loc[frame.index[:3], "device"] = "mi300x"
    with pytest.raises(InputError, match=r"unknown device\(s\) \['mi300x'\]") as info:
        fit(frame)
    assert info.value.field == "profiles.device"


def test_unknown_or_unmodellable_model_is_an_input_error() -> None:
    frame = measured("a100")
    frame.loc[frame.index[:3], "model"] = "gpt-x"
    with pytest.raises(InputError, match=r"unknown model\(s\) \['gpt-x'\]"):
        fit(frame)
    opaque = {"gpt-x": ModelSpec(name="gpt-x", kv_bytes_per_token=65536), **CATALOG}
    with pytest.raises(InputError, match="params_b"):
        fit(frame, models=opaque)


def test_custom_hardware_is_used_for_the_fit() -> None:
    """A device missing from HARDWARE calibrates once its spec sheet is passed in."""
    frame = measured("a100")
    frame["device"] = "a100-pcie"
    specs = {"a100-pcie": msgspec.structs.replace(HARDWARE["a100"], name="a100-pcie")}
    fitted = fit(frame, hardware=specs).devices["a100-pcie"]
    assert_factors_close(fitted.factors, TRUTH, rel=1e-3)


# (e) the error is per device ------------------------------------------------------------------------


def test_fit_error_is_reported_per_device() -> None:
    quiet = measured("a100", noise=0.02, seed=4)
    loud = measured("l40s", noise=0.10, seed=5)
    calibration = fit(pd.concat([quiet, loud], ignore_index=True))
    a100, l40s = calibration.devices["a100"], calibration.devices["l40s"]
    assert (a100.rows, l40s.rows) == (len(quiet), len(loud))
    for rms in (a100.ttft_rms, a100.tbt_rms):
        assert rms == pytest.approx(0.02, rel=0.25)
    for rms in (l40s.ttft_rms, l40s.tbt_rms):
        assert rms == pytest.approx(0.10, rel=0.25)
    text = report(calibration)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert {"a100", "l40s"} <= set(lines)
    assert f"| {100 * l40s.ttft_rms:.2f} |" in lines["l40s"]
    assert f"| {100 * a100.tbt_max:.2f} |" in lines["a100"]


# what the rows cannot tell --------------------------------------------------------------------------


def test_parameters_the_rows_do_not_constrain_are_named_and_base_jitter_kept() -> None:
    """Batch-1 decode alone (no TTFT, no percentiles) is memory-bound: e_c and o_pre are not determined."""
    frame = measured("a100")
    frame = frame[frame.batch == 1].copy()
    for column in ("ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tbt_ms_p90", "tbt_ms_p99"):
        frame[column] = np.nan
    a100 = fit(frame).devices["a100"]
    assert a100.ttft_rows == 0
    assert np.isnan(a100.ttft_rms)
    assert set(a100.unconstrained) == {"compute_eff", "prefill_overhead_ms"}
    start = Efficiency().factors(HARDWARE["a100"])  # the base the fit starts from: the default A100's factors
    assert (a100.factors.compute_eff, a100.factors.prefill_overhead_ms) == pytest.approx(
        (start.compute_eff, start.prefill_overhead_ms)
    )
    assert a100.factors.mem_eff == pytest.approx(TRUTH.mem_eff, rel=1e-2)
    assert not a100.jitter_measured
    assert a100.factors.j99 == start.j99
    text = report(fit(frame))
    assert "do not constrain compute_eff, prefill_overhead_ms (left at the base value)" in text
    assert "| - | - |" in text


def test_no_rows_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no rows"):
        fit(measured("a100").iloc[:0])


# other parameters, and the default factors' own fit ------------------------------------------------


def test_fit_can_fit_the_per_layer_prefill_cost_instead() -> None:
    """Rows of 16- and 32-layer models with a per-layer prefill cost: fitting that parameter recovers it."""
    truth = msgspec.structs.replace(TRUTH, prefill_overhead_ms=0.0, prefill_layer_ms=0.12)
    names = ("compute_eff", "mem_eff", "prefill_layer_ms", "decode_overhead_ms")
    base = with_gpu(msgspec.structs.replace(Efficiency().kinds["gpu"], prefill_overhead_ms=0.0))
    a100 = fit(measured("a100", truth), base=base, parameters=names).devices["a100"]
    for name in names:
        assert getattr(a100.factors, name) == pytest.approx(getattr(truth, name), rel=1e-3, abs=1e-6), name
    assert a100.factors.prefill_overhead_ms == 0.0  # not fitted: the base's
    assert max(a100.ttft_max, a100.tbt_max) < 1e-3
    # With the default parameters the per-call cost takes the place of the base's per-layer one.
    assert fit(measured("a100")).devices["a100"].factors.prefill_layer_ms == 0.0


def test_unknown_parameters_are_refused() -> None:
    with pytest.raises(InputError, match="'j99'") as info:
        fit(measured("a100"), parameters=("compute_eff", "j99"))
    assert info.value.field == "parameters"


def test_a_calibrated_kind_replaces_the_base_device_factors() -> None:
    """Measured L4 rows reach an A100 too: the base's A100 factors do not shadow the calibration, while
    per-device factors of kinds nobody measured stay."""
    base = msgspec.structs.replace(
        Efficiency(), devices={"a100": TRUTH, "trn1": Efficiency().kinds["trainium"]}
    )
    calibration = fit(measured("l4"), base=base)
    for eff in (calibration.efficiency(), calibration.efficiency("a100")):
        assert set(eff.devices) == {"trn1"}
        assert eff.factors(HARDWARE["a100"]) == calibration.devices["l4"].factors


def _figure(metric: str, output: int = 1024) -> Figure:
    return Figure(
        label=f"a100 llama-3.1-8b {metric}",
        source="test",
        model=CATALOG["llama-3.1-8b"],
        hardware=HARDWARE["a100"],
        tp=1,
        batch=1,
        prompt_tokens=1024,
        output_tokens=output,
        metric=metric,
        measured_ms=1.0,
    )


def test_fit_figures_recovers_factors_from_exact_figures() -> None:
    """Figures of two depths at the estimates of known factors, as a source would print them: refit them."""
    truth = msgspec.structs.replace(TRUTH, prefill_overhead_ms=0.0, prefill_layer_ms=0.12)
    eff = with_gpu(truth)
    figures = []
    points = ((1, 128, 1, "ttft"), (8, 2048, 1, "ttft"), (1, 1024, 256, "tbt"), (32, 512, 128, "e2e"))
    for model in ("llama-3.2-1b", "llama-3.1-8b"):
        for batch, prompt, output, metric in points:
            figure = msgspec.structs.replace(
                _figure(metric, output), model=CATALOG[model], batch=batch, prompt_tokens=prompt
            )
            (ms,) = estimate_figures([figure], eff)
            figures.append(msgspec.structs.replace(figure, measured_ms=float(ms)))
    names = ("compute_eff", "mem_eff", "prefill_layer_ms", "decode_overhead_ms")
    refit = fit_figures(
        figures, msgspec.structs.replace(Efficiency().kinds["gpu"], prefill_overhead_ms=0.0), names
    )
    for name in names:
        assert getattr(refit.factors, name) == pytest.approx(getattr(truth, name), rel=1e-4, abs=1e-8), name
    assert refit.max < 1e-6


# Which parameters each default factor set was fitted on; the rest come from the kind's roofline-v1 factors.
DEFAULT_FITS = {
    "a100": ("gpu", ("compute_eff", "mem_eff", "prefill_layer_ms", "decode_overhead_ms")),
    "h100": ("gpu", ("compute_eff", "mem_eff", "prefill_layer_ms", "decode_overhead_ms")),
    "trainium": ("trainium", ("compute_eff", "mem_eff", "prefill_overhead_ms", "step_us")),
}


@pytest.mark.parametrize("group", sorted(DEFAULT_FITS))
def test_default_factors_are_the_fit_of_the_public_figures(group: str) -> None:
    """analytic.py's A100, H100 and Trainium factors are fit_figures on PUBLIC_FIGURES, rounded: refit."""
    kind, names = DEFAULT_FITS[group]
    figures = [figure for figure in PUBLIC_FIGURES if figure.fit == group]
    assert len(figures) >= 4
    default = Efficiency().factors(figures[0].hardware)
    assert all(Efficiency().factors(figure.hardware) == default for figure in figures)
    # roofline-v1 kind factors (the trainium kind's were inferentia's) with the per-call prefill cost zeroed
    # where the per-layer one is fitted
    start = Efficiency().kinds["inferentia" if kind == "trainium" else kind]
    if "prefill_layer_ms" in names:
        start = msgspec.structs.replace(start, prefill_overhead_ms=0.0)
    refit = fit_figures(figures, start, names)
    for name in KindFactors.__struct_fields__:
        assert getattr(default, name) == pytest.approx(getattr(refit.factors, name), abs=6e-3), name
    assert refit.max < 0.2


def test_fit_figures_refuses_what_it_cannot_fit() -> None:
    queued = msgspec.structs.replace(_figure("tbt"), comparable=False)
    with pytest.raises(InputError, match="not comparable"):
        fit_figures([queued], Efficiency().kinds["gpu"])
    with pytest.raises(InputError, match="no figures"):
        fit_figures([], Efficiency().kinds["gpu"])


def test_estimate_figures_uses_each_figures_own_lengths() -> None:
    """An end-to-end figure is TTFT + (output - 1) decode steps; a TBT figure reads prompt + output / 2."""
    total, first, step = estimate_figures([_figure("e2e"), _figure("ttft"), _figure("tbt")])
    assert total == pytest.approx(first + 1023 * step)
    (row,) = estimate_rows(CATALOG["llama-3.1-8b"], HARDWARE["a100"], [1], [1], [1024], output_tokens=1024)
    assert (first, step) == pytest.approx((row.ttft_ms_p50, row.tbt_ms_p50), abs=1e-3)


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_an_efficiency_factor_must_be_a_positive_share_of_peak(value):
    """compute_eff 0 was a ValidationError deep in the estimator (a traceback); -1 estimated a 6,159 ms
    TTFT at 101.7 ms."""
    from fleetplan.models.codec import convert
    from fleetplan.models.errors import InputError
    from fleetplan.profiler.analytic import _GPU, KindFactors

    factors = msgspec.to_builtins(_GPU)
    with pytest.raises(InputError, match="compute_eff: Expected `float` > 0.0"):
        convert({**factors, "compute_eff": value}, KindFactors)
