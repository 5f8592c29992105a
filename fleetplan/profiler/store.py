"""Where profile sets live: the bundled fixtures and, optionally, a user store directory.

A set is a directory `<name>/` holding `profile.csv` and `manifest.json` (a ProfileSetManifest).

Writing (`ProfileStore.save`) is atomic, so a failed or interrupted write never replaces the last good set:

1. the table is checked (profiler.tables) and the manifest completed (sha256 of the CSV bytes, row count)
   before anything is written; a failed check raises and touches nothing;
2. both files are written and fsynced into a fresh temporary directory under `<root>/.versions/`, re-read
   and re-hashed, then renamed to `<root>/.versions/<name>-<sha12>-<nonce>/` (a complete version);
3. a symlink to that version is created under a temporary name and renamed over `<root>/<name>`
   (`os.replace` of a symlink is one rename(2): a reader sees the old set or the new one, never a mix).

Readers resolve `<root>/<name>` once per load (`_directory` returns the resolved version directory), so the
CSV and the manifest they read belong to the same version. The previous version is kept for readers that
resolved it just before a swap; older ones are pruned. A plain directory `<root>/<name>` (written by hand or
by an older fleetplan) is still read; saving over it moves it into `.versions/` first, the one step that is
not atomic (the set is briefly absent, never half-written).

Saves of one name are serialized by an flock on `<root>/.lock-<name>` (threads and processes alike), so
the existence check of `replace=False`, the swap and the pruning of old versions are one step per writer.
A store that cannot be written (no space, no permission) raises StoreNotWritable and keeps its sets.
"""

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import msgspec
import pandas as pd

from fleetplan import fixtures
from fleetplan.models.base import Name
from fleetplan.models.errors import InputError, ProfileMissing, ProfileSetExists, StoreNotWritable
from fleetplan.models.profile import ProfileSetManifest
from fleetplan.profiler.tables import ProfileTable, csv_bytes, from_frame, read_csv

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

STORE_ENV = "FLEETPLAN_PROFILE_STORE"


def bundled_root() -> Path:
    return fixtures.profiles_dir()


VERSIONS = ".versions"
KEEP_VERSIONS = 2  # the current version and the one before it (a reader may have just resolved it)


class ProfileStore:
    """Profile sets by name; later roots shadow earlier ones (a set saved since session 25 never takes a
    bundled set's name: check_set_name; one written by hand or before may still shadow it).

    `writable` is the root `save` writes into: by default $FLEETPLAN_PROFILE_STORE when `roots` is not
    given, else the last of `roots` unless that is the bundled fixtures directory (which is never written).
    """

    def __init__(self, roots: list[Path] | None = None, writable: Path | None = None) -> None:
        if roots is None:
            roots = [bundled_root()]
            if os.environ.get(STORE_ENV):
                roots.append(Path(os.environ[STORE_ENV]))
        self.roots = roots
        if writable is None and roots and Path(roots[-1]) != bundled_root():
            writable = Path(roots[-1])
        if writable is not None and Path(writable) not in [Path(r) for r in self.roots]:
            self.roots = [*self.roots, Path(writable)]
        self.writable = Path(writable) if writable is not None else None

    def _directory(self, name: str) -> Path:
        if name and not name.startswith(".") and "/" not in name:
            for root in reversed(self.roots):
                candidate = root / name
                if (candidate / "profile.csv").is_file():
                    return candidate.resolve()  # one version for both files, even if swapped meanwhile
        msg = f"unknown profile set {name!r}; known sets: {self.names()}"
        raise ProfileMissing(msg, field="profiles.set")

    def names(self) -> list[str]:
        found = {
            path.parent.name
            for root in self.roots
            if root.is_dir()
            for path in root.glob("*/profile.csv")
            if not path.parent.name.startswith(".")  # .versions and in-flight temporaries
        }
        return sorted(found)

    def exists(self, name: str) -> bool:
        return name in self.names()

    def manifests(self) -> tuple[list[tuple[str, ProfileSetManifest]], list[str]]:
        """(name, manifest) of every set, and a line for each set whose manifest cannot be read (listed
        apart, so that one damaged set does not hide the others)."""
        found, broken = [], []
        for name in self.names():
            try:
                found.append((name, self.manifest(name)))
            except ProfileMissing as error:
                broken.append(str(error))
        return found, broken

    def is_bundled(self, name: str) -> bool:
        """Whether set `name`, as this store resolves it, is one of the bundled fixtures (not shadowed)."""
        try:
            return self._directory(name).is_relative_to(bundled_root().resolve())
        except ProfileMissing:
            return False

    def save(
        self,
        name: str,
        frame: pd.DataFrame,
        manifest: ProfileSetManifest,
        *,
        replace: bool = True,
        checks: Sequence[Callable[[pd.DataFrame], None]] = (),
    ) -> ProfileSetManifest:
        """Check `frame`, then write it and `manifest` as set `name`, atomically (see the module docstring).

        The manifest's `name`, `sha256` and `rows` are filled in from what is written. Raises the table
        check's ProfileMissing (naming the rows) before touching the store, ProfileSetExists when `name`
        exists and not `replace`, StoreNotWritable without a writable root. `checks` are extra named
        table checks (e.g. tables.check_no_nan for a measured set) run on the normalized table first.
        """
        root = self._writable_root()
        check_set_name(name)
        table = from_frame(frame, name)  # every named check, before anything is written
        for check in checks:
            check(table.frame)
        data = csv_bytes(table.frame)
        sha256 = table.sha256
        manifest = msgspec.structs.replace(manifest, name=name, sha256=sha256, rows=len(table.frame))
        try:
            with _locked(root, name):  # one writer of a name at a time, across processes
                if not replace and self.exists(name):
                    msg = f"profile set {name!r} exists; replace it explicitly (--replace, or ?replace=true)"
                    raise ProfileSetExists(msg, field="name")
                self._write(root, name, data, manifest)
                self._prune(name)
        except OSError as error:
            why = error.strerror or str(error)
            msg = f"profile store {str(root)!r} cannot be written ({why}); the sets in it are unchanged"
            raise StoreNotWritable(msg) from error
        return manifest

    def _write(self, root: Path, name: str, data: bytes, manifest: ProfileSetManifest) -> None:
        """Steps 2 and 3 of the module docstring, under the name's lock."""
        sha256 = manifest.sha256
        versions = root / VERSIONS
        versions.mkdir(parents=True, exist_ok=True)
        nonce = uuid.uuid4().hex[:8]
        staging = versions / f".tmp-{name}-{nonce}"
        final = versions / f"{name}-{sha256[:12]}-{nonce}"
        link = root / name
        temp_link = root / f".tmp-link-{name}-{nonce}"
        try:
            staging.mkdir()
            _write_synced(staging / "profile.csv", data)
            encoded = msgspec.json.format(msgspec.json.encode(manifest), indent=2)
            _write_synced(staging / "manifest.json", encoded)
            written = read_csv(staging / "profile.csv", name)  # what readers will see, checked and re-hashed
            if written.sha256 != sha256:
                msg = f"profile set {name!r}: the written CSV hashes {written.sha256}, expected {sha256}"
                raise ProfileMissing(msg, field="profiles")
            _fsync_dir(staging)
            staging.rename(final)
            _fsync_dir(versions)
            if link.is_dir() and not link.is_symlink():
                link.rename(versions / f"{name}-legacy-{nonce}")  # the one non-atomic step (docstring)
            os.symlink(Path(VERSIONS) / final.name, temp_link, target_is_directory=True)
            os.replace(temp_link, link)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                temp_link.unlink()
            if final.exists() and link.resolve() != final.resolve():
                shutil.rmtree(final, ignore_errors=True)
            raise

    def _writable_root(self) -> Path:
        if self.writable is None:
            msg = (
                "no writable profile store: set $FLEETPLAN_PROFILE_STORE (or pass --store/--out) to a "
                "directory; the bundled fixtures are read-only"
            )
            raise StoreNotWritable(msg)
        try:
            self.writable.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file where the directory should be, no permission, a read-only disk
            msg = f"profile store {str(self.writable)!r} cannot be written ({error.strerror or error})"
            raise StoreNotWritable(msg) from error
        return self.writable

    def _prune(self, name: str) -> None:
        """Remove versions of `name` older than the KEEP_VERSIONS newest (the current one always stays)."""
        assert self.writable is not None
        versions = self.writable / VERSIONS
        current = (self.writable / name).resolve()
        mine = [
            p for p in versions.glob(f"{name}-*") if p.is_dir() and p.name[len(name) + 1 :].count("-") == 1
        ]
        with contextlib.suppress(OSError):  # housekeeping: the set is saved either way
            mine.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
            for old in mine[KEEP_VERSIONS:]:
                if old.resolve() != current:
                    shutil.rmtree(old, ignore_errors=True)

    def manifest(self, name: str) -> ProfileSetManifest:
        path = self._directory(name) / "manifest.json"
        try:
            return msgspec.json.decode(path.read_bytes(), type=ProfileSetManifest)
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as error:
            msg = f"profile set {name!r} has no valid manifest.json: {error}"
            raise ProfileMissing(msg, field="profiles.set") from error

    def load(self, name: str) -> ProfileTable:
        """The checked table of a set, cached by file identity so a replaced set is re-read."""
        path = self._directory(name) / "profile.csv"
        stat = path.stat()
        return _load_cached(path, name, stat.st_mtime_ns, stat.st_size)


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """An exclusive lock on set `name` in `root` (flock on `<root>/.lock-<name>`), across threads and
    processes: without it two saves of one name could each prune the version the other was about to link
    (the set then pointed at a deleted directory), and two `replace=false` uploads could both pass the
    existence check. Where flock is missing (not POSIX) saves are not serialized."""
    with held_flock(root / f".lock-{name}"):
        yield


@contextlib.contextmanager
def held_flock(path: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive flock on `path` (created if need be) for the with-block, across threads and processes;
    with `wait=False`, BlockingIOError at once where another holder has it. Where flock is missing (not
    POSIX), no lock: the block runs unserialized."""
    if fcntl is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_set_name(name: str) -> None:
    """A set name a request can name (models.base.Name: letters, digits, `._:+-`, not starting with a
    punctuation mark) that is one directory name (no '/'), is not a profiler's resume file
    (`<set>.partial.jsonl`), and is not a bundled set's: a stored set of that name
    would shadow it for every request that names it. InputError (or ProfileSetExists for a bundled name)
    naming the field "name". The profile and merge commands call it before any work, POST /profiles and
    ProfileStore.save before writing."""
    try:
        msgspec.convert(name, Name)
    except msgspec.ValidationError as error:
        raise InputError(f"{name!r} cannot name a profile set: {error}", field="name") from error
    if "/" in name or name.endswith(".partial.jsonl"):
        msg = f"{name!r} cannot name a profile set directory: no '/', and not ending in .partial.jsonl"
        raise InputError(msg, field="name")
    if name in ProfileStore([bundled_root()]).names():
        msg = f"{name!r} is a bundled profile set and cannot be replaced; choose another name"
        raise ProfileSetExists(msg, field="name")


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@lru_cache(maxsize=16)
def _load_cached(path: Path, name: str, _mtime_ns: int, _size: int) -> ProfileTable:
    return read_csv(path, name)
