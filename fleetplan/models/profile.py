"""Latency profiles: one row per measured (model, device, tp, batch, prompt_tokens) point."""

from typing import Annotated

import msgspec
from msgspec import Meta

from fleetplan.models.base import Base, Count, Milliseconds, Name, PositiveInt, Tokens, duplicates

PERCENTILES = (50, 90, 99)
LATENCY_COLUMNS = tuple(f"{metric}_ms_p{q}" for metric in ("ttft", "tbt") for q in PERCENTILES)
KEY_COLUMNS = ("model", "device", "tp", "batch", "prompt_tokens")


class ProfileRow(Base):
    """TTFT = prefill of one batch of `batch` prompts of `prompt_tokens`; TBT = one decode step at `batch`.

    Percentile columns a request's SLOs do not use may be absent. A missing row means "not measured or
    does not fit", never zero.
    """

    model: Name
    device: Name
    tp: PositiveInt
    batch: PositiveInt
    prompt_tokens: Tokens
    ttft_ms_p50: Milliseconds | None = None
    ttft_ms_p90: Milliseconds | None = None
    ttft_ms_p99: Milliseconds | None = None
    tbt_ms_p50: Milliseconds | None = None
    tbt_ms_p90: Milliseconds | None = None
    tbt_ms_p99: Milliseconds | None = None
    source: str | None = None


class ProfilesSpec(Base):
    """Where a request's latencies come from: a stored or bundled set by name, or rows inline."""

    set: Name | None = None
    rows: Annotated[list[ProfileRow], Meta(min_length=1)] | None = None

    def __post_init__(self) -> None:
        if (self.set is None) == (self.rows is None):
            msg = "give exactly one of 'set' (a stored set's name) or 'rows' (inline rows)"
            raise ValueError(msg)
        if self.rows is not None and not self.rows:
            msg = "rows: empty; give at least one row"
            raise ValueError(msg)


class ProfileSetManifest(Base):
    """What a stored profile set is and where its figures come from (manifest.json beside the CSV)."""

    name: Name
    description: str
    sha256: str
    rows: int
    generator: str
    created: str
    sources: dict[str, str] = {}


class ProfileGrid(Base):
    """What to measure on one device: models x tp x batches x prompt lengths, at one output length.

    `warmup` batches are run and discarded before `runs` measured batches at every point (the original
    study's method: 20 and 100).
    """

    device: Name
    models: list[Name]
    batches: list[PositiveInt]
    prompts: list[Tokens]
    tp: list[PositiveInt] = msgspec.field(default_factory=lambda: [1])
    output_tokens: Tokens = 128
    warmup: Count = 20
    runs: PositiveInt = 100

    def __post_init__(self) -> None:
        for field in ("models", "batches", "prompts", "tp"):
            values = getattr(self, field)
            if not values:
                msg = f"{field}: empty; give at least one"
                raise ValueError(msg)
            repeated = duplicates([str(v) for v in values])
            if repeated:
                msg = f"{field}: duplicate value(s) {repeated}"
                raise ValueError(msg)
        if self.output_tokens < 2:
            msg = "output_tokens: at least 2, or there is no inter-token gap to time"
            raise ValueError(msg)

    def points(self) -> list[tuple[str, int, int, int]]:
        """(model, tp, batch, prompt_tokens) in measuring order."""
        return [
            (m, t, b, p) for m in self.models for t in self.tp for b in self.batches for p in self.prompts
        ]


class ProfileUpload(Base):
    """A profile set sent to POST /profiles: rows plus what the manifest needs."""

    name: Name
    description: str
    rows: Annotated[list[ProfileRow], Meta(min_length=1)]
    sources: dict[str, str] = {}

    def __post_init__(self) -> None:
        if not self.rows:
            msg = "rows: empty; give at least one row"
            raise ValueError(msg)
