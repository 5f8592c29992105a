"""The service's settings: one object, read from `FLEETPLAN_*` environment variables and an optional file.

Precedence, lowest first: the defaults below, a settings file (TOML or JSON; `FLEETPLAN_SETTINGS_FILE` or
`fleetplan serve --config FILE`), the environment, then `fleetplan serve` options. Every value is checked by
msgspec when the settings are built, so a typo fails at start-up naming the setting, never mid-request.

The defaults are the safe ones: bind 127.0.0.1, writes refused until a token is configured (or anonymous
writes are switched on explicitly), bounded bodies, request sizes, time limits and solver slots.
"""

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

ENV_PREFIX = "FLEETPLAN_"
SETTINGS_FILE_ENV = "FLEETPLAN_SETTINGS_FILE"

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=600)]
LogFormat = Literal["text", "json"]


def _default_solves() -> int:
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the service is allowed to do; `docs/api.md` ("Service settings") lists each with its env name."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # writes (routes marked opt={"write": True}) need `Authorization: Bearer <api_token>`
    api_token: str | None = None
    # with no api_token, writes are refused unless this is switched on explicitly
    allow_anonymous_writes: bool = False
    # reads (GET /plan-free routes such as GET /profiles, and POST /plan) need the token too
    read_auth: bool = False
    # a bigger body is refused with 413 before it is decoded
    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    # caps per request: over one, a 422 names the cap
    max_devices: PositiveInt = 256
    max_workloads: PositiveInt = 5000
    max_links: PositiveInt = 4096
    max_profile_rows: PositiveInt = 100_000
    max_time_limit_s: Seconds = 60.0
    # a smaller time_limit_s is refused (422): a worker process, the profile set and the candidates take
    # about this long before any solve starts, so a request asking less could only time out
    min_time_limit_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 0.5
    # solves running at once (each in its own worker process), and requests waiting for one
    max_concurrent_solves: PositiveInt = dataclasses.field(default_factory=_default_solves)
    max_queued_solves: Annotated[int, msgspec.Meta(ge=0)] = 8
    # a what-if sweep holds one solve slot at most this long (its deadline is the smaller of this and POST
    # /plan's per plan times the plans it may solve, which for a 2,000-point grid was hours)
    max_sweep_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 600.0
    # an idle keep-alive connection is closed after this long; Retry-After never asks a client to wait
    # longer than keep_alive_s - 5, so a client that obeys it reuses its connection before the server
    # closes it (a close racing the client's next request is a connection error, not an answer)
    keep_alive_s: Annotated[int, msgspec.Meta(ge=6, le=3600)] = 30
    # SIGTERM: in-flight requests get this long to finish, then their solves are killed
    shutdown_grace_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 10.0
    # the store's database (another package reads and migrates it); None: that package's default
    database_url: str | None = None
    # a writable profile store directory (POST /profiles writes there); None: uploads answer 503
    profile_store: str | None = None
    log_format: LogFormat = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __repr__(self) -> str:
        """Never shows the token (settings get logged at start-up)."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if shown["api_token"] is not None:
            shown["api_token"] = "***"
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def writes_open(self) -> bool:
        """Whether a write can ever succeed: a token is configured or anonymous writes are on."""
        return self.api_token is not None or self.allow_anonymous_writes


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Settings))


def env_name(field: str) -> str:
    """`max_body_bytes` -> `FLEETPLAN_MAX_BODY_BYTES`."""
    return ENV_PREFIX + field.upper()


class SettingsError(ValueError):
    """A setting does not parse or is out of range; the message names the setting and where it came from."""


def _from_env(environ: Mapping[str, str]) -> dict[str, str]:
    values = {f: environ[env_name(f)] for f in FIELDS if env_name(f) in environ}
    return {k: v for k, v in values.items() if v != "" or k in ("api_token",)}


def _from_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as error:
        msg = f"settings file {path}: {error.strerror or error}"
        raise SettingsError(msg) from error
    try:
        data = tomllib.loads(text.decode()) if path.suffix == ".toml" else msgspec.json.decode(text)
    except (tomllib.TOMLDecodeError, msgspec.DecodeError, UnicodeDecodeError) as error:
        msg = f"settings file {path}: {error}"
        raise SettingsError(msg) from error
    if not isinstance(data, dict):
        msg = f"settings file {path}: expected a table of settings"
        raise SettingsError(msg)
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        msg = f"settings file {path}: unknown setting(s) {unknown}; known: {list(FIELDS)}"
        raise SettingsError(msg)
    return data


def load_settings(
    environ: Mapping[str, str] | None = None, file: Path | None = None, **overrides: Any
) -> Settings:
    """Defaults < file < environment < `overrides` (options given on the command line, None = not given)."""
    environ = os.environ if environ is None else environ
    if file is None and environ.get(SETTINGS_FILE_ENV):
        file = Path(environ[SETTINGS_FILE_ENV])
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}  # where each given setting came from, for the message that names it
    layers = [
        (_from_file(file) if file is not None else {}, f"settings file {file}"),
        (_from_env(environ), ""),
        ({k: v for k, v in overrides.items() if v is not None}, "command line"),
    ]
    for values, origin in layers:
        merged.update(values)
        source.update({k: origin or env_name(k) for k in values})
    if merged.get("api_token") == "":
        merged["api_token"] = None  # an empty token is no token (it would match an empty Bearer)
    try:
        # strict=False: environment strings become ints, floats and bools ("1", "true", "8000")
        settings = msgspec.convert(merged, Settings, strict=False)
    except msgspec.ValidationError as error:
        reason, _, at = str(error).partition(" - at `$.")
        field = at.rstrip("`")
        where = f"{field} ({source.get(field, env_name(field))})" if field else "settings"
        msg = f"{where}: {reason}"
        raise SettingsError(msg) from error
    if settings.min_time_limit_s > settings.max_time_limit_s:  # every plan would be refused
        msg = (
            f"min_time_limit_s ({source.get('min_time_limit_s', 'default')}) = {settings.min_time_limit_s:g} "
            f"is above max_time_limit_s ({source.get('max_time_limit_s', 'default')}) = "
            f"{settings.max_time_limit_s:g}: no time limit would be accepted"
        )
        raise SettingsError(msg)
    return settings


def describe() -> list[tuple[str, str, str]]:
    """(env name, default, comment) per setting, for `fleetplan serve --help` and docs/api.md."""
    defaults = Settings()
    rows = []
    for f in dataclasses.fields(Settings):
        value = getattr(defaults, f.name)
        shown = (
            "CPU count" if f.name == "max_concurrent_solves" else ("unset" if value is None else str(value))
        )
        rows.append((env_name(f.name), shown, f.name))
    return rows


__all__ = ["FIELDS", "Settings", "SettingsError", "describe", "env_name", "load_settings"]
