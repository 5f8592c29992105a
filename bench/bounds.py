"""Do the service's bounds hold on a real server and the real CLI? (issue 13, "Bounds")

1. A 5,000-class request (bench.instances.synthetic_request, 8 device types) with time_limit_s 2:
   - CLI: wall time of `python -m fleetplan plan FILE`, process start to exit (the answer is its one line),
     and whether any process of it is left afterwards;
   - HTTP: wall time of POST /plan, and whether any worker of the server is still working right after
     (its warm workers stay alive, idle: bench/server.py tells a working one by its CPU time growing).
2. A client that disconnects 1 s into a paper request (time_limit_s 30): how long until the worker solving it
   is gone (a worker already working before the request, such as a candidate build of the 5,000-class
   request finishing past its deadline, docs/api.md "How POST /plan runs", is not counted).
3. SIGTERM while solves run and wait (8 paper requests, 2 solver slots, grace 2 s): time to exit.

Baseline in the same run: the time limit itself (the goal is time_limit_s + 0.2 s) and, for (2) and (3),
the paper request's own solve time (what would have run on without the bounds).

    python -m bench.bounds [--repeat 3]

Writes bench/results/bounds-<UTC timestamp>.json and bench/results/bounds-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec

from bench.record import git_info, git_line, machine_info, machine_line, write_results
from bench.server import ROOT, alive, running_server
from fleetplan import fixtures
from fleetplan.models.codec import encode

RESULTS = ROOT / "bench" / "results"
JSON = {"content-type": "application/json"}
LIMIT_S = 2.0
GOAL_S = LIMIT_S + 0.2


def big_request(path: Path) -> int:
    from bench.instances import synthetic_request

    request = synthetic_request(8, 5000, [1, 2, 4], [1, 2, 4, 8, 16, 32], seed=3)
    request = msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, time_limit_s=LIMIT_S)
    )
    path.write_bytes(encode(request))
    return len(request.workloads)


def _processes_with(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cli_runs(path: Path, repeat: int) -> list[dict]:
    runs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(repeat):
        began = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "fleetplan", "plan", str(path)], env=env, capture_output=True, text=True
        )
        wall = time.monotonic() - began
        runs.append(
            {
                "wall_s": round(wall, 3),
                "exit_code": out.returncode,
                "stderr": out.stderr.strip()[:200],
                "left_running": _processes_with(str(path)),
            }
        )
    return runs


def http_runs(base: str, server, body: bytes, repeat: int) -> list[dict]:
    runs = []
    for _ in range(repeat):
        began = time.monotonic()
        response = httpx.post(
            f"{base}/plan", content=body, headers={"content-type": "application/json"}, timeout=60
        )
        wall = time.monotonic() - began
        runs.append(
            {
                "wall_s": round(wall, 3),
                "status": response.status_code,
                "detail": response.json().get("detail", "")[:200],
                "solving_right_after": server.solving(),
            }
        )
        time.sleep(0.3)
    return runs


def disconnect_run(base: str, server, paper: bytes) -> dict:
    """A client that gives up after 1 s: how long until the worker solving its request is gone (the server
    kills and reaps it; a fresh one replaces it)."""
    already = set(server.solving())  # e.g. a candidate build finishing past an earlier request's deadline
    began = time.monotonic()
    outcome: list[str] = []

    def post() -> None:
        try:
            httpx.post(f"{base}/plan", content=paper, headers=JSON, timeout=1.0)
            outcome.append("answered within 1 s")
        except httpx.TimeoutException:
            outcome.append("client gave up after 1 s")

    client = threading.Thread(target=post)
    client.start()
    time.sleep(0.4)
    busy = [pid for pid in server.solving() if pid not in already]  # the worker on the request (CPU grows)
    client.join()
    gone = time.monotonic()
    while any(alive(pid) for pid in busy) and time.monotonic() - gone < 30:
        time.sleep(0.01)
    return {
        "outcome": outcome[0] if outcome else "?",
        "worker": busy,
        "solve_stopped_after_disconnect_s": round(time.monotonic() - gone, 3),
        "still_solving": server.solving(),
        "since_request_s": round(time.monotonic() - began, 3),
    }


def sigterm_run(paper: bytes) -> dict:
    env = {"FLEETPLAN_MAX_CONCURRENT_SOLVES": "2", "FLEETPLAN_SHUTDOWN_GRACE_S": "2"}
    statuses: list[object] = []
    with running_server(env) as server:

        def one() -> None:
            try:
                r = httpx.post(
                    f"{server.base}/plan",
                    content=paper,
                    headers={"content-type": "application/json"},
                    timeout=60,
                )
                statuses.append(r.status_code)
            except httpx.HTTPError as error:
                statuses.append(type(error).__name__)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        running = len(server.solving())
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        exited = time.monotonic() - began
        for t in threads:
            t.join(60)
        left = server.descendants()
    return {
        "solving_at_sigterm": running,
        "exit_after_sigterm_s": round(exited, 3),
        "exit_code": server.proc.returncode,
        "left_running": left,
        "client_outcomes": sorted(map(str, statuses)),
    }


def paper_body(limit: float) -> bytes:
    body = json.loads(fixtures.request_path("paper").read_bytes())
    body["options"]["time_limit_s"] = limit
    return json.dumps(body).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC)
    machine, git = machine_info(), git_info()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big5000.json"
        classes = big_request(path)
        body = path.read_bytes()
        cli = cli_runs(path, args.repeat)
        with running_server({"FLEETPLAN_MAX_CONCURRENT_SOLVES": "2"}) as server:
            http = http_runs(server.base, server, body, args.repeat)
            paper_ok = httpx.post(
                f"{server.base}/plan",
                content=paper_body(60),
                headers={"content-type": "application/json"},
                timeout=90,
            )
            paper_s = paper_ok.elapsed.total_seconds()
            disconnect = disconnect_run(server.base, server, paper_body(30))
    sigterm = sigterm_run(paper_body(30))
    result = {
        "benchmark": "bounds",
        "utc": stamp.isoformat(timespec="seconds"),
        "machine": machine,
        "git": git,
        "classes": classes,
        "body_bytes": len(body),
        "time_limit_s": LIMIT_S,
        "goal_s": GOAL_S,
        "cli": cli,
        "http": http,
        "paper_solve_s_baseline": round(paper_s, 3),
        "paper_status": paper_ok.status_code,
        "disconnect": disconnect,
        "sigterm": sigterm,
    }
    print(machine_line(machine))
    print(git_line(git))
    print(f"5,000-class request ({len(body) / 1e6:.1f} MB), time_limit_s {LIMIT_S:g}, goal <= {GOAL_S:g} s")
    print("  CLI wall s:  " + "  ".join(f"{r['wall_s']:.2f} (exit {r['exit_code']})" for r in cli))
    print("  HTTP wall s: " + "  ".join(f"{r['wall_s']:.2f} ({r['status']})" for r in http))
    after = [r["solving_right_after"] for r in http]
    print(
        "  workers still working right after the HTTP answers (a candidate build finishing past its "
        f"deadline, at most max_time_limit_s and half the slots: docs/api.md): {after}"
    )
    print(f"paper request alone (baseline): {paper_s:.2f} s, status {paper_ok.status_code}")
    print(f"disconnect after 1 s: solve stopped {disconnect['solve_stopped_after_disconnect_s']:.2f} s later")
    print(
        f"SIGTERM with {sigterm['solving_at_sigterm']} solving and 6 waiting: exit after "
        f"{sigterm['exit_after_sigterm_s']:.2f} s (grace 2 s), left running: {sigterm['left_running']}"
    )
    write_results("bounds", result, stamp=stamp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
