"""The store against real databases: an SQLite file and a PostgreSQL server the tests start themselves.

Migrations, versioned fleets, paging, promotion in one transaction, and a promotion killed with SIGKILL in
the middle of its transaction while a reader looks on.
"""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa
from postgres_server import database_url_fixture, postgres_root_url_fixture  # noqa: F401 (fixtures)
from store_helpers import QUICK_GATE, tiny_request

from fleetplan.models.codec import decode, encode
from fleetplan.models.errors import InputError, NotFound
from fleetplan.models.plan import Plan
from fleetplan.models.store import ProfileSetRecord, ReplanRequest
from fleetplan.replan import replan
from fleetplan.solver.pipeline import plan
from fleetplan.store import Repository, make_engine, open_repository
from fleetplan.store.engine import current_revision, head_revision

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ProfileSetRecord(name="inline", sha256="0" * 64, models=["m"], devices=["d"], created_at="t")


@pytest.fixture(scope="module")
def two_plans():
    """Two real plans of the tiny fleet (20 and 30 rps): different pools, so each promotion is visible."""
    low, high = tiny_request(rate_rps=20.0), tiny_request(rate_rps=30.0)
    return (low, plan(low, with_baselines=False)), (high, plan(high, with_baselines=False))


def test_migrations_versioned_fleets_and_paging(database_url):
    engine = make_engine(database_url)
    assert current_revision(engine) is None
    with pytest.raises(Exception, match="db upgrade"):
        Repository(engine).check_migrated()
    repo = open_repository(database_url, migrate=True)
    assert current_revision(engine) == head_revision(engine) == "0002"
    open_repository(database_url, migrate=True)  # a second upgrade is a no-op

    first = repo.put_fleet("b-fleet", tiny_request(rate_rps=20.0))
    again = repo.put_fleet("b-fleet", tiny_request(rate_rps=20.0))
    changed = repo.put_fleet("b-fleet", tiny_request(rate_rps=25.0))
    assert (first.version, again.version, changed.version) == (1, 1, 2)
    assert repo.get_fleet("b-fleet").request.workloads[0].rate_rps == 25.0
    repo.put_fleet("a-fleet", tiny_request())
    repo.put_fleet("c-fleet", tiny_request())
    assert [f.name for f in repo.list_fleets()] == ["a-fleet", "b-fleet", "c-fleet"]
    assert [f.name for f in repo.list_fleets(limit=1, offset=1)] == ["b-fleet"]
    with pytest.raises(NotFound, match="unknown fleet 'nope'"):
        repo.get_fleet("nope")
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
    repo.engine.dispose()


def test_promotion_moves_the_pointer_and_keeps_history(database_url, two_plans):
    (low_request, low), (high_request, high) = two_plans
    repo = open_repository(database_url, migrate=True)
    repo.put_fleet("f", low_request)
    first = repo.start_run("f")
    assert first.status == "running"
    done = repo.finish_run(
        first.id, status="promoted", reason=None, plan=(low_request, 1, low, PROFILE), promote=True
    )
    assert repo.current_plan("f").id == done.plan_id
    assert done.previous_plan_id is None

    kept = repo.start_run("f")
    kept = repo.finish_run(kept.id, status="kept", reason="gate", plan=(high_request, 1, high, PROFILE))
    current = repo.current_plan("f")
    assert current.id == done.plan_id
    assert current.plan == low  # a kept run never moves the pointer
    assert repo.get_plan(kept.plan_id).state == "candidate"

    second = repo.start_run("f")
    second = repo.finish_run(
        second.id, status="promoted", reason=None, plan=(high_request, 1, high, PROFILE), promote=True
    )
    assert repo.current_plan("f").plan == high
    assert second.previous_plan_id == done.plan_id
    states = [(p.id, p.state) for p in repo.list_plans("f")]
    assert states == [(second.plan_id, "current"), (kept.plan_id, "candidate"), (done.plan_id, "superseded")]
    assert [r.status for r in repo.list_runs("f")] == ["promoted", "kept", "promoted"]
    assert [p.id for p in repo.list_plans("f", limit=1, offset=1)] == [kept.plan_id]
    repo.engine.dispose()


# The child promotes `high` over the current plan and stops inside the promotion's one transaction, at one
# of three points: after inserting the new plan ("insert"), after moving the current-plan pointer
# ("point"), or after its last write, the run's outcome, just before COMMIT ("outcome"). There it reports
# and hangs, and the test kills it with SIGKILL.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fleetplan.models.codec import decode
    from fleetplan.models.plan import Plan, PlanRequest
    from fleetplan.models.store import ProfileSetRecord
    from fleetplan.store import open_repository, repository

    url, request_file, plan_file, point = sys.argv[1:5]
    request = decode(Path(request_file).read_bytes(), PlanRequest)
    plan = decode(Path(plan_file).read_bytes(), Plan)
    profile = ProfileSetRecord(name="inline", sha256="1" * 64, models=["m"], devices=["d"], created_at="t")
    repo = open_repository(url)
    run = repo.start_run("f")
    print(f"run {run.id}", flush=True)

    def hang_after(function):
        def wrapped(*args, **kwargs):
            result = function(*args, **kwargs)
            print("in-transaction", flush=True)
            time.sleep(120)
            return result
        return wrapped

    name = {"insert": "_insert_plan", "point": "_point_current", "outcome": "run_record"}[point]
    setattr(repository, name, hang_after(getattr(repository, name)))
    repo.finish_run(run.id, status="promoted", reason=None, plan=(request, 1, plan, profile), promote=True)
    """
)
CHILD_APP = "fleetplan-killed-child"


def _child_url(url: str) -> str:
    """The child's URL; on PostgreSQL it names its connections, so the test can find its transaction."""
    return url if url.startswith("sqlite") else f"{url}?application_name={CHILD_APP}"


def _transaction_open(url: str) -> bool:
    """True while the child's promotion transaction is open and has written: on PostgreSQL its backend is
    `idle in transaction` with a transaction id (it wrote); on SQLite the write lock is taken, so another
    BEGIN IMMEDIATE fails at once."""
    if url.startswith("sqlite"):
        connection = sqlite3.connect(sa.make_url(url).database, timeout=0, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            return "locked" in str(error)
        finally:
            connection.close()
        return False
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT state, backend_xid FROM pg_stat_activity WHERE application_name = :app"),
            {"app": CHILD_APP},
        ).all()
    engine.dispose()
    return any(state == "idle in transaction" and xid is not None for state, xid in rows)


@pytest.mark.parametrize("point", ["insert", "point", "outcome"])
def test_sigkill_mid_promotion_loses_nothing_and_shows_no_partial_plan(
    database_url, two_plans, tmp_path, point
):
    (low_request, low), (high_request, high) = two_plans
    repo = open_repository(database_url, migrate=True)
    repo.put_fleet("f", low_request)
    run = repo.start_run("f")
    good = repo.finish_run(
        run.id, status="promoted", reason=None, plan=(low_request, 1, low, PROFILE), promote=True
    )
    (tmp_path / "request.json").write_bytes(encode(high_request))
    (tmp_path / "plan.json").write_bytes(encode(high))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", CHILD, _child_url(database_url)]
    argv += [str(tmp_path / "request.json"), str(tmp_path / "plan.json"), point]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        killed_run = int(child.stdout.readline().split()[1])
        line = child.stdout.readline()
        assert line.strip() == "in-transaction", child.stderr.read()
        # the kill comes inside the promotion's transaction, after it wrote: not before, not after
        assert _transaction_open(database_url)
        # a reader during the promotion sees the last committed state, complete
        during = repo.current_plan("f")
        assert during.id == good.plan_id
        assert during.plan == low
        assert [p.id for p in repo.list_plans("f")] == [good.plan_id]
        assert repo.get_run(killed_run).status == "running"  # alive: not declared abandoned
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
        child.stderr.close()
    repo.engine.dispose()
    after = open_repository(database_url)
    current = after.current_plan("f")
    assert current.id == good.plan_id
    assert current.plan == low
    assert current.state == "current"
    assert [p.id for p in after.list_plans("f")] == [good.plan_id]
    # the killed run's start was committed, its end was not; its process is gone, so it is marked failed
    killed = after.get_run(killed_run)
    assert killed.status == "failed"
    assert killed.reason.startswith(f"abandoned: its process stopped (pid {child.pid} on ")
    assert killed.plan_id is None
    assert [r.status for r in after.list_runs("f")] == ["failed", "promoted"]
    if after.engine.dialect.name == "sqlite":
        with after.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    # the store is usable again at once: no lock survives the killed writer
    retry = after.start_run("f")
    assert retry.status == "running"
    retry = after.finish_run(
        retry.id, status="promoted", reason=None, plan=(high_request, 1, high, PROFILE), promote=True
    )
    assert retry.status == "promoted"
    assert after.current_plan("f").plan == high
    after.engine.dispose()


# The writer promotes `low` and `high` in turn, N times: "finish" as fast as it can through the repository,
# "replan" through replan() itself, the fleet's rate switched between the two before each (no gate).
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fleetplan.models.codec import decode
    from fleetplan.models.plan import Plan, PlanRequest
    from fleetplan.models.store import GateSpec, ProfileSetRecord, ReplanRequest
    from fleetplan.replan import replan
    from fleetplan.store import open_repository

    url, folder, n, mode = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    plans = [
        (decode((folder / f"{k}-request.json").read_bytes(), PlanRequest),
         decode((folder / f"{k}-plan.json").read_bytes(), Plan))
        for k in ("high", "low")
    ]
    profile = ProfileSetRecord(name="inline", sha256="2" * 64, models=["m"], devices=["d"], created_at="t")
    repo = open_repository(url)
    print("ready", flush=True)
    for i in range(n):
        request, plan = plans[i % 2]
        if mode == "replan":
            repo.put_fleet("f", request)
            run = replan(repo, "f", ReplanRequest(gate=GateSpec(simulate=False)))
            assert run.status == "promoted", (run.status, run.reason)
            continue
        run = repo.start_run("f")
        stored = (request, 1, plan, profile)
        repo.finish_run(run.id, status="promoted", reason=None, plan=stored, promote=True)
    """
)


def _snapshot(engine: sa.Engine) -> dict:
    """Plans, pointer and runs of fleet "f" read in one snapshot (REPEATABLE READ on PostgreSQL)."""
    options = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}
    with engine.connect().execution_options(**options) as connection, connection.begin():
        plans = connection.exec_driver_sql("SELECT id, state, plan FROM plans ORDER BY id").all()
        pointer = connection.exec_driver_sql("SELECT plan_id FROM current_plans").scalar_one_or_none()
        runs = connection.exec_driver_sql("SELECT status, plan_id FROM runs ORDER BY id").all()
    return {"plans": plans, "pointer": pointer, "runs": runs}


def _check_whole(view: dict, rates: set[float]) -> None:
    """What a reader may see: every promotion whole, or not at all."""
    plans, pointer, runs = view["plans"], view["pointer"], view["runs"]
    current = [pid for pid, state, _ in plans if state == "current"]
    assert current == [pointer]  # one current plan, the one the pointer names
    assert all(state == "superseded" for pid, state, _ in plans if pid != pointer)
    promoted = [plan_id for status, plan_id in runs if status == "promoted"]
    assert promoted == [pid for pid, _, _ in plans]  # a plan exists exactly when its run is finished
    assert all(plan_id is None for status, plan_id in runs if status == "running")
    text = next(body for pid, _, body in plans if pid == pointer)
    assert decode(text.encode(), Plan).slo_rps in rates  # the current plan is complete


@pytest.mark.parametrize(("mode", "n"), [("finish", 40), ("replan", 4)])
def test_concurrent_readers_never_see_a_partial_promotion(database_url, two_plans, tmp_path, mode, n):
    """A writer process promotes n times (through the repository, or through whole re-plans); the test
    reads in one snapshot as often as it can meanwhile. Every read must show whole promotions, and the
    reads must see the writes happen (several states)."""
    (low_request, low), (high_request, high) = two_plans
    repo = open_repository(database_url, migrate=True)
    repo.put_fleet("f", low_request)
    first = repo.start_run("f")
    repo.finish_run(
        first.id, status="promoted", reason=None, plan=(low_request, 1, low, PROFILE), promote=True
    )
    for key, (request, result) in {"low": (low_request, low), "high": (high_request, high)}.items():
        (tmp_path / f"{key}-request.json").write_bytes(encode(request))
        (tmp_path / f"{key}-plan.json").write_bytes(encode(result))
    rates = {low.slo_rps, high.slo_rps}
    assert rates == {20.0, 30.0}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", WRITER, database_url, str(tmp_path), str(n), mode]
    writer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        while writer.poll() is None:
            view = _snapshot(repo.engine)
            _check_whole(view, rates)
            seen.add(len(view["plans"]))
            time.sleep(0.002)  # leave the writer a core
        assert writer.returncode == 0, writer.stderr.read()
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.stdout.close()
        writer.stderr.close()
    final = _snapshot(repo.engine)
    _check_whole(final, rates)
    assert len(final["plans"]) == n + 1
    assert len(seen) >= 3, sorted(seen)  # the reads overlapped the writes
    repo.engine.dispose()


def test_replan_twice_is_unchanged_on_both_databases(database_url):
    repo = open_repository(database_url, migrate=True)
    repo.put_fleet("tiny", tiny_request())
    order = ReplanRequest(gate=QUICK_GATE)
    first = replan(repo, "tiny", order)
    assert first.status == "promoted"
    assert first.gate.passed
    second = replan(repo, "tiny", order)
    assert second.status == "unchanged"
    assert second.plan_id == first.plan_id == repo.current_plan("tiny").id
    assert msgspec.to_builtins(second.diff)["moves"] == 0
    assert second.diff.pools == []
    assert second.diff.devices == []
    assert second.diff.classes == []
    repo.engine.dispose()


def test_two_writers_creating_one_fleet_do_not_fail(database_url, monkeypatch):
    """The race of two first PUTs of one fleet, made deterministic: the second writer's existence check
    runs before the first writer's row is visible (on PostgreSQL there is no row to lock yet), so its
    insert breaks the unique name; put_fleet tries once more and takes the update path."""
    import fleetplan.store.repository as repository

    repo = open_repository(database_url, migrate=True)
    repo.put_fleet("raced", tiny_request(rate_rps=20.0))  # the first writer won
    real, calls = repository._fleet_row, []

    def stale_then_real(db, name, *, lock=False):
        calls.append(name)
        return None if len(calls) == 1 else real(db, name, lock=lock)

    monkeypatch.setattr(repository, "_fleet_row", stale_then_real)
    second = repo.put_fleet("raced", tiny_request(rate_rps=30.0))
    assert len(calls) >= 2  # the first attempt really broke the unique name and was retried
    assert second.version == 2
    assert repo.get_fleet("raced").request.workloads[0].rate_rps == 30.0
    assert [f.name for f in repo.list_fleets()] == ["raced"]
    repo.engine.dispose()


def test_a_fleet_name_holding_a_slash_is_refused(tmp_path):
    """`fleetplan fleet put x/y` stored a fleet no HTTP route could reach (404 on /fleets/x/y)."""
    repo = open_repository(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    with pytest.raises(InputError, match="cannot hold '/'") as caught:
        repo.put_fleet("x/y", tiny_request())
    assert caught.value.field == "name"
    assert repo.put_fleet("x.y:z+1", tiny_request()).version == 1  # the other name characters stay
