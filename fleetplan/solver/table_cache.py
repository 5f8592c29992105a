"""Candidate tables kept on disk, for every process of the machine (docs/formulation.md, "Candidate cache").

`candidates.build_candidates` keeps the tables of its last requests in memory, per process. That cache is
empty in every new process: each `fleetplan plan` command, a nightly re-plan, each of the server's worker
processes and the server after a restart build the same fleet's tables again, which takes seconds on a
medium fleet (the bench's M: 7 s on these machines) and tens of seconds on a large one. So a built set is
also written to a directory, under the same key as the memory cache plus a fingerprint of the code that
builds it, and a process that misses in memory reads it from there.

Where: `FLEETPLAN_CANDIDATE_CACHE` names the directory; `default` is the user's cache directory
(`default_directory`, e.g. ~/.cache/fleetplan/candidates); `off` or unset: none. Library calls
(`solver.plan` from Python) use it only when it is set; the `fleetplan` command (and so the server it
starts, whose worker processes inherit the environment) sets it to `default` when it is unset.

What is trusted: the files are pickles, and unpickling runs code, so the directory must be the user's own:
it is created with mode 0700, and one owned by another user or writable by group or others is not used
(a warning, once). A file that does not load, or whose key or fingerprint differs, is a miss (and removed);
a directory that cannot be written is a warning, once, and the plan goes on without it. At most
MAX_FILES files and MAX_BYTES bytes are kept, the least recently used removed first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import stat
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

ENV = "FLEETPLAN_CANDIDATE_CACHE"
OFF = ("", "off", "0", "none")
DEFAULT = "default"
SUFFIX = ".pkl"
# the bench's L instance pickles to about 10 MB, M to 1.5 MB, paper.json to 70 kB
MAX_FILES = 64
MAX_BYTES = 1 << 30

log = logging.getLogger("fleetplan.solver")
_warned: set[tuple[str, str]] = set()


def default_directory() -> Path:
    """The user's cache directory for fleetplan's candidate tables, e.g. ~/.cache/fleetplan/candidates."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("fleetplan", appauthor=False)) / "candidates"


def directory() -> Path | None:
    """The directory FLEETPLAN_CANDIDATE_CACHE names (`default`: `default_directory()`), None when it is
    unset or off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    return default_directory() if value.lower() == DEFAULT else Path(value).expanduser()


@cache
def code_fingerprint() -> str:
    """A hash of every source file of the fleetplan package and of the versions of the libraries its
    tables are pickled with: tables built by other code are never read back."""
    import numpy
    import pandas

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(f"numpy {numpy.__version__} pandas {pandas.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _warn_once(where: Path, why: str) -> None:
    if (str(where), why) not in _warned:
        _warned.add((str(where), why))
        log.warning("candidate cache %s not used: %s", where, why)


def _usable(folder: Path) -> bool:
    """Create `folder` (mode 0700) if needed; True when it is a directory of this user's that no one else
    may write."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as error:
        _warn_once(folder, f"cannot create it ({error.strerror or error})")
        return False
    if not stat.S_ISDIR(info.st_mode):
        _warn_once(folder, "not a directory")
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        _warn_once(folder, "owned by another user")
        return False
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        _warn_once(folder, "writable by group or others (chmod 700 it)")
        return False
    return True


def _path(folder: Path, key: bytes) -> Path:
    return folder / (hashlib.sha256(code_fingerprint().encode() + key).hexdigest() + SUFFIX)


def load(key: bytes) -> Any | None:
    """The tables kept under `key`, or None (no directory, no file, or a file that is not them)."""
    folder = directory()
    if folder is None or not _usable(folder):
        return None
    path = _path(folder, key)
    try:
        with path.open("rb") as handle:
            fingerprint, stored_key, tables = pickle.load(handle)  # noqa: S301 - the user's own 0700 directory
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - a truncated or foreign file is a miss, never a failed plan
        log.info("candidate cache: %s unreadable (%s): removed", path.name, type(error).__name__)
        path.unlink(missing_ok=True)
        return None
    if fingerprint != code_fingerprint() or stored_key != key:
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # least recently used goes first
    except OSError:
        pass
    return tables


def save(key: bytes, tables: Any) -> None:
    """Keep `tables` under `key` (atomically: a reader sees the old file or the whole new one), then drop
    the least recently used files beyond MAX_FILES or MAX_BYTES. Failures are logged, never raised."""
    folder = directory()
    if folder is None or not _usable(folder):
        return
    data = pickle.dumps((code_fingerprint(), key, tables), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, _path(folder, key))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as error:
        _warn_once(folder, f"cannot write it ({error.strerror or error})")
        return
    prune(folder)


def prune(folder: Path, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> int:
    """Remove the least recently used files beyond `max_files` or `max_bytes`; the number removed."""
    files = []
    for path in kept(folder):
        try:
            info = path.stat()
        except OSError:  # removed by another process meanwhile
            continue
        files.append((info.st_mtime, info.st_size, path))
    files.sort(reverse=True)  # newest first
    removed, total = 0, 0
    for count, (_, size, path) in enumerate(files, start=1):
        total += size
        if count > max_files or total > max_bytes:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def clear(folder: Path | None = None) -> int:
    """Remove every kept table set (of `folder`, default: the configured directory); the number removed."""
    folder = folder if folder is not None else directory()
    if folder is None or not folder.is_dir():
        return 0
    removed = 0
    for path in kept(folder):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def kept(folder: Path) -> list[Path]:
    """The kept table sets (not another process's file being written, a dot file until it is complete)."""
    return [path for path in folder.glob("*" + SUFFIX) if not path.name.startswith(".")]
