"""A throwaway PostgreSQL server for the store tests: initdb in a temporary directory, pg_ctl start on
127.0.0.1 and a free port, stopped (and the directory removed) afterwards. As root the server runs as the
`postgres` system user (PostgreSQL refuses root).

Also the two fixtures the store tests share (import both `*_fixture` functions into a test module):
`postgres_root_url` (one server per module) and `database_url` (a fresh empty database, parametrized:
an SQLite file, and a new database on that server)."""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

START_TIMEOUT_S = 30


def find_bindir() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, or the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    for candidate in reversed(candidates):
        if (Path(candidate) / "pg_ctl").exists() and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@contextlib.contextmanager
def postgres_server(bindir: Path) -> Iterator[str]:
    """Yield a postgresql+psycopg URL of a fresh server; stop it and remove its files afterwards."""
    root = Path(tempfile.mkdtemp(prefix="fleetplan-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        root.chmod(0o700)
    port = _free_port()
    run = dict(check=True, capture_output=True, timeout=START_TIMEOUT_S)
    try:
        subprocess.run(
            _as_server_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            **run,
        )
        options = f"-p {port} -h 127.0.0.1 -k {root} -c fsync=off -c full_page_writes=off"
        subprocess.run(
            _as_server_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(root / "log"),
                    "-w",
                    "start",
                ]
            ),
            **run,
        )
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                _as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                check=False,
                capture_output=True,
                timeout=START_TIMEOUT_S,
            )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", name="postgres_root_url")
def postgres_root_url_fixture():
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql")
    with postgres_server(bindir) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"], name="database_url")
def database_url_fixture(request, tmp_path):
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
