"""Every installed backend against HiGHS (style rule 5): same plans, same objectives, same statuses.

Three layers:
- `test_backend_*`: each backend on hand-made MatrixForms with a known answer (a knapsack MILP, its LP
  relaxation, a warm start, an infeasible model, a time-out without incumbent);
- `test_forms_agree`: the MatrixForm of each hand-built request, every objective vector, MILP and LP
  relaxation, solved by each backend and compared with highs (this is how ortools is checked end to end
  while `options.solver` does not accept "ortools" yet);
- `test_plans_agree`: `fleetplan.solver.plan` with `options.solver` switched; weighted goodput within 1e-6
  relative, equal status, and `verify` passing. A backend the Options Struct does not accept is skipped.

OR-Tools must never be imported in this process (its libhighs clashes with highspy's; docs/solvers.md): its
presence is checked with importlib.util.find_spec, which locates a package without loading it.
"""

from __future__ import annotations

import importlib.util
import sys
import typing
from typing import Any

import msgspec
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from strategies import tiny_requests

from fleetplan import fixtures, solver
from fleetplan.models import PlanRequest
from fleetplan.models.codec import read_request
from fleetplan.models.errors import InputError, SolverFailure
from fleetplan.models.plan import SolverName
from fleetplan.solver.backends import Sense, Termination, get_backend
from fleetplan.solver.backends.base import _BACKENDS
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.formulation import MatrixForm, build_matrix
from fleetplan.solver.pipeline import resolve_profiles
from fleetplan.solver.verify import verify

REL = 1e-6


def _available(name: str) -> tuple[bool, str]:
    """find_spec, not importorskip: importing ortools here would break highspy in this process."""
    if name == "highs":
        return True, ""
    reason = f"{name} not installed: pip install 'fleetplan[{name}]'"
    return importlib.util.find_spec(name) is not None, reason


def _backend_param(name: str) -> Any:
    ok, reason = _available(name)
    return pytest.param(name, id=name, marks=() if ok else pytest.mark.skip(reason=reason))


ALL = [_backend_param(name) for name in ("highs", "pyomo", "ortools")]
OTHERS = [_backend_param(name) for name in ("pyomo", "ortools")]


def backend(name: str) -> Any:
    """get_backend for the registered names; ortools directly until base._BACKENDS lists it."""
    if name == "ortools" and name not in _BACKENDS:
        from fleetplan.solver.backends.ortools import BACKEND

        return BACKEND
    return get_backend(name)


def close(a: float | None, b: float | None, rel: float = REL) -> bool:
    assert a is not None, (a, b)
    assert b is not None, (a, b)
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


# ----------------------------------------------------------------------------------------------------------
# Hand-made MatrixForms
# ----------------------------------------------------------------------------------------------------------


def form_of(
    A: list[list[float]], row_lo: list[float], row_hi: list[float], col_hi: list[float], integer: list[bool]
) -> MatrixForm:
    n = len(col_hi)
    return MatrixForm(
        A=sp.csr_matrix(np.array(A, dtype=float)),
        row_lo=np.array(row_lo, dtype=float),
        row_hi=np.array(row_hi, dtype=float),
        col_lo=np.zeros(n),
        col_hi=np.array(col_hi, dtype=float),
        integer=np.array(integer, dtype=bool),
        row_blocks=[],
    )


def knapsack() -> tuple[MatrixForm, np.ndarray]:
    """max 10a + 13b + 7c + y  s.t.  4a + 6b + 3c <= 10,  y - a <= 0.5 (ranged row: y - a >= -1),
    a, b, c in {0..3}, y in [0, 2] continuous; an empty row (skipped) and an unreferenced column d.

    MILP optimum: a = 1, c = 2, y = 1.5 -> 10 + 14 + 1.5 = 25.5 (b = 1 instead of c gives 24.5; c = 3 gives
    22.5). LP: a = 2.5 (best value per weight), y = 2 -> 27.
    """
    form = form_of(
        A=[[4, 6, 3, 0, 0], [-1, 0, 0, 1, 0], [0, 0, 0, 0, 0]],
        row_lo=[-np.inf, -1, -np.inf],
        row_hi=[10, 0.5, 5],
        col_hi=[3, 3, 3, 2, 2],
        integer=[True, True, True, False, False],
    )
    return form, np.array([10.0, 13.0, 7.0, 1.0, 0.0])


def market_split(m: int = 4, n: int = 30, seed: int = 0, point: np.ndarray | None = None) -> MatrixForm:
    """sum_j a_ij x_j = b_i, x binary (Cornuejols-Dahl): no solver finds a point in 0.3 s.

    b_i = floor(sum_j a_ij / 2), or a @ point when a feasible point is given.
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, (m, n)).astype(float)
    b = np.floor(a.sum(axis=1) / 2) if point is None else a @ point
    return MatrixForm(sp.csr_matrix(a), b, b.copy(), np.zeros(n), np.ones(n), np.ones(n, dtype=bool), [])


@pytest.mark.parametrize("name", ALL)
def test_backend_knapsack_milp(name):
    form, c = knapsack()
    result = backend(name).solve(form, c, Sense.MAX, time_limit_s=20, mip_rel_gap=0.0)
    assert result.termination is Termination.OPTIMAL, result
    assert result.objective == pytest.approx(25.5, rel=1e-9)
    assert result.bound == pytest.approx(25.5, rel=1e-6)
    assert result.values is not None
    assert result.values.shape == (5,)
    assert np.allclose(result.values[:4], [1, 0, 2, 1.5], atol=1e-6)
    assert 0 <= result.values[4] <= 2  # free column: any value within its bounds
    assert float(c @ result.values) == pytest.approx(25.5, rel=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_backend_relaxation_is_the_lp(name):
    form, c = knapsack()
    result = backend(name).solve(form, c, Sense.MAX, time_limit_s=20, mip_rel_gap=0.0, relax=True)
    assert result.termination is Termination.OPTIMAL, result
    assert result.objective == pytest.approx(27.0, rel=1e-9)
    assert result.bound == pytest.approx(27.0, rel=1e-9)
    assert result.values is not None
    assert result.values[0] == pytest.approx(2.5)


@pytest.mark.parametrize("name", ALL)
def test_backend_minimize_with_start(name):
    # min -(10a + 13b + 7c + y) is the knapsack again; the start (a = 2, y = 1.5) is feasible but worse.
    form, c = knapsack()
    start = np.array([2.0, 0.0, 0.0, 1.5, 0.0])
    result = backend(name).solve(form, -c, Sense.MIN, time_limit_s=20, mip_rel_gap=0.0, start=start)
    assert result.termination is Termination.OPTIMAL, result
    assert result.objective == pytest.approx(-25.5, rel=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_backend_infeasible(name):
    # x + y >= 3 with x, y in [0, 1]
    form = form_of(A=[[1, 1]], row_lo=[3], row_hi=[np.inf], col_hi=[1, 1], integer=[True, False])
    result = backend(name).solve(form, np.array([1.0, 1.0]), Sense.MAX, time_limit_s=20, mip_rel_gap=0.0)
    assert result.termination is Termination.INFEASIBLE, result
    assert result.values is None
    assert result.objective is None


@pytest.mark.parametrize("name", ALL)
def test_backend_time_limit_without_incumbent(name):
    result = backend(name).solve(market_split(), np.zeros(30), Sense.MAX, time_limit_s=0.3, mip_rel_gap=0.0)
    assert result.termination is Termination.NO_SOLUTION, result
    assert result.values is None
    assert result.objective is None
    assert not result.has_solution


@pytest.mark.parametrize("name", ALL)
def test_backend_start_is_an_incumbent(name):
    """The same hard model with a feasible start: every backend returns at least the start's objective.

    (HiGHS and Pyomo pass it to setSolution, OR-Tools to SetHint, which SCIP tries as a solution.)
    """
    point = np.random.default_rng(7).integers(0, 2, 40).astype(float)
    form = market_split(5, 40, seed=1, point=point)
    c = np.random.default_rng(8).random(40)
    result = backend(name).solve(form, c, Sense.MAX, time_limit_s=0.3, mip_rel_gap=0.0, start=point)
    assert result.termination in (Termination.FEASIBLE, Termination.OPTIMAL), result
    assert result.objective is not None
    assert result.objective >= float(c @ point) - 1e-9


# ----------------------------------------------------------------------------------------------------------
# Hand-built requests (inline profile rows)
# ----------------------------------------------------------------------------------------------------------


def row(device: str, tp: int, batch: int, prompt: int, ttft: float, tbt: float, model: str = "m1") -> dict:
    """A profile row with the same latency at every percentile."""
    return {
        "model": model,
        "device": device,
        "tp": tp,
        "batch": batch,
        "prompt_tokens": prompt,
        "ttft_ms_p50": ttft,
        "ttft_ms_p90": ttft,
        "ttft_ms_p99": ttft,
        "tbt_ms_p50": tbt,
        "tbt_ms_p90": tbt,
        "tbt_ms_p99": tbt,
    }


def workload(
    name: str,
    rate: float,
    *,
    prompt: int = 128,
    output: int = 10,
    ttft: float = 1000.3,
    tbt: float = 50.3,
    weight: float = 1.0,
    model: str = "m1",
) -> dict:
    return {
        "name": name,
        "model": model,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "rate_rps": rate,
        "slo": {"ttft_ms": ttft, "tbt_ms": tbt, "percentile": 90},
        "weight": weight,
    }


# gpu: fast prefill, slow decode; acc: slow prefill, fast decode (cross-type pairs win); both colocate m2.
ROWS = [
    row("gpu", 1, 1, 128, 50, 100),
    row("gpu", 1, 1, 1024, 100, 120),
    row("gpu", 1, 4, 128, 120, 110),
    row("gpu", 1, 4, 1024, 300, 130),
    row("gpu", 2, 1, 128, 30, 70),
    row("gpu", 2, 1, 1024, 60, 90),
    row("acc", 1, 1, 128, 5000, 20),
    row("acc", 1, 1, 1024, 6000, 25),
    row("acc", 1, 4, 128, 7000, 30),
    row("acc", 1, 4, 1024, 9000, 40),
    row("gpu", 1, 1, 128, 40, 8, model="m2"),
    row("gpu", 1, 1, 1024, 200, 12, model="m2"),
    row("gpu", 1, 4, 128, 90, 12, model="m2"),
    row("gpu", 1, 4, 1024, 400, 18, model="m2"),
    row("acc", 1, 1, 128, 80, 10, model="m2"),
    row("acc", 1, 1, 1024, 500, 14, model="m2"),
]
MODELS = [{"name": "m1", "kv_bytes_per_token": 1048576}, {"name": "m2", "kv_bytes_per_token": 262144}]


def make_request(
    devices: list[dict],
    workloads: list[dict],
    *,
    links: list[dict] | None = None,
    kv_budget: float | None = None,
    **options: Any,
) -> PlanRequest:
    return msgspec.convert(
        {
            "devices": devices,
            "workloads": workloads,
            "links": links or [],
            "kv_budget_gbps": kv_budget,
            "models": MODELS,
            "profiles": {"rows": ROWS},
            "options": {
                "mip_rel_gap": 1e-9,
                "time_limit_s": 60,
                "capacity_model": "flat",
                "max_utilization": 0.9,
                **options,
            },
        },
        PlanRequest,
    )


def fleet(
    gpu: int = 3, acc: int = 4, gpu_nic: float | None = None, acc_nic: float | None = None
) -> list[dict]:
    gpu_device: dict[str, Any] = {"name": "gpu", "count": gpu, "cost_per_hour": 3.0}
    acc_device: dict[str, Any] = {"name": "acc", "count": acc, "cost_per_hour": 1.5}
    if gpu_nic is not None:
        gpu_device["network_gbps"] = gpu_nic
    if acc_nic is not None:
        acc_device["network_gbps"] = acc_nic
    return [gpu_device, acc_device]


THREE_CLASSES = [
    workload("chat", 40.0, weight=2.0),
    workload("long", 6.0, prompt=700, ttft=2000.3),
    workload("small", 25.0, model="m2", output=32, tbt=20.3, weight=1.5),
]

REQUESTS = {
    "max_goodput/model/nic": make_request(fleet(gpu_nic=10, acc_nic=25), THREE_CLASSES),
    "max_goodput/class/nic": make_request(fleet(gpu_nic=10, acc_nic=5), THREE_CLASSES, pooling="class"),
    "max_goodput/model/links+kv_budget": make_request(
        fleet(gpu=4, acc=6),
        THREE_CLASSES,
        links=[
            {"source": "gpu", "target": "acc", "gbps": 12.0},
            {"source": "gpu", "target": "gpu", "gbps": 2.0},
        ],
        kv_budget=9.0,
    ),
    "max_goodput/class/budget": make_request(
        fleet(gpu_nic=25), THREE_CLASSES, pooling="class", budget_per_hour=10.25
    ),
    "min_cost/model": make_request(
        fleet(gpu=4, acc=6, gpu_nic=25, acc_nic=25),
        [workload("chat", 6.0, weight=2.0), workload("small", 5.0, model="m2", output=32, tbt=20.3)],
        objective="min_cost",
    ),
    "min_cost/class/infeasible": make_request(
        fleet(gpu=2, acc=2), THREE_CLASSES, pooling="class", objective="min_cost"
    ),
    "max_min_fraction/model/links": make_request(
        fleet(gpu_nic=10, acc_nic=10),
        THREE_CLASSES,
        objective="max_min_fraction",
        links=[{"source": "gpu", "target": "acc", "gbps": 15.0}],
    ),
    "max_min_fraction/class": make_request(
        fleet(gpu=2, acc=3), THREE_CLASSES, pooling="class", objective="max_min_fraction"
    ),
}


def with_solver(request: PlanRequest, name: str) -> PlanRequest:
    return msgspec.structs.replace(request, options=msgspec.structs.replace(request.options, solver=name))


def weighted_goodput(request: PlanRequest, plan: Any) -> float:
    weight = {w.name: w.weight for w in request.workloads}
    return sum(weight[r.name] * r.served_rps for r in plan.workloads)


_HIGHS_PLANS: dict[str, Any] = {}


def highs_plan(case: str) -> Any:
    if case not in _HIGHS_PLANS:
        _HIGHS_PLANS[case] = solver.plan(with_solver(REQUESTS[case], "highs"), with_baselines=False)
    return _HIGHS_PLANS[case]


def test_requests_are_not_trivial():
    """The cases exercise what they are named after: something served, something binding or unserved."""
    statuses = {case: highs_plan(case).status for case in REQUESTS}
    assert statuses["min_cost/class/infeasible"] == "infeasible"
    assert statuses["min_cost/model"] == "optimal"
    for case in REQUESTS:
        plan = highs_plan(case)
        assert weighted_goodput(REQUESTS[case], plan) > 0, case
        if REQUESTS[case].options.objective != "min_cost":
            assert any(r.unserved_rps > 1e-6 for r in plan.workloads), case  # capacity binds somewhere
    assert any(p.role == "prefill" for p in highs_plan("max_goodput/model/nic").pools)
    assert any(p.role == "decode" for p in highs_plan("max_goodput/model/links+kv_budget").pools)


def _accepts(name: str) -> bool:
    return name in typing.get_args(SolverName) and name in _BACKENDS


@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", OTHERS)
def test_plans_agree(name, case):
    if not _accepts(name):
        pytest.skip(f"options.solver does not accept {name!r} yet (models.plan.SolverName, base._BACKENDS)")
    request = with_solver(REQUESTS[case], name)
    plan = solver.plan(request, with_baselines=False)
    reference = highs_plan(case)
    assert plan.status == reference.status
    assert close(weighted_goodput(request, plan), weighted_goodput(request, reference))
    if request.options.objective == "min_cost" and plan.status == "optimal":
        assert close(plan.cost_per_hour, reference.cost_per_hour)
    assert plan.solver.backend == name
    verify(request, plan)


def forms_of(request: PlanRequest) -> MatrixForm:
    form, _ = build_matrix(build_candidates(request, resolve_profiles(request)))
    return form


SENSES = {"goodput": Sense.MAX, "cost": Sense.MIN, "phi": Sense.MAX}


@pytest.mark.parametrize("relax", [False, True], ids=["milp", "lp"])
@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", OTHERS)
def test_forms_agree(name, case, relax):
    """Every objective vector of the request's MatrixForm: the same optimum (and bound) as highs."""
    form = forms_of(REQUESTS[case])
    highs, other = get_backend("highs"), backend(name)
    for objective, vector in form.objectives.items():
        sense = SENSES[objective]
        kwargs = {"time_limit_s": 60, "mip_rel_gap": 1e-9, "relax": relax}
        reference = highs.solve(form, vector, sense, **kwargs)
        result = other.solve(form, vector, sense, **kwargs)
        assert result.termination is reference.termination, (objective, result, reference)
        if reference.termination is Termination.INFEASIBLE:  # min_cost with demand the fleet cannot meet
            continue
        assert reference.termination is Termination.OPTIMAL
        assert close(result.objective, reference.objective), (objective, result, reference)
        assert close(float(vector @ result.values), result.objective)
        lo, hi = form.row_lo - 1e-6, form.row_hi + 1e-6
        activity = form.A @ result.values
        assert np.all((activity >= lo - 1e-6 * np.abs(lo)) & (activity <= hi + 1e-6 * np.abs(hi))), objective
        assert result.bound is not None


PROPERTY = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY
@given(tiny_requests(pooling="model", with_nic=None, with_links=None, with_budget=None))
def test_pyomo_plans_agree_on_drawn_requests(request):
    ok, reason = _available("pyomo")
    if not ok:
        pytest.skip(reason)
    reference = solver.plan(request, with_baselines=False)
    plan = solver.plan(with_solver(request, "pyomo"), with_baselines=False)
    assert plan.status == reference.status
    assert close(weighted_goodput(request, plan), weighted_goodput(request, reference))
    verify(request, plan)


@PROPERTY
@given(tiny_requests(pooling="class", n_classes=3, with_nic=None, with_links=None, paired=None))
def test_ortools_forms_agree_on_drawn_requests(request):
    ok, reason = _available("ortools")
    if not ok:
        pytest.skip(reason)
    cand = build_candidates(request, resolve_profiles(request))
    if cand.uses.empty:
        return
    form, _ = build_matrix(cand)
    vector = form.objectives["goodput"]
    kwargs = {"time_limit_s": 60, "mip_rel_gap": 1e-9}
    reference = get_backend("highs").solve(form, vector, Sense.MAX, **kwargs)
    result = backend("ortools").solve(form, vector, Sense.MAX, **kwargs)
    assert result.termination is reference.termination is Termination.OPTIMAL
    assert close(result.objective, reference.objective)


# ----------------------------------------------------------------------------------------------------------
# OR-Tools isolation
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [p for p in OTHERS if p.values == ("ortools",)])
def test_ortools_stays_out_of_this_process(name):
    form, c = knapsack()
    result = backend(name).solve(form, c, Sense.MAX, time_limit_s=20, mip_rel_gap=0.0)
    assert result.objective == pytest.approx(25.5)
    assert "ortools" not in sys.modules
    import highspy  # still loadable: the clash would show here as an undefined symbol

    assert highspy.Highs().version()


def test_ortools_missing_names_the_extra(monkeypatch):
    from fleetplan.solver.backends import ortools as module

    form, c = knapsack()
    monkeypatch.setattr(module, "ortools_installed", lambda: False)
    with pytest.raises(InputError, match=r"pip install 'fleetplan\[ortools\]'") as caught:
        module.BACKEND.solve(form, c, Sense.MAX, time_limit_s=5, mip_rel_gap=0.0)
    assert caught.value.field == "options.solver"


def test_ortools_worker_import_failure_names_the_extra(monkeypatch):
    """The worker's own failure to import ortools (here: -S hides site-packages) becomes the same error."""
    from fleetplan.solver.backends import ortools as module

    form, c = knapsack()
    monkeypatch.setattr(module, "ortools_installed", lambda: True)

    def without_site(source, target):
        return [sys.executable, "-P", "-S", str(module.WORKER), str(source), str(target)]

    monkeypatch.setattr(module, "worker_command", without_site)
    with pytest.raises(InputError, match=r"pip install 'fleetplan\[ortools\]'") as caught:
        module.BACKEND.solve(form, c, Sense.MAX, time_limit_s=5, mip_rel_gap=0.0)
    assert caught.value.field == "options.solver"


def test_a_non_finite_coefficient_is_a_solver_failure_not_a_crash():
    """A rate of inf once reached HiGHS through a re-plan's forecast and the worker died of SIGSEGV."""
    form = MatrixForm(
        A=sp.csr_matrix(np.array([[1.0, np.inf]])),
        row_lo=np.array([-np.inf]),
        row_hi=np.array([1.0]),
        col_lo=np.zeros(2),
        col_hi=np.full(2, 10.0),
        integer=np.array([True, False]),
        row_blocks=[("capacity", 0, 1)],
    )
    with pytest.raises(SolverFailure, match="non-finite coefficient"):
        get_backend("highs").solve(form, np.ones(2), Sense.MAX, time_limit_s=1.0, mip_rel_gap=1e-4)


def test_pyomo_plans_the_paper_request_as_highs_does():
    """The paper model has a row with no finite bound, which Pyomo refuses as a constraint ((None, body,
    None)): `solver: "pyomo"`, an allowed value, answered 500 on the bundled example."""
    pytest.importorskip("pyomo")
    base = read_request(fixtures.request_path("paper"))
    primary = {}
    for name in ("highs", "pyomo"):
        options = msgspec.structs.replace(base.options, solver=name)
        result = solver.plan(msgspec.structs.replace(base, options=options), with_baselines=False)
        assert result.status == "optimal"
        (stage,) = [s for s in result.solver.stages if s.step == "primary"]
        primary[name] = stage.objective
    assert primary["pyomo"] == pytest.approx(primary["highs"], rel=base.options.mip_rel_gap)
