"""Hypothesis strategies for tiny PlanRequests the brute-force oracle (tests/oracle.py) can enumerate.

Numbers are chosen so that discrete decisions never sit on a floating-point knife edge, which would make
the solver and the oracle disagree for reasons that are not bugs:
- profile latencies are whole milliseconds and SLO thresholds are whole milliseconds + 0.3, so an
  interpolated latency (a multiple of 1/896 ms between prompts 128 and 1024) or a latency plus a KV
  transfer time never equals a threshold;
- costs are multiples of 0.5 and budgets are whole numbers + 0.25, so a cost sum never equals the budget.
After drawing, device counts are lowered (largest first) until the oracle's x enumeration has at most
`max_vectors` vectors.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st
from oracle import count_x_vectors

from fleetplan.models import PlanRequest

DEVICE_NAMES = ("gpu", "acc")
MODEL_NAMES = ("m1", "m2")
PROMPTS = (128, 1024)  # profiled prompt lengths; classes fall inside, often strictly between
KV_BYTES = (1048576, 262144, 65536, 524288, 131072)  # large first: NIC and link limits bind
MAX_VECTORS = 2000
RATES = (20.0, 5.0, 50.0, 0.5, 2.37, 11.3)
OUTPUTS = (8, 32, 4, 128, 256, 17)
SLO_TTFT = (2000.3, 800.3, 4000.3, 300.3, 120.3, 40.3)  # whole ms + 0.3: never equal to a latency
SLO_TBT = (60.3, 30.3, 80.3, 15.3, 8.3, 4.3)
NICS = (5, 1, 25, 3, 50, 10)
PAIRED_SLO_TTFT = (800.3, 300.3, 2000.3, 150.3, 4000.3)
PAIRED_SLO_TBT = (20.3, 30.3, 15.3, 60.3)  # Gbit/s per device


def _percentiles(value: int) -> tuple[int, int, int]:
    """p50 <= p90 <= p99 around a p90 of `value` (whole ms)."""
    return max(1, int(value * 0.8)), value, int(value * 1.25 + 0.999)


@st.composite
def _profile_rows(
    draw: st.DrawFn, models: list[str], devices: list[str], paired: bool
) -> list[dict[str, Any]]:
    """Rows at prompts 128 and 1024 for tp 1 (sometimes 2) and batch 1 and 4; a few keys left out.

    paired: the first device prefills fast but decodes slowly and the second the other way round (the
    study's heterogeneous pairing), so that cross-type disaggregated routes win and KV limits bind.
    """
    rows = []
    for model in models:
        for position, device in enumerate(devices):
            if paired:
                ttft_range, tbt_range = ((10, 60), (25, 60)) if position == 0 else ((150, 600), (4, 15))
            else:
                ttft_range, tbt_range = (10, 150), (4, 40)
            ttft_128 = draw(st.integers(*ttft_range))  # ms, tp 1, batch 1, at prompt 128 (p90)
            ttft_growth = draw(st.integers(2, 8))  # prompt 1024 / prompt 128
            ttft_batch = draw(st.integers(150, 400)) / 100  # batch 4 / batch 1
            tbt_1 = draw(st.integers(*tbt_range))
            tbt_growth = draw(st.integers(100, 130)) / 100
            tbt_batch = draw(st.integers(100, 150)) / 100
            tps = [1, 2] if draw(st.booleans()) else [1]
            tp2_ttft = draw(st.integers(50, 90)) / 100
            tp2_tbt = draw(st.integers(55, 95)) / 100
            for tp in tps:
                for batch in (1, 4):
                    if draw(st.sampled_from([False, False, False, False, False, True])):
                        continue  # "not measured or does not fit": no row at all for this key
                    for prompt in PROMPTS:
                        ttft = ttft_128 * (ttft_growth if prompt == 1024 else 1)
                        ttft *= ttft_batch if batch == 4 else 1
                        ttft *= tp2_ttft if tp == 2 else 1
                        tbt = tbt_1 * (tbt_growth if prompt == 1024 else 1)
                        tbt *= tbt_batch if batch == 4 else 1
                        tbt *= tp2_tbt if tp == 2 else 1
                        t50, t90, t99 = _percentiles(max(1, round(ttft)))
                        b50, b90, b99 = _percentiles(max(1, round(tbt)))
                        rows.append(
                            {
                                "model": model,
                                "device": device,
                                "tp": tp,
                                "batch": batch,
                                "prompt_tokens": prompt,
                                "ttft_ms_p50": t50,
                                "ttft_ms_p90": t90,
                                "ttft_ms_p99": t99,
                                "tbt_ms_p50": b50,
                                "tbt_ms_p90": b90,
                                "tbt_ms_p99": b99,
                            }
                        )
    for model in models:
        if not any(r["model"] == model for r in rows):
            # Every dropped: keep one row, so that the model is "profiled" (a model with no rows at all is an
            # input error, ProfileMissing, not an empty candidate set).
            rows.append(
                {
                    "model": model,
                    "device": devices[0],
                    "tp": 1,
                    "batch": 1,
                    "prompt_tokens": 128,
                    "ttft_ms_p50": 40,
                    "ttft_ms_p90": 50,
                    "ttft_ms_p99": 63,
                    "tbt_ms_p50": 8,
                    "tbt_ms_p90": 10,
                    "tbt_ms_p99": 13,
                }
            )
    return rows


def _flag(draw: st.DrawFn, value: bool | None) -> bool:
    return draw(st.booleans()) if value is None else value


@st.composite
def tiny_request_dicts(
    draw: st.DrawFn,
    pooling: str = "model",
    with_nic: bool | None = None,
    with_links: bool | None = None,
    with_budget: bool | None = False,
    n_models: int | None = None,
    n_classes: int | None = None,
    objective: str = "max_goodput",
    paired: bool | None = False,
    max_vectors: int = MAX_VECTORS,
) -> dict[str, Any]:
    """The request as builtins (see tiny_requests)."""
    paired = _flag(draw, paired)
    n_devices = (
        2 if paired else draw(st.sampled_from([2, 1, 2]) if with_nic or with_links else st.integers(1, 2))
    )
    device_names = list(DEVICE_NAMES[:n_devices])
    budget = _flag(draw, with_budget)
    priced = objective == "min_cost" or budget or draw(st.booleans())
    devices = []
    for name in device_names:
        device: dict[str, Any] = {
            "name": name,
            "count": draw(st.sampled_from([2, 1, 3, 2, 1, 0])),
            "memory_gib": 48,
        }
        if priced:
            device["cost_per_hour"] = draw(st.integers(1, 6)) * 0.5
        # with_nic=True: the first device has a NIC, the second usually (a NIC on one end only still
        # bounds that end's traffic, with no transfer time); None: drawn; False: no NICs.
        if with_nic is None:
            nic = draw(st.booleans())
        elif with_nic and devices:
            nic = draw(st.sampled_from([True, True, False]))
        else:
            nic = with_nic
        if nic:
            device["network_gbps"] = float(draw(st.one_of(st.sampled_from(NICS), st.integers(1, 50))))
        devices.append(device)

    n_models = n_models or draw(st.integers(1, 2))
    model_names = list(MODEL_NAMES[:n_models])
    models = [{"name": m, "kv_bytes_per_token": draw(st.sampled_from(KV_BYTES))} for m in model_names]
    rows = draw(_profile_rows(model_names, device_names, paired))

    n_classes = n_classes or draw(st.integers(1, 3))
    workloads = []
    for index in range(n_classes):
        prompt = draw(st.one_of(st.sampled_from(PROMPTS), st.integers(129, 1023)))
        if paired and objective == "max_goodput":
            # Between the two devices' latencies: the gpu's TBT or the acc's TTFT often misses the SLO.
            rate = draw(st.sampled_from(RATES))
            ttft_slo = draw(st.sampled_from(PAIRED_SLO_TTFT))
            tbt_slo = draw(st.sampled_from(PAIRED_SLO_TBT))
        elif objective == "max_goodput":
            rate = draw(st.one_of(st.sampled_from(RATES), st.integers(50, 5000).map(lambda r: r / 100)))
            ttft_slo = draw(
                st.one_of(st.sampled_from(SLO_TTFT), st.integers(100, 4000).map(lambda v: v + 0.3))
            )
            tbt_slo = draw(st.one_of(st.sampled_from(SLO_TBT), st.integers(5, 80).map(lambda v: v + 0.3)))
        else:
            # min_cost / max_min_fraction: small demands and loose SLOs, so full service is often possible.
            rate = draw(st.integers(10, 500)) / 100
            ttft_slo = draw(st.sampled_from(SLO_TTFT[:3]))
            tbt_slo = draw(st.sampled_from(SLO_TBT[:3]))
        workloads.append(
            {
                "name": f"c{index + 1}",
                "model": model_names[index % n_models]
                if index < n_models
                else draw(st.sampled_from(model_names)),
                "prompt_tokens": prompt,
                "output_tokens": draw(st.one_of(st.sampled_from(OUTPUTS), st.integers(4, 256))),
                "rate_rps": rate,
                # Generous SLOs come first: hypothesis's simplest examples then have candidates.
                "slo": {
                    "ttft_ms": ttft_slo,
                    "tbt_ms": tbt_slo,
                    "percentile": draw(st.sampled_from([90, 50, 99])),
                },
                "weight": draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])),
            }
        )

    links = []
    kv_budget = None
    if _flag(draw, with_links):
        gbps = st.sampled_from([5.0, 1.0, 20.0, 0.0, 0.5, 2.0, 10.0, 50.0])
        # The first link is always there (cross-type when there are two types); the others are drawn.
        pairs = [(device_names[0], device_names[-1])]
        pairs += [(s, t) for s in device_names for t in device_names if (s, t) != pairs[0]]
        for index, (source, target) in enumerate(pairs):
            if index == 0 or draw(st.booleans()):
                links.append({"source": source, "target": target, "gbps": draw(gbps)})
        if draw(st.sampled_from([True, False])):
            kv_budget = draw(gbps)

    # (allow_colocated, allow_disaggregated). KV limits only matter when disaggregated routes carry the
    # flow, and colocated routes often win, so NIC and link suites lean towards disaggregated-only.
    kv_limits = with_nic or with_links
    role_choices = (
        [(False, True), (True, True), (False, True)]
        if kv_limits
        else [(True, True), (True, True), (True, False), (False, True)]
    )
    roles = draw(st.sampled_from(role_choices))
    options: dict[str, Any] = {
        "objective": objective,
        "pooling": pooling,
        "capacity_model": "flat",  # the oracle's model (tests/oracle.py)
        "max_utilization": draw(st.sampled_from([0.9, 0.9, 1.0, 0.75, 0.5])),
        "allow_colocated": roles[0],
        "allow_disaggregated": roles[1],
        "batch_sizes": draw(st.sampled_from([None, None, None, [1], [4], [1, 4]])),
        "tp_degrees": draw(st.sampled_from([None, None, [1], None, [1, 2]])),
        "mip_rel_gap": 1e-9,
        "time_limit_s": 30,
    }
    if budget:
        options["budget_per_hour"] = draw(st.integers(0, 8)) + 0.25

    request = {
        "devices": devices,
        "links": links,
        "kv_budget_gbps": kv_budget,
        "models": models,
        "workloads": workloads,
        "profiles": {"rows": rows},
        "options": options,
    }
    # Keep the enumeration small: lower the largest device count until the oracle can enumerate x.
    while count_x_vectors(msgspec.convert(request, PlanRequest)) > max_vectors:
        largest = max(devices, key=lambda d: d["count"])
        largest["count"] -= 1
    return request


@st.composite
def tiny_requests(draw: st.DrawFn, pooling: str = "model", **kwargs: Any) -> PlanRequest:
    """A tiny PlanRequest with inline profile rows whose x enumeration has at most `max_vectors` vectors.

    Keyword arguments (None = drawn): with_nic, with_links (links and sometimes kv_budget_gbps),
    with_budget (default False), n_models (1-2), n_classes (1-3), objective, paired (default False: two
    device types, one fast at prefill and one at decode), max_vectors.
    """
    return msgspec.convert(draw(tiny_request_dicts(pooling=pooling, **kwargs)), PlanRequest)


__all__ = ["MAX_VECTORS", "tiny_request_dicts", "tiny_requests"]
