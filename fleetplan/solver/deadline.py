"""A wall-clock budget for one plan() call, checked between the pipeline's stages.

The service and the CLI give `plan()` the moment its answer is due (`time.monotonic()` seconds, the same
clock in every process of the machine). Stages that cannot be interrupted (profile lookup, candidates) are
followed by a check; the solver gets what remains, less a reserve for extraction, baselines and
verification, as its own time limit, so that HiGHS stops with its best incumbent in time. The caller still
owns the hard stop (a worker process killed at the deadline): a check only ends work early and politely.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetplan.models.errors import DeadlineExceeded

# the stages `Deadline.enter` reports
CANDIDATES = "candidates"
SOLVE = "solve"
# the solver gets this share of what remains after candidates; the rest is for extract/baselines/verify
SOLVE_SHARE = 0.8


@dataclass(frozen=True)
class Deadline:
    """`at`: a time.monotonic() value; `budget_s`: the request's time_limit_s (for messages); `on_stage`
    (optional): told each stage as it begins (`enter`)."""

    at: float
    budget_s: float
    on_stage: Callable[[str], None] | None = field(default=None, compare=False)

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds, seconds)

    def enter(self, stage: str) -> None:
        """Tell the caller which stage begins: CANDIDATES, then SOLVE. The service lets a candidate build
        outlive its request's deadline, so that the tables are kept for the next request
        (fleetplan/api/workers.py, "finishing")."""
        if self.on_stage is not None:
            self.on_stage(stage)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, stage: str) -> None:
        """Raise DeadlineExceeded (naming the stage that used the budget up) once the deadline has passed."""
        if self.remaining() <= 0:
            msg = (
                f"no plan within time_limit_s={self.budget_s:g} (the budget ran out after {stage}); "
                "raise time_limit_s or shrink the request"
            )
            raise DeadlineExceeded(msg, field="options.time_limit_s")

    def solver_time_limit(self, requested: float) -> float:
        """The time limit to give the optimizer now: never above `requested`, never past the deadline."""
        return max(min(requested, SOLVE_SHARE * self.remaining()), 0.01)


def seconds_left(time_limit_s: float, began: float, deadline: Deadline | None) -> float:
    """What is left of `time_limit_s` counted from `began` (a time.perf_counter() value), and no more than
    `deadline` gives the solver now: negative once the work since `began` has run past the limit."""
    left = time_limit_s - (time.perf_counter() - began)
    if deadline is not None:
        left = min(left, deadline.solver_time_limit(left))
    return left
