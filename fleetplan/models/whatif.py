"""What-if sweeps over one base request (docs/whatif.md).

A WhatIfRequest names one or two axes; the answer has one Point per grid point (the first axis varies
slowest), the indices of the Pareto frontier in (cost lower, SLO RPS higher), and how it was run.
"""

from typing import Annotated, Literal

import msgspec

from fleetplan.models.base import Base, Count, NonNegFloat, Total
from fleetplan.models.plan import PlanRequest, Status

# Axis parameters that take a device name after a colon ("count:tpu-v5e").
DEVICE_PARAMS = ("count", "max_count", "price")
# Axis parameters on the whole request.
REQUEST_PARAMS = ("budget_per_hour", "demand_scale", "slo_scale")
# The most grid points one request may ask for (both axes together).
MAX_POINTS = 2_000
AxisParam = Annotated[str, msgspec.Meta(min_length=1, max_length=140)]
PointStatus = Status


class Axis(Base):
    """One swept parameter: explicit `values`, or `num` evenly spaced from `start` to `stop` (inclusive)."""

    param: AxisParam
    values: list[float] | None = None
    start: float | None = None
    stop: float | None = None
    num: Annotated[int, msgspec.Meta(ge=1, le=MAX_POINTS)] | None = None

    def __post_init__(self) -> None:
        kind, _, device = self.param.partition(":")
        if not ((kind in REQUEST_PARAMS and not device) or (kind in DEVICE_PARAMS and device)):
            msg = (
                f"param: {self.param!r} is not one of {', '.join(REQUEST_PARAMS)}, "
                f"{', '.join(p + ':DEVICE' for p in DEVICE_PARAMS)}"
            )
            raise ValueError(msg)
        spaced = (self.start, self.stop, self.num)
        if self.values is not None and any(v is not None for v in spaced):
            raise ValueError("values: give either values or start/stop/num, not both")
        if self.values is None and any(v is None for v in spaced):
            raise ValueError("values: give values, or all of start, stop and num")
        if self.values is not None and not self.values:
            raise ValueError("values: empty; give at least one value")
        for value in self.grid():
            self._check(value)

    def grid(self) -> list[float]:
        """The axis values in order."""
        if self.values is not None:
            return [float(v) for v in self.values]
        assert self.start is not None
        assert self.stop is not None
        assert self.num is not None
        if self.num == 1:
            return [float(self.start)]
        step = (self.stop - self.start) / (self.num - 1)
        # rounded to 12 significant digits: 0.6 + 6 x 0.1 is 1.2, not 1.2000000000000002 in the CSV
        return [float(f"{self.start + i * step:.12g}") for i in range(self.num)]

    @property
    def kind(self) -> str:
        return self.param.partition(":")[0]

    @property
    def device(self) -> str | None:
        return self.param.partition(":")[2] or None

    def _check(self, value: float) -> None:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("values: every value must be finite")
        if value < 0:
            msg = f"values: {self.param} must be >= 0, got {value:g}"
            raise ValueError(msg)
        if self.kind in ("demand_scale", "slo_scale") and value <= 0:
            msg = f"values: {self.param} must be > 0, got {value:g}"
            raise ValueError(msg)
        if self.kind in ("count", "max_count") and value != int(value):
            msg = f"values: {self.param} counts devices; {value:g} is not a whole number"
            raise ValueError(msg)


class WhatIfRequest(Base):
    """A base PlanRequest and one or two axes to sweep; every point is that request with the point's
    changes, planned as POST /plan would plan it."""

    base: PlanRequest
    axes: list[Axis]
    baselines: bool = True  # the GPU-only and greedy baselines at every point
    marginal: bool = True  # the SLO RPS one more device of each type would add, at every point

    def __post_init__(self) -> None:
        if not 1 <= len(self.axes) <= 2:
            msg = f"axes: give one or two axes, got {len(self.axes)}"
            raise ValueError(msg)
        if len(self.axes) == 2 and self.axes[0].param == self.axes[1].param:
            msg = f"axes[1].param: {self.axes[1].param!r} is already axes[0]"
            raise ValueError(msg)
        n = 1
        for axis in self.axes:
            n *= len(axis.grid())
        if n > MAX_POINTS:
            msg = f"axes: {n} grid points; at most {MAX_POINTS}"
            raise ValueError(msg)
        devices = {d.name: d for d in self.base.devices}
        for index, axis in enumerate(self.axes):
            if axis.device is not None and axis.device not in devices:
                msg = f"axes[{index}].param: unknown device {axis.device!r} (devices are {sorted(devices)})"
                raise ValueError(msg)
            if axis.kind == "max_count":
                count = devices[axis.device].count  # type: ignore[index]
                low = min(axis.grid())
                if low < count:
                    msg = f"axes[{index}].values: max_count {low:g} is below {axis.device}'s count {count}"
                    raise ValueError(msg)
        self._check_count_grid()

    def _check_count_grid(self) -> None:
        """A grid of count:D by max_count:D must keep max_count >= count at every point: in one axis order a
        point such as (count 12, max_count 8) failed on its own, in the other it was planned with max_count
        12 and labelled 8 (session 34)."""
        by_param = {axis.param: (index, axis) for index, axis in enumerate(self.axes)}
        for param, (i, counts) in by_param.items():
            if counts.kind != "count":
                continue
            j, caps = by_param.get(f"max_count:{counts.device}", (None, None))
            if caps is not None and max(counts.grid()) > min(caps.grid()):
                low, high = min(caps.grid()), max(counts.grid())
                msg = (
                    f"axes[{j}].values: max_count {low:g} is below count {high:g} of axes[{i}] ({param}) "
                    "at a grid point; every max_count must be at least every count"
                )
                raise ValueError(msg)

    def size(self) -> int:
        n = 1
        for axis in self.axes:
            n *= len(axis.grid())
        return n


class BaselinePoint(Base):
    """A baseline at one point: its SLO RPS and what it spends."""

    slo_rps: Total
    cost_per_hour: Total


class PointBaselines(Base):
    gpu_only: BaselinePoint
    greedy: BaselinePoint


class Point(Base):
    """One grid point: the plan of the base request with the point's changes, summarized.

    `devices`: devices used per type; `bought`: of those, how many are purchased (types with max_count);
    `binding`: the limits at zero slack ("devices:NAME", "budget", "link:SRC->DST", "kv_budget", "demand");
    `marginal_rps`: SLO RPS gained with one more device of each type (same budget), 0 where it adds nothing.
    """

    coords: dict[str, float]
    status: PointStatus
    slo_rps: Total
    demand_rps: Total
    cost_per_hour: Total
    mip_gap: float | None
    devices: dict[str, Count]
    bought: dict[str, Count] = {}
    binding: list[str] = []
    marginal_rps: dict[str, float] = {}
    baselines: PointBaselines | None = None
    solve_ms: NonNegFloat = 0.0
    reused: bool = False  # the plan of another budget that provably is this point's plan too


class WhatIfSolver(Base):
    """How the sweep ran: the backend, the executor and its workers, MILP solves made, points that
    reused another point's plan, and marginal values an LP relaxation settled without a MILP solve."""

    backend: str
    executor: Literal["serial", "processes", "dask"]
    workers: Count
    candidates_built: Count
    solves: Count
    reused: Count
    screened: Count = 0


class WhatIfResult(Base):
    """The answer: points in grid order (first axis slowest), the frontier's point indices, the run."""

    axes: list[AxisParam]
    points: list[Point]
    frontier: list[int]
    solver: WhatIfSolver
    wall_ms: NonNegFloat


__all__ = [
    "Axis",
    "BaselinePoint",
    "Point",
    "PointBaselines",
    "WhatIfRequest",
    "WhatIfResult",
    "WhatIfSolver",
]
