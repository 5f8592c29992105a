"""The analytic estimator's physics, its calibration, and the bundled profile sets it generates."""

import hashlib
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.hardware import HARDWARE, HardwareSpec
from fleetplan.models.profile import KEY_COLUMNS, LATENCY_COLUMNS, ProfileRow, ProfileSetManifest
from fleetplan.models.workload import CATALOG, ModelSpec
from fleetplan.profiler import build_fixtures
from fleetplan.profiler.analytic import Efficiency, estimate_rows
from fleetplan.profiler.calibrate import PUBLIC_FIGURES, Figure, estimate_figures

ROOT = Path(__file__).resolve().parents[1]
PROFILES = fixtures.profiles_dir()
REQUESTS = fixtures.requests_dir()
SETS = ("paper", "synthetic")
SMALL = ("llama-3.2-1b", "llama-3.2-3b", "mistral-7b")


def frame(name: str) -> pd.DataFrame:
    return pd.read_csv(PROFILES / name / "profile.csv")


def estimate(model: str, device: str, tp: int, batch: int, prompt: int, output: int = 128) -> ProfileRow:
    (row,) = estimate_rows(CATALOG[model], HARDWARE[device], [tp], [batch], [prompt], output_tokens=output)
    return row


# --- physics, on the estimator directly ------------------------------------------------------------


@pytest.mark.parametrize("device", sorted(HARDWARE))
@pytest.mark.parametrize(("model", "tp"), [("llama-3.2-1b", 1), ("llama-3.1-8b", 2)])
def test_ttft_grows_with_prompt_and_batch(model: str, tp: int, device: str) -> None:
    """A longer prompt or a bigger batch is more prefill work: TTFT never falls along either axis and rises
    from end to end of both (a small prefill bound by its one weight read is flat: the roofline plateau)."""
    rows = estimate_rows(CATALOG[model], HARDWARE[device], [tp], [1, 2, 4, 8], [128, 256, 512, 1024])
    table = pd.DataFrame(msgspec.to_builtins(rows))
    grid = table.pivot(index="batch", columns="prompt_tokens", values="ttft_ms_p50").to_numpy()
    assert not np.isnan(grid).any()
    assert (np.diff(grid, axis=0) >= 0).all()
    assert (np.diff(grid, axis=1) >= 0).all()
    assert (grid[-1, :] > grid[0, :]).all()
    assert (grid[:, -1] > grid[:, 0]).all()


def test_decode_step_grows_slowly_with_batch() -> None:
    """Decode is weight-read bound: 8x the batch costs well under 2x the step, so per-token cost falls."""
    grid = frame("synthetic").pivot_table(
        index=["model", "device", "tp", "prompt_tokens"], columns="batch", values="tbt_ms_p50"
    )
    ratio = (grid[8] / grid[1]).dropna()
    assert len(ratio) > 500
    assert (ratio >= 1).all()
    assert (ratio < 2).all(), ratio.sort_values().tail()
    per_token = grid.to_numpy() / grid.columns.to_numpy(dtype=float)
    steps = np.diff(per_token, axis=1)
    assert (steps[~np.isnan(steps)] < 0).all()


def test_tensor_parallelism_speeds_up_compute_bound_prefill() -> None:
    """Splitting a long prefill over NVLinked GPUs beats the all-reduces it adds."""
    ttft = [estimate("llama-3.1-8b", "a100", tp, 8, 2048).ttft_ms_p50 for tp in (1, 2, 4)]
    assert ttft[0] > ttft[1] > ttft[2]


def test_capacity_check_drops_what_does_not_fit() -> None:
    """141 GB of Llama-3.1-70B weights fit on no 24 GB L4 (not even split 4 ways); big KV caches drop rows."""
    assert estimate_rows(CATALOG["llama-3.1-70b"], HARDWARE["l4"], [1, 2, 4], [1], [128]) == []
    synthetic = frame("synthetic")
    assert synthetic[(synthetic.model == "llama-3.1-70b") & (synthetic.device == "l4")].empty
    # Mistral-7B fills most of a 16 GB TPU v5e chip: small batches fit, 32 x (2048 + 128) tokens of KV do not.
    rows = estimate_rows(CATALOG["mistral-7b"], HARDWARE["tpu-v5e"], [1], [1, 32], [128, 2048])
    assert {(r.batch, r.prompt_tokens) for r in rows} == {(1, 128), (1, 2048)}


def test_output_tokens_enter_the_capacity_check() -> None:
    """The KV cache is sized for prompt + output, so a long enough output drops a row that fits otherwise."""
    model, hw = CATALOG["llama-2-7b"], HARDWARE["a10g"]
    assert estimate_rows(model, hw, [1], [4], [1024], output_tokens=128)
    assert not estimate_rows(model, hw, [1], [4], [1024], output_tokens=4096)


@pytest.mark.parametrize("model", SMALL)
def test_gpu_prefills_faster_than_inf2_and_tpu(model: str) -> None:
    """Prefill is compute-bound: the RTX 6000 Ada has the most usable FLOPS of the paper's three devices."""
    paper = frame("paper")
    ttft = paper[paper.model == model].pivot_table(
        index=["batch", "prompt_tokens"], columns="device", values="ttft_ms_p90"
    )
    assert (ttft["a6000ada"] < ttft["inf2"]).all()
    assert (ttft["a6000ada"] < ttft["tpu-v5e"]).all()


@pytest.mark.parametrize("model", SMALL)
def test_inf2_and_tpu_are_competitive_at_decode(model: str) -> None:
    """Decode is bandwidth-bound and the three devices have similar bandwidth: TBT within ~1.5x of the GPU."""
    paper = frame("paper")
    tbt = paper[paper.model == model].pivot_table(
        index=["batch", "prompt_tokens"], columns="device", values="tbt_ms_p90"
    )
    assert (tbt["inf2"] / tbt["a6000ada"] <= 1.6).all()
    assert (tbt["tpu-v5e"] / tbt["a6000ada"] <= 1.6).all()


def test_percentiles_come_from_the_kinds_jitter() -> None:
    """p90 and p99 are the median scaled by the device kind's documented spread, GPU wider than Neuron."""
    gpu, neuron = estimate("mistral-7b", "a6000ada", 1, 1, 512), estimate("mistral-7b", "inf2", 1, 1, 512)
    kinds = Efficiency().kinds
    for row, kind in ((gpu, "gpu"), (neuron, "inferentia")):
        assert row.ttft_ms_p99 == pytest.approx(row.ttft_ms_p50 * (1 + kinds[kind].j99), abs=2e-3)
        assert row.tbt_ms_p90 == pytest.approx(row.tbt_ms_p50 * (1 + kinds[kind].j90), abs=2e-3)
    assert kinds["gpu"].j99 > kinds["inferentia"].j99


# --- calibration against the public figures (docs/profiles.md) -------------------------------------

CALIBRATION = [
    # (what, model, device, tp, batch, prompt, output, metric, measured ms, tolerance as a ratio)
    ("llama.cpp RTX 6000 Ada tg1024", "llama-3.1-8b", "a6000ada", 1, 1, 1, 1024, "tbt", 1000 / 51.97, 0.10),
    ("llama.cpp RTX 6000 Ada pp1024", "llama-3.1-8b", "a6000ada", 1, 1, 1024, 1, "ttft", 1024e3 / 6205, 0.10),
    ("llama.cpp RTX A6000 tg1024", "llama-3.1-8b", "a6000", 1, 1, 1, 1024, "tbt", 1000 / 40.25, 0.10),
    ("llama.cpp L40S tg1024", "llama-3.1-8b", "l40s", 1, 1, 1, 1024, "tbt", 1000 / 43.42, 0.10),
    ("jetstream v5e-8 prefill 128", "llama-2-7b", "tpu-v5e", 8, 1, 128, 1, "ttft", 7.7, 0.10),
    ("jetstream v5e-8 prefill 1024", "llama-2-7b", "tpu-v5e", 8, 1, 1024, 1, "ttft", 38.4, 0.10),
    ("jetstream v5e-8 prefill 2048", "llama-2-7b", "tpu-v5e", 8, 1, 2048, 1, "ttft", 78.2, 0.10),
    ("Neuron inf2 TP24 Llama-2-7B TTFT", "llama-2-7b", "inf2", 12, 1, 128, 3968, "ttft", 27.64, 0.30),
    ("Neuron inf2 TP24 Llama-2-7B TPOT", "llama-2-7b", "inf2", 12, 1, 128, 3968, "tbt", 6.47, 0.30),
    ("Neuron inf2 TP24 Llama-3-70B TTFT", "llama-3.1-70b", "inf2", 12, 1, 2048, 2048, "ttft", 745.49, 0.30),
    ("Neuron inf2 TP24 Llama-3-70B TPOT", "llama-3.1-70b", "inf2", 12, 1, 2048, 2048, "tbt", 34.67, 0.30),
]


@pytest.mark.parametrize(
    ("what", "model", "device", "tp", "batch", "prompt", "output", "metric", "measured", "tolerance"),
    CALIBRATION,
    ids=[c[0] for c in CALIBRATION],
)
def test_estimates_reproduce_the_public_figures(
    what: str,
    model: str,
    device: str,
    tp: int,
    batch: int,
    prompt: int,
    output: int,
    metric: str,
    measured: float,
    tolerance: float,
) -> None:
    """The calibration points stay calibrated: a change to the factors or equations that moves them fails."""
    row = estimate(model, device, tp, batch, prompt, output)
    estimated = row.ttft_ms_p50 if metric == "ttft" else row.tbt_ms_p50
    message = f"{what}: estimated {estimated:.2f} ms, measured {measured:.2f}"
    assert abs(estimated / measured - 1) <= tolerance, message


# Every Llama-2/3-70B latency in docs/public-figures.md that measures what the estimator models (one static
# batch: no queueing). The inf2 Llama-2-70B TTFT cannot be met: 277 ms at 1,024 tokens against the same
# instance's 745 ms at 2,048 (Llama-3-70B) is 2.7x the time for 2x the tokens, which no prefill linear in the
# prompt fits (a refit of the inferentia factors that includes it still leaves it at 1.32x and moves the paper
# set's inf2 TTFTs by up to 19%, docs/profiles.md).
SEVENTY_B = [f for f in PUBLIC_FIGURES if f.model.params_b is not None and f.model.params_b > 60]
UNREACHABLE = {"inf2 Llama-2-70B TTFT 1024"}


def _pinned(figure: Figure) -> object:
    if figure.label in UNREACHABLE:
        reason = "inconsistent with the Llama-3-70B rows of the same CSV under any linear prefill (1.56x)"
        return pytest.param(figure, id=figure.label, marks=pytest.mark.xfail(strict=True, reason=reason))
    return pytest.param(figure, id=figure.label)


def test_every_cited_70b_figure_is_covered() -> None:
    """Neuron (inf2, trn1), TensorRT-LLM, LLM-Inference-Bench and NIM: 18 static-batch figures, 8 queued."""
    assert len([f for f in SEVENTY_B if f.comparable]) == 18
    assert len([f for f in SEVENTY_B if not f.comparable]) == 8
    assert {f.hardware.name for f in SEVENTY_B} == {"inf2", "trn1", "a100", "h100"}


@pytest.mark.parametrize("figure", [_pinned(f) for f in SEVENTY_B if f.comparable])
def test_estimates_are_within_25_percent_of_the_70b_figures(figure: Figure) -> None:
    """Prefill and decode of 70B models at the tp, batch and lengths the sources ran, default factors."""
    (estimated,) = estimate_figures([figure])
    ratio = estimated / figure.measured_ms
    message = (
        f"{figure.label}: estimated {estimated:.2f} ms, measured {figure.measured_ms:.2f} ({ratio:.2f}x)"
    )
    assert 0.75 <= ratio <= 1.25, message


@pytest.mark.parametrize("concurrency", [5, 25, 50])
def test_nim_inter_token_latency_under_load_is_decode_plus_interleaved_prefill(concurrency: int) -> None:
    """NIM's ITL at concurrency c is not one decode step at batch c: each step also carries c x 5000 / 500
    prompt tokens of the requests admitted meanwhile. Decode plus that prefill work reproduces it, which is
    why the bare decode step looks 2-3x optimistic against it (docs/profiles.md)."""
    (figure,) = [
        f for f in SEVENTY_B if f.label == f"H100x2 FP8 NIM Llama-3.3-70B ITL 5000/500 c={concurrency}"
    ]
    (decode,) = estimate_figures([figure])
    assert decode / figure.measured_ms < 0.9
    interleaved = concurrency * figure.prompt_tokens / figure.output_tokens
    f = Efficiency().factors(figure.hardware)
    assert figure.model.params_b is not None
    # The matmul work of the interleaved prompt tokens at the prefill efficiency, added to the step: an
    # accounting (it assumes no overlap with the step's weight read), not part of the estimator.
    flops = 2 * figure.model.params_b * 1e9 * interleaved
    extra = flops / (figure.tp * figure.hardware.bf16_tflops * 1e12 * f.compute_eff) * 1e3
    assert 0.9 <= (decode + extra) / figure.measured_ms <= 1.1


def test_estimator_refuses_what_it_cannot_model() -> None:
    """No architecture or no calibrated kind is an error, never a made-up latency."""
    bare = ModelSpec(name="opaque", kv_bytes_per_token=65536)
    with pytest.raises(ValueError, match="params_b"):
        estimate_rows(bare, HARDWARE["a100"], [1], [1], [128])
    cpu = msgspec.structs.replace(HARDWARE["a100"], name="epyc", kind="cpu")
    with pytest.raises(ValueError, match="kind 'cpu'"):
        estimate_rows(CATALOG["llama-3.2-1b"], cpu, [1], [1], [128])


# --- the generated sets ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_csv_is_complete_sorted_and_ordered(name: str) -> None:
    data = frame(name)
    assert list(data.columns) == [*KEY_COLUMNS, *LATENCY_COLUMNS, "source"]
    assert not data.isna().any().any()
    assert not data.duplicated(list(KEY_COLUMNS)).any()
    assert data.equals(data.sort_values(list(KEY_COLUMNS)).reset_index(drop=True))
    for metric in ("ttft", "tbt"):
        p50, p90, p99 = (data[f"{metric}_ms_p{q}"] for q in (50, 90, 99))
        assert ((p50 > 0) & (p50 <= p90) & (p90 <= p99)).all()
    assert (data.source == "analytic:" + data.device + ":" + Efficiency().tag).all()


@pytest.mark.parametrize("name", SETS)
def test_every_row_decodes_as_a_profile_row(name: str) -> None:
    records = frame(name).to_dict(orient="records")
    rows = msgspec.convert(records, list[ProfileRow])
    assert len(rows) == len(records)


@pytest.mark.parametrize("name", SETS)
def test_manifest_describes_the_csv(name: str) -> None:
    manifest = msgspec.json.decode((PROFILES / name / "manifest.json").read_bytes(), type=ProfileSetManifest)
    data = (PROFILES / name / "profile.csv").read_bytes()
    assert manifest.name == name
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.rows == len(frame(name))
    assert manifest.generator == build_fixtures.GENERATOR
    assert {f"hardware:{device}" for device in frame(name).device.unique()} <= set(manifest.sources)


def test_paper_set_covers_its_grid() -> None:
    """Every paper point fits on its device, so the set is the full 3 x 3 x 2 x 3 grid at tp 1."""
    paper = frame("paper")
    assert len(paper) == 3 * 3 * 2 * 3
    assert set(paper.model) == set(SMALL)
    assert set(paper.device) == {"a6000ada", "inf2", "tpu-v5e"}
    assert set(paper.tp) == {1}


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    build_fixtures.main(out_dir=tmp_path)
    for name in SETS:
        for file in ("profile.csv", "manifest.json"):
            rebuilt, bundled = (tmp_path / name / file).read_bytes(), (PROFILES / name / file).read_bytes()
            assert rebuilt == bundled, f"{name}/{file}"


# --- the bundled requests --------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(REQUESTS.glob("*.json")), ids=lambda p: p.stem)
def test_request_fixtures_decode_and_use_the_spec_sheets(path: Path) -> None:
    """Each bundled request is a valid PlanRequest whose devices carry the HardwareSpec figures."""
    request = read_request(path)
    assert request.profiles.set == "paper"
    for device in request.devices:
        spec: HardwareSpec = HARDWARE[device.name]
        assert (device.kind, device.memory_gib) == (spec.kind, spec.memory_gib)
        assert (device.network_gbps, device.cost_per_hour) == (spec.network_gbps, spec.cost_per_hour)
    paper = frame("paper")
    for workload in request.workloads:
        assert workload.prompt_tokens in set(paper.prompt_tokens)
        assert workload.model in set(paper.model)
