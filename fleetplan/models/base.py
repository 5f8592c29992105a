"""The one Struct base and the unit aliases every domain type uses.

Units follow docs/formulation.md: milliseconds for latency, tokens for lengths, requests/s for rates,
Gbit/s for bandwidth, GiB for memory, currency per hour for cost.
"""

from typing import Annotated

import msgspec


class Base(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Strict, immutable, keyword-only.

    forbid_unknown_fields: a misspelt field ("rate_rpss") is an error, not a silently ignored default.
    kw_only: Structs with many optional fields are only readable with names at the call site.
    frozen: a decoded request is shared by the solver, baselines and verify(); nobody may mutate it.
    """


# Upper bounds are generous sanity limits; they also reject the infinities JSON cannot carry anyway.
_HUGE = 1e12
RPS_LIMIT = _HUGE  # rates at or above it are refused (Rps)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/+-]*$"
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
TOKEN_LIMIT = 10_000_000  # the most tokens a prompt or an output may have
Tokens = Annotated[int, msgspec.Meta(ge=1, le=TOKEN_LIMIT)]
Milliseconds = Annotated[float, msgspec.Meta(gt=0, lt=_HUGE)]
Rps = Annotated[float, msgspec.Meta(ge=0, lt=_HUGE)]
Gbps = Annotated[float, msgspec.Meta(ge=0, lt=_HUGE)]
PositiveGbps = Annotated[float, msgspec.Meta(gt=0, lt=_HUGE)]
Gib = Annotated[float, msgspec.Meta(gt=0, lt=_HUGE)]
CostPerHour = Annotated[float, msgspec.Meta(ge=0, lt=_HUGE)]
Bytes = Annotated[int, msgspec.Meta(ge=1, le=10**12)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, lt=_HUGE)]
# a sum or product of bounded figures in an answer (a plan's SLO RPS, demand and cost, KV traffic): no
# upper bound, since many classes each just under a bound add up past it
Total = Annotated[float, msgspec.Meta(ge=0)]


def duplicates(names: list[str]) -> list[str]:
    """Names that occur more than once, in first-seen order (linear: a body of 60,000 repeated device names
    took seconds with a list membership test, on the server's event loop)."""
    seen: set[str] = set()
    repeated: dict[str, None] = {}
    for name in names:
        if name in seen:
            repeated[name] = None
        seen.add(name)
    return list(repeated)
