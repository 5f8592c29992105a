"""Test-suite setup: make the project root and tests/ importable however pytest is started."""

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for _path in (_TESTS.parent, _TESTS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
