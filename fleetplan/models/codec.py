"""Decode and encode the domain types: the one door every edge (HTTP, CLI files, fixtures) goes through."""

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fleetplan.models.errors import InputError
from fleetplan.models.plan import Plan, PlanRequest

T = TypeVar("T")

_request_decoder = msgspec.json.Decoder(PlanRequest)
_encoder = msgspec.json.Encoder()


_RELATIVE_FIELD = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*): "
)


def _input_error(error: msgspec.ValidationError, type_: Any = None) -> InputError:
    """InputError from msgspec's "reason - at `$.a.b[0]`", joined with a cross-field rule's own
    "field: reason" prefix (rules in __post_init__ name fields relative to their Struct). Where `type_` (the
    type decoded) is given, an unknown field says which fields its object takes (and the likeliest one
    meant) and an enum value which values it takes."""
    text = str(error)
    reason, _, path = text.partition(" - at `$")
    path = path.rstrip("`").lstrip(".")
    relative = _RELATIVE_FIELD.match(reason)
    if relative:
        reason = reason[relative.end() :]
        path = f"{path}.{relative.group(1)}" if path else relative.group(1)
    named = _NAMED_FIELD.match(reason)
    if named:  # the field is the one missing or unknown, not the object around it (no path at the top)
        missing = named.group(1) == "missing required"
        reason = (
            "required field missing"
            if missing
            else "unknown field" + _fields_hint(type_, path, named.group(2))
        )
        path = f"{path}.{named.group(2)}" if path else named.group(2)
    elif reason.startswith("Invalid enum value"):
        reason += _values_hint(type_, path)
    elif _EMPTY.match(reason):
        reason = f"empty; give at least one {_ITEM.get(path.rpartition('.')[2], 'item')}"
    return InputError(reason, field=path or None)


_NAMED_FIELD = re.compile(r"^Object (missing required|contains unknown) field `([^`]+)`$")
_EMPTY = re.compile(r"^Expected `array` of length >= 1$")
_ITEM = {"workloads": "workload class", "devices": "device type", "rows": "profile row"}


def _info_at(type_: Any, path: str) -> Any:
    """msgspec.inspect's type info of the value at `path` ("workloads[0].slo") in `type_`, or None."""
    if type_ is None:
        return None
    info = msgspec.inspect.type_info(type_)
    for name, index in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)?(\[\d+\])?\.?", path):
        if name:
            info = _unwrapped(info)
            fields = {f.encode_name: f.type for f in getattr(info, "fields", ())}
            if name not in fields:
                return None
            info = fields[name]
        if index:
            info = getattr(_unwrapped(info), "item_type", None)
    return _unwrapped(info)


def _unwrapped(info: Any) -> Any:
    """The one non-None member of an optional type's union (X | None), else `info`."""
    if isinstance(info, msgspec.inspect.UnionType):
        members = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        return members[0] if len(members) == 1 else info
    return info


def _fields_hint(type_: Any, path: str, unknown: str) -> str:
    """ "; did you mean 'rate_rps'? (fields: name, model, ...)" for an unknown field of the object at
    `path`, or "" where the object's type is not known."""
    import difflib

    info = _info_at(type_, path)
    names = [f.encode_name for f in getattr(info, "fields", ())]
    if not names:
        return ""
    close = difflib.get_close_matches(unknown, names, n=1)
    meant = f"; did you mean {close[0]!r}?" if close else ""
    return f"{meant} (fields: {', '.join(names)})"


def _values_hint(type_: Any, path: str) -> str:
    """ "; one of 50, 90, 99" for an enum (Literal) field at `path`, or ""."""
    values = getattr(_info_at(type_, path), "values", None)
    return (
        f"; one of {', '.join(repr(v) if isinstance(v, str) else str(v) for v in values)}" if values else ""
    )


def decode(data: bytes | str, type_: type[T]) -> T:
    """JSON -> `type_`, or InputError naming the field and the reason."""
    try:
        value = msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as error:
        value = _whole_floats_retried(data, type_, error)
    except msgspec.DecodeError as error:
        raise _malformed(data, error) from error
    except UnicodeDecodeError as error:
        raise _not_utf8(data, error) from error
    refuse_duplicate_keys(data)
    return value


def refuse_duplicate_keys(data: bytes | str) -> None:
    """InputError when an object of the (valid) JSON repeats a key: msgspec, like most parsers, would keep
    the last one silently, so {"rate_rps": 1, "rate_rps": 100} would plan 100 RPS where a proxy or a log
    that read the first saw 1 (RFC 8259: names SHOULD be unique; interoperability is undefined otherwise).
    Python's C parser with a pairs hook: ~0.1 ms on paper.json, ~65 ms on a 1.8 MB body."""

    def pairs(items: list[tuple[str, Any]]) -> None:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):  # linear: keys.count per key was quadratic (120,000 keys: 4 s)
            repeated = sorted(key for key, n in Counter(keys).items() if n > 1)
            raise InputError(
                f"duplicate key(s) {repeated} in one JSON object; give each key once", field=repeated[0]
            )

    try:
        json.loads(data, object_pairs_hook=pairs)
    except ValueError:  # not JSON at all: the decoder above has said so already
        return


# msgspec's message for a float where an int (or an int-or-something) is due
_FLOAT_FOR_INT = re.compile(r"^Expected `int[^`]*`, got `float`")


def _whole_floats_retried(data: bytes | str, type_: type[T], error: msgspec.ValidationError) -> T:
    """JSON has one number type, and JSON Schema (the OpenAPI document) counts 2.0 as an integer: a
    whole float in an integer field is that integer. msgspec refuses it, so such a body is decoded again
    with its whole floats read as ints (2.5 and "2" are still refused). Any other error is raised as is."""
    if not _FLOAT_FOR_INT.match(str(error)):
        raise _input_error(error, type_) from error
    try:
        return msgspec.convert(_ints_for_whole_floats(msgspec.json.decode(data)), type=type_)
    except msgspec.ValidationError as again:
        raise _input_error(again, type_) from again
    except RecursionError as deep:  # msgspec's typed decode refuses such depth itself; the untyped one raises
        raise InputError("the JSON nests too deeply") from deep


def _ints_for_whole_floats(node: Any) -> Any:
    if isinstance(node, float) and node.is_integer() and abs(node) < 2**53:
        return int(node)
    if isinstance(node, dict):
        return {key: _ints_for_whole_floats(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_ints_for_whole_floats(value) for value in node]
    return node


def _malformed(data: bytes | str, error: msgspec.DecodeError) -> InputError:
    """The error for JSON msgspec cannot parse: a NaN/Infinity is named by its field (every endpoint and
    the CLI alike), anything else by msgspec's byte offset."""
    path = locate_non_finite(data)
    if path is not None:
        return InputError("NaN and Infinity are not JSON numbers; give a finite number", field=path)
    reason = str(error).removeprefix("JSON is malformed: ")
    at = re.search(r" \(byte (\d+)\)$", reason)
    if at:  # msgspec counts bytes; an editor shows lines and columns
        offset = int(at.group(1))
        head = (data.encode() if isinstance(data, str) else data)[:offset]
        line = head.count(b"\n") + 1
        column = offset - (head.rfind(b"\n") + 1) + 1
        reason = f"{reason[: at.start()]} at line {line}, column {column} (byte {offset})"
    return InputError(f"malformed JSON: {reason}")


def _not_utf8(data: bytes | str, error: UnicodeDecodeError) -> InputError:
    """The error for a string that is not UTF-8 (JSON text must be: RFC 8259, section 8.1), at its byte
    offset in the whole document (msgspec's error counts within the one string)."""
    try:
        data.decode("utf-8") if isinstance(data, bytes) else None
    except UnicodeDecodeError as whole:
        error = whole
    bad = error.object[error.start : error.end]
    return InputError(f"the JSON is not UTF-8: byte(s) {bad!r} at offset {error.start}; encode it as UTF-8")


def locate_non_finite(data: bytes | str) -> str | None:
    """The path of the first NaN/Infinity in `data` ("profiles.rows[0].ttft_ms_p90"), if any.

    Python's json.dumps writes NaN and Infinity, which are not JSON: msgspec reports them as malformed
    JSON at a byte offset. Python's own parser accepts them, so it can say which field holds one.
    """

    def walk(node: object, path: str) -> str | None:
        if isinstance(node, float) and not math.isfinite(node):
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
        return walk(json.loads(data), "")
    except (ValueError, RecursionError):
        return None


def decode_request(data: bytes | str) -> PlanRequest:
    """A PlanRequest from JSON, validated (types, bounds and cross-field rules)."""
    try:
        request = _request_decoder.decode(data)
    except msgspec.ValidationError as error:
        request = _whole_floats_retried(data, PlanRequest, error)
    except msgspec.DecodeError as error:
        raise _malformed(data, error) from error
    except UnicodeDecodeError as error:
        raise _not_utf8(data, error) from error
    refuse_duplicate_keys(data)
    return request


def read_request(path: str | Path) -> PlanRequest:
    """A PlanRequest from a JSON file; the error names the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InputError(f"cannot read request file {path}: {error.strerror}") from error
    return decode_request(data)


def convert(obj: Any, type_: type[T]) -> T:
    """Builtins (dicts from a CSV or a test) -> `type_`, with the same errors as decode()."""
    try:
        return msgspec.convert(obj, type=type_)
    except msgspec.ValidationError as error:
        raise _input_error(error, type_) from error


def encode(obj: Any) -> bytes:
    """Any domain value -> JSON bytes."""
    return _encoder.encode(obj)


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def encode_plan(plan: Plan) -> bytes:
    return _encoder.encode(plan)
