"""A real `fleetplan serve` on 127.0.0.1 for the service benchmarks (bench/bounds.py, bench/load.py).

Started as `python -m fleetplan serve` from this checkout (PYTHONPATH set), stopped by pid, never left
running: `with running_server(env) as srv:` kills it (and its fork server and children) on the way out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    log_path: Path

    def descendants(self) -> list[int]:
        """Every live process under the server (its fork server, the solve children)."""
        return descendants(self.proc.pid)

    def workers(self) -> list[int]:
        """Processes two levels down: the fork server's children, i.e. the solve workers, busy or idle."""
        children = _children_map()
        return [grand for child in children.get(self.proc.pid, []) for grand in children.get(child, [])]

    def solving(self, window_s: float = 0.2) -> list[int]:
        """The workers still working: those whose CPU time grows over `window_s` (an idle worker sleeps on
        its pipe; a solve is CPU-bound)."""
        before = {pid: cpu_ms(pid) for pid in self.workers()}
        time.sleep(window_s)
        after = {pid: cpu_ms(pid) for pid in before}
        return [pid for pid, t in before.items() if t is not None and (after[pid] or 0.0) > t]

    def rss_kib(self) -> int:
        """Resident memory of the server process itself (KiB)."""
        return rss_kib(self.proc.pid)


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def cpu_ms(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None where there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    children, found, todo = _children_map(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def running_server(env: dict[str, str] | None = None, start_timeout_s: float = 120) -> Iterator[Server]:
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    log = tempfile.NamedTemporaryFile(prefix="fleetplan-serve-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "fleetplan", "serve", "--host", HOST, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    server = Server(proc, f"http://{HOST}:{port}", Path(log.name))
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                msg = f"server exited with {proc.returncode}: {server.log_path.read_text()[-2000:]}"
                raise RuntimeError(msg)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                msg = "server did not become healthy"
                raise RuntimeError(msg)
            time.sleep(0.2)
        yield server
    finally:
        stop(server)
        log.close()


def stop(server: Server, grace_s: float = 15) -> None:
    """SIGTERM by pid, then SIGKILL of the server and anything left under it."""
    leftovers = server.descendants()
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
