"""Regenerate the bundled profile sets byte for byte: `python -m fleetplan.profiler.build_fixtures [OUT_DIR]`.

Each set is `<OUT_DIR>/<name>/profile.csv` plus `manifest.json` (a ProfileSetManifest whose sha256 is that of
the CSV bytes). OUT_DIR defaults to fleetplan/fixtures/profiles/ in this tree. Everything here is a pure
function of the catalog, the spec sheets and the estimator's defaults, and `created` is a constant, so a
rebuild that changes a byte means one of those changed.
"""

import hashlib
import sys
from pathlib import Path
from typing import NamedTuple

import msgspec
import pandas as pd

from fleetplan.models.hardware import HARDWARE
from fleetplan.models.profile import KEY_COLUMNS, LATENCY_COLUMNS, ProfileRow, ProfileSetManifest
from fleetplan.models.workload import CATALOG
from fleetplan.profiler.analytic import Efficiency, estimate_rows

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"
GENERATOR = "fleetplan.profiler.build_fixtures (analytic roofline v1)"
CREATED = "2025-11-22"
COLUMNS = [*KEY_COLUMNS, *LATENCY_COLUMNS, "source"]
OUTPUT_TOKENS = 128

CALIBRATION_SOURCES = {
    "estimator": (
        "fleetplan/profiler/analytic.py: roofline over the spec sheets (fleetplan/models/hardware.py) with "
        "per-kind efficiency "
        "factors; equations and measured-vs-estimated table in docs/profiles.md"
    ),
    "calibration:llama.cpp": (
        "XiongjieDai/GPU-Benchmarks-on-LLM-Inference@aa72e0ec README (no license; cited, not vendored): "
        "Llama-3-8B F16 bs1 tg1024 / pp1024 on RTX 6000 Ada, RTX A6000, L40S"
    ),
    "calibration:neuron": (
        "aws-neuron/aws-neuron-sdk@81ce03ae about-neuron/benchmarks/inf2/latency_data_decoder.csv "
        "(CC-BY-SA-4.0; cited, not vendored): inf2.48xlarge TP24, Neuron 2.18, BF16 rows"
    ),
    "calibration:jetstream": (
        "github.com/AI-Hypercomputer/jetstream-pytorch/pull/68: Llama-2-7B prefill 128-2048 tokens on TPU "
        "v5e (slice not stated; read as v5e-8 TP8)"
    ),
    "models": (
        "Hugging Face config.json shapes (docs/public-figures.md section 5; "
        "fleetplan/models/workload.py CATALOG)"
    ),
}
# Cited only by the sets holding these devices, whose factors were fitted apart from their kind's.
DEVICE_CALIBRATION_SOURCES = {
    "calibration:serving-gpu": (
        {"a100", "h100"},
        "a100, h100: fleetplan.profiler.calibrate.fit_figures on PUBLIC_FIGURES: "
        "NVIDIA/TensorRT-LLM@138f96d4 docs/source/performance.md (low latency, A100 FP16, H100 FP8), "
        "argonne-lcf/LLM-Inference-Bench@4211f5d4 (BSD-3) Plots/All_results.csv and Fig_22 TTFT, "
        "NVIDIA NIM 1.8.0 benchmarking docs (Llama-3.3-70B, 2 x H100 FP8, concurrency 1)",
    ),
    "calibration:trainium": (
        {"trn1"},
        "aws-neuron-sdk@81ce03ae about-neuron/benchmarks/trn1/latency_data_decoder.csv "
        "(CC-BY-SA-4.0; cited, not vendored): trn1.32xlarge TP32, Llama-2-70B and Llama-3-8B, bs1",
    ),
}


class SetSpec(NamedTuple):
    """One profile set: which models and devices, on which (tp, batch, prompt) grid."""

    name: str
    description: str
    models: tuple[str, ...]
    devices: tuple[str, ...]
    tp_degrees: tuple[int, ...]
    batches: tuple[int, ...]
    prompts: tuple[int, ...]


SETS = (
    SetSpec(
        name="paper",
        description=(
            "Llama-3.2-1B, Llama-3.2-3B and Mistral-7B on one RTX 6000 Ada, one Inferentia2 chip and one TPU "
            "v5e chip (tp 1), batch 1/4, prompts 128/512/1024, KV sized for 128 output tokens. No public "
            "measurement matches a grid point exactly (the Neuron figures are 12-chip TP24, the GPU ones "
            "Llama-3-8B), so every row is the analytic estimate calibrated on those figures."
        ),
        models=("llama-3.2-1b", "llama-3.2-3b", "mistral-7b"),
        devices=("a6000ada", "inf2", "tpu-v5e"),
        tp_degrees=(1,),
        batches=(1, 4),
        prompts=(128, 512, 1024),
    ),
    SetSpec(
        name="synthetic",
        description=(
            "Analytic estimates for the six catalog models on the ten spec-sheet devices, tp 1/2/4, batch "
            "1-32, prompts 128-2048, KV sized for 128 output tokens; rows only where the model fits. For "
            "solver scaling and what-if fleets, not for claims about a device."
        ),
        models=("llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "llama-3.1-8b", "llama-2-7b", "llama-3.1-70b"),
        devices=tuple(HARDWARE),
        tp_degrees=(1, 2, 4),
        batches=(1, 2, 4, 8, 16, 32),
        prompts=(128, 256, 512, 1024, 2048),
    ),
)


def build_rows(spec: SetSpec, efficiency: Efficiency) -> list[ProfileRow]:
    """Every fitting (model, device, tp, batch, prompt) of the set, estimated."""
    return [
        row
        for model in spec.models
        for device in spec.devices
        for row in estimate_rows(
            CATALOG[model],
            HARDWARE[device],
            list(spec.tp_degrees),
            list(spec.batches),
            list(spec.prompts),
            efficiency,
            output_tokens=OUTPUT_TOKENS,
        )
    ]


def csv_bytes(rows: list[ProfileRow]) -> bytes:
    """The CSV in column order, sorted by key, ms with three decimals, "\\n" line ends on every platform."""
    frame = pd.DataFrame(msgspec.to_builtins(rows), columns=COLUMNS)
    frame = frame.sort_values(list(KEY_COLUMNS), kind="stable")
    return frame.to_csv(index=False, float_format="%.3f", lineterminator="\n").encode()


def set_sources(spec: SetSpec) -> dict[str, str]:
    """Citations of the estimator, its calibration and each device's spec sheet."""
    devices = set(spec.devices)
    fitted = {key: text for key, (which, text) in DEVICE_CALIBRATION_SOURCES.items() if which & devices}
    hardware = {f"hardware:{name}": HARDWARE[name].source for name in spec.devices}
    return {**CALIBRATION_SOURCES, **fitted, **hardware}


def write_set(spec: SetSpec, out_dir: Path, efficiency: Efficiency) -> ProfileSetManifest:
    """Write `<out_dir>/<name>/{profile.csv,manifest.json}` and return the manifest."""
    rows = build_rows(spec, efficiency)
    data = csv_bytes(rows)
    manifest = ProfileSetManifest(
        name=spec.name,
        description=spec.description,
        sha256=hashlib.sha256(data).hexdigest(),
        rows=len(rows),
        generator=GENERATOR,
        created=CREATED,
        sources=set_sources(spec),
    )
    directory = out_dir / spec.name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "profile.csv").write_bytes(data)
    pretty = msgspec.json.format(msgspec.json.encode(manifest), indent=2)
    (directory / "manifest.json").write_bytes(pretty + b"\n")
    return manifest


def main(out_dir: Path | None = None) -> list[ProfileSetManifest]:
    """Build every set into `out_dir` (default: the bundled fixtures) with the default calibration."""
    target = out_dir or DEFAULT_OUT
    efficiency = Efficiency()
    manifests = [write_set(spec, target, efficiency) for spec in SETS]
    for manifest in manifests:
        print(f"{target / manifest.name}: {manifest.rows} rows, sha256 {manifest.sha256[:12]}")
    return manifests


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
