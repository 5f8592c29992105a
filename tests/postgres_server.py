"""A throwaway PostgreSQL server for the store tests: initdb in a temporary directory, pg_ctl start on
127.0.0.1 and a free port, stopped (and the directory removed) afterwards. As root the server runs as the
`postgres` system user (PostgreSQL refuses root)."""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
