"""Who runs a re-plan, and when a `running` run is abandoned (docs/store.md, "Run statuses").

A run records its owner when it starts: a readable `owner` ("pid 4242 on host-a") and an `owner_key`
that says where that pid lives: the boot (/proc/sys/kernel/random/boot_id), the PID namespace
(/proc/self/ns/pid), the pid and the process's start time (field 22 of /proc/PID/stat, so a reused pid is
not mistaken for the owner). While it runs, the owner refreshes `heartbeat_at` every `heartbeat_s`.

A `running` run is abandoned when
- its owner lives where the checker lives (same boot and PID namespace) and that process is gone, or
- its heartbeat (or, before the first one, its start) is older than the lease, wherever it ran.

The first rule finds a killed process at once on its own machine or container; the lease finds it from
another host or pod. Neither decides a promotion: finish_run promotes only over the plan the run started
from, so a run wrongly declared abandoned can still never promote over another.
"""

import os
import socket
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

# a running run refreshes its heartbeat this often (s) ...
HEARTBEAT_S = 30.0
# ... and is abandoned when none came for this long (s): ten missed beats
RUN_LEASE_S = 300.0


@cache
def _scope() -> str | None:
    """This boot and PID namespace (None off Linux: then only the lease applies)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None when there is no such process, or only
    its zombie, killed and not yet waited for)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # fields after the command name (which may hold spaces and parentheses): state is field 3, start 22
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def owner() -> tuple[str, str | None]:
    """(readable owner, owner key) of the calling process."""
    pid = os.getpid()
    readable = f"pid {pid} on {socket.gethostname()}"
    scope = _scope()
    ticks = _start_ticks(pid) if scope else None
    return readable, (f"{scope}|{pid}|{ticks}" if scope and ticks else None)


def owner_alive(owner_key: str | None) -> bool | None:
    """True or False when the owner lives where this process does; None when that cannot be told here."""
    if not owner_key or owner_key.count("|") != 2:
        return None
    scope, pid, ticks = owner_key.split("|")
    if scope != _scope():
        return None
    return _start_ticks(int(pid)) == ticks


def parse_stamp(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def abandoned_reason(row, now: datetime, lease_s: float) -> str | None:
    """Why the `running` run in `row` (owner, owner_key, heartbeat_at, started_at) is abandoned, or None
    while it may still be alive."""
    who = row.owner or "an unrecorded process"
    last = row.heartbeat_at or row.started_at
    if owner_alive(row.owner_key) is False:
        return f"abandoned: its process stopped ({who}; last heartbeat {last})"
    if parse_stamp(last) < now - timedelta(seconds=lease_s):
        return f"abandoned: no heartbeat from {who} since {last} (lease {lease_s:g} s)"
    return None


def utc_now() -> datetime:
    return datetime.now(UTC)


__all__ = ["HEARTBEAT_S", "RUN_LEASE_S", "abandoned_reason", "owner", "owner_alive", "utc_now"]
