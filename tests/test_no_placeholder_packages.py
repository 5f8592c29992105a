"""No dependency anywhere may name the PyPI placeholders of vendor SDKs (dependency-confusion risk).

The real torch-neuronx / neuronx-cc / libneuronxla / transformers-neuronx come from AWS's own index and
jetstream-pytorch from its GitHub sources (docs/profiling.md); on PyPI those names are placeholders.
"""

import os
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"jetstream-pt", "torch-neuronx", "neuronx-cc", "libneuronxla", "transformers-neuronx"}
SKIP_DIRS = {".venv", ".git", "node_modules", "build", "dist", ".tox", ".nox"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(line: str) -> str | None:
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith("-"):  # options such as -r, --index-url
        return None
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    return _normalize(match.group(0)) if match else None


def _pyproject_requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data.get("project", {})
    found = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        found.extend(group)
    for group in data.get("dependency-groups", {}).values():
        found.extend(item for item in group if isinstance(item, str))
    found.extend(data.get("build-system", {}).get("requires", []))
    return found


def _requirement_files() -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in names:
            if (name.startswith("requirements") and name.endswith((".txt", ".in"))) or name.endswith(".lock"):
                files.append(Path(folder) / name)
    return files


def test_pyproject_names_no_placeholder_package() -> None:
    names = {_requirement_name(r) for r in _pyproject_requirements()}
    assert names.isdisjoint(FORBIDDEN), sorted(names & FORBIDDEN)


def test_requirement_and_lock_files_name_no_placeholder_package() -> None:
    offenders = []
    for path in _requirement_files():
        text = path.read_text(errors="replace")
        names = {_requirement_name(line) for line in text.splitlines()}
        # lock files (uv.lock, poetry.lock, ...) spell packages as name = "..." entries
        names |= {_normalize(m) for m in re.findall(r'^\s*name\s*=\s*"([^"]+)"', text, flags=re.MULTILINE)}
        offenders.extend(f"{path.relative_to(ROOT)}: {name}" for name in sorted(names & FORBIDDEN))
    assert not offenders, offenders


def test_normalization_catches_spelling_variants() -> None:
    assert _requirement_name("Torch_Neuronx==2.1 ; platform_system == 'Linux'") == "torch-neuronx"
    assert _requirement_name("jetstream.pt>=0.1") == "jetstream-pt"
    assert _requirement_name("--extra-index-url https://pip.repos.neuron.amazonaws.com") is None
