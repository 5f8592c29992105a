"""The database of fleets, plans and runs (docs/store.md): engine and URL, migrations, a repository."""

from fleetplan.store.engine import DATABASE_ENV, database_url, make_engine, upgrade
from fleetplan.store.repository import Repository


def open_repository(url: str | None = None, *, migrate: bool = False) -> Repository:
    """A Repository on `database_url(url)`; `migrate` applies the migrations first, else the database
    must already be at the newest revision (StoreUnavailable otherwise)."""
    engine = make_engine(url)
    if migrate:
        upgrade(engine)
    repository = Repository(engine)
    repository.check_migrated()
    return repository


__all__ = ["DATABASE_ENV", "Repository", "database_url", "make_engine", "open_repository", "upgrade"]
