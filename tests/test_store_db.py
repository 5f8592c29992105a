"""The store against real databases: an SQLite file and a PostgreSQL server the tests start themselves.

Migrations, versioned fleets, paging, promotion in one transaction, and a promotion killed with SIGKILL in
the middle of its transaction while a reader looks on.
"""

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa
from postgres_server import find_bindir, postgres_server
from store_helpers import QUICK_GATE, tiny_request

from fleetplan.models.codec import encode
from fleetplan.models.errors import NotFound
from fleetplan.models.store import ProfileSetRecord, ReplanRequest
from fleetplan.replan import replan
from fleetplan.solver.pipeline import plan
from fleetplan.store import Repository, make_engine, open_repository
from fleetplan.store.engine import current_revision, head_revision

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ProfileSetRecord(name="inline", sha256="0" * 64, models=["m"], devices=["d"], created_at="t")


@pytest.fixture(scope="module")
def postgres_root_url():
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql")
    with postgres_server(bindir) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """A fresh, empty database: an SQLite file in tmp_path, or a new database on the test server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    root = request.getfixturevalue("postgres_root_url")
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(root, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    yield root.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    admin.dispose()


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
    assert current_revision(engine) == head_revision(engine) == "0001"
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


# The child promotes `high` over the current plan; _point_current (the last write of the promotion's one
# transaction) is wrapped so that the child reports and then hangs with the transaction still open.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fleetplan.models.codec import decode
    from fleetplan.models.plan import Plan, PlanRequest
    from fleetplan.models.store import ProfileSetRecord
    from fleetplan.store import open_repository, repository

    url, request_file, plan_file = sys.argv[1:4]
    request = decode(Path(request_file).read_bytes(), PlanRequest)
    plan = decode(Path(plan_file).read_bytes(), Plan)
    profile = ProfileSetRecord(name="inline", sha256="1" * 64, models=["m"], devices=["d"], created_at="t")
    original = repository._point_current

    def point_and_hang(*args):
        original(*args)
        print("in-transaction", flush=True)
        time.sleep(120)

    repository._point_current = point_and_hang
    repo = open_repository(url)
    run = repo.start_run("f")
    repo.finish_run(run.id, status="promoted", reason=None, plan=(request, 1, plan, profile), promote=True)
    """
)


def test_sigkill_mid_promotion_loses_nothing_and_shows_no_partial_plan(database_url, two_plans, tmp_path):
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
    argv = [
        sys.executable,
        "-c",
        CHILD,
        database_url,
        str(tmp_path / "request.json"),
        str(tmp_path / "plan.json"),
    ]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline()
        assert line.strip() == "in-transaction", child.stderr.read()
        # a reader during the promotion sees the last committed state, complete
        during = repo.current_plan("f")
        assert during.id == good.plan_id
        assert during.plan == low
        assert [p.id for p in repo.list_plans("f")] == [good.plan_id]
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
    statuses = sorted(r.status for r in after.list_runs("f"))
    assert statuses == ["promoted", "running"]  # the killed run's start was committed, its end was not
    if after.engine.dialect.name == "sqlite":
        with after.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    # the store is usable again at once: no lock survives the killed writer
    retry = after.start_run("f")
    retry = after.finish_run(
        retry.id, status="promoted", reason=None, plan=(high_request, 1, high, PROFILE), promote=True
    )
    assert after.current_plan("f").plan == high
    after.engine.dispose()


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
