"""optimize() as named steps: the one relative gap, and the per-stage records a plan carries."""

import pytest

from fleetplan.solver.backends import relative_gap
from fleetplan.solver.backends.base import SolveResult, Termination


@pytest.mark.parametrize(
    ("objective", "bound", "gap"),
    [
        (100.0, 101.0, 0.01),
        (100.0, 99.0, 0.01),  # a min stage: the bound lies below
        (5.0, 5.0, 0.0),  # equal
        (0.0, 0.0, 0.0),  # 0 objective, closed
        (1e6, 1e6 + 5e-10, 0.0),  # within the 1e-9 absolute tolerance
        (-10.0, -9.0, 0.1),  # negative: over |objective|
        (-10.0, -11.0, 0.1),
        (-1e-3, 1e-3, 2.0),  # across zero
        (0.5, 0.6, 0.2),  # below 1 in magnitude: over |objective|, not over 1
    ],
)
def test_relative_gap(objective, bound, gap):
    assert relative_gap(objective, bound) == pytest.approx(gap, rel=1e-12, abs=1e-15)


def test_relative_gap_of_a_zero_objective_with_an_open_bound_is_large():
    assert relative_gap(0.0, 2e-9) == pytest.approx(2.0)
    assert relative_gap(0.0, 1.0) == pytest.approx(1e9)
    assert relative_gap(0.0, -1.0) == pytest.approx(1e9)


def test_relative_gap_is_none_without_an_objective_or_a_bound():
    assert relative_gap(None, 1.0) is None
    assert relative_gap(1.0, None) is None
    assert relative_gap(None, None) is None


def test_solve_result_gap_is_relative_gap():
    result = SolveResult(Termination.FEASIBLE, None, 0.5, 0.4, 0.0)
    assert result.gap == relative_gap(0.5, 0.4) == pytest.approx(0.2)
