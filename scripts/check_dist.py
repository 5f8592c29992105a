"""Build the sdist and the wheel, then use the wheel the way a new user would, outside the checkout.

    python scripts/check_dist.py [--keep]

1. In a copy of the files git tracks (a clean clone, without build leftovers), `python -m build` makes
   the sdist, then the wheel *from the sdist* (so a file missing from the sdist
   breaks the wheel too), into a temporary folder.
2. Contents: every file git tracks under fleetplan/ (each subpackage and each data file: profile sets,
   requests, later migrations and templates) must be in the wheel and in the sdist, and the wheel may hold
   no top-level import name but `fleetplan` (no generic `api`, `models`, ... in a user's site-packages).
3. A fresh virtual environment in an empty temporary folder gets `pip install <wheel>`; from there (so
   nothing can be imported from the working tree):
   - `fleetplan --version` and `python -m fleetplan --version` print the metadata version;
   - every module of the package imports, except where an optional extra is not installed;
   - `python -c "import api"` and `python -c "import models"` fail;
   - `fleetplan plan paper --plain` prints an optimal plan of the bundled request;
   - `fleetplan db upgrade` runs the migrations shipped in the wheel on a fresh SQLite file;
   - `fleetplan serve` on a free 127.0.0.1 port answers GET /health and POST /plan, then is stopped by pid.

Exit 0 when every check passes, 1 with the failed checks named otherwise. `make dist-check` runs it in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fleetplan"
# third-party packages that only optional extras install: a module that fails on one of them is fine
# (the engines for vLLM, Neuron and JetStream import their vendor packages; docs/profiling.md)
OPTIONAL = {
    "pyomo",
    "ortools",
    "torch",
    "transformers",
    "httpx",
    "vllm",
    "jetstream",
    "grpc",
    "optimum",
    "torch_neuronx",
}
SERVE_TIMEOUT_S = 60


class CheckFailed(Exception):
    pass


def run(
    cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def must(proc: subprocess.CompletedProcess, what: str) -> str:
    if proc.returncode != 0:
        raise CheckFailed(f"{what}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def tracked_package_files() -> set[str]:
    """Paths (relative to the repository) of every file git tracks under fleetplan/."""
    out = must(run(["git", "ls-files", "-z", PACKAGE], cwd=ROOT), "git ls-files")
    return {name for name in out.split("\0") if name and not name.endswith(".pyc")}


def clean_copy(dest: Path) -> Path:
    """The files git tracks, as they are in the working tree, copied to `dest`: what a clean clone holds,
    without the build leftovers (a stale *.egg-info/SOURCES.txt would add files the sdist rules miss)."""
    names = [n for n in must(run(["git", "ls-files", "-z"], cwd=ROOT), "git ls-files").split("\0") if n]
    for name in names:
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build(outdir: Path, source: Path) -> tuple[Path, Path]:
    must(
        run([sys.executable, "-m", "build", "--outdir", str(outdir), str(source)], cwd=source),
        "python -m build",
    )
    wheels, sdists = sorted(outdir.glob("*.whl")), sorted(outdir.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(f"expected one wheel and one sdist in {outdir}, found {wheels + sdists}")
    return wheels[0], sdists[0]


def check_contents(wheel: Path, sdist: Path, expected: set[str]) -> list[str]:
    """Failures: tracked package files missing from either archive, or foreign top-level names."""
    failures = []
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name for name in archive.namelist() if ".dist-info/" not in name}
    with tarfile.open(sdist) as archive:
        # sdist members are "<name>-<version>/<path>"
        in_sdist = {member.name.split("/", 1)[1] for member in archive.getmembers() if "/" in member.name}
    for label, present in (("wheel", in_wheel), ("sdist", in_sdist)):
        missing = sorted(expected - present)
        if missing:
            failures.append(f"{label} lacks {len(missing)} tracked file(s): {', '.join(missing[:20])}")
    top_level = {name.split("/", 1)[0] for name in in_wheel}
    if top_level != {PACKAGE}:
        failures.append(f"wheel claims top-level names {sorted(top_level - {PACKAGE})} beside {PACKAGE!r}")
    print(f"contents: {len(expected)} tracked files; wheel {len(in_wheel)} files, sdist {len(in_sdist)}")
    return failures


def fresh_venv(where: Path, wheel: Path) -> Path:
    must(run([sys.executable, "-m", "venv", str(where)], cwd=where.parent), "python -m venv")
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    must(run([*pip, str(wheel)], cwd=where.parent), f"pip install {wheel.name}")
    return where / "bin"


def clean_env(bindir: Path) -> dict:
    """The environment of a user's shell with only the fresh venv on PATH: no PYTHONPATH into the tree."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("FLEETPLAN_PROFILE_STORE", None)
    return env


IMPORT_ALL = f"""
import importlib, pkgutil, sys, {PACKAGE}
optional = {sorted(OPTIONAL)!r}
bad = []
for info in pkgutil.walk_packages({PACKAGE}.__path__, "{PACKAGE}."):
    if info.name.rsplit(".", 1)[-1].endswith("_worker"):
        continue  # a script run by path in its own process (fleetplan/solver/backends/_ortools_worker.py)
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in optional:
            bad.append(f"{{info.name}}: {{error}}")
print(sum(1 for _ in pkgutil.walk_packages({PACKAGE}.__path__, "{PACKAGE}.")), "modules")
sys.exit("\\n".join(bad) if bad else 0)
"""


def check_installed(bindir: Path, workdir: Path, version: str) -> list[str]:
    env, python, cli = clean_env(bindir), str(bindir / "python"), str(bindir / "fleetplan")
    failures = []
    for cmd in ([cli, "--version"], [python, "-m", PACKAGE, "--version"]):
        out = run(cmd, cwd=workdir, env=env)
        if out.returncode != 0 or version not in out.stdout:
            failures.append(f"`{' '.join(cmd[-3:])}` printed {out.stdout.strip()!r}, not version {version}")
    where = run([python, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=workdir, env=env)
    if str(ROOT) in where.stdout or str(bindir.parent) not in where.stdout:
        failures.append(f"{PACKAGE} imported from {where.stdout.strip()!r}, not the fresh venv")
    out = run([python, "-c", IMPORT_ALL], cwd=workdir, env=env)
    if out.returncode != 0:
        failures.append(f"modules fail to import from the wheel:\n{out.stderr.strip()}")
    for generic in ("api", "models", "solver", "profiler", "fixtures"):
        if run([python, "-c", f"import {generic}"], cwd=workdir, env=env).returncode == 0:
            failures.append(f"`import {generic}` succeeds: the wheel claims a generic top-level name")
    out = run([cli, "plan", "paper", "--plain"], cwd=workdir, env=env)
    if out.returncode != 0 or not out.stdout.startswith("status optimal"):
        failures.append(
            f"`fleetplan plan paper` failed (exit {out.returncode}):\n{out.stdout[:500]}{out.stderr}"
        )
    else:
        print(out.stdout.splitlines()[0])
    db = f"sqlite:///{workdir / 'store.db'}"
    out = run([cli, "db", "upgrade", "--database-url", db], cwd=workdir, env=env)
    if out.returncode != 0 or "at revision" not in out.stdout:
        failures.append(f"`fleetplan db upgrade` failed (exit {out.returncode}):\n{out.stdout}{out.stderr}")
    failures += check_serve(cli, workdir, env)
    return failures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=body, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:  # a 4xx/5xx still has a problem+json body worth printing
        return error.code, json.loads(error.read() or b"{}")


def check_serve(cli: str, workdir: Path, env: dict) -> list[str]:
    """`fleetplan serve` on a free loopback port: GET /health, POST /plan on the bundled paper request."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = workdir / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [cli, "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdout=sink,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            try:
                status, health = http("GET", f"{base}/health")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    return [f"`fleetplan serve` never answered GET /health:\n{log.read_text()[-2000:]}"]
                time.sleep(0.25)
        request = run([str(Path(cli).parent / "python"), "-c", _PRINT_PAPER], cwd=workdir, env=env).stdout
        plan_status, plan = http("POST", f"{base}/plan", request.encode())
        print(f"serve: GET /health {status} {health}; POST /plan {plan_status} slo_rps={plan.get('slo_rps')}")
        if status != 200 or plan_status != 200 or plan.get("status") != "optimal":
            return [f"served answers wrong: /health {status} {health}, /plan {plan_status} {plan}"]
        return []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_PRINT_PAPER = "from fleetplan import fixtures; print(fixtures.request_path('paper').read_text())"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args = parser.parse_args(argv)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    tmp = Path(tempfile.mkdtemp(prefix="fleetplan-dist-"))
    print(f"work folder: {tmp}")
    try:
        wheel, sdist = build(tmp / "dist", clean_copy(tmp / "src"))
        failures = check_contents(wheel, sdist, tracked_package_files())
        empty = tmp / "empty"
        empty.mkdir()
        failures += check_installed(fresh_venv(tmp / "venv", wheel), empty, version)
    except (CheckFailed, subprocess.TimeoutExpired) as error:
        failures = [str(error)]
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print("dist check: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
