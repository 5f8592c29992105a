"""Load: 50 concurrent clients of POST /plan (the paper request) for 30 s on a real server, plus a /health
prober. (issue 13, "Load benchmark")

Reports throughput, client-side p50/p99 by outcome, errors (anything but a 200 or a 503 that carries
Retry-After), 503s, /health p50/p99/max during the load, and the server's resident memory (the server
process, and its whole tree: fork server and warm solve workers) sampled every 0.5 s.

Goals: 0 errors other than 503-with-Retry-After; /health p99 <= 50 ms; RSS bounded (no growth with time).

    python -m bench.load [--clients 50] [--seconds 30] [--solves 2]

Writes bench/results/load-<UTC timestamp>.json and bench/results/load-latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.record import git_info, git_line, machine_info, machine_line, write_results
from bench.server import ROOT, Server, rss_kib, running_server
from fleetplan import fixtures

RESULTS = ROOT / "bench" / "results"
HEADERS = {"content-type": "application/json"}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def client_loop(client: httpx.AsyncClient, base: str, body: bytes, until: float, out: list) -> None:
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            r = await client.post(f"{base}/plan", content=body, headers=HEADERS, timeout=120)
            kind = str(r.status_code)
            if r.status_code == 503:
                kind = "503+retry-after" if "retry-after" in r.headers else "503-no-retry-after"
                await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 5))
        except httpx.HTTPError as error:
            kind = type(error).__name__
        out.append((kind, time.monotonic() - began))


def health_prober(base: str, seconds: float, out: Any) -> None:
    """GET /health every 0.1 s for `seconds`, in a process of its own (a blocking client): the latency is
    the server's, not the 50 load clients' event loop's (they share one Python process and its GIL).
    Sends [(ok, seconds), ...] to `out` (a pipe end)."""
    samples = []
    until = time.monotonic() + seconds
    with httpx.Client() as client:
        while time.monotonic() < until:
            began = time.monotonic()
            try:
                ok = client.get(f"{base}/health", timeout=10).status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append((ok, time.monotonic() - began))
            time.sleep(0.1)
    out.send(samples)
    out.close()


async def health_in_a_process(base: str, seconds: float, out: list) -> None:
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    prober = ctx.Process(target=health_prober, args=(base, seconds, send), daemon=True)
    prober.start()
    send.close()
    out.extend(await asyncio.to_thread(receive.recv))
    await asyncio.to_thread(prober.join)


async def memory_loop(server: Server, until: float, out: list) -> None:
    began = time.monotonic()
    while time.monotonic() < until:
        tree = [server.proc.pid, *server.descendants()]
        total = 0
        for pid in tree:
            try:
                total += rss_kib(pid)
            except OSError:
                continue
        out.append((round(time.monotonic() - began, 1), server.rss_kib(), total))
        await asyncio.sleep(0.5)


async def run_load(server: Server, body: bytes, clients: int, seconds: float) -> dict:
    plans: list = []
    health: list = []
    memory: list = []
    limits = httpx.Limits(max_connections=clients + 5, max_keepalive_connections=clients + 5)
    async with httpx.AsyncClient(limits=limits) as client:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(client_loop(client, server.base, body, until, plans) for _ in range(clients)),
            health_in_a_process(server.base, seconds, health),
            memory_loop(server, until, memory),
        )
    return {"plans": plans, "health": health, "memory": memory}


def summarize(raw: dict, seconds: float) -> dict:
    plans, health, memory = raw["plans"], raw["health"], raw["memory"]
    kinds = Counter(kind for kind, _ in plans)
    ok = [s for kind, s in plans if kind == "200"]
    errors = {k: v for k, v in kinds.items() if k not in ("200", "503+retry-after")}
    health_s = [s for _, s in health]
    return {
        "requests": len(plans),
        "outcomes": dict(kinds),
        "errors": errors,
        "plans_per_s": round(len(ok) / seconds, 3),
        "ok_p50_s": percentile(ok, 50),
        "ok_p99_s": percentile(ok, 99),
        "all_p50_s": percentile([s for _, s in plans], 50),
        "all_p99_s": percentile([s for _, s in plans], 99),
        "health_n": len(health),
        "health_failures": sum(1 for good, _ in health if not good),
        "health_p50_ms": None if not health_s else round(1e3 * percentile(health_s, 50), 2),
        "health_p99_ms": None if not health_s else round(1e3 * percentile(health_s, 99), 2),
        "health_max_ms": None if not health_s else round(1e3 * max(health_s), 2),
        "rss_server_kib": {"first": memory[0][1], "max": max(m[1] for m in memory), "last": memory[-1][1]}
        if memory
        else None,
        "rss_tree_kib": {"first": memory[0][2], "max": max(m[2] for m in memory), "last": memory[-1][2]}
        if memory
        else None,
        "rss_samples": memory,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--solves", type=int, default=2, help="FLEETPLAN_MAX_CONCURRENT_SOLVES")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=60,
        help="options.time_limit_s of the paper request (its own 10 s is too short on a loaded 2-core box)",
    )
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC)
    machine, git = machine_info(), git_info()
    request = json.loads(fixtures.request_path("paper").read_bytes())
    request["options"]["time_limit_s"] = args.time_limit
    body = json.dumps(request).encode()
    env = {"FLEETPLAN_MAX_CONCURRENT_SOLVES": str(args.solves), "FLEETPLAN_LOG_LEVEL": "warning"}
    with running_server(env) as server:
        # baseline in the same run: one paper request alone on the idle server
        alone = httpx.post(f"{server.base}/plan", content=body, headers=HEADERS, timeout=120)
        alone_s = alone.elapsed.total_seconds()
        rss_idle = server.rss_kib()
        raw = asyncio.run(run_load(server, body, args.clients, args.seconds))
        loadavg_after = os.getloadavg()
        metrics = httpx.get(f"{server.base}/metrics", timeout=10).text
    summary = summarize(raw, args.seconds)
    result = {
        "benchmark": "load",
        "utc": stamp.isoformat(timespec="seconds"),
        "machine": machine,
        "git": git,
        "clients": args.clients,
        "seconds": args.seconds,
        "solver_slots": args.solves,
        "time_limit_s": args.time_limit,
        "paper_alone_s": round(alone_s, 3),
        "paper_alone_status": alone.status_code,
        "rss_idle_kib": rss_idle,
        "loadavg_after": [round(x, 2) for x in loadavg_after],
        **summary,
        "metrics_excerpt": [
            line for line in metrics.splitlines() if line.startswith(("fleetplan_solves", "fleetplan_plans"))
        ],
    }
    print(machine_line(machine))
    print(git_line(git))
    print(
        f"{args.clients} clients x {args.seconds:g} s of POST /plan "
        f"(paper, time_limit_s {args.time_limit:g}), {args.solves} solver slots"
    )
    print(f"  paper alone (baseline): {alone_s:.2f} s, status {alone.status_code}")
    print(f"  load average at start {machine['loadavg_at_start']}, after the load {result['loadavg_after']}")
    print(f"  outcomes: {summary['outcomes']}  errors: {summary['errors'] or 0}")
    print(f"  plans/s {summary['plans_per_s']}, 200 p50 {summary['ok_p50_s']} s, p99 {summary['ok_p99_s']} s")
    print(
        f"  /health: n={summary['health_n']} failures={summary['health_failures']} "
        f"p50 {summary['health_p50_ms']} ms, p99 {summary['health_p99_ms']} ms, "
        f"max {summary['health_max_ms']} ms"
    )
    print(
        f"  RSS server (KiB): idle {rss_idle}, during {summary['rss_server_kib']}; "
        f"tree {summary['rss_tree_kib']}"
    )
    write_results("load", result, stamp=stamp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
