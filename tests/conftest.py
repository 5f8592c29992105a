"""Test-suite setup: make the project root and tests/ importable however pytest is started."""

import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
for _path in (_TESTS.parent, _TESTS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


# No test reads or writes the user's candidate cache (~/.cache/fleetplan/candidates, which the `fleetplan`
# command turns on): the suite's cold builds stay cold, and tests of the disk cache name their own directory.
os.environ["FLEETPLAN_CANDIDATE_CACHE"] = "off"


@pytest.fixture(autouse=True, scope="session")
def _own_database(tmp_path_factory: pytest.TempPathFactory):
    """No test touches the user's own store (~/.local/share/fleetplan/fleetplan.db, the default): every
    test process gets a fresh SQLite file, unless the caller set FLEETPLAN_DATABASE_URL; tests that need
    a database of their own still set it themselves (their env or monkeypatch wins over this)."""
    if "FLEETPLAN_DATABASE_URL" in os.environ:
        yield
        return
    path = tmp_path_factory.mktemp("store") / "fleetplan.db"
    os.environ["FLEETPLAN_DATABASE_URL"] = f"sqlite:///{path}"
    try:
        yield
    finally:
        os.environ.pop("FLEETPLAN_DATABASE_URL", None)
