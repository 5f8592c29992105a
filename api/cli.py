"""`fleetplan`: plan a fleet from a request file, serve the HTTP API, list profile sets.

A thin shell: it decodes through models.codec, calls solver.plan and prints. Heavy imports (the solver's
pandas and highspy, Litestar, uvicorn) happen inside the commands so that `fleetplan --help` is fast.

Exit codes: 0 success, 2 bad input (the request, or the profile data it names: a 4xx over HTTP),
1 the planner failed (the solver gave no plan, or a plan failed verification: a 5xx over HTTP).
"""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

if TYPE_CHECKING:
    from models.errors import PlannerError
    from models.plan import PlanRequest

EXIT_INPUT = 2
EXIT_SOLVER = 1


def _fail(error: "PlannerError") -> NoReturn:
    """Print "error: <field>: <reason>" on stderr; exit 2 for the user's input, 1 for the planner."""
    click.echo(f"error: {error}", err=True)
    sys.exit(EXIT_INPUT if error.status_code < 500 else EXIT_SOLVER)


def _with_time_limit(request: "PlanRequest", seconds: float) -> "PlanRequest":
    """The request with options.time_limit_s replaced, re-validated through the codec (so the bounds and
    the error message are the same as for a time limit written in the file)."""
    from models.codec import convert, to_builtins
    from models.plan import PlanRequest

    data = to_builtins(request)
    data["options"]["time_limit_s"] = seconds
    return convert(data, PlanRequest)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fleetplan", prog_name="fleetplan")
def main() -> None:
    """Placement planner for LLM serving fleets (prefill/decode device pairing as a MILP)."""


@main.command("plan")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the Plan as JSON (the API's response body).")
@click.option("--time-limit", type=float, metavar="S", help="Override options.time_limit_s (seconds).")
@click.option("--plain", is_flag=True, help="Plain-text tables even on a terminal with rich installed.")
def plan_command(file: Path, as_json: bool, time_limit: float | None, plain: bool) -> None:
    """Plan the fleet described by the PlanRequest JSON in FILE."""
    from models.codec import read_request
    from models.errors import PlannerError

    try:
        request = read_request(file)
        if time_limit is not None:
            request = _with_time_limit(request, time_limit)
        from solver import plan

        result = plan(request)
    except PlannerError as error:
        _fail(error)

    if as_json:
        import msgspec

        from models.codec import encode

        click.echo(msgspec.json.format(encode(result), indent=2).decode())
    else:
        from api.render import render

        # rich only pays off on a terminal; pipes and files get plain columns that never wrap mid-cell
        render(result, sys.stdout, plain=plain or not sys.stdout.isatty())


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve_command(host: str, port: int, log_level: str) -> None:
    """Serve the HTTP API (POST /plan, GET /profiles, GET /health; OpenAPI at /schema)."""
    import uvicorn

    from api.app import create_app

    uvicorn.run(create_app(), host=host, port=port, log_level=log_level)


@main.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print the manifests as JSON.")
def profiles_command(as_json: bool) -> None:
    """List the stored and bundled profile sets."""
    from models.codec import encode
    from models.errors import PlannerError
    from profiler.store import ProfileStore

    store = ProfileStore()
    try:
        manifests = [store.manifest(name) for name in store.names()]
    except PlannerError as error:
        _fail(error)
    if as_json:
        import msgspec

        click.echo(msgspec.json.format(encode(manifests), indent=2).decode())
        return
    if not manifests:
        click.echo("no profile sets found (bundled fixtures/profiles or $FLEETPLAN_PROFILE_STORE)")
        return
    width = max(len(m.name) for m in manifests)
    for m in manifests:
        description = m.description if len(m.description) <= 90 else m.description[:87] + "..."
        click.echo(f"{m.name.ljust(width)}  {m.rows:>6} rows  sha256 {m.sha256[:12]}  {description}")


__all__ = ["main"]
