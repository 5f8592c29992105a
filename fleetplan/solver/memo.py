"""Results derived from a profile table alone, kept per table content (its sha256) across plans.

A warm worker plans request after request on the same profile set; what a stage reads off the table
(verification's latencies at each class's prompt, the profiled prompt lengths behind the interpolation
warnings) does not change between them. `per_table` keeps the last few such results per (table sha256,
arguments). Values are shared between callers: they must be treated as read-only.
"""

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

R = TypeVar("R")
CACHE_SIZE = 8


class _Hashed(Protocol):
    sha256: str


def per_table(fn: Callable[..., R]) -> Callable[..., R]:
    """`fn(table, *args)` cached on (table.sha256, *args), least recently used first out (CACHE_SIZE)."""
    cache: OrderedDict[tuple[Hashable, ...], Any] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(fn)
    def cached(table: _Hashed, *args: Hashable) -> R:
        key = (table.sha256, *args)
        with lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]  # type: ignore[no-any-return]
        value = fn(table, *args)
        with lock:
            cache[key] = value
            while len(cache) > CACHE_SIZE:
                cache.popitem(last=False)
        return value

    cached.cache_clear = cache.clear  # type: ignore[attr-defined]
    return cached


__all__ = ["CACHE_SIZE", "per_table"]
