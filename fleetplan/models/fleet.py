"""What the fleet has: device types and KV-transfer links between them."""

from typing import Literal

from fleetplan.models.base import Base, CostPerHour, Count, Gbps, Gib, Name, PositiveGbps

DeviceKind = Literal["gpu", "inferentia", "trainium", "tpu", "cpu", "other"]


class Device(Base):
    """A device type in the inventory: `count` identical devices, each with its own NIC for KV transfer.

    `network_gbps` absent means the NIC is never a bottleneck and KV transfer takes no time.
    `kind` lets the GPU-only baseline find a GPU when `options.baseline_device` is not given.
    `max_count` (>= count) makes the type purchasable: the solver may buy up to `max_count - count` more
    at `cost_per_hour` each (an integer decision under `options.budget_per_hour`).
    """

    name: Name
    count: Count
    max_count: Count | None = None
    memory_gib: Gib | None = None
    cost_per_hour: CostPerHour = 0.0
    network_gbps: PositiveGbps | None = None
    kind: DeviceKind | None = None

    def __post_init__(self) -> None:
        if self.max_count is not None and self.max_count < self.count:
            msg = f"max_count: {self.max_count} is below count {self.count}; give max_count >= count or null"
            raise ValueError(msg)

    @property
    def capacity(self) -> int:
        """The most devices of this type a plan may use: owned plus purchasable."""
        return self.count if self.max_count is None else self.max_count


class Link(Base):
    """A directional KV bandwidth budget from prefill pools on `source` to decode pools on `target`."""

    source: Name
    target: Name
    gbps: Gbps


def check_links(devices: list[Device], links: list[Link]) -> None:
    """Every link names known device types, and each (source, target) pair appears once."""
    known = {device.name for device in devices}
    seen: set[tuple[str, str]] = set()
    for index, link in enumerate(links):
        for end in ("source", "target"):
            name = getattr(link, end)
            if name not in known:
                msg = f"links[{index}].{end}: unknown device {name!r} (devices are {sorted(known)})"
                raise ValueError(msg)
        pair = (link.source, link.target)
        if pair in seen:
            msg = f"links[{index}]: duplicate link {link.source} -> {link.target}"
            raise ValueError(msg)
        seen.add(pair)


__all__ = ["Device", "DeviceKind", "Link", "check_links"]
