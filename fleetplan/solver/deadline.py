"""A wall-clock budget for one plan() call, checked between the pipeline's stages.

The service and the CLI give `plan()` the moment its answer is due (`time.monotonic()` seconds, the same
clock in every process of the machine). Stages that cannot be interrupted (profile lookup, candidates) are
followed by a check; the solver gets what remains, less a reserve for the work after it (the pooled credit
and window guard, the plan's assembly, baselines and verification: `after_solve_s`, sized by the model), as
its own time limit, so that HiGHS stops with its best incumbent in time. The caller still owns the hard stop
(a worker process killed at the deadline): a check only ends work early and politely.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fleetplan.models.errors import DeadlineExceeded

# the stages `Deadline.enter` reports
CANDIDATES = "candidates"
SOLVE = "solve"
# the solver gets at most this share of what remains after candidates, and less where the work after it
# needs more than the rest (`Deadline.reserve_s`)
SOLVE_SHARE = 0.8
# what the stages after the main solve take, as a * n ** p seconds for n candidate uses: fitted to a new
# process's first plan on a 2-core machine (paper 176 uses, the bench's M 2,306, L 18,719; bench/README,
# "Session 32") with 50% to spare (25% left a server worker's first plan of L 0.1 s late: the solver's own
# overrun of its limit, up to 0.4 s on L, comes out of it too). The pooled credit (solver/pooled.py) is not
# reserved: a gain, never a requirement, it runs in what is left beyond these
WINDOW_FIT = (0.0066, 0.47)  # the window guard (solver/window.py)
REST_FIT = (0.036, 0.42)  # the plan's assembly, its baselines and verification


def after_solve_s(n_uses: int) -> tuple[float, float]:
    """(window, rest): the seconds the window guard, then the plan's assembly, baselines and verification,
    are expected to take for a model of `n_uses` candidate uses (WINDOW_FIT, REST_FIT)."""
    n = max(n_uses, 1)
    return WINDOW_FIT[0] * n ** WINDOW_FIT[1], REST_FIT[0] * n ** REST_FIT[1]


def holding(deadline: "Deadline | None", seconds: float) -> "Deadline | None":
    """`deadline` holding `seconds` back from its solver time limits (None stays None)."""
    return None if deadline is None else replace(deadline, reserve_s=seconds)


@dataclass(frozen=True)
class Deadline:
    """`at`: a time.monotonic() value; `budget_s`: the request's time_limit_s (for messages); `on_stage`
    (optional): told each stage as it begins (`enter`); `reserve_s`: what the work after the solver's
    stage needs, held back from its time limit (`holding`)."""

    at: float
    budget_s: float
    on_stage: Callable[[str], None] | None = field(default=None, compare=False)
    reserve_s: float = 0.0

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
        """The time limit to give the optimizer now: never above `requested`, and ending early enough to
        leave the larger of `reserve_s` and (1 - SOLVE_SHARE) of what remains; at least 10 ms."""
        remaining = self.remaining()
        held = max((1 - SOLVE_SHARE) * remaining, self.reserve_s)
        return max(min(requested, remaining - held), 0.01)


def seconds_left(time_limit_s: float, began: float, deadline: Deadline | None) -> float:
    """What is left of `time_limit_s` counted from `began` (a time.perf_counter() value), and no more than
    `deadline` gives the solver now: negative once the work since `began` has run past the limit."""
    left = time_limit_s - (time.perf_counter() - began)
    if deadline is not None:
        left = min(left, deadline.solver_time_limit(left))
    return left
