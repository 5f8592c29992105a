"""Where the database is and how to talk to it: the URL, the engine, and the migrations (docs/store.md).

SQLite by default: a file under the user's data directory, in WAL mode (readers never wait for the writer
and never see its uncommitted rows), foreign keys on, and write transactions begun with BEGIN IMMEDIATE so
two writers queue on the busy timeout instead of failing on a lock upgrade. PostgreSQL through
FLEETPLAN_DATABASE_URL=postgresql+psycopg://... for several API replicas.
"""

import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleetplan.models.errors import StoreUnavailable

DATABASE_ENV = "FLEETPLAN_DATABASE_URL"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# how long a writer waits for another writer's transaction on SQLite (ms)
SQLITE_BUSY_MS = 30_000
# the execution option that makes a transaction begin as a writer (BEGIN IMMEDIATE on SQLite)
WRITE_OPTION = "fleetplan_write"


def default_sqlite_url() -> str:
    """An SQLite file in the user's data directory (platformdirs), e.g. ~/.local/share/fleetplan/."""
    import platformdirs

    directory = Path(platformdirs.user_data_dir("fleetplan", appauthor=False))
    return f"sqlite:///{directory / 'fleetplan.db'}"


def database_url(url: str | None = None) -> str:
    """The database URL: `url` when given, else $FLEETPLAN_DATABASE_URL, else the default SQLite file."""
    return url or os.environ.get(DATABASE_ENV) or default_sqlite_url()


def make_engine(url: str | None = None) -> Engine:
    """An engine for `database_url(url)`; SQLite gets WAL, foreign keys, a busy timeout, its parent
    directory created, and explicit BEGIN / BEGIN IMMEDIATE (pysqlite's own transaction handling off)."""
    resolved = sa.make_url(database_url(url))
    if resolved.get_backend_name() != "sqlite":
        return sa.create_engine(resolved, pool_pre_ping=True)
    if resolved.database and resolved.database != ":memory:":
        Path(resolved.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(resolved, connect_args={"timeout": SQLITE_BUSY_MS / 1000})
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    sa.event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None  # BEGIN is ours (_sqlite_on_begin), not the driver's
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


def _sqlite_on_begin(connection) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def alembic_config(engine: Engine):
    """An Alembic Config for the migrations shipped inside this package (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Apply the migrations up to `revision` and return the database's revision afterwards."""
    from alembic import command

    config = alembic_config(engine)
    try:
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
            connection.commit()
    except sa.exc.OperationalError as error:
        msg = f"cannot migrate the database at {engine.url!r}: {error.orig}"
        raise StoreUnavailable(msg) from error
    return current_revision(engine)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision(engine: Engine) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


__all__ = [
    "DATABASE_ENV",
    "current_revision",
    "database_url",
    "default_sqlite_url",
    "head_revision",
    "make_engine",
    "upgrade",
]
