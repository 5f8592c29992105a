"""solver/memo.py: what is read off a profile table is kept per table content, and only per content."""

from types import SimpleNamespace

from fleetplan.solver import memo


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
