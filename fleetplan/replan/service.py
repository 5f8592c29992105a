"""The re-plan of one fleet: the service function behind `POST /fleets/{name}/replan` and `fleetplan replan`.

1. record the run as `running`;
2. the fleet's request with the REPLAN's profiles (a set that misses a model or device of the fleet is
   bad input) and, from observed traffic, forecast rates;
3. solve with the current plan as start and churn in the MILP (max_moves, churn_penalty);
4. diff against the current plan: nothing to change and the same request -> `unchanged` (the very inputs
   of the plan in force, profile content included, are `unchanged` without a solve);
5. the simulation gate on the forecast rates;
6. promote in one transaction (`promoted`), or keep the current plan (`kept`, with the reason; the new
   plan is stored as a candidate), or record the failure (`failed`: bad input, or no plan to keep).
A failure at any step leaves the current plan current (docs/store.md, "Exit codes").
"""

from datetime import UTC, datetime

import msgspec

from fleetplan.models.codec import convert, to_builtins
from fleetplan.models.errors import InputError, PlannerError, PlanVerificationError, SolverFailure
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.profile import ProfilesSpec
from fleetplan.models.store import (
    ForecastReport,
    ForecastSpec,
    GateSpec,
    PlanRecord,
    ProfileSetRecord,
    ReplanRequest,
    Run,
)
from fleetplan.profiler.store import ProfileStore
from fleetplan.profiler.tables import ProfileTable
from fleetplan.replan.diff import diff, is_empty
from fleetplan.replan.forecast import ETS_MISSING, forecast_classes
from fleetplan.replan.gate import gate_reason, run_gate
from fleetplan.replan.traffic import read_rates
from fleetplan.solver import pipeline
from fleetplan.solver.formulation import Churn
from fleetplan.store.repository import Repository

# cost units per hour per instance moved when the REPLAN gives no churn_penalty: a tie-break only (a
# move is never worth less than this), so equal plans keep the one in force
DEFAULT_CHURN_PENALTY = 1e-3
PROMISED = ("optimal", "feasible")


def replan(
    repo: Repository,
    fleet: str,
    order: ReplanRequest | None = None,
    *,
    profile_store: ProfileStore | None = None,
    run: Run | None = None,
) -> Run:
    """Re-plan `fleet` and record the run; returns the finished RUN (raises only for an unknown fleet or
    an unreachable store: every other failure is the run's status and reason). `run`: a run the caller
    started already (the HTTP service does, in the process that may have to mark it failed)."""
    order = order or ReplanRequest()
    check_order(order)
    run = run or repo.start_run(fleet, dry_run=order.dry_run)
    if run.status != "running":  # refused: another run of the fleet is alive
        return run
    with repo.heartbeat(run.id):
        try:
            return _replan(repo, fleet, order, run, profile_store)
        except PlannerError:
            raise
        except Exception as error:  # a bug: the run must not stay "running"
            reason = f"internal error: {type(error).__name__}: {error}"
            repo.finish_run(run.id, status="failed", reason=reason)
            raise


def check_order(order: ReplanRequest) -> None:
    """What a REPLAN asks that cannot be done whatever the data, refused before any run is recorded (HTTP
    400, CLI exit 1): a forecast without observed traffic, an ETS forecast without the `forecast` extra.
    What the data gets wrong (a traffic file, a profile set) is the run's `failed` status instead."""
    if order.forecast is not None and order.traffic is None:
        raise InputError("a forecast needs observed traffic; give 'traffic' too", field="forecast")
    if order.forecast is not None and order.forecast.method == "ets":
        from fleetplan.replan.forecast import ets_available

        if not ets_available():
            raise InputError(ETS_MISSING, field="forecast.method")


def _replan(
    repo: Repository, fleet: str, order: ReplanRequest, run: Run, profile_store: ProfileStore | None
) -> Run:
    record = repo.get_fleet(fleet)
    current = repo.current_plan(fleet)
    forecast: ForecastReport | None = None
    try:
        request, forecast = replan_request(record.request, order)
        if order.profiles is None:
            request = msgspec.structs.replace(request, profiles=newest_profiles(request, profile_store))
        table = pipeline.resolve_profiles(request, profile_store)
        check_covers(request, table)
        if same_inputs(current, request, table):
            change = diff(current.plan, current.plan, current.request, request)
            reason = "the request, its rates and its profile set are the plan in force's: nothing to re-plan"
            return repo.finish_run(run.id, status="unchanged", reason=reason, diff=change, forecast=forecast)
        churn = _churn(current, request, order)
        # no baselines: the run compares the new plan with the plan in force, not with the GPU-only or
        # greedy plans (`fleetplan plan` shows those), and a nightly job over many fleets saves their solves
        new_plan = pipeline.plan(request, profile_store, with_baselines=False, churn=churn)
    except PlannerError as error:
        return repo.finish_run(
            run.id, status=_failure_status(error, current), reason=_reason(error, order), forecast=forecast
        )
    change = diff(current.plan if current else None, new_plan, current.request if current else None, request)
    if current is not None and is_empty(change) and current.request == request:
        reason = "the new plan equals the current plan"
        return repo.finish_run(run.id, status="unchanged", reason=reason, diff=change, forecast=forecast)
    stored = (request, record.version, new_plan, profile_record(table))
    keep = "kept" if current is not None else "failed"
    if new_plan.status not in PROMISED:
        reason = f"solver: the new plan is {new_plan.status}"
        return repo.finish_run(
            run.id, status=keep, reason=reason, plan=stored, diff=change, forecast=forecast
        )
    try:
        gate = run_gate(request, new_plan, table, order.gate or GateSpec())
    except PlannerError as error:  # the run must end: a raise here left it `running`
        reason = f"gate: the simulation could not run: {error}"
        return repo.finish_run(
            run.id, status=keep, reason=reason, plan=stored, diff=change, forecast=forecast
        )
    outcome = dict(plan=stored, diff=change, forecast=forecast, gate=gate)
    if not gate.passed:
        return repo.finish_run(run.id, status=keep, reason=gate_reason(gate), **outcome)
    if order.dry_run:
        passed = "passed the gate" if gate.simulated else "was not gated (no gate asked)"
        reason = f"dry run: the new plan {passed} and was not promoted"
        return repo.finish_run(run.id, status="kept", reason=reason, **outcome)
    return repo.finish_run(run.id, status="promoted", reason=None, promote=True, **outcome)


def uncovered(request: PlanRequest, frame) -> list[str]:
    """The fleet's models and devices that a profile table (its frame) has no rows for, as "model m" and
    "device d"; empty where it covers them all."""
    models = sorted({w.model for w in request.workloads} - set(frame["model"]))
    devices = sorted({d.name for d in request.devices} - set(frame["device"]))
    return [f"model {m}" for m in models] + [f"device {d}" for d in devices]


def check_covers(request: PlanRequest, table: ProfileTable) -> None:
    """InputError (the run `failed`, the plan in force kept) where the profile set misses a model or a
    device of the fleet: a plan would silently drop that hardware (a first plan only warns), and a nightly
    job must not promote a fleet without its TPUs because a set was cut short."""
    missing = uncovered(request, table.frame)
    if missing:
        msg = (
            f"profile set {table.name!r} has no rows for {', '.join(missing)} of the fleet; a re-plan on it "
            "would drop that hardware. Give a set that covers the fleet (or change the fleet first)"
        )
        raise InputError(msg, field="profiles")


def same_inputs(current: PlanRecord | None, request: PlanRequest, table: ProfileTable) -> bool:
    """Whether the plan in force answered this very request (rates included) on this very profile content,
    and was proven optimal: then it is the answer, and a re-solve, which starts from it with churn and
    without the first plan's pooled credit, could only come out another of its ties or a little worse
    (session 34: paper.json re-planned twice promoted 56.019 -> 55.990 SLO RPS with no move)."""
    return (
        current is not None
        and current.plan.status == "optimal"
        and current.request == request
        and current.profile_set.sha256 == table.sha256
    )


def newest_profiles(request: PlanRequest, store: ProfileStore | None) -> ProfilesSpec:
    """`profiles: null` in a REPLAN: the newest set stored in the profile store (by its manifest's
    `created`, then name) that is strictly newer than the fleet's own and has rows for every model and
    device of the fleet; else the fleet's own profiles (also when they are inline rows). A bundled set
    never replaces the fleet's own (paper.json would otherwise have been re-planned on `synthetic`, which
    shares its date), and a set whose manifest or table cannot be read is passed over."""
    own = request.profiles.set
    if own is None:
        return request.profiles
    store = store or ProfileStore()
    floor = _created(store, own) or ""
    dated = []
    for name in store.names():
        created = None if name == own or store.is_bundled(name) else _created(store, name)
        if created is not None and created > floor:
            dated.append((created, name))
    dated.sort()
    for _, name in reversed(dated):
        try:
            frame = store.load(name).frame
        except PlannerError:
            continue
        if not uncovered(request, frame):
            return ProfilesSpec(set=name)
    return request.profiles


def _created(store: ProfileStore, name: str) -> str | None:
    """A set's manifest `created`, or None when its manifest cannot be read."""
    try:
        return store.manifest(name).created
    except PlannerError:
        return None


def replan_request(
    fleet_request: PlanRequest, order: ReplanRequest
) -> tuple[PlanRequest, ForecastReport | None]:
    """The request to solve: the fleet's, with the REPLAN's profiles and the forecast rates."""
    request = fleet_request
    if order.profiles is not None:
        request = msgspec.structs.replace(request, profiles=order.profiles)
    if order.traffic is None:
        return request, None
    rates = read_rates(request, order.traffic)
    report = forecast_classes(request, rates, order.forecast or ForecastSpec())
    planned = {c.name: c.planned_rps for c in report.classes}
    workloads = [msgspec.structs.replace(w, rate_rps=planned[w.name]) for w in request.workloads]
    # structs.replace skips the models' constraints: the request is checked again as if decoded, so that
    # what a traffic file put in it meets them before any solver sees it
    return convert(to_builtins(msgspec.structs.replace(request, workloads=workloads)), PlanRequest), report


def _churn(current: PlanRecord | None, request: PlanRequest, order: ReplanRequest) -> Churn | None:
    if current is None:
        return None
    penalty = DEFAULT_CHURN_PENALTY if order.churn_penalty is None else order.churn_penalty
    return Churn.from_pools(current.plan.pools, request.options.pooling, order.max_moves, penalty)


def _failure_status(error: PlannerError, current: PlanRecord | None) -> str:
    """`kept` when the solver or the plan's verification said no and a plan is in force; `failed` for
    bad input (traffic, profiles, request) or when there is no plan to keep."""
    kept = isinstance(error, SolverFailure | PlanVerificationError) and current is not None
    return "kept" if kept else "failed"


def _reason(error: PlannerError, order: ReplanRequest) -> str:
    if isinstance(error, SolverFailure) and order.max_moves is not None:
        if error.proven_infeasible:  # more time finds nothing, more moves may
            return (
                f"no plan within max_moves={order.max_moves}: the solver proved none exists (the fleet's "
                "change needs more moves); raise max_moves (--max-moves)"
            )
        return f"no plan within max_moves={order.max_moves} (or the time limit): {error}"
    if isinstance(error, SolverFailure):
        return str(error)
    if isinstance(error, PlanVerificationError):
        return f"the new plan failed verification: {error}"
    return f"invalid input: {error}"


def profile_record(table: ProfileTable) -> ProfileSetRecord:
    frame = table.frame
    return ProfileSetRecord(
        name=table.name,
        sha256=table.sha256,
        models=sorted(map(str, frame["model"].unique())),
        devices=sorted(map(str, frame["device"].unique())),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def plan_of(run: Run, repo: Repository) -> Plan | None:
    """The plan a run produced or kept (None for a failed run without one)."""
    return None if run.plan_id is None else repo.get_plan(run.plan_id).plan


__all__ = ["DEFAULT_CHURN_PENALTY", "check_order", "plan_of", "profile_record", "replan", "replan_request"]
