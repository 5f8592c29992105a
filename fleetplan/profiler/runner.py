"""The profiling harness: run a ProfileGrid through an engine and store the result as a profile set.

For every grid point (model, tp, batch, prompt_tokens), in `ProfileGrid.points()` order:

    warmup x engine.run_batch(...)                  discarded
    runs   x engine.run_batch(...)                  every request's TTFT and every inter-token gap kept
    -> profiler.stats.latency_columns               p50/p90/p99 in ms -> one ProfileRow
       (source "measured:<engine>:<device>")

An engine that estimates instead of timing (the `RowEstimator` protocol: `estimate_point`, e.g. the
`analytic` engine) is asked for the row directly; it may answer None ("does not fit"), which leaves the
point missing and listed, never filled.

Interrupt-safe and resumable: after each point its row is appended (and fsynced) to
`<out>/<name>.partial.jsonl`, whose first line records the grid and the engine. A rerun with the same grid
skips the points already there; a different grid is an InputError naming the differences (or `restart=True`
discards the file). Ctrl-C raises RunInterrupted (a KeyboardInterrupt) saying how many points are kept.
Only a complete run is checked (profiler.tables) and saved, atomically, by ProfileStore.save into `<out>`;
the partial file is removed after that save succeeds, so an interrupted save resumes with nothing to measure.
One run of a set at a time per store directory: a run holds an flock on `<out>/.run-<name>` throughout, and
a second run of the same set there is refused at once (ProfileRunBusy) rather than appending to the same
resume file.
"""

import contextlib
import json
import os
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
import pandas as pd

from fleetplan.models.codec import convert, to_builtins
from fleetplan.models.errors import InputError, ProfileMissing, ProfileRunBusy
from fleetplan.models.profile import ProfileGrid, ProfileRow, ProfileSetManifest
from fleetplan.profiler.engines.base import Engine
from fleetplan.profiler.stats import latency_columns
from fleetplan.profiler.store import ProfileStore, held_flock
from fleetplan.profiler.tables import check_no_nan, missing_grid_points, monotone_warnings
from fleetplan.progress import progress_bar

Point = tuple[str, int, int, int]
PARTIAL_SUFFIX = ".partial.jsonl"


@runtime_checkable
class RowEstimator(Protocol):
    """An engine that produces rows without timing anything (the `analytic` engine)."""

    def estimate_point(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> ProfileRow | None:
        """The row at one point, or None where there is none (the model does not fit)."""
        ...


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: `kept` of `total` points are safe in `partial`; rerun to resume."""

    def __init__(self, kept: int, total: int, partial: Path) -> None:
        super().__init__(f"interrupted: {kept} of {total} points kept in {partial}")
        self.kept = kept
        self.total = total
        self.partial = partial


@dataclass
class RunResult:
    """What a completed run wrote and what the checks found."""

    name: str
    directory: Path
    manifest: ProfileSetManifest
    warnings: list[str] = field(default_factory=list)
    done_now: int = 0
    resumed: int = 0
    missing: list[Point] = field(default_factory=list)


def partial_path(out: Path, name: str) -> Path:
    return Path(out) / f"{name}{PARTIAL_SUFFIX}"


def _point_label(point: Point, device: str) -> str:
    model, tp, batch, prompt = point
    return f"{model}/{device}/tp{tp}/b{batch}/p{prompt}"


# --- the partial file -------------------------------------------------------------------------------------


def _header(grid: ProfileGrid, engine: Engine) -> dict[str, Any]:
    """The partial file's first line: the engine, the grid, and the engine's setup as the manifest records
    it (`describe()`: endpoint, seed, versions, device, host), so that a resumed run is the same run."""
    return {"header": {"engine": engine.name, "grid": to_builtins(grid), "setup": engine.describe()}}


def _grid_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between an earlier run's header and this run's: the engine, any grid field and any
    field of the engine's setup (a file written before session 34 has no setup: not compared). A resume
    that changed the seed or the endpoint mixed rows of two setups under one manifest naming the last."""
    diffs = []
    if saved.get("engine") != current["engine"]:
        diffs.append(f"engine: {saved.get('engine')!r} then, {current['engine']!r} now")
    for part in ("grid", "setup"):
        if part == "setup" and "setup" not in saved:
            continue
        old, new = saved.get(part) or {}, current[part]
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                diffs.append(f"{key}: {old.get(key)!r} then, {new.get(key)!r} now")
    return diffs


def load_partial(path: Path, grid: ProfileGrid, engine: Engine) -> dict[Point, ProfileRow | None]:
    """Finished points of an earlier run with the same grid and engine; a torn last line is dropped.

    The file is rewritten (atomically) with only its valid lines, so later appends start on a clean line.
    """
    lines = path.read_text().splitlines()
    try:
        header = json.loads(lines[0])["header"]
    except (IndexError, ValueError, KeyError, TypeError) as error:
        msg = f"{path} has no valid header line; delete it or pass --restart"
        raise InputError(msg, field="out") from error
    diffs = _grid_differences(header, _header(grid, engine)["header"])
    if diffs:
        msg = (
            f"{path} holds a run with a different grid or engine setup ({'; '.join(diffs)}); rerun with the "
            "same options to resume it, or pass --restart to discard its finished points"
        )
        raise InputError(msg, field="grid")
    done: dict[Point, ProfileRow | None] = {}
    wanted = set(grid.points())
    kept = [lines[0]]
    for line in lines[1:]:
        try:
            entry = json.loads(line)
            point = (str(entry["point"][0]), *(int(v) for v in entry["point"][1:]))
            row = None if entry["row"] is None else convert(entry["row"], ProfileRow)
        except (ValueError, KeyError, TypeError, IndexError, InputError):
            continue  # a torn line from a crash mid-write: that point is measured again
        if point in wanted:
            done[point] = row  # type: ignore[index]
            kept.append(line)
    _replace_text(path, "".join(f"{line}\n" for line in kept))
    return done


def _replace_text(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def _append(handle: Any, point: Point, row: ProfileRow | None, reason: str | None = None) -> None:
    entry = {"point": list(point), "row": to_builtins(row) if row is not None else None, "reason": reason}
    handle.write(json.dumps(entry) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


# --- measuring ----------------------------------------------------------------------------------------------


def measure_point(engine: Engine, grid: ProfileGrid, point: Point) -> ProfileRow:
    """warmup batches discarded, `runs` batches reduced to percentiles: one measured row."""
    model, tp, batch, prompt = point
    for _ in range(grid.warmup):
        engine.run_batch(model, tp, batch, prompt, grid.output_tokens)
    batches = []
    for _ in range(grid.runs):
        timings = engine.run_batch(model, tp, batch, prompt, grid.output_tokens)
        if len(timings) != batch:
            msg = f"{_point_label(point, grid.device)}: engine {engine.name!r} timed {len(timings)} requests"
            raise ProfileMissing(f"{msg}, expected {batch}", field="profiles")
        batches.append(timings)
    try:
        columns = latency_columns(batches)
    except ValueError as error:
        msg = f"{_point_label(point, grid.device)}: {error}"
        raise ProfileMissing(msg, field="profiles") from error
    fields = {"model": model, "device": grid.device, "tp": tp, "batch": batch, "prompt_tokens": prompt}
    source = f"measured:{engine.name}:{grid.device}"
    try:
        return convert({**fields, **columns, "source": source}, ProfileRow)
    except InputError as error:  # e.g. a 0 ms percentile: not a latency the planner may use
        msg = f"{_point_label(point, grid.device)}: {error}"
        raise ProfileMissing(msg, field="profiles") from error


@contextlib.contextmanager
def _progress(total: int, done: int, show: bool, label: str) -> Iterator[Callable[[], None]]:
    """fleetplan.progress.progress_bar, starting at `done` of `total`; yields `advance()`."""
    with progress_bar(label, show) as update:
        count = done
        update(count, total)

        def advance() -> None:
            nonlocal count
            count += 1
            update(count, total)

        yield advance


@contextlib.contextmanager
def _one_run(out: Path, name: str) -> Iterator[None]:
    """Hold an exclusive flock on `<out>/.run-<name>` (not the store's save lock, `.lock-<name>`, which a
    save inside the run takes), or raise ProfileRunBusy where another run holds it. Without flock (not
    POSIX) runs are not serialized."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(held_flock(out / f".run-{name}", wait=False))
        except BlockingIOError:
            msg = (
                f"another profiler run of set {name!r} is in progress in {out} (its resume file is "
                f"{partial_path(out, name)}); wait for it to end, or stop it, and run again"
            )
            raise ProfileRunBusy(msg, field="set") from None
        yield


def run_grid(
    engine: Engine,
    grid: ProfileGrid,
    out: Path,
    name: str,
    *,
    restart: bool = False,
    show_progress: bool = False,
    description: str | None = None,
) -> RunResult:
    """Measure (or estimate) every point of `grid`, then save set `name` atomically into the store `out`.

    Raises RunInterrupted on Ctrl-C (finished points kept), InputError for a grid that does not match the
    partial file, ProfileRunBusy while another run of the set holds the store directory's resume file, and
    the table checks' ProfileMissing (naming rows) before anything replaces a stored set.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with _one_run(out, name):
        return _run_grid(engine, grid, out, name, restart, show_progress, description)


def _run_grid(
    engine: Engine,
    grid: ProfileGrid,
    out: Path,
    name: str,
    restart: bool,
    show_progress: bool,
    description: str | None,
) -> RunResult:
    """`run_grid` inside its run lock: resume, run the points not done, check and save the set."""
    store = ProfileStore([out], writable=out)
    validate = getattr(engine, "validate_grid", None)
    if callable(validate):
        validate(grid)
    partial = partial_path(out, name)
    done = _resume(partial, grid, engine, restart)
    resumed = len(done)

    points = grid.points()
    estimator = engine if isinstance(engine, RowEstimator) else None
    todo = [p for p in points if p not in done]
    label = f"{engine.name} {grid.device}"
    with partial.open("a") as handle, _progress(len(points), resumed, show_progress, label) as advance:
        try:
            for point in todo:
                row, reason = _point_row(engine, estimator, grid, point)
                _append(handle, point, row, reason)
                done[point] = row
                advance()
        except KeyboardInterrupt as interrupt:
            raise RunInterrupted(len(done), len(points), partial) from interrupt

    frame, missing, warnings = _grid_frame(done, points, grid.device)
    manifest = _manifest(engine, grid, name, description)
    checks = () if estimator is not None else (check_no_nan,)  # a measured row has all six percentiles
    saved = store.save(name, frame, manifest, checks=checks)
    partial.unlink(missing_ok=True)
    return RunResult(
        name=name,
        directory=out / name,
        manifest=saved,
        warnings=warnings,
        done_now=len(todo),
        resumed=resumed,
        missing=missing,
    )


def _resume(
    partial: Path, grid: ProfileGrid, engine: Engine, restart: bool
) -> dict[Point, ProfileRow | None]:
    """The finished points of the partial file (none after `restart`, which deletes it); a new file gets
    its header line."""
    if restart:
        partial.unlink(missing_ok=True)
    done: dict[Point, ProfileRow | None] = load_partial(partial, grid, engine) if partial.exists() else {}
    if not partial.exists():
        _replace_text(partial, json.dumps(_header(grid, engine)) + "\n")
    return done


def _point_row(
    engine: Engine, estimator: RowEstimator | None, grid: ProfileGrid, point: Point
) -> tuple[ProfileRow | None, str | None]:
    """The point's row, estimated (None where the model does not fit, with that reason) or measured."""
    if estimator is not None:
        row = estimator.estimate_point(*point, grid.output_tokens)
        reason = None if row is not None else "no row: does not fit in device memory"
    else:
        row, reason = measure_point(engine, grid, point), None
    return row, reason


def _grid_frame(
    done: dict[Point, ProfileRow | None], points: list[Point], device: str
) -> tuple[pd.DataFrame, list[Point], list[str]]:
    """The rows in grid order as a frame, the points without a row, and the warnings (monotonicity, then
    the missing points); ProfileMissing when no point produced a row."""
    rows = [done[p] for p in points if done.get(p) is not None]
    if not rows:
        example = _point_label(points[0], device)
        msg = f"no grid point produced a row ({len(points)} point(s), e.g. {example})"
        raise ProfileMissing(msg, field="profiles")
    frame = pd.DataFrame(msgspec.to_builtins(rows))
    missing = missing_grid_points(frame, device, points)
    warnings = monotone_warnings(frame)
    if missing:
        shown = ", ".join(_point_label(p, device) for p in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        warnings.append(f"{len(missing)} grid point(s) have no row (not filled): {shown}{more}")
    return frame, missing, warnings


def _manifest(engine: Engine, grid: ProfileGrid, name: str, description: str | None) -> ProfileSetManifest:
    """engine, versions (engine.describe()), device, host, grid and date; sha256 and rows come from save."""
    described = {str(k): str(v) for k, v in engine.describe().items()}
    sources = {f"engine.{key}": value for key, value in described.items()}
    sources.update(
        {
            "engine": engine.name,
            "device": grid.device,
            "host": described.get("host") or platform.node(),
            "grid": msgspec.json.encode(grid).decode(),
        }
    )
    now = datetime.now(UTC)
    how = (  # an estimator runs no batches: its manifest said "20 warmup + 100 measured" (session 34)
        "estimated, no batches run"
        if isinstance(engine, RowEstimator)
        else f"{grid.warmup} warmup + {grid.runs} measured batches per point"
    )
    default = (
        f"{engine.name} profile of {', '.join(grid.models)} on {grid.device}: tp {grid.tp}, batches "
        f"{grid.batches}, prompts {grid.prompts}, {grid.output_tokens} output tokens, {how}"
    )
    return ProfileSetManifest(
        name=name,
        description=description or default,
        sha256="",
        rows=0,
        generator=f"fleetplan profile --backend {engine.name} (profiler.runner)",
        created=now.isoformat(timespec="seconds"),
        sources=sources,
    )


__all__ = [
    "RowEstimator",
    "RunInterrupted",
    "RunResult",
    "load_partial",
    "measure_point",
    "partial_path",
    "run_grid",
]
