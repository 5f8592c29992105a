"""Analytic roofline estimator: profile rows for devices nobody has measured yet.

A dense decoder-only transformer with P parameters, L layers and hidden size H, run in BF16 with tensor
parallelism over `tp` devices (peak F TFLOPS, memory bandwidth B GB/s, device-to-device bandwidth I GB/s):

    prefill (one batch of b prompts of p tokens), in seconds:
        compute   = (2 P b p + 2 L b p^2 H) / (tp F e_c)          matmuls + causal attention
        memory    = 2 P / (tp B e_m)                             every weight read once
        ttft      = max(compute, memory) + comm(b p) + o_prefill + L o_layer
    decode (one step of b sequences holding c = p + o/2 tokens on average over o output tokens):
        memory    = (2 P + b c K) / (tp B e_m)                   weights + the batch's KV (K bytes/token)
        compute   = 2 P b / (tp F e_c)
        tbt       = max(memory, compute) + comm(b) + o_decode
    comm(n tokens) = 2 L * 2 (tp - 1) * (alpha + n H 2 / (tp I e_i))
        two ring all-reduces per layer, 2 (tp - 1) steps each, every step moving 1/tp of the activations.

A row is emitted only where the model fits (docs/formulation.md, "Memory is implicit"):
    2 P / tp + b (p + o) K / tp + reserve * memory <= memory.

Percentiles: p50 is the model; p90 = p50 (1 + j90) and p99 = p50 (1 + j99), per device kind.
The efficiency factors e_c, e_m, e_i, alpha, o_prefill, o_layer, o_decode, j90, j99 are per device kind, or
per device where a device's serving stack was measured apart from its kind (the A100 and H100), and
calibrated against the public measurements in docs/public-figures.md; docs/profiles.md tabulates measured
vs estimated.
"""

from typing import Annotated, NamedTuple

import msgspec
import numpy as np

from fleetplan.models.base import Base
from fleetplan.models.hardware import HardwareSpec
from fleetplan.models.profile import ProfileRow
from fleetplan.models.workload import ModelSpec

_GIB = 2**30
# Standard-normal quantiles: with latency ~ p50 (1 + sigma Z), j90 / j99 = z90 / z99.
_Z90_OVER_Z99 = 1.2816 / 2.3263


# a share of a spec-sheet peak: above 0 (a factor of 0 divided by zero into an infinite latency; a negative
# one estimated TTFT at 101.7 ms where 6158.9 was due), and below 10 (a fit above 1 means the catalog's peak
# is low, which a calibration may correct, not an order of magnitude)
Efficiency = Annotated[float, msgspec.Meta(gt=0, lt=10)]
NonNegative = Annotated[float, msgspec.Meta(ge=0, lt=1e6)]


class KindFactors(Base):
    """How close one device kind's serving stack gets to its spec sheet (fractions of peak, fixed costs).

    compute_eff: share of `bf16_tflops` prefill matmuls sustain. mem_eff: share of `memory_bw_gbs` a
    weight and KV stream sustains. comm_eff: share of `interconnect_gbs` a ring all-reduce sustains.
    step_us: fixed latency of one ring step (launch and synchronisation). prefill_overhead_ms and
    decode_overhead_ms: per-call costs no bandwidth explains (graph launch, sampling, host round trip).
    prefill_layer_ms: a fixed prefill cost per layer (kernel launches and synchronisation that repeat in every
    layer), so it grows with depth: 80-layer 70B models pay 2.5x what 32-layer 7B models do.
    j90, j99: relative spread of the 90th and 99th percentile over the median.
    """

    compute_eff: Efficiency
    mem_eff: Efficiency
    comm_eff: Efficiency
    step_us: NonNegative
    prefill_overhead_ms: NonNegative
    decode_overhead_ms: NonNegative
    j90: NonNegative
    j99: NonNegative
    prefill_layer_ms: NonNegative = 0.0


# Calibration against docs/public-figures.md; docs/profiles.md has the measured-vs-estimated table.
# gpu: mem_eff is the least-squares fit of llama.cpp bs1 TPOT (Llama-3-8B F16) on RTX 6000 Ada, RTX A6000 and
#   L40S with 0.5 ms per step; compute_eff reproduces the RTX 6000 Ada pp1024 time (165 ms). Serving engines
#   on A100/H100 (vLLM, TensorRT-LLM) reach 2-3x this compute efficiency: those two devices have their own
#   factors below. The other GPUs keep these (llama.cpp-like, conservative for prefill).
# inferentia: least-squares fit of the TP24 inf2.48xlarge (12-chip) Neuron 2.18 figures, BF16 rows,
#   with the all-reduce term above. Those figures cannot separate a per-step fixed cost from per-collective
#   latency (the fit is as good with 0.5 ms as with 5 ms); one chip runs no collectives, so the fixed decode
#   cost is pinned at 1 ms and the collectives carry the rest.
# tpu: fit of jetstream-pytorch PR 68 prefill times (Llama-2-7B, 128-2048 tokens), read as TP8 on a v5e-8
#   (the PR does not name the slice). No public TPU decode latency: mem_eff 0.8 and the prefill's fixed cost
#   for decode are assumptions, checked against the v5e-8 JetStream throughput (docs/profiles.md).
# comm_eff 0.7 and the ring-step latencies (GPU 5 us, TPU 3 us) are assumptions (NCCL-style all-reduces reach
#   70-80% of link rate); the A100/H100 fits below, which include TP2/TP4 70B figures, keep them.
# j99: mean P99/P50 - 1 over the 32 TTFT/TPOT pairs of the Neuron CSV (0.064). No public GPU/TPU percentiles:
#   twice that spread is assumed for their dynamically batched stacks.
# The kind factors above are the "roofline-v1" calibration the paper set was built with; they are frozen so
# that set stays byte-identical. The factors below were fitted later, each to its own device's figures, with
# profiler.calibrate.fit_figures on profiler.calibrate.PUBLIC_FIGURES (tests/test_calibrate.py refits them):
# a100, h100: serving engines (TensorRT-LLM, vLLM, NIM) on the datacenter GPUs, Llama-2/3 7-8B at tp 1 and
#   70B at tp 2/4. Fitted: e_c, e_m, the per-layer prefill cost and o_dec (per-call o_pre = 0: the per-layer
#   cost fits 7B and 70B prefill together, a per-call one cannot). Comm factors and spread as the gpu kind.
# trainium: the trn1.32xlarge TP32 (16-chip) Neuron figures, Llama-2-70B and Llama-3-8B. Fitted: e_c, e_m,
#   o_pre and the ring-step latency, with o_dec pinned at 1 ms as for Inferentia: four figures, four
#   parameters, so it reproduces them exactly and nothing checks it. The inf2 factors predicted trn1 prefill
#   2-3x too slow.
_GPU = KindFactors(
    compute_eff=0.28,
    mem_eff=0.86,
    comm_eff=0.7,
    step_us=5.0,
    prefill_overhead_ms=0.5,
    decode_overhead_ms=0.5,
    j90=0.12 * _Z90_OVER_Z99,
    j99=0.12,
)
_NEURON = KindFactors(
    compute_eff=0.17,
    mem_eff=0.63,
    comm_eff=0.7,
    step_us=3.6,
    prefill_overhead_ms=18.5,
    decode_overhead_ms=1.0,
    j90=0.06 * _Z90_OVER_Z99,
    j99=0.06,
)
_TPU = KindFactors(
    compute_eff=0.31,
    mem_eff=0.8,
    comm_eff=0.7,
    step_us=3.0,
    prefill_overhead_ms=0.5,
    decode_overhead_ms=0.5,
    j90=0.12 * _Z90_OVER_Z99,
    j99=0.12,
)


# Fitted with profiler.calibrate.fit_figures (see the comment above); rounded to three decimals.
_A100 = msgspec.structs.replace(
    _GPU,
    compute_eff=0.746,
    mem_eff=0.542,
    prefill_overhead_ms=0.0,
    prefill_layer_ms=0.117,
    decode_overhead_ms=0.0,
)
_H100 = msgspec.structs.replace(
    _GPU,
    compute_eff=0.543,
    mem_eff=0.653,
    prefill_overhead_ms=0.0,
    prefill_layer_ms=0.143,
    decode_overhead_ms=0.0,
)
_TRAINIUM = msgspec.structs.replace(
    _NEURON, compute_eff=0.645, mem_eff=0.54, prefill_overhead_ms=9.06, step_us=1.41, decode_overhead_ms=1.0
)


def _calibrated() -> dict[str, KindFactors]:
    return {"gpu": _GPU, "inferentia": _NEURON, "trainium": _TRAINIUM, "tpu": _TPU}


def _calibrated_devices() -> dict[str, KindFactors]:
    return {"a100": _A100, "h100": _H100}


class Efficiency(Base):
    """The estimator's knobs: factors per device kind and per device, the memory reserve, the rows' tag.

    devices: factors for one device by name, which win over its kind's (the A100 and H100 were measured with
    serving engines; the other GPUs keep the gpu kind's). Replacing `kinds["gpu"]` does not touch them.
    reserve_fraction: share of device memory kept for activations, runtime and fragmentation.
    tag: short name of this calibration, written into every row's `source` ("analytic:<device>:<tag>").
    """

    tag: str = "roofline-v1"
    kinds: dict[str, KindFactors] = msgspec.field(default_factory=_calibrated)
    devices: dict[str, KindFactors] = msgspec.field(default_factory=_calibrated_devices)
    reserve_fraction: float = 0.10

    def factors(self, hw: HardwareSpec) -> KindFactors:
        """The device's own factors, else its kind's; a kind without calibration is an error, not a guess."""
        if hw.name in self.devices:
            return self.devices[hw.name]
        if hw.kind not in self.kinds:
            known = sorted(self.kinds)
            msg = f"no efficiency factors for device kind {hw.kind!r} ({hw.name}); known: {known}"
            raise ValueError(msg)
        return self.kinds[hw.kind]


class _Shape(NamedTuple):
    """What the roofline needs of a model, in bytes and counts."""

    params: float
    weight_bytes: float
    layers: int
    hidden: int
    kv_bytes: int
    element_bytes: int


def _shape(model: ModelSpec) -> _Shape:
    """Parameters, weights and KV bytes per token; the estimator needs the full architecture."""
    if model.params_b is None or model.hidden_size is None or model.layers is None:
        msg = f"model {model.name!r}: the analytic estimator needs params_b, hidden_size and layers"
        raise ValueError(msg)
    params = model.params_b * 1e9
    return _Shape(
        params=params,
        weight_bytes=params * model.bytes_per_element,
        layers=model.layers,
        hidden=model.hidden_size,
        kv_bytes=model.kv_bytes,
        element_bytes=model.bytes_per_element,
    )


def fits_memory(
    shape: _Shape, hw: HardwareSpec, tp: np.ndarray, tokens: np.ndarray, reserve_fraction: float
) -> np.ndarray:
    """Weights and the KV cache of `tokens` resident tokens, split over tp devices, plus the reserve fit."""
    need = (shape.weight_bytes + tokens * shape.kv_bytes) / tp + reserve_fraction * hw.memory_gib * _GIB
    return need <= hw.memory_gib * _GIB


def allreduce_s(
    shape: _Shape, hw: HardwareSpec, f: KindFactors, tp: np.ndarray, tokens: np.ndarray
) -> np.ndarray:
    """Two ring all-reduces of the activations per layer; zero at tp = 1."""
    message = tokens * shape.hidden * shape.element_bytes
    step = f.step_us * 1e-6 + message / (tp * hw.interconnect_gbs * 1e9 * f.comm_eff)
    return 2 * shape.layers * 2 * (tp - 1) * step


def prefill_ms(
    shape: _Shape, hw: HardwareSpec, f: KindFactors, tp: np.ndarray, batch: np.ndarray, prompt: np.ndarray
) -> np.ndarray:
    """TTFT of one batch: the slower of compute and one weight read, plus all-reduces and fixed costs."""
    flops = 2 * shape.params * batch * prompt + 2 * shape.layers * batch * prompt**2 * shape.hidden
    compute = flops / (tp * hw.bf16_tflops * 1e12 * f.compute_eff)
    memory = shape.weight_bytes / (tp * hw.memory_bw_gbs * 1e9 * f.mem_eff)
    seconds = np.maximum(compute, memory) + allreduce_s(shape, hw, f, tp, batch * prompt)
    return seconds * 1e3 + f.prefill_overhead_ms + f.prefill_layer_ms * shape.layers


def decode_ms(
    shape: _Shape, hw: HardwareSpec, f: KindFactors, tp: np.ndarray, batch: np.ndarray, context: np.ndarray
) -> np.ndarray:
    """One decode step: the weight and KV stream or the compute, whichever is slower, plus fixed costs."""
    streamed = shape.weight_bytes + batch * context * shape.kv_bytes
    memory = streamed / (tp * hw.memory_bw_gbs * 1e9 * f.mem_eff)
    compute = 2 * shape.params * batch / (tp * hw.bf16_tflops * 1e12 * f.compute_eff)
    seconds = np.maximum(memory, compute) + allreduce_s(shape, hw, f, tp, batch)
    return seconds * 1e3 + f.decode_overhead_ms


def estimate_rows(
    model: ModelSpec,
    hw: HardwareSpec,
    tp_degrees: list[int],
    batches: list[int],
    prompts: list[int],
    efficiency: Efficiency | None = None,
    output_tokens: int = 128,
) -> list[ProfileRow]:
    """Rows for every (tp, batch, prompt) on the grid where the model fits, validated as ProfileRows.

    `output_tokens` sizes the KV cache for the capacity check (prompt + output per sequence) and the mean
    context a decode step reads (prompt + output / 2).
    """
    eff = efficiency or Efficiency()
    f = eff.factors(hw)
    shape = _shape(model)
    tp, batch, prompt = (
        axis.ravel().astype(float) for axis in np.meshgrid(tp_degrees, batches, prompts, indexing="ij")
    )
    keep = fits_memory(shape, hw, tp, batch * (prompt + output_tokens), eff.reserve_fraction)
    ttft = prefill_ms(shape, hw, f, tp, batch, prompt)
    tbt = decode_ms(shape, hw, f, tp, batch, prompt + output_tokens / 2)
    source = f"analytic:{hw.name}:{eff.tag}"
    return [
        _row(model.name, hw.name, int(tp[i]), int(batch[i]), int(prompt[i]), ttft[i], tbt[i], f, source)
        for i in np.flatnonzero(keep)
    ]


def _row(
    model: str,
    device: str,
    tp: int,
    batch: int,
    prompt: int,
    ttft: float,
    tbt: float,
    f: KindFactors,
    source: str,
) -> ProfileRow:
    """One row with percentiles from the kind's jitter, rounded to the microsecond and decoded strictly
    (msgspec checks bounds only when converting, so this is what guarantees the CSV decodes)."""
    latencies = {
        f"{metric}_ms_p{q}": round(float(value) * (1 + jitter), 3)
        for metric, value in (("ttft", ttft), ("tbt", tbt))
        for q, jitter in ((50, 0.0), (90, f.j90), (99, f.j99))
    }
    fields = {"model": model, "device": device, "tp": tp, "batch": batch, "prompt_tokens": prompt}
    return msgspec.convert({**fields, **latencies, "source": source}, ProfileRow)
