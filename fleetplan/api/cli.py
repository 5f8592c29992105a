"""`fleetplan`: plan a fleet from a request file, serve the HTTP API, list profile sets.

A thin shell: it decodes through models.codec, calls solver.plan and prints. Heavy imports (the solver's
pandas and highspy, Litestar, uvicorn) happen inside the commands so that `fleetplan --help` is fast.

Exit codes: 0 success, 2 bad input (the request, or the profile data it names: a 4xx over HTTP),
1 the planner failed (the solver gave no plan, or a plan failed verification: a 5xx over HTTP),
130 `profile` was interrupted (Ctrl-C; the finished points are kept for a rerun to resume).
"""

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from fleetplan.api.cli_store import register as register_store_commands

if TYPE_CHECKING:
    import pandas as pd

    from fleetplan.models.errors import PlannerError
    from fleetplan.models.plan import Plan, PlanRequest
    from fleetplan.models.profile import ProfileGrid
    from fleetplan.models.simulation import SimulationReport
    from fleetplan.profiler.calibrate import Calibration
    from fleetplan.profiler.runner import RunResult
    from fleetplan.profiler.store import ProfileStore

_IMPORTED = time.monotonic()
EXIT_INPUT = 2
EXIT_SOLVER = 1
EXIT_INTERRUPTED = 130
# `plan` answers this long before its time limit ends: what the interpreter needs to exit (measured
# 0.1-0.3 s on a loaded 2-core machine, bench/bounds.py)
EXIT_RESERVE_S = 0.25


def _fail(error: "PlannerError") -> NoReturn:
    """Print "error: <field>: <reason>" on stderr; exit 2 for the user's input, 1 for the planner."""
    click.echo(f"error: {error}", err=True)
    sys.exit(EXIT_INPUT if error.status_code < 500 else EXIT_SOLVER)


def _with_time_limit(request: "PlanRequest", seconds: float) -> "PlanRequest":
    """The request with options.time_limit_s replaced, re-validated through the codec (so the bounds and
    the error message are the same as for a time limit written in the file)."""
    from fleetplan.models.codec import convert, to_builtins
    from fleetplan.models.plan import PlanRequest

    data = to_builtins(request)
    data["options"]["time_limit_s"] = seconds
    return convert(data, PlanRequest)


def _process_started() -> float:
    """When this `fleetplan` process started, on the time.monotonic() clock (Linux: /proc), so that a
    time limit covers the interpreter's start too; when this module was imported long after its process
    started (a test runner, a notebook), or elsewhere, now."""
    import os

    now = time.monotonic()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = now - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return now
    return started if 0 <= _IMPORTED - started < 2.0 else now


def _request_path(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Path | None:
    """A request file, or the name of a bundled example request (`fleetplan plan paper`) when no file of
    that name exists."""
    if value is None or Path(value).exists():
        return None if value is None else Path(value)
    from fleetplan import fixtures

    if value in fixtures.request_names():
        return fixtures.request_path(value)
    raise click.BadParameter(
        f"no such file, and no bundled request of that name (bundled: {', '.join(fixtures.request_names())})"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fleetplan", prog_name="fleetplan")
def main() -> None:
    """Placement planner for LLM serving fleets (prefill/decode device pairing as a MILP)."""
    import os

    # candidate tables kept on disk for every later command and the server's workers (they inherit the
    # environment): the user's cache directory unless the variable says otherwise
    # (fleetplan/solver/table_cache.py; named here, not imported: --help stays free of the solver)
    os.environ.setdefault("FLEETPLAN_CANDIDATE_CACHE", "default")


@main.command("plan")
@click.argument("file", metavar="REQUEST", callback=_request_path)
@click.option("--json", "as_json", is_flag=True, help="Print the Plan as JSON (the API's response body).")
@click.option("--time-limit", type=float, metavar="S", help="Override options.time_limit_s (seconds).")
@click.option("--plain", is_flag=True, help="Plain-text tables even on a terminal with rich installed.")
def plan_command(file: Path, as_json: bool, time_limit: float | None, plain: bool) -> None:
    """Plan the fleet described by the PlanRequest JSON in REQUEST: a file, or the name of a bundled
    example (paper, scarce_gpus, link_bound, infeasible).

    options.time_limit_s (or --time-limit) is a wall-clock budget for the whole command: the plan runs in
    a child process that is killed when the budget ends (exit 1, "no plan within time_limit_s")."""
    began = _process_started()  # options.time_limit_s bounds the whole command, start-up included
    from fleetplan.api.workers import WorkerCrashed, solve_blocking
    from fleetplan.models.codec import read_request
    from fleetplan.models.errors import PlannerError

    try:
        request = read_request(file)
        if time_limit is not None:
            request = _with_time_limit(request, time_limit)
        result = solve_blocking(request, None, began + request.options.time_limit_s - EXIT_RESERVE_S)
    except PlannerError as error:
        _fail(error)
    except WorkerCrashed as error:
        click.echo(f"error: the planner failed unexpectedly: {error}", err=True)
        sys.exit(EXIT_SOLVER)

    if as_json:
        import msgspec

        from fleetplan.models.codec import encode

        click.echo(msgspec.json.format(encode(result), indent=2).decode())
    else:
        from fleetplan.api.render import render

        # rich only pays off on a terminal; pipes and files get plain columns that never wrap mid-cell
        render(result, sys.stdout, plain=plain or not sys.stdout.isatty())


def _settings_epilog() -> str:
    from fleetplan.api.settings import describe

    lines = ["\b", "Settings (environment; defaults < --config FILE < environment < options):"]
    lines += [f"  {env:<36} {default:<12} {field}" for env, default, field in describe()]
    lines.append("  FLEETPLAN_SETTINGS_FILE              unset        a TOML or JSON file of these settings")
    return "\n".join(lines)


@main.command("serve", epilog=_settings_epilog())
@click.option("--host", default=None, help="Interface to bind (FLEETPLAN_HOST; default 127.0.0.1).")
@click.option("--port", default=None, type=click.IntRange(0, 65535), help="TCP port (FLEETPLAN_PORT; 8000).")
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    metavar="FILE",
    help="A settings file (TOML or JSON), below the environment in precedence.",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="FLEETPLAN_LOG_LEVEL; default info.",
)
@click.option(
    "--log-format",
    default=None,
    type=click.Choice(["text", "json"]),
    help="FLEETPLAN_LOG_FORMAT; default text.",
)
def serve_command(
    host: str | None, port: int | None, config: Path | None, log_level: str | None, log_format: str | None
) -> None:
    """Serve the HTTP API (POST /plan, GET /profiles, GET /health, GET /metrics; OpenAPI at /schema).

    SIGTERM or Ctrl-C: new requests are refused, in-flight ones get FLEETPLAN_SHUTDOWN_GRACE_S to finish,
    then every running solve is killed and the server exits.
    """
    from fleetplan.api.app import create_app
    from fleetplan.api.server import serve
    from fleetplan.api.settings import SettingsError, load_settings

    try:
        settings = load_settings(
            file=config, host=host, port=port, log_level=log_level, log_format=log_format
        )
    except SettingsError as error:
        raise click.UsageError(str(error)) from error
    serve(create_app(settings=settings), settings)


@main.command("cache")
@click.option("--clear", is_flag=True, help="Remove every kept table set.")
def cache_command(clear: bool) -> None:
    """Where the candidate tables are kept on disk (FLEETPLAN_CANDIDATE_CACHE; `off` turns it off), how
    many and how large; with --clear, remove them. Later plans of a fleet, in any process of this user,
    read its tables from there instead of building them again."""
    from fleetplan.solver import table_cache

    folder = table_cache.directory()
    if folder is None:
        click.echo("candidate cache: off (FLEETPLAN_CANDIDATE_CACHE)")
        return
    if clear:
        click.echo(f"removed {table_cache.clear(folder)} table sets from {folder}")
        return
    files = table_cache.kept(folder)
    size = sum(path.stat().st_size for path in files)
    click.echo(f"candidate cache: {folder}\n{len(files)} table sets, {size / 2**20:.1f} MiB")


@main.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print the manifests as JSON.")
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="A user profile store to list too (default: $FLEETPLAN_PROFILE_STORE).",
)
def profiles_command(as_json: bool, store_dir: Path | None) -> None:
    """List the stored and bundled profile sets."""
    from fleetplan.models.codec import encode
    from fleetplan.models.errors import PlannerError

    store = _store(store_dir)
    try:
        named, broken = store.manifests()
    except PlannerError as error:
        _fail(error)
    manifests = [manifest for _, manifest in named]
    for line in broken:
        click.echo(f"warning: {line}", err=True)
    if as_json:
        import msgspec

        click.echo(msgspec.json.format(encode(manifests), indent=2).decode())
        return
    if not manifests:
        click.echo("no profile sets found (bundled fleetplan/fixtures/profiles or $FLEETPLAN_PROFILE_STORE)")
        return
    width = max(len(m.name) for m in manifests)
    for m in manifests:
        description = m.description if len(m.description) <= 90 else m.description[:87] + "..."
        click.echo(f"{m.name.ljust(width)}  {m.rows:>6} rows  sha256 {m.sha256[:12]}  {description}")


def _check_output(name: str, out: Path) -> None:
    """The set's name (profiler.store.check_set_name: one a request can name, not a bundled set's) and an
    OUT directory this process can make and write: checked before any work (an unwritable --out and a
    name like 'a/b' were tracebacks once the first point was measured)."""
    from fleetplan.profiler.store import check_set_name

    check_set_name(name)
    writable_dir(out, "out")


def writable_dir(path: Path, field: str) -> None:
    """Make `path` (with its parents) and check this process can write into it: an InputError naming
    `field` otherwise, before any work whose output would be lost."""
    import os

    from fleetplan.models.errors import InputError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot make {str(path)!r}: {error.strerror}", field=field) from error
    if not os.access(path, os.W_OK):
        raise InputError(f"cannot write into {str(path)!r}", field=field)


def _int_list(text: str, option: str) -> list[str]:
    """Comma-separated values as strings ("1, 4,16": 1, 4, 16); an empty item ("128,,512": a typo) is an
    InputError naming `option`, not skipped."""
    from fleetplan.models.errors import InputError

    parts = [part.strip() for part in text.split(",")]
    if len(parts) > 1 and not all(parts):
        msg = f"{text!r} has an empty item; give values separated by single commas"
        raise InputError(msg, field=option)
    return [part for part in parts if part]


@main.command("profile")
@click.option(
    "--backend",
    required=True,
    metavar="NAME",
    help="Engine: transformers, openai, vllm, neuron, jetstream or analytic (spec-sheet estimate).",
)
@click.option(
    "--device",
    required=True,
    metavar="LABEL",
    help="Device label the rows carry (for --backend analytic: a models.hardware name, e.g. inf2).",
)
@click.option("--models", required=True, metavar="M1,M2", help="Comma-separated model names.")
@click.option("--batches", required=True, metavar="B1,B2", help="Comma-separated batch sizes.")
@click.option("--prompts", required=True, metavar="P1,P2", help="Comma-separated prompt lengths (tokens).")
@click.option("--tp", default="1", show_default=True, metavar="T1,T2", help="Comma-separated TP degrees.")
@click.option(
    "--output-tokens", default=128, show_default=True, type=int, help="Tokens generated per request."
)
@click.option("--warmup", default=20, show_default=True, type=int, help="Batches discarded per point.")
@click.option("--runs", default=100, show_default=True, type=int, help="Batches measured per point.")
@click.option("--name", "set_name", metavar="SET", help="Profile set name (default: <backend>-<device>).")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Profile store directory the set is written into (atomically), with the resume file.",
)
@click.option("--endpoint", metavar="URL", help="Server address for --backend openai or jetstream.")
@click.option(
    "--engine-option",
    "engine_options",
    multiple=True,
    metavar="KEY=JSON",
    help="Extra engine constructor argument, value as JSON or a bare string "
    '(e.g. model_map=\'{"llama-3.1-8b": "meta-llama/Llama-3.1-8B"}\'); repeatable.',
)
@click.option("--restart", is_flag=True, help="Discard the finished points of an earlier run of this set.")
@click.option("--description", help="Manifest description (default: the grid in words).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar (stderr).")
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="For --backend analytic: factors fitted by `fleetplan calibrate --out FILE`.",
)
def profile_command(
    backend: str,
    device: str,
    models: str,
    batches: str,
    prompts: str,
    tp: str,
    output_tokens: int,
    warmup: int,
    runs: int,
    set_name: str | None,
    out: Path,
    endpoint: str | None,
    restart: bool,
    description: str | None,
    progress: bool,
    calibration: Path | None,
    engine_options: tuple[str, ...],
) -> None:
    """Measure (or, with --backend analytic, estimate) a latency grid and store it as a profile set.

    Finished points go to OUT/SET.partial.jsonl as they complete; Ctrl-C keeps them and the same command
    resumes. The set replaces OUT/SET only after the whole grid is done and every table check passed.
    """
    from fleetplan.models.errors import PlannerError

    try:
        grid = _profile_grid(device, models, batches, prompts, tp, output_tokens, warmup, runs)
        name = set_name or f"{backend}-{device}"
        _check_output(name, out)  # before any point is measured or a resume file written
        options = _profile_engine_options(backend, device, endpoint, calibration, engine_options)
        result = _run_profile(backend, options, grid, out, name, restart, progress, description)
    except PlannerError as error:
        _fail(error)
    _echo_profile_result(result, out)


def _profile_grid(
    device: str,
    models: str,
    batches: str,
    prompts: str,
    tp: str,
    output_tokens: int,
    warmup: int,
    runs: int,
) -> "ProfileGrid":
    """The `profile` options as a ProfileGrid (the comma-separated lists split, the integer ones parsed),
    validated through the codec."""
    from fleetplan.models.codec import convert
    from fleetplan.models.errors import InputError
    from fleetplan.models.profile import ProfileGrid

    raw = {
        "device": device,
        "models": _int_list(models, "--models"),
        "batches": _int_list(batches, "--batches"),
        "prompts": _int_list(prompts, "--prompts"),
        "tp": _int_list(tp, "--tp"),
        "output_tokens": output_tokens,
        "warmup": warmup,
        "runs": runs,
    }
    for key in ("batches", "prompts", "tp"):
        try:
            raw[key] = [int(v) for v in raw[key]]
        except ValueError:
            msg = f"expected comma-separated integers, got {','.join(raw[key])!r}"
            raise InputError(msg, field=key) from None
    return convert(raw, ProfileGrid)


def _profile_engine_options(
    backend: str,
    device: str,
    endpoint: str | None,
    calibration: Path | None,
    engine_options: tuple[str, ...],
) -> dict[str, object]:
    """The engine's constructor arguments: the --engine-option pairs, then --endpoint and the device (with
    --calibration's factors) where the backend takes them; an InputError where it does not."""
    from fleetplan.models.errors import InputError

    options: dict[str, object] = _parse_engine_options(engine_options)
    if backend == "openai" and not endpoint:
        raise InputError("--backend openai needs --endpoint URL", field="endpoint")
    if endpoint:
        if backend not in ("openai", "jetstream"):
            msg = f"--endpoint only applies to --backend openai or jetstream, not {backend!r}"
            raise InputError(msg, field="endpoint")
        options["endpoint"] = endpoint
    if backend == "analytic":
        options["device"] = device
        if calibration is not None:
            options["efficiency"] = _read_calibration(calibration).efficiency(device)
    elif calibration is not None:
        raise InputError("--calibration only applies to --backend analytic", field="calibration")
    return options


def _run_profile(
    backend: str,
    options: dict[str, object],
    grid: "ProfileGrid",
    out: Path,
    name: str,
    restart: bool,
    progress: bool,
    description: str | None,
) -> "RunResult":
    """Run the grid through the backend's engine (closed afterwards); on Ctrl-C, say how many points are
    kept and how to resume, and exit 130."""
    from fleetplan.profiler.engines import get_engine
    from fleetplan.profiler.runner import RunInterrupted, run_grid

    engine = get_engine(backend, **options)
    try:
        return run_grid(
            engine, grid, out, name, restart=restart, show_progress=progress, description=description
        )
    except RunInterrupted as interrupted:
        click.echo(
            f"interrupted: {interrupted.kept} of {interrupted.total} points kept in "
            f"{interrupted.partial}; "
            "rerun the same command to resume (--restart to start over)",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    finally:
        engine.close()


def _echo_profile_result(result: "RunResult", out: Path) -> None:
    """The run's warnings (stderr), then what it wrote and how to plan with it."""
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    resumed = f", {result.resumed} resumed from an earlier run" if result.resumed else ""
    click.echo(
        f"wrote profile set {result.name!r} ({result.manifest.rows} rows, "
        f"sha256 {result.manifest.sha256[:12]}"
        f"{resumed}) to {result.directory}"
    )
    spec = f'"profiles": {{"set": "{result.name}"}}'
    click.echo(f"plan with it: FLEETPLAN_PROFILE_STORE={out} and {spec}")


__all__ = ["main"]


def _store(store_dir: Path | None) -> "ProfileStore":
    """The bundled sets plus `store_dir` (default: $FLEETPLAN_PROFILE_STORE)."""
    from fleetplan.profiler.store import ProfileStore, bundled_root

    return ProfileStore([bundled_root(), store_dir]) if store_dir is not None else ProfileStore()


def _parse_engine_options(pairs: tuple[str, ...]) -> dict[str, object]:
    """KEY=VALUE pairs; VALUE is parsed as JSON when it is JSON, else kept as a string."""
    import json

    from fleetplan.models.errors import InputError

    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            msg = f"expected KEY=VALUE with a Python identifier as KEY, got {pair!r}"
            raise InputError(msg, field="engine_option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _read_calibration(path: Path) -> "Calibration":
    from fleetplan.models.codec import decode
    from fleetplan.models.errors import InputError
    from fleetplan.profiler.calibrate import Calibration

    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(
            f"cannot read calibration file {path}: {error.strerror}", field="calibration"
        ) from error
    try:
        return decode(data, Calibration)
    except InputError as error:  # "name: unknown field" read as if about --name (session 34)
        where = f" at {error.field}" if error.field else ""
        writer = "`fleetplan calibrate SET --out FILE` writes one"
        msg = f"{path} is not a calibration ({writer}){where}: {error.message}"
        raise InputError(msg, field="--calibration") from error


@main.command("calibrate")
@click.argument("set_name", metavar="SET")
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="A user profile store holding SET (default: $FLEETPLAN_PROFILE_STORE and the bundled sets).",
)
@click.option(
    "--output-tokens",
    default=128,
    show_default=True,
    type=click.IntRange(1, 10_000_000),
    help="The output length SET was measured with (sets the decode context).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the fitted factors as JSON, for `fleetplan profile --backend analytic --calibration`.",
)
def calibrate_command(set_name: str, store_dir: Path | None, output_tokens: int, out: Path | None) -> None:
    """Fit the analytic estimator to the measured rows of SET; print the fit error per device."""
    from fleetplan.models.codec import encode
    from fleetplan.models.errors import PlannerError
    from fleetplan.profiler.calibrate import fit, report

    store = _store(store_dir)
    try:
        calibration = fit(store.load(set_name), output_tokens=output_tokens)
    except PlannerError as error:
        _fail(error)
    click.echo(report(calibration))
    if out is not None:
        try:
            out.write_bytes(encode(calibration))
        except OSError as error:
            from fleetplan.models.errors import InputError

            _fail(InputError(f"cannot write {str(out)!r}: {error.strerror}", field="out"))
        click.echo(f"wrote the fitted factors to {out}")


@main.command("merge")
@click.argument("sets", nargs=-1, required=True, metavar="SET...")
@click.option("--name", "set_name", required=True, metavar="SET", help="Name of the merged set.")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Store to write the merged set into (the sets are also looked up there).",
)
@click.option("--replace", is_flag=True, help="Replace an existing set of that name (after validation).")
def merge_command(sets: tuple[str, ...], set_name: str, out: Path, replace: bool) -> None:
    """Merge profile sets from several machines into one (e.g. one per device family).

    Rows are concatenated, never averaged: a (model, device, tp, batch, prompt_tokens) point measured in
    two sets is an error naming both rows. The merged set is validated, then stored atomically.
    """
    import datetime

    from fleetplan.models.errors import PlannerError
    from fleetplan.models.profile import ProfileSetManifest
    from fleetplan.profiler.store import check_set_name
    from fleetplan.profiler.tables import merge_tables

    store = _store(out)
    try:
        check_set_name(set_name)  # before loading and merging
        tables = [store.load(name) for name in sets]
        manifest = ProfileSetManifest(
            name=set_name,
            description=f"merged from {', '.join(sets)}",
            sha256="",
            rows=0,
            generator="fleetplan merge",
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            sources={t.name: f"sha256 {t.sha256}" for t in tables},
        )
        saved = store.save(set_name, merge_tables(tables), manifest, replace=replace)
    except PlannerError as error:
        _fail(error)
    click.echo(
        f"wrote profile set {set_name!r} ({saved.rows} rows, sha256 {saved.sha256[:12]}) to {out / set_name}"
    )


@main.command("simulate")
@click.argument("file", metavar="FILE", callback=_request_path)
@click.option(
    "--request",
    "request_file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="REQUEST",
    help="When FILE is a Plan (the JSON of `fleetplan plan --json`): the request it was planned for.",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="CSV",
    help="Arrivals from a trace (TIMESTAMP,ContextTokens,GeneratedTokens) instead of Poisson.",
)
@click.option(
    "--duration", default=600.0, show_default=True, type=float, metavar="S", help="Simulated seconds."
)
@click.option("--warmup", default=60.0, show_default=True, type=float, metavar="S", help="Unmeasured start.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--rate-scale", default=1.0, show_default=True, type=float, help="Multiply every class's rate.")
@click.option("--json", "as_json", is_flag=True, help="Print the SimulationReport as JSON.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PNG",
    help="Also draw TTFT/TBT distributions per class against the SLO lines (needs matplotlib).",
)
def simulate_command(
    file: Path,
    request_file: Path | None,
    trace: Path | None,
    duration: float,
    warmup: float,
    seed: int,
    rate_scale: float,
    as_json: bool,
    plot: Path | None,
) -> None:
    """Replay a plan through the discrete-event simulator: simulated vs predicted SLO attainment.

    FILE is a PlanRequest (planned first) or a Plan with --request.
    """
    import msgspec

    from fleetplan.models.codec import encode
    from fleetplan.models.errors import InputError, PlannerError

    try:
        _check_plot(plot)
        loaded = _load_trace(trace, warmup, duration, rate_scale)
        request, planned = _plan_to_simulate(file, request_file)
        if loaded is None:
            _check_arrivals(request, planned, warmup + duration, rate_scale)
        report = _replay(request, planned, loaded, duration, warmup, seed, rate_scale, plot)
    except PlannerError as error:
        _fail(error)
    except OSError as error:
        _fail(InputError(f"cannot read {error.filename}: {error.strerror}", field="file"))
    if plot is not None:
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        click.echo(msgspec.json.format(encode(report), indent=2).decode())
        return
    _echo_simulation(report)


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _check_plot(plot: Path | None) -> None:
    """InputError naming --plot when its file's suffix is not a picture's (PLOT_SUFFIXES)."""
    from fleetplan.models.errors import InputError

    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        msg = f"{str(plot)!r}: a picture is one of {', '.join(PLOT_SUFFIXES)}"
        raise InputError(msg, field="--plot")


def _load_trace(
    trace: Path | None, warmup: float, duration: float, rate_scale: float
) -> "pd.DataFrame | None":
    """The --trace arrivals (None without --trace), checked against the measured window."""
    loaded = None if trace is None else _check_trace(trace)
    if loaded is not None:
        _check_trace_window(loaded, warmup, duration, rate_scale)
    return loaded


def _plan_to_simulate(file: Path, request_file: Path | None) -> tuple["PlanRequest", "Plan"]:
    """The request and the plan to replay: FILE as a Plan for the --request file, else FILE planned; an
    InputError when the plan's status leaves nothing to simulate."""
    from fleetplan.models.codec import decode, read_request
    from fleetplan.models.errors import InputError
    from fleetplan.models.plan import Plan
    from fleetplan.solver import plan as solve

    if request_file is not None:
        request = read_request(request_file)
        planned = decode(file.read_bytes(), Plan)
    else:
        try:
            request = read_request(file)
        except InputError as error:
            _refuse_a_plan(file, error)
        planned = solve(request, with_baselines=False)
    if planned.status not in ("optimal", "feasible"):
        raise InputError(f"the plan's status is {planned.status!r}: nothing to simulate", field="status")
    return request, planned


def _refuse_a_plan(file: Path, error: Exception) -> NoReturn:
    """Re-raise `error` (FILE is not a request), or, where FILE decodes as a Plan, an InputError that says
    so and how to replay it: a plan alone does not say its fleet's profiles and SLOs."""
    import msgspec

    from fleetplan.models.errors import InputError
    from fleetplan.models.plan import Plan

    try:
        msgspec.json.decode(file.read_bytes(), type=Plan)
    except (msgspec.DecodeError, OSError):
        raise error from None
    msg = (
        f"{file} is a Plan, not a PlanRequest; replay it with the request it answers: --request REQUEST.json"
    )
    raise InputError(msg, field="FILE") from error


def _replay(
    request: "PlanRequest",
    planned: "Plan",
    loaded: "pd.DataFrame | None",
    duration: float,
    warmup: float,
    seed: int,
    rate_scale: float,
    plot: Path | None,
) -> "SimulationReport":
    """The replay's report; with --plot, the latency distributions drawn into `plot` and their samples
    dropped from the report."""
    import msgspec

    from fleetplan.simulator import simulate
    from fleetplan.solver.pipeline import resolve_profiles

    report = simulate(
        request,
        planned,
        resolve_profiles(request),
        duration_s=duration,
        warmup_s=warmup,
        seed=seed,
        rate_scale=rate_scale,
        trace=loaded,
        keep_samples=plot is not None,
    )
    if plot is not None:
        from fleetplan.api.plots import plot_latency_distributions

        plot_latency_distributions(report, plot)
        report = msgspec.structs.replace(
            report,
            classes=[
                msgspec.structs.replace(c, ttft_ms_samples=None, tbt_ms_samples=None) for c in report.classes
            ],
        )
    return report


def _echo_simulation(report: "SimulationReport") -> None:
    """The report's table view on stdout."""
    import io

    from fleetplan.api.render import render_simulation

    buffer = io.StringIO()
    render_simulation(report, buffer)
    click.echo(buffer.getvalue(), nl=False)


def _check_trace(path: Path) -> "pd.DataFrame":
    """The --trace file as simulator.arrivals.load_trace reads it (read up front, so that a bad file is an
    InputError naming --trace: it was a traceback for an empty, ragged, non-UTF-8 or badly dated file)."""
    from fleetplan.models.errors import InputError
    from fleetplan.simulator.arrivals import CONTENT_ERRORS, load_trace

    try:
        return load_trace(path)
    except OSError as error:
        raise InputError(f"cannot read {str(path)!r}: {error.strerror}", field="--trace") from error
    except CONTENT_ERRORS as error:
        raise InputError(f"{str(path)!r}: {error}", field="--trace") from error


def _check_arrivals(request: "PlanRequest", planned: "Plan", window_s: float, rate_scale: float) -> None:
    """InputError naming --duration when the window would draw more than MAX_ARRIVALS Poisson arrivals
    (a 1e12 s window tried to allocate 116 TiB). The CLI's window only: the gate's and verify's are the
    planner's, sized to the request."""
    from fleetplan.models.errors import InputError
    from fleetplan.simulator.run import MAX_ARRIVALS, expected_arrivals

    expected = expected_arrivals(request, planned, window_s, rate_scale)
    if expected > MAX_ARRIVALS:
        msg = (
            f"{expected:.3g} arrivals expected, more than the {MAX_ARRIVALS:,} one replay draws: shorten "
            "the window or split it over seeds"
        )
        raise InputError(msg, field="--duration")


def _check_trace_window(frame: "pd.DataFrame", warmup: float, duration: float, rate_scale: float) -> None:
    """InputError when the trace ends before the measured window starts (nothing would be measured, and
    the report read "attainment 100.0% ... (0.00 RPS)"); a warning when it ends inside it (the rates
    measured are the trace's over the whole window, its silent end included). The replay runs the trace
    at `rate_scale`: its times divided by it."""
    from fleetplan.models.errors import InputError

    span = float(frame["t_s"].max()) / rate_scale
    if span < warmup:
        msg = f"the trace spans {span:g} s and the measured window starts at {warmup:g} s: lower --warmup"
        raise InputError(msg, field="--trace")
    if span < warmup + duration:
        click.echo(
            f"warning: the trace spans {span:g} s, less than the {warmup + duration:g} s of warm-up and "
            f"measured window: the rates below count its silent end (use --duration {span - warmup:g})",
            err=True,
        )


register_store_commands(main)  # fleet, plans, runs, replan, db (fleetplan/api/cli_store.py)

from fleetplan.api.cli_whatif import whatif_command  # noqa: E402  (it builds on the helpers above)

main.add_command(whatif_command)
