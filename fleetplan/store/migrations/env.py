"""Alembic environment: runs on the connection store.engine.upgrade hands over (or the configured URL)."""

from alembic import context

from fleetplan.store.tables import metadata

# imported outside a migration run (e.g. by a walk over every module) there is no config and nothing to run
try:
    config = context.config
except (NameError, AttributeError):
    config = None


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from fleetplan.store.engine import make_engine

        with make_engine(config.get_main_option("sqlalchemy.url")).connect() as own:
            _run(own)
            own.commit()
        return
    _run(connection)


def _run(connection) -> None:
    """Every pending revision in one transaction: a failure anywhere rolls all of them back, rows and
    revision. SQLite's DDL is transactional too (the engine begins every transaction itself, BEGIN
    IMMEDIATE), but Alembic assumes it is not and would commit after each revision: hence transactional_ddl.
    """
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transactional_ddl=True,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if config is not None:
    if context.is_offline_mode():
        raise SystemExit("offline (SQL script) migrations are not supported; run `fleetplan db upgrade`")
    run_migrations_online()
