"""Candidate building (request + profiles -> the tables the MILP is built from): cold, warm (the candidate
cache in memory) and in a process with nothing in memory reading them from the disk cache
(fleetplan/solver/table_cache.py), and the model built from those tables (`formulation.build_matrix`, once
per solve of a request), against the same measurement at a baseline commit, in one run.

    python -m bench.candidates_speed [--baseline REV] [--repeats 5] [--synthetic M L]

`--synthetic` adds the bench's synthetic instances (bench/instances.py), generated once in this checkout and
handed to both trees as the same request file; they are built cold once each (L takes seconds to minutes).

The baseline runs this very measurement in a child process over a temporary `git worktree` of REV (the
checkout's own venv, with the worktree first on sys.path), so the ratio compares code, not machines or
moments. Prints a table and records JSON under bench/results/.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.record import git_info, git_line, machine_info, machine_line, write_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
REQUESTS = ("paper", "scarce_gpus", "link_bound")
DEFAULT_BASELINE = "4888355"  # the last commit before numpy candidates and the candidate cache

# Runs inside the code under test (this checkout or the baseline's worktree): prints {name: {cold, warm,
# disk}} ms. Cold and warm with no disk cache; "disk": a process with nothing in memory reading the tables
# another build kept on disk (fleetplan/solver/table_cache.py; None where the tree has none).
_PROBE = """
import dataclasses, json, os, statistics, sys, tempfile, time
os.environ["FLEETPLAN_CANDIDATE_CACHE"] = "off"
from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import candidates, formulation
from fleetplan.solver.pipeline import resolve_profiles
repeats, out = int(sys.argv[1]), {}
clear = getattr(candidates, "clear_candidates_cache", lambda: None)
on_disk = hasattr(candidates, "table_cache")
for arg in sys.argv[2:]:
    name, _, path = arg.partition("=")
    request = read_request(path or fixtures.request_path(name))
    table = resolve_profiles(request)
    cold, warm, disk = [], [], []
    for _ in range(repeats if not path else 1):
        clear()
        start = time.perf_counter()
        candidates.build_candidates(request, table)
        cold.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        candidates.build_candidates(request, table)
        warm.append((time.perf_counter() - start) * 1e3)
    if on_disk:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["FLEETPLAN_CANDIDATE_CACHE"] = folder
            clear()
            candidates.build_candidates(request, table)  # built and written
            for _ in range(repeats if not path else 3):
                clear()
                start = time.perf_counter()
                candidates.build_candidates(request, table)
                disk.append((time.perf_counter() - start) * 1e3)
            os.environ["FLEETPLAN_CANDIDATE_CACHE"] = "off"
    out[name] = {
        "cold_ms": statistics.median(cold),
        "warm_ms": statistics.median(warm),
        "disk_ms": statistics.median(disk) if disk else None,
    }
    cand = candidates.build_candidates(request, table)
    model = []  # on a copy with an empty memo: nothing the tables keep (formulation.model_arrays) reused
    for _ in range(repeats if not path else 1):
        fresh = dataclasses.replace(cand, memo={})
        start = time.perf_counter()
        try:
            formulation.build_matrix(fresh)
        except Exception:  # a baseline older than build_matrix(cand)
            break
        model.append((time.perf_counter() - start) * 1e3)
    out[name]["model_ms"] = statistics.median(model) if model else None
print(json.dumps(out))
"""


def probe(root: Path, repeats: int, synthetic: dict[str, Path]) -> dict:
    """Run the measurement with `root`'s fleetplan first on the import path; `synthetic`: name -> request
    file of the synthetic instances to add."""
    code = f"import sys; sys.path.insert(0, {str(root)!r})\n" + _PROBE
    names = [*REQUESTS, *(f"{name}={path}" for name, path in synthetic.items())]
    out = subprocess.run(
        [sys.executable, "-c", code, str(repeats), *names],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_synthetic(names: list[str], folder: Path) -> dict[str, Path]:
    """The synthetic instances as request files in `folder` (name -> path)."""
    from bench.instances import instance
    from fleetplan.models.codec import encode

    paths = {}
    for name in names:
        paths[name] = folder / f"{name.replace('/', '_')}.json"
        paths[name].write_bytes(encode(instance(name)))
    return paths


def probe_baseline(rev: str, repeats: int, synthetic: dict[str, Path]) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleetplan-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
        try:
            return probe(tree, repeats, synthetic)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def render(now: dict, base: dict, rev: str) -> str:
    lines = [
        f"| request | baseline {rev} (ms) | cold (ms) | warm, cached (ms) | new process, from disk (ms) "
        f"| cold speed-up | warm speed-up | from-disk speed-up | model at {rev} (ms) | model (ms) "
        "| model speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in now:
        b, c, w = base[name]["cold_ms"], now[name]["cold_ms"], now[name]["warm_ms"]
        d = now[name].get("disk_ms")
        bm, m = base[name].get("model_ms"), now[name]["model_ms"]
        model = "-" if bm is None else f"{bm:.1f}"
        ratio = "-" if bm is None else f"{bm / m:.1f}x"
        disk, disk_ratio = ("-", "-") if d is None else (f"{d:.1f}", f"{b / d:.0f}x")
        cells = [f"{b:.0f}", f"{c:.0f}", f"{w:.2f}", disk, f"{b / c:.1f}x", f"{b / w:.0f}x", disk_ratio]
        cells += [model, f"{m:.1f}", ratio]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare against")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--synthetic", nargs="*", default=[], help="bench instances to add (M, L, M/3, ...)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    machine, git = machine_info(), git_info()
    with tempfile.TemporaryDirectory(prefix="fleetplan-synthetic-") as tmp:
        synthetic = write_synthetic(args.synthetic, Path(tmp))
        now = probe(ROOT, args.repeats, synthetic)
        base = probe_baseline(args.baseline, args.repeats, synthetic)
    text = render(now, base, args.baseline)
    print(machine_line(machine))
    print(git_line(git))
    print(text)
    record = {
        "benchmark": "candidates_speed",
        "machine": machine,
        "git": git,
        "args": vars(args),
        "wall_s": round(time.perf_counter() - began, 1),
        "now": now,
        "baseline": base,
        "table": text,
    }
    write_results("candidates_speed", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
