"""solver/memo.py: what is read off a profile table is kept per table content, and only per content; the
profile-coverage check (pipeline.check_cover) built on it."""

from types import SimpleNamespace

import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.errors import ProfileMissing
from fleetplan.profiler.tables import from_frame
from fleetplan.solver import memo, pipeline
from fleetplan.solver.pipeline import resolve_profiles


def test_per_table_keys_on_the_content_hash_and_the_arguments() -> None:
    calls: list[tuple[str, int]] = []

    @memo.per_table
    def derive(table: SimpleNamespace, n: int) -> list[int]:
        calls.append((table.sha256, n))
        return [n]

    a, a_again, b = SimpleNamespace(sha256="a"), SimpleNamespace(sha256="a"), SimpleNamespace(sha256="b")
    assert derive(a, 1) is derive(a_again, 1)  # same content, another object: one computation
    assert derive(a, 2) == [2]
    assert derive(b, 1) == [1]
    assert calls == [("a", 1), ("a", 2), ("b", 1)]
    for i in range(memo.CACHE_SIZE):  # the oldest entries go first
        derive(SimpleNamespace(sha256=f"other{i}"), 1)
    derive(a, 1)
    assert calls[-1] == ("a", 1)


def _paper_with(table_rows_without: str | None = None):
    request = read_request(fixtures.request_path("paper"))
    table = resolve_profiles(request)
    if table_rows_without is not None:
        frame = table.frame[table.frame["model"] != table_rows_without].reset_index(drop=True)
        table = from_frame(frame, "without-" + table_rows_without)
    return request, table


def test_check_cover_names_the_first_class_at_fault() -> None:
    request, table = _paper_with(table_rows_without="llama-3.2-3b")
    first = next(i for i, w in enumerate(request.workloads) if w.model == "llama-3.2-3b")
    with pytest.raises(ProfileMissing) as raised:
        pipeline.check_cover(request, table)
    assert raised.value.field == f"workloads[{first}].model"
    with pytest.raises(ProfileMissing):  # a failure is never remembered as covered
        pipeline.check_cover(request, table)


def test_check_cover_checks_each_model_and_percentile_once_per_table(monkeypatch: pytest.MonkeyPatch) -> None:
    request, table = _paper_with()
    checked: list[int] = []
    real = pipeline.check_profiles_cover

    def counting(req, tab) -> None:
        checked.append(len(req.workloads))
        real(req, tab)

    monkeypatch.setattr(pipeline, "check_profiles_cover", counting)
    pipeline._covered.cache_clear()
    pipeline.check_cover(request, table)
    pipeline.check_cover(request, table)
    assert checked == [len({(w.model, w.slo.percentile) for w in request.workloads})]
