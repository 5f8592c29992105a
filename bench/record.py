"""What every benchmark records beside its figures: the machine, the commit, and the result files.

Each bench writes bench/results/<name>-<UTC timestamp>.json and <name>-latest.json (`write_results`) with
`machine_info()` and `git_info()` in the record, and prints `machine_line` / `git_line` above its table.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def write_results(name: str, record: Any, out: Path = RESULTS, *, stamp: datetime | None = None) -> Path:
    """Write `record` as JSON to out/<name>-<UTC timestamp>.json and out/<name>-latest.json; returns the
    first."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, default=str) + "\n"
    when = (stamp or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{name}-{when}.json"
    path.write_text(text)
    (out / f"{name}-latest.json").write_text(text)
    return path


def report(name: str, args: Any, began: float, text: str, *, summary: Any = None, **fields: Any) -> Path:
    """The tail the probe benches share: print the machine and commit lines, `text` (and `summary`), and
    record them with the arguments (as strings), the wall time since `began` (perf_counter) and `fields`
    under `name` (`write_results`); returns the timestamped file."""
    machine, git = machine_info(), git_info()
    print(machine_line(machine))
    print(git_line(git))
    print(text)
    if summary is not None:
        print(summary)
    record: dict[str, Any] = {
        "benchmark": name,
        "machine": machine,
        "git": git,
        "args": {k: str(v) for k, v in vars(args).items()},
        "wall_s": round(time.perf_counter() - began, 1),
    }
    if summary is not None:
        record["summary"] = summary
    return write_results(name, {**record, **fields, "table": text})


def machine_info() -> dict:
    model = None
    with contextlib.suppress(Exception):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5, check=False).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "highspy": version("highspy"),
        "numpy": version("numpy"),
        "scipy": version("scipy"),
        "pandas": version("pandas"),
        "loadavg_at_start": load,
    }


def git_info() -> dict:
    def run(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.rstrip("\n")

    status = run("status", "--porcelain") or ""
    diff = subprocess.run(["git", "diff", "HEAD"], cwd=ROOT, capture_output=True, timeout=10, check=False)
    files = [line[3:] for line in status.splitlines()]
    return {
        "commit": (run("rev-parse", "--short", "HEAD") or "").strip() or None,
        "dirty": bool(status),
        "dirty_files": status.splitlines(),
        # uncommitted edits outside bench/ change what is measured: name them, and fingerprint the diff
        "dirty_outside_bench": [f for f in files if not f.startswith("bench/")],
        "diff_sha256": hashlib.sha256(diff.stdout).hexdigest()[:16] if diff.stdout else None,  # tracked files
    }


def git_line(g: dict) -> str:
    if not g["dirty_outside_bench"]:
        return f"commit {g['commit']}"
    untracked = {line[3:] for line in g["dirty_files"] if line.startswith("??")}
    edited = [f for f in g["dirty_outside_bench"] if f not in untracked]
    others = [f for f in g["dirty_outside_bench"] if f in untracked]
    text = f"commit {g['commit']}"
    if edited:
        text += f" + uncommitted edits to {', '.join(edited)} (diff {g['diff_sha256']})"
    if others:
        text += f"; untracked: {', '.join(others)}"
    return text


def machine_line(m: dict) -> str:
    load = "" if m["loadavg_at_start"] is None else f", load avg {m['loadavg_at_start'][0]}"
    return (
        f"{m['cpu_model'] or platform.processor() or '?'} x{m['cpu_count']}{load} | {m['platform']} | "
        f"Python {m['python']} | highspy {m['highspy']} | numpy {m['numpy']}"
    )
