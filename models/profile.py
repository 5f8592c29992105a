"""Latency profiles: one row per measured (model, device, tp, batch, prompt_tokens) point."""

from models.base import Base, Milliseconds, Name, PositiveInt, Tokens

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
    rows: list[ProfileRow] | None = None

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
