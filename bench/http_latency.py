"""HTTP latency of POST /plan on the S instance (fleetplan/fixtures/requests/paper.json) against the
real server.

Starts `fleetplan serve --host 127.0.0.1 --port <free port>` as a subprocess, waits for GET /health, sends
one warm-up POST (not counted: the first request pays lazy imports), then N sequential POSTs with httpx
(each with a timeout), and reports p50/p90/p99/max client-side latency with a breakdown from the Plan's
solver.build_ms / solver.solve_ms and the answer's `Server-Timing: plan;dur=` (solver.plan's own time in
the worker): the overhead of the service is the client wall time less that. For reference it also times
GET /health (the HTTP floor) and, in this process, solver.plan() on the same request (the pipeline without
HTTP, JSON or the worker). The server is stopped in a finally block.

`--base DIR` also starts the server of another checkout (e.g. /work/main) and alternates the timed POSTs
between the two (one to each, in turn), so that both see the same load; its numbers go under "base".

    python -m bench.http_latency [-n 50] [--timeout 30] [--inprocess 10] [--request PATH] [--base DIR]

Writes bench/results/http_latency-<UTC timestamp>.json and bench/results/http_latency-latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import httpx

from bench.record import git_info, git_line, machine_info, machine_line, write_results
from bench.server import cpu_ms
from bench.solver_scaling import shown, table
from fleetplan import fixtures

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "bench" / "results"
MAX_N = 1000
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_command(port: int) -> list[str]:
    """`python -m fleetplan serve`, run from the repository root: the fleetplan of this checkout (the venv's
    `fleetplan` script would import whichever checkout the venv was installed from)."""
    serve = ["serve", "--host", HOST, "--port", str(port), "--log-level", "warning"]
    return [sys.executable, "-m", "fleetplan", *serve]


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "min": min(values),
        "mean": statistics.fmean(values),
    }


def wait_healthy(client: httpx.Client, base: str, proc: subprocess.Popen, deadline_s: float) -> float:
    began = time.perf_counter()
    while time.perf_counter() - began < deadline_s:
        if proc.poll() is not None:
            msg = f"server exited with code {proc.returncode} before /health answered"
            raise RuntimeError(msg)
        try:
            if client.get(f"{base}/health", timeout=1.0).status_code == 200:
                return (time.perf_counter() - began) * 1e3
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    msg = f"/health did not answer within {deadline_s} s"
    raise RuntimeError(msg)


def in_process(path: Path, n: int) -> dict:
    """solver.plan on the same request in this process (after one warm-up), for the HTTP overhead."""
    from fleetplan.models.codec import read_request
    from fleetplan.solver import plan

    request = read_request(path)
    plan(request)
    times = []
    for _ in range(n):
        began = time.perf_counter()
        plan(request)
        times.append((time.perf_counter() - began) * 1e3)
    return stats(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--requests", type=int, default=50, help=f"timed POSTs (1..{MAX_N})")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    parser.add_argument("--health", type=int, default=20, help="GET /health requests for the HTTP floor")
    parser.add_argument("--inprocess", type=int, default=10, help="in-process solver.plan() runs (0: skip)")
    parser.add_argument("--request", type=Path, default=fixtures.request_path("paper"))
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--base", type=Path, help="another checkout whose server is timed alternately")
    return parser.parse_args(argv)


@dataclass
class Measurements:
    """What one run against the server measured; times in ms."""

    startup_ms: float = 0.0  # until GET /health answered
    warmup_ms: float = 0.0  # the uncounted first POST /plan
    health_ms: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # client wall time of each answered POST /plan
    build: list[float] = field(default_factory=list)  # the Plans' solver.build_ms
    solve: list[float] = field(default_factory=list)  # the Plans' solver.solve_ms
    plan: list[float] = field(default_factory=list)  # Server-Timing plan;dur: solver.plan in the worker
    errors: list[str] = field(default_factory=list)
    statuses: set[str] = field(default_factory=set)
    tie_breaks: set[str | None] = field(default_factory=set)
    response_bytes: int | None = None  # of the last answered POST
    server_cpu_before: float | None = None  # server utime + stime around the timed POSTs
    server_cpu_after: float | None = None


def warm_up(client: httpx.Client, base: str, body: bytes, timeout: float) -> float:
    """One POST /plan that pays the lazy imports; its ms. Raises unless it answers 200."""
    began = time.perf_counter()
    warm = client.post(f"{base}/plan", content=body, timeout=timeout)
    warmup_ms = (time.perf_counter() - began) * 1e3
    if warm.status_code != 200:
        msg = f"warm-up POST /plan answered {warm.status_code}: {warm.text[:500]}"
        raise RuntimeError(msg)
    return warmup_ms


def time_health(client: httpx.Client, base: str, count: int, timeout: float) -> list[float]:
    """`count` sequential GET /health, ms each: the HTTP floor."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        client.get(f"{base}/health", timeout=timeout)
        times.append((time.perf_counter() - began) * 1e3)
    return times


def server_timing_ms(header: str | None, name: str = "plan") -> float | None:
    """`dur` of metric `name` in a Server-Timing header ("plan;dur=12.3"); None if absent."""
    for metric in (header or "").split(","):
        parts = [p.strip() for p in metric.split(";")]
        if parts[0] == name:
            for param in parts[1:]:
                if param.startswith("dur="):
                    return float(param[4:])
    return None


def time_plan(client: httpx.Client, base: str, body: bytes, timeout: float, m: Measurements) -> None:
    """One POST /plan into `m`: wall time, the Plan's solver times and Server-Timing, or the error."""
    began = time.perf_counter()
    try:
        response = client.post(f"{base}/plan", content=body, timeout=timeout)
    except httpx.HTTPError as error:
        m.errors.append(f"request {len(m.latencies) + len(m.errors)}: {type(error).__name__}: {error}")
        return
    elapsed = (time.perf_counter() - began) * 1e3
    if response.status_code != 200:
        m.errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
        return
    answer = response.json()
    m.latencies.append(elapsed)
    m.build.append(answer["solver"]["build_ms"])
    m.solve.append(answer["solver"]["solve_ms"])
    plan_ms = server_timing_ms(response.headers.get("server-timing"))
    if plan_ms is not None:
        m.plan.append(plan_ms)
    m.statuses.add(answer["status"])
    m.tie_breaks.add(answer["solver"].get("tie_break"))
    m.response_bytes = len(response.content)


@dataclass
class Server:
    """One `fleetplan serve` of a checkout, and what was measured against it."""

    root: Path
    proc: subprocess.Popen
    log: IO[bytes]
    url: str
    m: Measurements = field(default_factory=Measurements)
    server_log: str = ""


def start_server(root: Path) -> Server:
    port = free_port()
    log = tempfile.TemporaryFile()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(server_command(port), cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Server(root, proc, log, f"http://{HOST}:{port}")


def measure(servers: list[Server], body: bytes, n: int, args: argparse.Namespace) -> None:
    """Wait for each server, warm it up, time GET /health, then time `n` POST /plan on each (alternating
    between servers, each going first in turn) with the servers' CPU time."""
    with httpx.Client(headers={"content-type": "application/json"}) as client:
        for server in servers:
            m = server.m
            m.startup_ms = wait_healthy(client, server.url, server.proc, deadline_s=60.0)
            print(f"server of {server.root} up on {server.url} in {m.startup_ms:.0f} ms", flush=True)
            m.warmup_ms = warm_up(client, server.url, body, args.timeout)
            m.health_ms = time_health(client, server.url, args.health, args.timeout)
            m.server_cpu_before = cpu_ms(server.proc.pid)
        for i in range(n):
            for server in servers if i % 2 == 0 else servers[::-1]:
                time_plan(client, server.url, body, args.timeout, server.m)
        for server in servers:
            server.m.server_cpu_after = cpu_ms(server.proc.pid)


def stop_server(proc: subprocess.Popen, log: IO[bytes]) -> str:
    """Terminate (then kill) the server; the tail of its log."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.seek(0)
    server_log = log.read().decode(errors="replace")[-4000:]
    log.close()
    return server_log


def server_cpu_per_request(m: Measurements) -> float | None:
    """Mean server CPU ms per timed POST; None without /proc or without an answered POST."""
    if m.server_cpu_before is None or m.server_cpu_after is None or not m.latencies:
        return None
    return (m.server_cpu_after - m.server_cpu_before) / (len(m.latencies) + len(m.errors))


def summary(m: Measurements) -> dict:
    """The numbers of one server's run; ms."""
    other = [t - b - s for t, b, s in zip(m.latencies, m.build, m.solve, strict=True)]
    overhead = (
        [t - p for t, p in zip(m.latencies, m.plan, strict=True)] if len(m.plan) == len(m.latencies) else []
    )
    return {
        "ok": len(m.latencies),
        "errors": m.errors,
        "statuses": sorted(m.statuses),
        "tie_breaks": sorted(t or "-" for t in m.tie_breaks),
        "response_bytes": m.response_bytes if m.latencies else None,
        "startup_ms": m.startup_ms,
        "warmup_ms": m.warmup_ms,
        "latency_ms": stats(m.latencies),
        "solver_build_ms": stats(m.build),
        "solver_solve_ms": stats(m.solve),
        "other_ms": stats(other),
        "plan_in_worker_ms": stats(m.plan),
        "overhead_ms": stats(overhead),
        "health_ms": stats(m.health_ms),
        "server_cpu_ms_per_request": server_cpu_per_request(m),
        "raw": {"latency_ms": m.latencies, "build_ms": m.build, "solve_ms": m.solve, "plan_ms": m.plan},
    }


def _rows(label: str, part: dict) -> list[list[str]]:
    keys = ["p50", "p90", "p99", "max"]

    def row(name: str, numbers: dict) -> list[str]:
        return [name, *(f"{numbers[k]:.1f}" if numbers.get("n") else "-" for k in keys)]

    return [
        row(f"{label}POST /plan (client wall)", part["latency_ms"]),
        row("  solver.build_ms", part["solver_build_ms"]),
        row("  solver.solve_ms", part["solver_solve_ms"]),
        row("  rest (wall - build - solve)", part["other_ms"]),
        row("  plan() in the worker (Server-Timing)", part["plan_in_worker_ms"]),
        row("  overhead (wall - plan() in the worker)", part["overhead_ms"]),
        row(f"{label}GET /health (HTTP floor)", part["health_ms"]),
    ]


def report_text(result: dict, timeout: float) -> str:
    """The human summary of a result: the run in words, then the latency table (and the base's)."""
    keys = ["p50", "p90", "p99", "max"]
    local = result["in_process_plan_ms"]
    base = result.get("base")
    rows = _rows("", result)
    if base:
        rows += _rows(f"base {base['git']['commit']}: ", base)
    if local.get("n"):
        rows.append(["solver.plan() in-process", *(f"{local[k]:.1f}" for k in keys)])
    load_end = result["loadavg_at_end"]

    def cpu(part: dict) -> str:
        value = part["server_cpu_ms_per_request"]
        return "-" if value is None else f"{value:.1f} ms"

    return "\n".join(
        [
            f"HTTP latency  |  {result['utc']}  |  {git_line(result['git'])}",
            f"Machine: {machine_line(result['machine'])}",
            f"POST {result['request']} ({result['request_bytes']} B) x {result['n']} sequential, "
            f"timeout {timeout:g} s; "
            f"ok {result['ok']}, errors {len(result['errors'])}; "
            f"status {', '.join(result['statuses']) or '-'}"
            + (f"; base {base['root']}: ok {base['ok']}, errors {len(base['errors'])}" if base else ""),
            f"server startup {result['startup_ms']:.0f} ms, "
            f"warm-up request {result['warmup_ms']:.0f} ms (not counted); "
            f"in-process solver.plan() x {local.get('n', 0)}; "
            f"load avg at end {load_end[0] if load_end else '?'}",
            "server CPU per POST (mean, utime+stime of the server process): "
            + cpu(result)
            + (f"; base {cpu(base)}" if base else ""),
            "",
            table(["ms", *keys], rows),
            "",
            f"target p50 <= 25 ms: {'met' if result['latency_ms'].get('p50', 1e9) <= 25 else 'missed'}"
            + (f" (p50 {result['latency_ms']['p50']:.1f} ms)" if result["ok"] else ""),
        ]
    )


def _write(out: Path, stamp: datetime, result: dict) -> None:
    path = write_results("http_latency", result, out, stamp=stamp)
    print(f"\nwrote {shown(path)} and http_latency-latest.json")


def _base_git(root: Path) -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    )
    return {"commit": commit.stdout.strip() or None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = max(1, min(args.requests, MAX_N))

    stamp = datetime.now(UTC)
    meta = {"utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine_info(), "git": git_info()}
    print(f"machine: {machine_line(meta['machine'])}", flush=True)
    body = args.request.read_bytes()
    servers: list[Server] = []
    try:
        for root in [ROOT, *([args.base.resolve()] if args.base else [])]:
            servers.append(start_server(root))
        measure(servers, body, n, args)
    finally:
        for server in servers:
            server.server_log = stop_server(server.proc, server.log)

    local = in_process(args.request, args.inprocess) if args.inprocess > 0 else {"n": 0}
    load_end = None
    with contextlib.suppress(OSError, AttributeError):
        load_end = [round(x, 2) for x in os.getloadavg()]
    mine = servers[0]
    result = {
        **meta,
        "request": str(shown(args.request.resolve())),
        "request_bytes": len(body),
        "n": n,
        **summary(mine.m),
        "in_process_plan_ms": local,
        "loadavg_at_end": load_end,
        "target_p50_ms": 25.0,
        "server_log_tail": mine.server_log,
    }
    if len(servers) > 1:
        other = servers[1]
        result["base"] = {
            "root": str(other.root),
            "git": _base_git(other.root),
            **summary(other.m),
            "server_log_tail": other.server_log,
        }

    text = report_text(result, args.timeout)
    result["table"] = text
    print()
    print(text)
    if mine.m.errors:
        print("\nerrors:\n  " + "\n  ".join(mine.m.errors[:10]))
    _write(args.out, stamp, result)
    return 0 if mine.m.latencies else 1


if __name__ == "__main__":
    sys.exit(main())
