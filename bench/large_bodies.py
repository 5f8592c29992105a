"""How long large request bodies hold the event loop: `/health` latency while several large `POST /plan`
bodies arrive at once, against the real server.

Starts `fleetplan serve` (bench.http_latency.start_server), builds one body of about `--mb` MB (paper.json
with that many inline profile rows of a model the request does not use, so the request decodes, then stops
at its profile check in the solve worker: a 422, as a client's mistake would), and sends `--bodies` of them
concurrently while `/health` is asked every 10 ms; reports the slowest and the median `/health` answer and
the posts' wall time (some answer 503 when the solve queue is full: the body was read and decoded first).
`--base DIR` measures the server of another checkout the same way, the two taking
turns (`--rounds` each), so that both see the same machine.

    python -m bench.large_bodies [--bodies 8] [--mb 7.5] [--rounds 2] [--base DIR]

Writes bench/results/large_bodies-<UTC timestamp>.json and bench/results/large_bodies-latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from bench.http_latency import ROOT, start_server, stop_server, wait_healthy
from bench.record import git_info, git_line, machine_info, machine_line, write_results
from fleetplan import fixtures

ROW = {
    "model": "unused-model",
    "device": "a6000ada",
    "tp": 1,
    "batch": 1,
    "ttft_ms_p90": 11.0,
    "tbt_ms_p90": 6.0,
}


def large_body(mb: float) -> bytes:
    """paper.json with inline rows: its own set's rows are not there, so the plan stops at the profile
    check (422) after the body was decoded and sent to a worker."""
    request = json.loads(fixtures.request_path("paper").read_text())
    row_bytes = len(json.dumps({**ROW, "prompt_tokens": 100000})) + 2
    rows = [{**ROW, "prompt_tokens": 128 + k} for k in range(int(mb * 1e6 / row_bytes))]
    request["profiles"] = {"rows": rows}
    return json.dumps(request).encode()


async def one_round(url: str, body: bytes, bodies: int) -> dict:
    """`bodies` concurrent POSTs of `body` while /health is polled; the latencies in ms."""
    health: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            while not done.is_set():
                began = time.perf_counter()
                await client.get(f"{url}/health")
                health.append((time.perf_counter() - began) * 1e3)
                await asyncio.sleep(0.01)

    async with httpx.AsyncClient(timeout=120, headers={"content-type": "application/json"}) as client:
        poller = asyncio.create_task(poll())
        await asyncio.sleep(0.3)
        began = time.perf_counter()
        answers = await asyncio.gather(*[client.post(f"{url}/plan", content=body) for _ in range(bodies)])
        posts_s = time.perf_counter() - began
        done.set()
        await poller
    return {
        "statuses": sorted({r.status_code for r in answers}),
        "posts_s": round(posts_s, 3),
        "health_max_ms": round(max(health), 1),
        "health_p50_ms": round(statistics.median(health), 1),
        "health_n": len(health),
    }


def measure(root: Path, body: bytes, bodies: int) -> dict:
    server = start_server(root)
    try:
        with httpx.Client() as client:
            wait_healthy(client, server.url, server.proc, deadline_s=60.0)
        return asyncio.run(one_round(server.url, body, bodies))
    finally:
        stop_server(server.proc, server.log)


def table(rows: list[dict]) -> str:
    head = f"{'checkout':<30} {'round':>5} {'/health max ms':>15} {'/health p50 ms':>15} {'posts s':>8}"
    lines = [f"{head}  statuses", "-" * 90]
    for r in rows:
        lines.append(
            f"{r['checkout']:<30} {r['round']:>5} {r['health_max_ms']:>15.1f} {r['health_p50_ms']:>15.1f} "
            f"{r['posts_s']:>8.2f}  {r['statuses']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=8)
    parser.add_argument(
        "--mb", type=float, default=7.5, help="size of each body (under the 8 MB default cap)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", type=Path, help="another checkout, measured in turn with this one")
    args = parser.parse_args(argv)
    body = large_body(args.mb)
    roots = [ROOT] + ([args.base.resolve()] if args.base else [])
    rows = []
    for k in range(args.rounds):
        for root in roots if k % 2 == 0 else roots[::-1]:
            row = measure(root, body, args.bodies)
            rows.append({"checkout": str(root), "round": k, **row})
            print(f"{root} round {k}: {row}", flush=True)
    machine, git = machine_info(), git_info()
    text = table(rows)
    print(machine_line(machine))
    print(git_line(git))
    print(f"{args.bodies} concurrent POST /plan bodies of {len(body) / 1e6:.2f} MB each, /health every 10 ms")
    print(text)
    record = {"benchmark": "large_bodies", "machine": machine, "git": git, "args": vars(args), "rows": rows}
    record["body_bytes"], record["table"] = len(body), text
    print(f"wrote {write_results('large_bodies', record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
