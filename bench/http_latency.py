"""HTTP latency of POST /plan on the S instance (fleetplan/fixtures/requests/paper.json) against the real server.

Starts `fleetplan serve --host 127.0.0.1 --port <free port>` as a subprocess, waits for GET /health, sends
one warm-up POST (not counted: the first request pays lazy imports), then N sequential POSTs with httpx
(each with a timeout), and reports p50/p90/p99/max client-side latency with a breakdown from the Plan's
solver.build_ms / solver.solve_ms. For reference it also times GET /health (the HTTP floor) and, in this
process, solver.plan() on the same request (the pipeline without HTTP, JSON or the worker thread).
The server is stopped in a finally block.

    python -m bench.http_latency [-n 50] [--timeout 30] [--inprocess 10] [--request PATH]

Writes bench/results/http_latency-<UTC timestamp>.json and bench/results/http_latency-latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.solver_scaling import git_info, git_line, machine_info, machine_line, shown, table
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
    script = Path(sys.executable).parent / "fleetplan"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "fleetplan"]
    return [*base, "serve", "--host", HOST, "--port", str(port), "--log-level", "warning"]


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


def cpu_ms(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--requests", type=int, default=50, help=f"timed POSTs (1..{MAX_N})")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    parser.add_argument("--health", type=int, default=20, help="GET /health requests for the HTTP floor")
    parser.add_argument("--inprocess", type=int, default=10, help="in-process solver.plan() runs (0: skip)")
    parser.add_argument("--request", type=Path, default=fixtures.request_path("paper"))
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    n = max(1, min(args.requests, MAX_N))

    stamp = datetime.now(UTC)
    meta = {"utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine_info(), "git": git_info()}
    print(f"machine: {machine_line(meta['machine'])}", flush=True)
    body = args.request.read_bytes()
    port = free_port()
    base = f"http://{HOST}:{port}"
    log = tempfile.TemporaryFile()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(server_command(port), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    latencies, build, solve, errors = [], [], [], []
    health_ms, statuses, tie_breaks = [], set(), set()
    try:
        with httpx.Client(headers={"content-type": "application/json"}) as client:
            startup_ms = wait_healthy(client, base, proc, deadline_s=60.0)
            print(f"server up on {base} in {startup_ms:.0f} ms (pid {proc.pid})", flush=True)

            began = time.perf_counter()
            warm = client.post(f"{base}/plan", content=body, timeout=args.timeout)
            warmup_ms = (time.perf_counter() - began) * 1e3
            if warm.status_code != 200:
                msg = f"warm-up POST /plan answered {warm.status_code}: {warm.text[:500]}"
                raise RuntimeError(msg)

            for _ in range(args.health):
                began = time.perf_counter()
                client.get(f"{base}/health", timeout=args.timeout)
                health_ms.append((time.perf_counter() - began) * 1e3)

            server_cpu_before = cpu_ms(proc.pid)
            for i in range(n):
                began = time.perf_counter()
                try:
                    response = client.post(f"{base}/plan", content=body, timeout=args.timeout)
                except httpx.HTTPError as error:
                    errors.append(f"request {i}: {type(error).__name__}: {error}")
                    continue
                elapsed = (time.perf_counter() - began) * 1e3
                if response.status_code != 200:
                    errors.append(f"request {i}: HTTP {response.status_code}: {response.text[:200]}")
                    continue
                answer = response.json()
                latencies.append(elapsed)
                build.append(answer["solver"]["build_ms"])
                solve.append(answer["solver"]["solve_ms"])
                statuses.add(answer["status"])
                tie_breaks.add(answer["solver"].get("tie_break"))
                response_bytes = len(response.content)
            server_cpu_after = cpu_ms(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.seek(0)
        server_log = log.read().decode(errors="replace")[-4000:]
        log.close()

    local = in_process(args.request, args.inprocess) if args.inprocess > 0 else {"n": 0}
    other = [t - b - s for t, b, s in zip(latencies, build, solve, strict=True)]
    server_cpu = None
    if server_cpu_before is not None and server_cpu_after is not None and latencies:
        server_cpu = (server_cpu_after - server_cpu_before) / (len(latencies) + len(errors))
    load_end = None
    with contextlib.suppress(OSError, AttributeError):
        load_end = [round(x, 2) for x in os.getloadavg()]
    result = {
        **meta,
        "request": str(shown(args.request.resolve())),
        "request_bytes": len(body),
        "response_bytes": response_bytes if latencies else None,
        "n": n,
        "ok": len(latencies),
        "errors": errors,
        "statuses": sorted(statuses),
        "tie_breaks": sorted(t or "-" for t in tie_breaks),
        "startup_ms": startup_ms,
        "warmup_ms": warmup_ms,
        "latency_ms": stats(latencies),
        "solver_build_ms": stats(build),
        "solver_solve_ms": stats(solve),
        "other_ms": stats(other),
        "health_ms": stats(health_ms),
        "in_process_plan_ms": local,
        "server_cpu_ms_per_request": server_cpu,
        "loadavg_at_end": load_end,
        "target_p50_ms": 25.0,
        "server_log_tail": server_log,
        "raw": {"latency_ms": latencies, "build_ms": build, "solve_ms": solve},
    }

    keys = ["p50", "p90", "p99", "max"]
    rows = [
        ["POST /plan (client wall)", *(f"{result['latency_ms'].get(k, 0):.1f}" for k in keys)],
        ["  solver.build_ms", *(f"{result['solver_build_ms'].get(k, 0):.1f}" for k in keys)],
        ["  solver.solve_ms", *(f"{result['solver_solve_ms'].get(k, 0):.1f}" for k in keys)],
        ["  rest (wall - build - solve)", *(f"{result['other_ms'].get(k, 0):.1f}" for k in keys)],
        ["GET /health (HTTP floor)", *(f"{result['health_ms'].get(k, 0):.1f}" for k in keys)],
    ]
    if local.get("n"):
        rows.append(["solver.plan() in-process", *(f"{local[k]:.1f}" for k in keys)])
    text = "\n".join(
        [
            f"HTTP latency  |  {meta['utc']}  |  {git_line(meta['git'])}",
            f"Machine: {machine_line(meta['machine'])}",
            f"POST {result['request']} ({len(body)} B) x {n} sequential to {base}, "
            f"timeout {args.timeout:g} s; "
            f"ok {len(latencies)}, errors {len(errors)}; status {', '.join(result['statuses']) or '-'}",
            f"server startup {startup_ms:.0f} ms, warm-up request {warmup_ms:.0f} ms (not counted); "
            f"in-process solver.plan() x {local.get('n', 0)}; "
            f"load avg at end {load_end[0] if load_end else '?'}",
            "server CPU per POST (mean, utime+stime of the server process): "
            + ("-" if server_cpu is None else f"{server_cpu:.1f} ms"),
            "",
            table(["ms", *keys], rows),
            "",
            f"target p50 <= 25 ms: {'met' if result['latency_ms'].get('p50', 1e9) <= 25 else 'missed'}"
            + (f" (p50 {result['latency_ms']['p50']:.1f} ms)" if latencies else ""),
        ]
    )
    result["table"] = text
    print()
    print(text)
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors[:10]))

    args.out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(result, indent=2, default=str)
    path = args.out / f"http_latency-{stamp.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(payload)
    (args.out / "http_latency-latest.json").write_text(payload)
    print(f"\nwrote {shown(path)} and http_latency-latest.json")
    return 0 if latencies else 1


if __name__ == "__main__":
    sys.exit(main())
