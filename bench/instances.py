"""Seeded benchmark instances: S (the paper fixture), M and L (synthetic fleets from the analytic estimator).

M: 8 device types, 36 classes, batch 1-32, tp 1-4.  L: 16 device types, 100 classes, batch 1-128, tp 1-8.
L's 16 types are the 10 spec sheets plus 6 variants that differ in NIC and price (same silicon, other hosts).
"""

from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.hardware import HARDWARE, HardwareSpec
from fleetplan.models.plan import PlanRequest
from fleetplan.models.workload import CATALOG
from fleetplan.profiler.analytic import estimate_rows

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [128, 256, 512, 1024, 2048]
SMALL_MODELS = ["llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "llama-3.1-8b", "llama-2-7b"]

_VARIANTS = [
    ("h100", "h100-ib", 400.0, 1.15),
    ("a100", "a100-ib", 200.0, 1.10),
    ("l4", "l4-spot", 10.0, 0.40),
    ("a10g", "a10g-spot", 10.0, 0.40),
    ("inf2", "inf2-100g", 100.0, 1.05),
    ("tpu-v5e", "tpu-v5e-200g", 200.0, 1.05),
]


def hardware(n_types: int) -> list[HardwareSpec]:
    base = list(HARDWARE.values())
    variants = [
        msgspec.structs.replace(
            HARDWARE[src], name=name, network_gbps=nic, cost_per_hour=HARDWARE[src].cost_per_hour * f
        )
        for src, name, nic, f in _VARIANTS
    ]
    return (base + variants)[:n_types]


def profile_rows(
    specs: list[HardwareSpec], models: list[str], tps: list[int], batches: list[int]
) -> list[dict]:
    rows = []
    for hw in specs:
        for model in models:
            rows += msgspec.to_builtins(estimate_rows(CATALOG[model], hw, tps, batches, PROMPTS))
    return rows


def synthetic_request(
    n_types: int, n_classes: int, tps: list[int], batches: list[int], seed: int
) -> PlanRequest:
    """A fleet of n_types device types and n_classes classes, SLOs drawn around what is achievable."""
    rng = np.random.default_rng(seed)
    specs = hardware(n_types)
    models = SMALL_MODELS + (["llama-3.1-70b"] if max(tps) >= 4 else [])
    rows = profile_rows(specs, models, tps, batches)
    frame = pd.DataFrame(rows)
    devices = [
        {
            "name": hw.name,
            "count": int(rng.integers(4, 33)),
            "memory_gib": hw.memory_gib,
            "cost_per_hour": hw.cost_per_hour,
            "network_gbps": hw.network_gbps,
            "kind": hw.kind,
        }
        for hw in specs
    ]
    workloads = []
    for i in range(n_classes):
        model = models[i % len(models)]
        prompt = int(rng.choice([128, 256, 384, 512, 768, 1024, 1536, 2048]))
        mine = frame[(frame["model"] == model) & (frame["prompt_tokens"] >= prompt)]
        best_ttft = float(mine["ttft_ms_p90"].min())
        best_tbt = float(mine["tbt_ms_p90"].min())
        workloads.append(
            {
                "name": f"c{i:03d}-{model}",
                "model": model,
                "prompt_tokens": prompt,
                "output_tokens": int(rng.choice([64, 128, 256, 512])),
                "rate_rps": round(float(rng.uniform(0.5, 8.0)), 3),
                "slo": {
                    "ttft_ms": round(best_ttft * float(rng.uniform(2.0, 12.0)), 1),
                    "tbt_ms": round(best_tbt * float(rng.uniform(1.5, 5.0)), 1),
                    "percentile": int(rng.choice([50, 90, 99])),
                },
                "weight": float(rng.choice([1.0, 1.0, 2.0])),
            }
        )
    body = {
        "devices": devices,
        "workloads": workloads,
        "profiles": {"rows": rows},
        "options": {"time_limit_s": 60},
    }
    return msgspec.convert(body, PlanRequest)


# The seed of "M" and "L"; "M/3" is the same generator at seed 3 (bench/solver_scaling.py --seeds).
DEFAULT_SEEDS = {"M": 7, "L": 11}


def seeded_names(name: str, count: int) -> list[str]:
    """name plus count - 1 more seeds of its generator ("M" -> "M", "M/1", "M/2", ...); S has no seed."""
    base, _, rest = name.partition("@")
    if base not in DEFAULT_SEEDS or count <= 1:
        return [name]
    seeds = [s for s in range(1, count + 1) if s != DEFAULT_SEEDS[base]][: count - 1]
    suffix = f"@{rest}" if rest else ""
    return [name, *(f"{base}/{s}{suffix}" for s in seeds)]


def instance(name: str) -> PlanRequest:
    """S, M or L at default options; "M@0.9" plans the same instance with the flat model at rho 0.9;
    "M/3" ("L/3") is M (L) generated from seed 3 instead of the default seed."""
    base, _, rho = name.partition("@")
    base, _, seed_text = base.partition("/")
    seed = int(seed_text) if seed_text else DEFAULT_SEEDS.get(base, 0)
    if base == "S":
        request = read_request(fixtures.request_path("paper"))
    elif base == "M":
        request = synthetic_request(8, 36, [1, 2, 4], [1, 2, 4, 8, 16, 32], seed=seed)
    elif base == "L":
        request = synthetic_request(16, 100, [1, 2, 4, 8], [1, 2, 4, 8, 16, 32, 64, 128], seed=seed)
    else:
        msg = f"unknown instance {name!r}"
        raise ValueError(msg)
    if rho:
        options = msgspec.structs.replace(request.options, capacity_model="flat", max_utilization=float(rho))
        request = msgspec.structs.replace(request, options=options)
    return request
