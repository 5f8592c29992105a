"""KV-cache transfers from prefill to decode instances (docs/simulation.md, "KV transfer").

Store-and-forward FIFO servers: a transfer starts when the source instance's NIC, the destination's NIC, the
device-type link (if `links` budgets that pair) and the fleet `kv_budget_gbps` (for cross-type moves) are all
free, and holds them all until it ends; its duration is the longest of the per-resource times.
"""

import math

from fleetplan.models.plan import PlanRequest


class KvNetwork:
    """The shared transfer resources: per (source, target) device-type link and the cross-type budget, each
    as [Gbit/s, time it is next free]. NICs live on the instances (nic_bw, nic_free)."""

    __slots__ = ("budget", "links")

    def __init__(self, links: dict[tuple[str, str], list[float]], budget: list[float] | None) -> None:
        self.links = links
        self.budget = budget

    @classmethod
    def of(cls, request: PlanRequest) -> "KvNetwork":
        links = {(lk.source, lk.target): [lk.gbps, 0.0] for lk in request.links}
        budget = None if request.kv_budget_gbps is None else [request.kv_budget_gbps, 0.0]
        return cls(links, budget)

    def transfer(self, gbit: float, src, dst, now: float) -> float:
        """Book a transfer of `gbit` gigabits from instance src to dst asked for at `now`; its end time."""
        bw = src.nic_bw if src.nic_bw < dst.nic_bw else dst.nic_bw
        t_nic = gbit / bw if bw < math.inf else 0.0
        start = now
        if t_nic > 0:
            start = max(start, src.nic_free, dst.nic_free)
        dur = t_nic
        link = self.links.get((src.device, dst.device))
        if link is not None and link[0] > 0:
            start = max(start, link[1])
            dur = max(dur, gbit / link[0])
        budget = self.budget
        shared = budget if (budget is not None and src.device != dst.device and budget[0] > 0) else None
        if shared is not None:
            start = max(start, shared[1])
            dur = max(dur, gbit / shared[0])
        end = start + dur
        if t_nic > 0:
            src.nic_free = end
            dst.nic_free = end
        if link is not None and link[0] > 0:
            link[1] = end
        if shared is not None:
            shared[1] = end
        return end
