"""What the fleet must serve: model architectures, SLOs and workload classes."""

from typing import Annotated, Literal

from msgspec import Meta

from fleetplan.models.base import Base, Bytes, Milliseconds, Name, PositiveInt, Rps, Tokens

Percentile = Literal[50, 90, 99]


class ModelSpec(Base):
    """An LLM as the planner needs it: KV bytes per token, given or derived from the architecture.

    The architecture fields also feed the analytic latency estimator (fleetplan/profiler/analytic.py).
    KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes_per_element.
    """

    name: Name
    kv_bytes_per_token: Bytes | None = None
    layers: PositiveInt | None = None
    kv_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    bytes_per_element: PositiveInt = 2
    hidden_size: PositiveInt | None = None
    params_b: Annotated[float, Meta(gt=0, lt=1e5)] | None = None  # billions

    def __post_init__(self) -> None:
        derivable = None not in (self.layers, self.kv_heads, self.head_dim)
        if self.kv_bytes_per_token is None and not derivable:
            msg = (
                f"kv_bytes_per_token: model {self.name!r} needs it, "
                "or layers, kv_heads and head_dim to derive it"
            )
            raise ValueError(msg)

    @property
    def kv_bytes(self) -> int:
        """KV-cache bytes one token occupies (given, or derived from the architecture)."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        # all three are guaranteed by __post_init__
        assert self.layers
        assert self.kv_heads
        assert self.head_dim
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element

    def kv_gbit(self, prompt_tokens: int) -> float:
        """Gigabits a request's KV cache moves from prefill to decode: 8 * S_w / 1e9, S_w = p_w * kv_bytes."""
        return 8.0 * prompt_tokens * self.kv_bytes / 1e9


class Slo(Base):
    """Latency targets at one percentile: the class is served only where both hold."""

    ttft_ms: Milliseconds
    tbt_ms: Milliseconds
    percentile: Percentile = 90


class Workload(Base):
    """A workload class: requests of one model and shape arriving at `rate_rps`, with one SLO."""

    name: Name
    model: Name
    prompt_tokens: Tokens
    output_tokens: Tokens
    rate_rps: Rps
    slo: Slo
    weight: Annotated[float, Meta(gt=0, lt=1e6)] = 1.0


# Shapes from the models' Hugging Face config.json (docs/public-figures.md section 5), bf16 KV cache.
CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(name="llama-3.2-1b", layers=16, kv_heads=8, head_dim=64, hidden_size=2048, params_b=1.236),
        ModelSpec(name="llama-3.2-3b", layers=28, kv_heads=8, head_dim=128, hidden_size=3072, params_b=3.213),
        ModelSpec(name="mistral-7b", layers=32, kv_heads=8, head_dim=128, hidden_size=4096, params_b=7.242),
        ModelSpec(name="llama-2-7b", layers=32, kv_heads=32, head_dim=128, hidden_size=4096, params_b=6.738),
        ModelSpec(name="llama-3.1-8b", layers=32, kv_heads=8, head_dim=128, hidden_size=4096, params_b=8.030),
        ModelSpec(
            name="llama-3.1-70b", layers=80, kv_heads=8, head_dim=128, hidden_size=8192, params_b=70.554
        ),
        # Built in memory with random weights by the transformers engine (float32, CPU): profiling tests
        # and demos run it without downloading anything.
        ModelSpec(
            name="tiny-llama",
            layers=2,
            kv_heads=2,
            head_dim=16,
            hidden_size=64,
            bytes_per_element=4,
            params_b=0.0001,
        ),
    )
}
