"""`fleetplan fleet put|list`, `plans`, `runs`, `replan`, `db upgrade`: the store's commands,
thin shells over fleetplan.store and fleetplan.replan (docs/store.md). Heavy imports stay inside the commands.

Exit codes of `replan` (the contract): 0 promoted or unchanged (or a dry run that would promote), 3 kept
the current plan (the gate, the churn limit or verification said no; the reason is printed), 1 error (bad
input, unknown fleet, store unreachable).
"""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from fleetplan.models.store import Run
    from fleetplan.store.repository import Repository

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_KEPT = 3

_database = click.option(
    "--database-url",
    "database_url",
    metavar="URL",
    envvar="FLEETPLAN_DATABASE_URL",
    help="The store (default: $FLEETPLAN_DATABASE_URL, else an SQLite file in the user's data directory).",
)
_as_json = click.option("--json", "as_json", is_flag=True, help="Print JSON (the API's response body).")


def _error(error: Exception) -> NoReturn:
    click.echo(f"error: {error}", err=True)
    sys.exit(EXIT_ERROR)


def _repository(url: str | None) -> "Repository":
    from fleetplan.store import open_repository

    return open_repository(url, migrate=True)


def _echo_json(obj: Any) -> None:
    import msgspec

    from fleetplan.models.codec import encode

    click.echo(msgspec.json.format(encode(obj), indent=2).decode())


def _listed(fetch: Callable[["Repository"], list[Any]], url: str | None, as_json: bool) -> list[Any] | None:
    """A listing from the store (a PlannerError exits 1, named); with --json it is printed here and None
    returned: the caller prints its table only for a list."""
    from fleetplan.models.errors import PlannerError

    try:
        records = fetch(_repository(url))
    except PlannerError as error:
        _error(error)
    if as_json:
        _echo_json(records)
        return None
    return records


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    """Plain columns, left-aligned text and right-aligned numbers (pipes and logs read them)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in rows) and rows for i in range(len(headers))]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_run(run: "Run") -> str:
    """The RUN as text: status and reason, then the diff's pools, devices, totals and classes, the forecast
    and the gate (with a note when its window was short for some class: gate.thin_note)."""
    from fleetplan.replan.gate import thin_note

    lines = [
        f"run {run.id} of fleet {run.fleet}: {run.status.upper()}" + (" (dry run)" if run.dry_run else "")
    ]
    if run.reason:
        lines.append(f"reason: {run.reason}")
    lines.append(f"plan: {run.plan_id}  (previous: {run.previous_plan_id})")
    change = run.diff
    if change is None:
        return "\n".join(lines)
    lines += ["", f"moves: {change.moves}"]
    if change.pools:
        rows = [
            [p.model, p.role, p.device, p.tp, p.batch, p.before, p.after, p.after - p.before]
            for p in change.pools
        ]
        lines += ["", _table(["model", "role", "device", "tp", "batch", "before", "after", "change"], rows)]
    if change.devices:
        rows = [[d.name, d.before, d.after, d.after - d.before] for d in change.devices]
        lines += ["", _table(["device", "before", "after", "change"], rows)]
    totals = [
        ["slo_rps", round(change.slo_rps.before, 3), round(change.slo_rps.after, 3)],
        ["cost_per_hour", round(change.cost_per_hour.before, 4), round(change.cost_per_hour.after, 4)],
    ]
    lines += ["", _table(["total", "before", "after"], totals)]
    if change.classes:
        rows = [[c.name, round(c.served_before, 3), round(c.served_after, 3), c.why] for c in change.classes]
        lines += ["", _table(["class", "served_before", "served_after", "why"], rows)]
    if run.forecast is not None:
        rows = [
            [
                c.name,
                round(c.previous_rps, 3),
                round(c.history_rps[-1], 3) if c.history_rps else 0.0,
                c.planned_rps,
            ]
            for c in run.forecast.classes
        ]
        title = f"forecast ({run.forecast.method}, {run.forecast.horizon_h:g} h, q{run.forecast.quantile:g})"
        lines += ["", title, _table(["class", "fleet_rps", "last_observed", "planned_rps"], rows)]
    if run.gate is not None and run.gate.simulated:
        verdict = "passed" if run.gate.passed else "FAILED"
        lines += ["", f"gate: {verdict} on {len(run.gate.seeds)} seed(s) of {run.gate.duration_s:g} s"]
        note = thin_note(run.gate)
        if note is not None:
            lines.append(note)
    return "\n".join(lines)


def exit_code(run: "Run") -> int:
    if run.status in ("promoted", "unchanged"):
        return EXIT_OK
    if run.status == "kept":
        return EXIT_OK if run.dry_run and run.reason and run.reason.startswith("dry run") else EXIT_KEPT
    return EXIT_ERROR


@click.group("fleet")
def fleet_group() -> None:
    """Store and list fleets (named, versioned PlanRequests)."""


@fleet_group.command("put")
@click.argument("name")
@click.argument("file", metavar="REQUEST.json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_database
@_as_json
def fleet_put(name: str, file: Path, database_url: str | None, as_json: bool) -> None:
    """Store REQUEST.json as fleet NAME (a new version when it differs from the stored one)."""
    from fleetplan.models.codec import read_request
    from fleetplan.models.errors import PlannerError

    try:
        record = _repository(database_url).put_fleet(name, read_request(file))
    except PlannerError as error:
        _error(error)
    if as_json:
        _echo_json(record)
    else:
        click.echo(f"fleet {record.name}: version {record.version}")


@fleet_group.command("list")
@_database
@_as_json
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 500))
@click.option("--offset", default=0, show_default=True, type=click.IntRange(0))
def fleet_list(database_url: str | None, as_json: bool, limit: int, offset: int) -> None:
    """List the stored fleets."""
    records = _listed(lambda repo: repo.list_fleets(limit, offset), database_url, as_json)
    if records is None:
        return
    rows = [
        [r.name, r.version, len(r.request.devices), len(r.request.workloads), r.updated_at] for r in records
    ]
    click.echo(_table(["fleet", "version", "devices", "workloads", "updated_at"], rows))


@click.command("plans")
@click.argument("name")
@_database
@_as_json
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--offset", default=0, show_default=True, type=click.IntRange(0))
def plans_command(name: str, database_url: str | None, as_json: bool, limit: int, offset: int) -> None:
    """List fleet NAME's plans, newest first (the current one marked)."""
    records = _listed(lambda repo: repo.list_plans(name, limit, offset), database_url, as_json)
    if records is None:
        return
    rows = [
        [
            r.id,
            r.state,
            r.fleet_version,
            r.plan.status,
            round(r.slo_rps, 3),
            round(r.cost_per_hour, 4),
            f"{r.profile_set.name}@{r.profile_set.sha256[:12]}",
            r.created_at,
        ]
        for r in records
    ]
    headers = ["id", "state", "fleet_version", "status", "slo_rps", "cost_per_hour", "profiles", "created_at"]
    click.echo(_table(headers, rows))


@click.command("runs")
@click.argument("name")
@_database
@_as_json
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
def runs_command(name: str, database_url: str | None, as_json: bool, limit: int) -> None:
    """List fleet NAME's re-plan runs, newest first."""
    runs = _listed(lambda repo: repo.list_runs(name, limit), database_url, as_json)
    if runs is None:
        return
    rows = [
        [r.id, r.status, r.diff.moves if r.diff else "", r.plan_id or "", r.started_at, r.reason or ""]
        for r in runs
    ]
    click.echo(_table(["id", "status", "moves", "plan", "started_at", "reason"], rows))


TRAFFIC_OPTIONS = ("traffic_format", "interval", "forecast", "horizon", "quantile")


def _traffic_options_need_traffic(options: dict[str, Any]) -> None:
    """A usage error (exit 1) for forecast options given without --traffic: they were silently ignored
    (`replan web --quantile 2` promoted a plan at the fleet's own rates)."""
    from click.core import ParameterSource

    context = click.get_current_context()
    given = [n for n in TRAFFIC_OPTIONS if context.get_parameter_source(n) is not ParameterSource.DEFAULT]
    if given and options["traffic"] is None:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in given)
        error = click.UsageError(f"{flags}: options of observed traffic; give --traffic FILE too", context)
        error.exit_code = EXIT_ERROR
        raise error


def _replan_order(options: dict[str, Any]) -> Any:
    """The REPLAN the options describe, decoded through models.codec (same errors as the HTTP body)."""
    from fleetplan.models.codec import convert
    from fleetplan.models.store import ReplanRequest

    order: dict[str, Any] = {"dry_run": options["dry_run"]}
    if options["traffic"] is not None:
        order["traffic"] = {
            "source": options["traffic_format"],
            "path": str(options["traffic"]),
            "interval_s": options["interval"],
        }
        order["forecast"] = {"method": options["forecast"], "horizon_h": options["horizon"]}
        if options["quantile"] is not None:
            order["forecast"]["quantile"] = options["quantile"]
    for key in ("max_moves", "churn_penalty"):
        if options[key] is not None:
            order[key] = options[key]
    if options["profiles"] is not None:
        order["profiles"] = {"set": options["profiles"]}
    gate: dict[str, Any] = {"simulate": not options["no_gate"]}
    for key, option in (
        ("seeds", "gate_seeds"),
        ("duration_s", "gate_duration"),
        ("warmup_s", "gate_warmup"),
    ):
        if options[option] is not None:
            gate[key] = options[option]
    order["gate"] = gate
    return convert(order, ReplanRequest)


class ReplanCommand(click.Command):
    """`fleetplan replan` exits 1 on a usage error (a missing --traffic file, --max-moves -1), not click's
    2: its exit codes are the contract's, 0 / 3 / 1, which a nightly job's alerting reads."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as error:
            error.exit_code = EXIT_ERROR
            raise


@click.command("replan", cls=ReplanCommand)
@click.argument("name")
@click.option(
    "--traffic", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Observed traffic."
)
@click.option(
    "--traffic-format",
    type=click.Choice(["azure_csv", "mooncake_jsonl", "rates_csv"]),
    default="azure_csv",
    show_default=True,
)
@click.option("--interval", default=3600.0, show_default=True, type=float, help="Bin width of the rates (s).")
@click.option(
    "--forecast",
    type=click.Choice(["constant", "ewma", "seasonal_naive", "ets"]),
    default="seasonal_naive",
    show_default=True,
)
@click.option("--horizon", default=24.0, show_default=True, type=float, help="Forecast horizon (hours).")
@click.option("--quantile", type=float, help="Plan for this quantile of the forecast (default 0.95).")
@click.option("--max-moves", type=click.IntRange(0), help="At most this many instances added or removed.")
@click.option("--churn-penalty", type=float, help="Cost per hour charged per instance moved.")
@click.option(
    "--profiles",
    metavar="SET",
    help=(
        "Plan with this profile set (default: the newest stored set newer than the fleet's own that "
        "covers it, else the fleet's own)."
    ),
)
@click.option("--gate-seeds", type=click.IntRange(1, 20), help="Simulated seeds of the gate (default 3).")
@click.option("--gate-duration", type=float, help="Measured seconds per gate simulation (default 600).")
@click.option("--gate-warmup", type=float, help="Warm-up seconds per gate simulation (default 60).")
@click.option("--no-gate", is_flag=True, help="Promote without the simulation gate.")
@click.option("--dry-run", is_flag=True, help="Compute, gate and record the run, but never promote.")
@_database
@_as_json
def replan_command(name: str, database_url: str | None, as_json: bool, **options: Any) -> None:
    """Re-plan fleet NAME with the newest profiles and observed traffic; print the diff.

    Exit 0 promoted or unchanged, 3 kept the current plan (the reason is printed), 1 error."""
    from fleetplan.models.errors import PlannerError
    from fleetplan.replan import replan

    _traffic_options_need_traffic(options)
    try:
        order = _replan_order(options)
        run = replan(_repository(database_url), name, order)
    except PlannerError as error:
        _error(error)
    if as_json:
        _echo_json(run)
    else:
        click.echo(render_run(run))
    code = exit_code(run)
    if code and run.reason:  # stderr for what a job must act on (a dry run that would promote exits 0)
        click.echo(f"{run.status}: {run.reason}", err=True)
    sys.exit(code)


@click.group("db")
def db_group() -> None:
    """The store's database: migrations."""


@db_group.command("upgrade")
@_database
def db_upgrade(database_url: str | None) -> None:
    """Apply the migrations up to the newest revision (safe to repeat)."""
    from fleetplan.models.errors import PlannerError
    from fleetplan.store import database_url as resolve
    from fleetplan.store import make_engine, upgrade

    url = resolve(database_url)
    try:
        engine = make_engine(url)
        revision = upgrade(engine)
    except PlannerError as error:
        _error(error)
    click.echo(f"database {engine.url.render_as_string(hide_password=True)} at revision {revision}")


def register(main: click.Group) -> None:
    """Attach the store's commands to the `fleetplan` group."""
    for command in (fleet_group, plans_command, runs_command, replan_command, db_group):
        main.add_command(command)


__all__ = ["exit_code", "register", "render_run"]
