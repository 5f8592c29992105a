"""What the HTTP handlers and the CLI commands share: request caps and the profile upload.

Handlers and commands only decode, call one of these, and encode (house review items 6-7).
"""

from datetime import UTC, datetime

import msgspec

from fleetplan.api.settings import Settings, env_name
from fleetplan.models.errors import InputError, LimitExceeded, ProfileMissing
from fleetplan.models.plan import PlanRequest
from fleetplan.models.profile import ProfileSetManifest, ProfileUpload
from fleetplan.profiler.store import ProfileStore


def _cap(field: str, count: int, setting: str, cap: float, what: str) -> None:
    if count > cap:
        msg = (
            f"{count:g} {what}; this server takes at most {setting}={cap:g} ({env_name(setting)}) per request"
        )
        raise LimitExceeded(msg, field=field)


def _floor(field: str, value: float, setting: str, floor: float, what: str) -> None:
    if value < floor:
        msg = f"{value:g} {what}; this server takes at least {setting}={floor:g} ({env_name(setting)})"
        raise LimitExceeded(msg, field=field)


def check_plan_limits(request: PlanRequest, settings: Settings, *, at: str = "") -> None:
    """A 422 (LimitExceeded) naming the first cap `request` is over, before any work is spent on it; `at`
    is where the request sits in the body ("base." in a what-if), so that the field is the body's."""
    _cap(f"{at}devices", len(request.devices), "max_devices", settings.max_devices, "devices")
    _cap(f"{at}workloads", len(request.workloads), "max_workloads", settings.max_workloads, "workloads")
    _cap(f"{at}links", len(request.links), "max_links", settings.max_links, "links")
    rows = request.profiles.rows
    if rows is not None:
        _cap(f"{at}profiles.rows", len(rows), "max_profile_rows", settings.max_profile_rows, "profile rows")
    asked = request.options.time_limit_s
    what = "seconds asked as time_limit_s"
    _cap(f"{at}options.time_limit_s", asked, "max_time_limit_s", settings.max_time_limit_s, what)
    _floor(f"{at}options.time_limit_s", asked, "min_time_limit_s", settings.min_time_limit_s, what)


def check_upload_limits(upload: ProfileUpload, settings: Settings) -> None:
    _cap("rows", len(upload.rows), "max_profile_rows", settings.max_profile_rows, "profile rows")


def upload_profile_set(
    store: ProfileStore, upload: ProfileUpload, *, replace: bool, generator: str = "POST /profiles"
) -> ProfileSetManifest:
    """Check the rows as a profile table (errors become 400s naming `rows` and the bad row numbers, which
    are the upload's own indices) and save the set; nothing is written unless every check passes. A
    bundled set's name is refused by the store (check_set_name): a stored set would shadow it."""
    import pandas as pd

    from fleetplan.profiler.tables import check_rows_have_latencies

    frame = pd.DataFrame(msgspec.to_builtins(upload.rows))
    manifest = ProfileSetManifest(
        name=upload.name,
        description=upload.description,
        sha256="",
        rows=0,
        generator=generator,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        sources=upload.sources,
    )
    try:
        check_rows_have_latencies(frame)
        return store.save(upload.name, frame, manifest, replace=replace)
    except ProfileMissing as error:  # a table check: the upload's rows are at fault, so a 400
        raise InputError(error.message, field="rows") from error


__all__ = ["check_plan_limits", "check_upload_limits", "upload_profile_set"]
