"""The greedy baseline's plan as the solver's start where the start's sub-MIP stops short
(optimize.primal_start, docs/formulation.md "The greedy start")."""

import numpy as np
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import baselines
from fleetplan.solver import optimize as optimize_module
from fleetplan.solver.backends import Sense, SolveResult, Termination
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.pipeline import resolve_profiles

FIXTURES = ["paper", "scarce_gpus", "link_bound"]


def _candidates(name: str):
    request = read_request(fixtures.request_path(name))
    return build_candidates(request, resolve_profiles(request))


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_instances_add_up_to_the_devices_the_baseline_reports(name):
    cand = _candidates(name)
    baseline, usage = baselines.greedy_run(cand)
    assert baseline.slo_rps > 0
    instances = usage.instances
    assert instances.shape == (len(cand.pools),)
    assert np.all(instances >= 0)
    assert np.array_equal(instances, np.round(instances))
    used = cand.pools.assign(u=instances * cand.pools["tp"].to_numpy()).groupby("device")["u"].sum()
    assert {device: int(n) for device, n in used.items() if n} == usage.devices


class _Recording:
    """The real backend, the start handed to the primary MIP kept, the sub-MIP stopped with a plan of
    nothing (what a sub-MIP cut short by its time limit may return)."""

    def __init__(self, backend):
        self.backend, self.name = backend, backend.name
        self.primary_start = None

    def solve(self, form, objective, sense, **kwargs):
        if kwargs.get("start") is not None:
            self.primary_start = np.asarray(kwargs["start"], dtype=float)
        return self.backend.solve(form, objective, sense, **kwargs)


@pytest.mark.parametrize("name", FIXTURES)
def test_a_sub_mip_stopped_short_hands_the_mip_a_start_at_least_the_greedy_baseline(name, monkeypatch):
    cand = _candidates(name)
    assert (cand.classes["weight"] == 1).all()  # the objective is then the baseline's unweighted RPS
    greedy = baselines.greedy_run(cand)[0].slo_rps
    stopped = []

    def stopped_short(form, cols, x_lps, stage, solver, time_limit_s, mip_rel_gap):
        nothing = np.zeros(form.A.shape[1])
        stopped.append(nothing)
        return SolveResult(Termination.FEASIBLE, nothing, 0.0, None, time_limit_s)

    backend = _Recording(optimize_module.get_backend("highs"))
    monkeypatch.setattr(optimize_module, "_sub_mip", stopped_short)
    monkeypatch.setattr(optimize_module, "get_backend", lambda name: backend)
    outcome = optimize_module.optimize(cand.request, cand, [("goodput", Sense.MAX)])
    assert stopped
    assert backend.primary_start is not None
    start_value = float(outcome.form.objectives["goodput"] @ backend.primary_start)
    assert start_value >= greedy * (1 - 1e-7)
    assert outcome.primary_value >= start_value * (1 - 1e-7)


def test_a_sub_mip_that_ends_in_its_box_runs_no_greedy(monkeypatch):
    cand = _candidates("paper")
    calls = []
    real = baselines.greedy_run
    monkeypatch.setattr(optimize_module, "greedy_run", lambda c: calls.append(c) or real(c))
    outcome = optimize_module.optimize(cand.request, cand, [("goodput", Sense.MAX)])
    assert outcome.termination is Termination.OPTIMAL
    assert [r.step for r in outcome.stages].count("start") == 1
    assert not calls
