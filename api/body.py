"""Request decoding for the shells: models.codec, plus the field path for NaN and Infinity.

`models.codec` is the one decoder (style rule 9); this module only adds a better error for one case.
Python's json.dumps writes NaN and Infinity, which are not JSON, so msgspec reports them as malformed
JSON at a byte offset. Python's own parser accepts them, so it can say which field holds one.
Kept free of Litestar so that the CLI can use it without loading the web stack.
"""

import json
import math
from pathlib import Path

from models.codec import decode_request, read_request
from models.errors import InputError
from models.plan import PlanRequest


def locate_non_finite(data: bytes | str) -> str | None:
    """The path of the first NaN/Infinity in `data` ("profiles.rows[0].ttft_ms_p90"), if any."""

    class _NonFinite(float):
        pass

    def walk(node: object, path: str) -> str | None:
        if isinstance(node, _NonFinite) or (isinstance(node, float) and not math.isfinite(node)):
            return path or "$"
        children: list[tuple[str, object]] = []
        if isinstance(node, dict):
            children = [(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(node)]
        for child_path, child in children:
            found = walk(child, child_path)
            if found is not None:
                return found
        return None

    try:
        return walk(json.loads(data, parse_constant=lambda token: _NonFinite(float(token))), "")
    except (ValueError, RecursionError):
        return None


def explain_malformed(error: InputError, data: bytes | str) -> InputError:
    """`error`, or a sharper one naming the field when the JSON is malformed only by a NaN or Infinity."""
    if error.field is not None or not error.message.startswith("malformed JSON"):
        return error
    path = locate_non_finite(data)
    if path is None:
        return error
    return InputError("NaN and Infinity are not JSON numbers; give a finite number", field=path)


def decode_plan_request(data: bytes | str) -> PlanRequest:
    """models.codec.decode_request, with NaN/Infinity errors naming their field."""
    try:
        return decode_request(data)
    except InputError as error:
        raise explain_malformed(error, data) from error


def read_plan_request(path: str | Path) -> PlanRequest:
    """models.codec.read_request, with NaN/Infinity errors naming their field."""
    try:
        return read_request(path)
    except InputError as error:
        if error.field is not None or not error.message.startswith("malformed JSON"):
            raise
        try:
            data = Path(path).read_bytes()
        except OSError:
            raise error from None
        raise explain_malformed(error, data) from error


__all__ = ["decode_plan_request", "explain_malformed", "locate_non_finite", "read_plan_request"]
