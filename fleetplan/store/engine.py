"""Where the database is and how to talk to it: the URL, the engine, and the migrations (docs/store.md).

SQLite by default: a file under the user's data directory, in WAL mode (readers never wait for the writer
and never see its uncommitted rows), foreign keys on, and write transactions begun with BEGIN IMMEDIATE so
two writers queue on the busy timeout instead of failing on a lock upgrade. PostgreSQL through
FLEETPLAN_DATABASE_URL=postgresql+psycopg://... for several API replicas.
"""

import os
import re
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
    directory created, and explicit BEGIN / BEGIN IMMEDIATE (pysqlite's own transaction handling off).
    A URL that names no database this installation can open raises StoreUnavailable (its password
    masked)."""
    raw = database_url(url)
    try:
        resolved = sa.make_url(raw)
        if resolved.get_backend_name() != "sqlite":
            return sa.create_engine(resolved, pool_pre_ping=True)
        if resolved.database and resolved.database != ":memory:":
            Path(resolved.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(resolved, connect_args={"timeout": SQLITE_BUSY_MS / 1000})
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError, OSError) as error:
        msg = f"cannot open the database {masked(raw)}: {error}"
        raise StoreUnavailable(msg) from error
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


# query parameters of a database URL that carry a secret (libpq's `password`, `sslpassword`, ...)
SECRET_QUERY = re.compile(r"pass|pwd|secret|token|key", re.IGNORECASE)


def masked(url: str | sa.URL) -> str:
    """A database URL fit for a message or a log: its password, and any query parameter that carries one
    (`?password=...`, which libpq takes too), replaced by ***."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return "<an unparsable database URL>"
    hidden = {k: "***" if SECRET_QUERY.search(k) else v for k, v in parsed.query.items()}
    return parsed.set(query=hidden).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def unavailable(engine: Engine, doing: str, error: Exception) -> StoreUnavailable:
    """The StoreUnavailable (HTTP 503, CLI exit 1) for a database error met while `doing`."""
    detail = getattr(error, "orig", None) or error
    return StoreUnavailable(f"cannot {doing} the database {masked(engine.url)}: {detail}")


# what the database (not the code) can raise: unreachable, locked, not a database, at an unknown revision
DATABASE_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DatabaseError, OSError)
# one key for PostgreSQL's advisory lock around migrations (any constant; "fleetplan" in ASCII)
MIGRATION_LOCK = 0x666C656574706C61


def alembic_config(engine: Engine):
    """An Alembic Config for the migrations shipped inside this package (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolates %: a percent-encoded password (p%40ss) must reach Alembic as %%
    url = engine.url.render_as_string(hide_password=False).replace("%", "%%")
    config.set_main_option("sqlalchemy.url", url)
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Apply the migrations up to `revision` and return the database's revision afterwards. On
    PostgreSQL a transaction-scoped advisory lock makes replicas that start together migrate one after
    the other (the later ones find the work done). Raises StoreUnavailable for what the database, not the
    code, got wrong: unreachable, not a database, or at a revision this fleetplan does not know."""
    from alembic import command
    from alembic.util.exc import CommandError

    config = alembic_config(engine)
    try:
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
            connection.commit()
    except CommandError as error:
        raise _unknown_revision(engine, error) from error
    except DATABASE_ERRORS as error:
        raise unavailable(engine, "migrate", error) from error
    return current_revision(engine)


def is_unavailable(error: sa.exc.DBAPIError) -> bool:
    """Whether a driver error is the database's state (unreachable, locked, not a database) rather than
    a statement's (an integrity or programming error, which is the code's and stays what it is)."""
    return (
        isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError)
        or type(error) is sa.exc.DatabaseError
    )


def known_revision(engine: Engine, revision: str | None) -> bool:
    """Whether `revision` is one of the migrations shipped with this fleetplan (None: before the first)."""
    from alembic.script import ScriptDirectory

    if revision is None:
        return True
    script = ScriptDirectory.from_config(alembic_config(engine))
    return revision in {r.revision for r in script.walk_revisions()}


def _unknown_revision(engine: Engine, error: Exception) -> StoreUnavailable:
    msg = (
        f"cannot migrate the database {masked(engine.url)}: {error}; it was migrated by a newer fleetplan "
        "(upgrade fleetplan), or its alembic_version table was edited"
    )
    return StoreUnavailable(msg)


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
    "DATABASE_ERRORS",
    "current_revision",
    "database_url",
    "default_sqlite_url",
    "head_revision",
    "is_unavailable",
    "known_revision",
    "make_engine",
    "masked",
    "unavailable",
    "upgrade",
]
