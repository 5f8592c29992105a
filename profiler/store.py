"""Where profile sets live: the bundled fixtures and, optionally, a user store directory.

A set is a directory `<name>/` holding `profile.csv` and `manifest.json` (a ProfileSetManifest).
"""

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

import msgspec

from models.errors import ProfileMissing
from models.profile import ProfileSetManifest
from profiler.tables import ProfileTable, read_csv

STORE_ENV = "FLEETPLAN_PROFILE_STORE"


def bundled_root() -> Path:
    return Path(str(resources.files("fixtures") / "profiles"))


class ProfileStore:
    """Profile sets by name; later roots shadow earlier ones (a user's set may replace a bundled one)."""

    def __init__(self, roots: list[Path] | None = None) -> None:
        if roots is None:
            roots = [bundled_root()]
            if os.environ.get(STORE_ENV):
                roots.append(Path(os.environ[STORE_ENV]))
        self.roots = roots

    def _directory(self, name: str) -> Path:
        for root in reversed(self.roots):
            candidate = root / name
            if (candidate / "profile.csv").is_file():
                return candidate
        msg = f"unknown profile set {name!r}; known sets: {self.names()}"
        raise ProfileMissing(msg, field="profiles.set")

    def names(self) -> list[str]:
        found = {
            path.parent.name for root in self.roots if root.is_dir() for path in root.glob("*/profile.csv")
        }
        return sorted(found)

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


@lru_cache(maxsize=16)
def _load_cached(path: Path, name: str, _mtime_ns: int, _size: int) -> ProfileTable:
    return read_csv(path, name)
