"""Response types that only the HTTP service has (the planning types themselves live in models/)."""

import msgspec


class Problem(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """An RFC 9457 problem details body, sent as `application/problem+json`.

    `field` (an extension member) is the path of the offending input, e.g. "devices[0].count", when
    there is one; `detail` always repeats it in front of the reason so a human reading only `detail`
    knows where to look.
    """

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None


class Health(msgspec.Struct, kw_only=True, frozen=True):
    status: str
    version: str


class ProfileSetSummary(msgspec.Struct, kw_only=True, frozen=True):
    """One line of GET /profiles: what a set is, how big, and its content hash (from its manifest)."""

    name: str
    description: str
    rows: int
    sha256: str


__all__ = ["Health", "Problem", "ProfileSetSummary"]
