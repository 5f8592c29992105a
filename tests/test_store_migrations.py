"""Migrations on real databases: 0001 -> 0002 (run owner and heartbeat) with data in the tables, and a
migration that fails half-way leaves the database as it was, data and revision, on SQLite and PostgreSQL."""

import shutil

import pytest
import sqlalchemy as sa
from postgres_server import database_url_fixture, postgres_root_url_fixture  # noqa: F401 (fixtures)
from store_helpers import tiny_request

from fleetplan.models.errors import StoreUnavailable
from fleetplan.models.store import ProfileSetRecord
from fleetplan.solver.pipeline import plan
from fleetplan.store import Repository, engine, make_engine, open_repository, upgrade
from fleetplan.store.engine import current_revision
from fleetplan.store.repository import _insert_plan

PROFILE = ProfileSetRecord(name="inline", sha256="0" * 64, models=["m"], devices=["d"], created_at="t")
OLD_START = "2026-01-02T03:04:05.000006+00:00"
RUN_COLUMNS_0001 = [
    "id", "fleet_id", "started_at", "finished_at", "status", "reason", "plan_id", "previous_plan_id",
    "diff", "forecast", "gate", "dry_run",
]  # fmt: skip


def _fill_at_0001(url: str) -> sa.Engine:
    """A database at revision 0001 holding a fleet, a promoted plan, a finished run and a run left
    `running` by a process that was killed before 0002 existed."""
    db = make_engine(url)
    assert upgrade(db, "0001") == "0001"
    repo = Repository(db)
    request = tiny_request()
    repo.put_fleet("old", request)  # fleets and fleet_versions are the same at 0001
    result = plan(request, with_baselines=False)
    runs = sa.table("runs", *(sa.column(c) for c in RUN_COLUMNS_0001))
    with db.begin() as connection:
        fleet_id = connection.exec_driver_sql("SELECT id FROM fleets WHERE name = 'old'").scalar_one()
        plan_id = _insert_plan(connection, fleet_id, (request, 1, result, PROFILE), "current")
        connection.exec_driver_sql(
            f"INSERT INTO current_plans (fleet_id, plan_id, promoted_at) VALUES ({fleet_id}, {plan_id}, 'x')"
        )
        finished = dict(
            started_at="2026-01-01T00:00:00+00:00",
            finished_at="2026-01-01T00:01:00+00:00",
            status="promoted",
            plan_id=plan_id,
            previous_plan_id=None,
        )
        killed = dict(
            started_at=OLD_START, finished_at=None, status="running", plan_id=None, previous_plan_id=plan_id
        )
        empty = dict(fleet_id=fleet_id, reason=None, diff=None, forecast=None, gate=None, dry_run=False)
        connection.execute(runs.insert(), [{**empty, **finished}, {**empty, **killed}])
    return db


def _dump(db: sa.Engine) -> dict[str, list]:
    """Every row of every table of revision 0001, in key order (the 0001 columns of runs)."""
    tables = {
        "fleets": "id",
        "fleet_versions": "fleet_id, version",
        "profile_sets": "id",
        "plans": "id",
        "current_plans": "fleet_id",
    }
    with db.connect() as connection:
        out = {
            t: connection.exec_driver_sql(f"SELECT * FROM {t} ORDER BY {k}").all() for t, k in tables.items()
        }
        out["runs"] = connection.exec_driver_sql(
            f"SELECT {', '.join(RUN_COLUMNS_0001)} FROM runs ORDER BY id"
        ).all()
    return {t: [tuple(r) for r in rows] for t, rows in out.items()}


def _run_columns(db: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(db).get_columns("runs")}


def test_upgrade_0001_to_0002_keeps_every_row_and_backfills_the_heartbeat(database_url):
    db = _fill_at_0001(database_url)
    before = _dump(db)
    assert {"owner", "owner_key", "heartbeat_at"}.isdisjoint(_run_columns(db))
    assert upgrade(db) == "0002"
    db.dispose()
    assert _dump(db) == before
    assert {"owner", "owner_key", "heartbeat_at"} <= _run_columns(db)
    with db.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT started_at, heartbeat_at, owner FROM runs ORDER BY id"
        ).all()
    assert [(r.heartbeat_at, r.owner) for r in rows] == [(r.started_at, None) for r in rows]
    # the run a killed pre-0002 process left `running` is past its lease: the next listing marks it failed
    repo = open_repository(database_url)
    listed = repo.list_runs("old")
    assert [r.status for r in listed] == ["failed", "promoted"]
    assert listed[0].reason == (
        f"abandoned: no heartbeat from an unrecorded process since {OLD_START} (lease 300 s)"
    )
    assert repo.current_plan("old").id == before["current_plans"][0][1]
    repo.engine.dispose()
    db.dispose()


def test_a_migration_that_fails_half_way_changes_nothing(database_url, tmp_path, monkeypatch):
    """A revision 0003 that fails after 0002's columns were added and the heartbeat backfilled: the one
    transaction of the upgrade rolls back, so the database is at 0001 with its rows and without the new
    columns, and the real upgrade then works."""
    db = _fill_at_0001(database_url)
    before = _dump(db)
    broken = tmp_path / "migrations"
    shutil.copytree(engine.MIGRATIONS, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "versions" / "0003_broken.py").write_text(
        '"""A revision that fails half-way."""\n'
        "import sqlalchemy as sa\nfrom alembic import op\n\n"
        'revision = "0003"\ndown_revision = "0002"\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade():\n"
        '    op.add_column("fleets", sa.Column("broken", sa.Integer, nullable=True))\n'
        "    op.execute(\"UPDATE runs SET status = 'vandalized'\")\n"
        '    raise RuntimeError("half-way")\n\n\n'
        "def downgrade():\n    pass\n"
    )
    monkeypatch.setattr(engine, "MIGRATIONS", broken)
    with pytest.raises(RuntimeError, match="half-way"):
        upgrade(db)
    db.dispose()
    assert current_revision(db) == "0001"
    assert _dump(db) == before
    assert {"owner", "owner_key", "heartbeat_at"}.isdisjoint(_run_columns(db))
    assert "broken" not in {c["name"] for c in sa.inspect(db).get_columns("fleets")}
    monkeypatch.undo()
    assert upgrade(db) == "0002"
    assert _dump(db) == before
    db.dispose()


def test_the_shipped_migrations_are_the_tables(tmp_path):
    """Alembic's autogenerate finds nothing to add: the migrations create exactly store.tables."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from fleetplan.store.tables import metadata

    db = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    upgrade(db)
    with db.connect() as connection:
        changes = compare_metadata(MigrationContext.configure(connection), metadata)
    assert changes == []
    db.dispose()


def test_databases_that_cannot_be_used_are_named_not_tracebacks(tmp_path):
    """Each raised a raw SQLAlchemy, Alembic or OS error before (a traceback on the CLI, a 500 over HTTP)."""
    fresh = f"sqlite:///{tmp_path / 'newer.db'}"
    upgrade(make_engine(fresh))
    with make_engine(fresh).begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")
    with pytest.raises(StoreUnavailable, match="'0099'.*migrated by a newer fleetplan"):
        open_repository(fresh, migrate=True)
    with pytest.raises(StoreUnavailable, match="at revision 0099, code expects .*upgrade fleetplan"):
        open_repository(fresh)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database " * 512)
    with pytest.raises(StoreUnavailable, match="file is not a database"):
        open_repository(f"sqlite:///{garbage}", migrate=True)
    with pytest.raises(StoreUnavailable, match="cannot open the database foo://bar"):
        make_engine("foo://bar")


def test_a_percent_encoded_password_reaches_alembic_and_no_message_shows_it():
    """ConfigParser read the % of p%40ss as interpolation: every store command failed, and its traceback
    printed the password."""
    url = "postgresql+psycopg://fpu:p%40ss%25w%3Ard@127.0.0.1:1/fp"
    db = make_engine(url)
    config = engine.alembic_config(db)
    assert sa.make_url(config.get_main_option("sqlalchemy.url")).password == "p@ss%w:rd"
    with pytest.raises(StoreUnavailable) as caught:
        upgrade(db)  # nothing listens on port 1
    assert "fpu:***@127.0.0.1:1/fp" in str(caught.value)
    assert "p@ss" not in str(caught.value)
    assert "p%40ss" not in str(caught.value)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_replicas_starting_together_migrate_a_fresh_database_once(database_url):
    """Four `db upgrade`s at once on a fresh PostgreSQL database: before the advisory lock, the losers
    crashed with DuplicateTable or UniqueViolation in 2 of 4 trials."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        revisions = list(pool.map(lambda _: upgrade(make_engine(database_url)), range(4)))
    assert len(set(revisions)) == 1
    assert revisions[0] == current_revision(make_engine(database_url))


def test_a_password_in_the_urls_query_reaches_no_message():
    """libpq takes `?password=` too; masked() hid only `user:pass@`, so a password given in the query went
    into every log line and every 503 an anonymous client could read (session 34's operator test)."""
    url = "postgresql+psycopg://fpu@127.0.0.1:1/fp?password=QuerySecretPW&sslmode=disable&sslpassword=k3y"
    assert (
        engine.masked(url)
        == "postgresql+psycopg://fpu@127.0.0.1:1/fp?password=***&sslmode=disable&sslpassword=***"
    )
    with pytest.raises(StoreUnavailable) as caught:
        upgrade(make_engine(url))  # nothing listens on port 1
    assert "QuerySecretPW" not in str(caught.value)
    assert "k3y" not in str(caught.value)
    assert "password=***" in str(caught.value)
