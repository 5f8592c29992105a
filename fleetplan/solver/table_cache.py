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
(a warning, once); each file is checked again once open (a regular file, not a link, of this user's, that no
one else may write), so nothing swapped in after the directory's check is read. A file that does not load,
or whose key or fingerprint differs, is a miss (and removed); a directory that cannot be written is a
warning, once, and the plan goes on without it: nothing here ever fails a plan. At most MAX_FILES files and
MAX_BYTES bytes are kept, the least recently used removed first, and a temporary file a killed writer left is
removed after STALE_TEMPORARY_S.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no build lock, each process builds what it misses
    fcntl = None  # type: ignore[assignment]

ENV = "FLEETPLAN_CANDIDATE_CACHE"
OFF = ("", "off", "0", "none")
DEFAULT = "default"
SUFFIX = ".pkl"
LOCK = ".lock"  # one per key: who builds its tables now (`building`)
TEMPORARY = ".tmp-"  # a file being written (then renamed); one left this long by a killed writer is removed
STALE_TEMPORARY_S = 600.0
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
    """A hash of every source file of the fleetplan package and of the versions of Python and the libraries
    its tables are built and pickled with: tables built by other code are never read back. A file that
    cannot be read (an editor's lock link, say) counts by its name alone."""
    import msgspec
    import numpy
    import pandas
    import scipy

    root = Path(__file__).resolve().parent.parent
    versions = [sys.version, numpy.__version__, pandas.__version__, scipy.__version__, msgspec.__version__]
    digest = hashlib.sha256(" ".join(versions).encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _warn_once(where: Path, why: str) -> None:
    if (str(where), why) not in _warned:
        _warned.add((str(where), why))
        log.warning("candidate cache %s not used: %s", where, why)


def _ours(info: os.stat_result) -> str | None:
    """Why a file or directory with this status may not hold what this process runs (None: it may)."""
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return "owned by another user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by group or others (chmod 700 it)"
    return None


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
    why = _ours(info)
    if why is not None:
        _warn_once(folder, why)
        return False
    return True


def _path(folder: Path, key: bytes) -> Path:
    return folder / (hashlib.sha256(code_fingerprint().encode() + key).hexdigest() + SUFFIX)


def load(key: bytes) -> Any | None:
    """The tables kept under `key`, or None (no directory, no file, or a file that is not them). Never
    raises: whatever goes wrong here is a miss, and the tables are built."""
    try:
        folder = directory()
        if folder is None or not _usable(folder):
            return None
        return _read(_path(folder, key), key)
    except Exception as error:  # noqa: BLE001 - the cache never fails a plan
        log.info("candidate cache: not read (%s: %s)", type(error).__name__, error)
        return None


def _read(path: Path, key: bytes) -> Any | None:
    """The tables in `path` if it is a regular file of this user's that no one else may write (checked on
    the open file: a link, or a file swapped in after the directory's check, is not read), pickled by this
    code under `key`; a file that is not that is removed."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(handle, "rb") as opened:
        info = os.fstat(opened.fileno())
        why = "not a regular file" if not stat.S_ISREG(info.st_mode) else _ours(info)
        if why is not None:
            log.warning("candidate cache: %s not read: %s", path, why)
            return None
        try:
            fingerprint, stored_key, tables = pickle.load(opened)  # noqa: S301 - checked just above
        except Exception as error:  # noqa: BLE001 - a truncated or foreign file is a miss
            log.info("candidate cache: %s unreadable (%s): removed", path.name, type(error).__name__)
            fingerprint = stored_key = tables = None
    if fingerprint != code_fingerprint() or stored_key != key:
        _remove(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used goes first
    return tables


@contextlib.contextmanager
def building(key: bytes) -> Iterator[None]:
    """One build of a key's tables at a time among the user's processes: an exclusive lock on the key's
    lock file, held while the caller reads the cache and, on a miss, builds and saves. A process that asks
    for tables another is building waits for it and then reads them, instead of building them again (two
    requests for a new fleet at once; the retry of a request whose build finishes past its deadline,
    fleetplan/api/workers.py). The kernel drops the lock of a process that dies, so a builder that is killed
    never holds the others up. Without a disk cache, or where no lock can be taken, nothing is held."""
    handle = _lock(key)
    try:
        yield
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock


def _lock(key: bytes) -> int | None:
    folder = directory()
    if folder is None or fcntl is None:
        return None
    handle = None
    try:
        if not _usable(folder):
            return None
        path = _path(folder, key).with_suffix(LOCK)
        handle = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(handle, fcntl.LOCK_EX)
    except Exception as error:  # noqa: BLE001 - the cache never fails a plan: build without the lock
        log.info("candidate cache: no build lock (%s: %s)", type(error).__name__, error)
        if handle is not None:
            os.close(handle)
        return None
    return handle


def save(key: bytes, tables: Any) -> None:
    """Keep `tables` under `key` (atomically: a reader sees the old file or the whole new one), then drop
    the least recently used files beyond MAX_FILES or MAX_BYTES. Failures are logged, never raised."""
    folder = directory()
    if folder is None:
        return
    try:
        if not _usable(folder):
            return
        _write(folder, _path(folder, key), (code_fingerprint(), key, tables))
        prune(folder)
    except OSError as error:
        _warn_once(folder, f"cannot write it ({error.strerror or error})")
    except Exception as error:  # noqa: BLE001 - the cache never fails a plan
        log.info("candidate cache: not written (%s: %s)", type(error).__name__, error)


def _write(folder: Path, path: Path, record: tuple) -> None:
    """`record` pickled into `path` through a temporary file of mode 0600 in `folder`, then renamed."""
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=TEMPORARY, suffix=SUFFIX)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        _remove(Path(temporary))
        raise


def prune(folder: Path, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> int:
    """Remove the least recently used files beyond `max_files` or `max_bytes`, and temporary files that
    STALE_TEMPORARY_S after their last write are still there (their writer was killed); the number
    removed."""
    files, removed = [], 0
    for path in folder.glob("*" + SUFFIX):
        try:
            info = path.stat()
        except OSError:  # removed by another process meanwhile
            continue
        if not path.name.startswith(TEMPORARY):
            files.append((info.st_mtime, info.st_size, path))
        elif time.time() - info.st_mtime > STALE_TEMPORARY_S:
            removed += _remove(path)
    for path in folder.glob("*" + LOCK):
        removed += _remove_lock(path)
    files.sort(reverse=True)  # newest first
    total = 0
    for count, (_, size, path) in enumerate(files, start=1):
        total += size
        if count > max_files or total > max_bytes:
            removed += _remove(path)
    return removed


def _remove_lock(path: Path) -> int:
    """Remove a lock file STALE_TEMPORARY_S old that no process holds (1), else leave it (0). A process
    that opened it just before may then build beside one that locks a new file: a build twice, no more."""
    if fcntl is None:
        return 0
    try:
        if time.time() - path.stat().st_mtime <= STALE_TEMPORARY_S:
            return 0
        handle = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return 0
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except OSError:  # held: a build is running
        return 0
    finally:
        os.close(handle)
    return 1


def _remove(path: Path) -> int:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        return 0
    return 1


def clear(folder: Path | None = None) -> int:
    """Remove every kept table set (of `folder`, default: the configured directory) and stale temporary
    files; the number of table sets removed."""
    folder = folder if folder is not None else directory()
    if folder is None or not folder.is_dir():
        return 0
    removed = sum(_remove(path) for path in kept(folder))
    prune(folder)  # the stale temporary files and locks
    return removed


def kept(folder: Path) -> list[Path]:
    """The kept table sets (not another process's file being written, a dot file until it is complete)."""
    return [path for path in folder.glob("*" + SUFFIX) if not path.name.startswith(".")]
