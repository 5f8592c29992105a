"""docs/request.md checked against the code: each Struct reachable from PlanRequest has a section whose table
lists exactly its fields (by their JSON names), and the worked example decodes and plans."""

import re
from pathlib import Path

import msgspec

from fleetplan.models.codec import decode_request
from fleetplan.models.plan import PlanRequest
from fleetplan.models.workload import CATALOG
from fleetplan.solver import plan

DOC = Path(__file__).resolve().parent.parent / "docs" / "request.md"
EXAMPLE_HEADING = "## Worked example"
# the Structs the page was written for; the walk below must find at least these
DOCUMENTED = {
    "PlanRequest",
    "Device",
    "Link",
    "ModelSpec",
    "Workload",
    "Slo",
    "ProfilesSpec",
    "ProfileRow",
    "Options",
}

_HEADING = re.compile(r"^#{1,6}\s+(.*)$")
_FIELD_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def reachable_structs(root: type) -> dict[str, list[str]]:
    """Struct name -> the encode names of its fields, for `root` and every Struct reachable from it (through
    lists, unions, dicts and annotations)."""
    found: dict[str, list[str]] = {}

    def walk(info: msgspec.inspect.Type) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls.__name__ in found:
                return
            found[info.cls.__name__] = [field.encode_name for field in info.fields]
            for field in info.fields:
                walk(field.type)
            return
        inner = list(getattr(info, "types", ())) + list(getattr(info, "item_types", ()))
        inner += [getattr(info, name, None) for name in ("type", "item_type", "key_type", "value_type")]
        for child in inner:
            if isinstance(child, msgspec.inspect.Type):
                walk(child)

    walk(msgspec.inspect.type_info(root))
    return found


def field_tables(text: str, structs: set[str]) -> dict[str, list[str]]:
    """Struct name -> the fields its section's table lists. A heading whose first backticked name is a Struct
    opens its section, which runs to the next heading; every table row in it whose first cell is a name in
    backticks lists a field. Code blocks are skipped."""
    tables: dict[str, list[str]] = {}
    current: str | None = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = _HEADING.match(line)
        if heading:
            named = [name for name in re.findall(r"`([A-Za-z_]\w*)`", heading.group(1)) if name in structs]
            current = named[0] if named else None
            if current is not None:
                assert current not in tables, f"two sections for {current}"
                tables[current] = []
            continue
        row = _FIELD_ROW.match(line)
        if current is not None and row:
            tables[current].append(row.group(1))
    return tables


def mismatches(text: str) -> list[str]:
    """What the page's tables get wrong about PlanRequest's Structs, one sentence each (empty: nothing)."""
    structs = reachable_structs(PlanRequest)
    tables = field_tables(text, set(structs))
    problems = [f"{name}: no section with a table" for name in structs if name not in tables]
    for name, listed in tables.items():
        fields = structs[name]
        problems += [f"{name}.{field}: not in its table" for field in fields if field not in listed]
        unknown = [field for field in listed if field not in fields]
        problems += [f"{name}.{field}: listed, but {name} has no such field" for field in unknown]
        problems += [f"{name}.{field}: listed twice" for field in set(listed) if listed.count(field) > 1]
    return problems


def example_text(text: str) -> str:
    """The first ```json block after the worked example's heading."""
    section = text[text.index(f"\n{EXAMPLE_HEADING}\n") :]
    return re.search(r"```json\n(.*?)```", section, re.S).group(1)


def test_the_walk_finds_every_struct_the_page_is_written_for():
    structs = reachable_structs(PlanRequest)
    assert set(structs) >= DOCUMENTED
    assert structs["Slo"] == ["ttft_ms", "tbt_ms", "percentile"]


def test_every_struct_has_a_table_of_exactly_its_fields():
    assert mismatches(DOC.read_text()) == []


def test_a_missing_row_and_an_unknown_field_are_caught():
    text = DOC.read_text()
    weight_row = next(line for line in text.splitlines() if line.startswith("| `weight` |"))
    tampered = text.replace(weight_row, "| `weights` | number | `1.0` | misspelt |")
    assert tampered != text
    problems = mismatches(tampered)
    assert "Workload.weight: not in its table" in problems
    assert "Workload.weights: listed, but Workload has no such field" in problems
    without_slo = re.sub(r"\n## `Slo`\n", "\n## Service levels\n", text)
    assert "Slo: no section with a table" in mismatches(without_slo)


def test_the_worked_example_decodes_and_plans():
    text = DOC.read_text()
    request = decode_request(example_text(text))
    # what the page says the example shows
    custom = {m.name for m in request.models or []} - set(CATALOG)
    assert custom
    assert {w.model for w in request.workloads} <= custom
    assert sorted(w.slo.percentile for w in request.workloads) == [90, 99]
    assert request.profiles.rows is not None
    assert {row.device for row in request.profiles.rows} == {d.name for d in request.devices}
    pairs = {(link.source, link.target) for link in request.links}
    assert any((target, source) in pairs for source, target in pairs if source != target)
    assert sorted((d.name, d.count) for d in request.devices) == [("acc-x", 6), ("h100", 2)]
    assert request.options.budget_per_hour is not None
    assert request.options.time_limit_s <= 10

    result = plan(request, with_baselines=False)
    assert result.status in ("optimal", "feasible")
    assert result.slo_rps > 0
    # the output shown on the page is this request's
    output = re.search(r"```text\n(status .*?)```", text[text.index(f"\n{EXAMPLE_HEADING}\n") :], re.S)
    assert f"/ {result.demand_rps:.2f} demand" in output.group(1).splitlines()[0]
