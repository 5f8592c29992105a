"""ProfileStore.save: checked before written, swapped atomically, never replacing a good set with a bad
one."""

import json
from pathlib import Path

import pandas as pd
import pytest

from fleetplan.models.errors import InputError, ProfileMissing
from fleetplan.models.profile import ProfileSetManifest
from fleetplan.profiler.store import VERSIONS, ProfileSetExists, ProfileStore, StoreNotWritable, bundled_root
from fleetplan.profiler.tables import check_grid_complete, check_no_nan, check_rows_have_latencies


def frame(ttft: list[float] | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": ["m", "m"],
            "device": ["d", "d"],
            "tp": [1, 1],
            "batch": [1, 4],
            "prompt_tokens": [128, 128],
            "ttft_ms_p90": ttft or [10.0, 20.0],
            "tbt_ms_p90": [5.0, 6.0],
        }
    )


MANIFEST = ProfileSetManifest(
    name="x", description="test set", sha256="", rows=0, generator="tests/test_store.py", created="2025-11-22"
)


def test_save_then_load_through_the_symlink(tmp_path: Path) -> None:
    store = ProfileStore([tmp_path])
    saved = store.save("s", frame(), MANIFEST)
    assert saved.name == "s"
    assert saved.rows == 2
    assert len(saved.sha256) == 64
    assert (tmp_path / "s").is_symlink()
    assert (tmp_path / "s").resolve().parent.name == VERSIONS
    assert store.load("s").sha256 == saved.sha256 == store.manifest("s").sha256
    assert store.names() == ["s"]  # neither .versions nor temporaries are sets


def test_failed_validation_never_replaces_the_last_good_set(tmp_path: Path) -> None:
    store = ProfileStore([tmp_path])
    good = store.save("s", frame(), MANIFEST).sha256
    with pytest.raises(
        ProfileMissing, match=r"ttft_ms_p90 must be finite and > 0: rows 1 \(m/d/tp1/b4/p128\)"
    ):
        store.save("s", frame(ttft=[10.0, -1.0]), MANIFEST)
    reread = ProfileStore([tmp_path])
    assert reread.load("s").sha256 == good
    assert reread.manifest("s").sha256 == good
    assert [p.name for p in (tmp_path / VERSIONS).iterdir()] == [(tmp_path / "s").resolve().name]


def test_replacing_a_set_is_seen_by_a_reader_and_old_versions_are_pruned(tmp_path: Path) -> None:
    store = ProfileStore([tmp_path])
    first = store.save("s", frame(), MANIFEST).sha256
    assert store.load("s").sha256 == first
    for ttft in ([11.0, 21.0], [12.0, 22.0], [13.0, 23.0]):
        latest = store.save("s", frame(ttft=ttft), MANIFEST).sha256
    assert store.load("s").sha256 == latest != first  # the cache follows the swap
    assert len(list((tmp_path / VERSIONS).iterdir())) == 2  # current + previous


def test_replace_false_refuses_an_existing_name(tmp_path: Path) -> None:
    store = ProfileStore([tmp_path])
    store.save("s", frame(), MANIFEST)
    with pytest.raises(ProfileSetExists, match="exists") as caught:
        store.save("s", frame(ttft=[1.0, 2.0]), MANIFEST, replace=False)
    assert caught.value.status_code == 409


def test_no_writable_root_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(StoreNotWritable):
        ProfileStore([bundled_root()]).save("s", frame(), MANIFEST)
    for name in ("../evil", ".hidden", "a/b"):
        with pytest.raises(InputError, match="cannot name a profile set"):
            ProfileStore([tmp_path]).save(name, frame(), MANIFEST)


def test_a_plain_directory_set_is_read_and_can_be_replaced(tmp_path: Path) -> None:
    legacy = tmp_path / "s"
    legacy.mkdir()
    frame().to_csv(legacy / "profile.csv", index=False)
    old = {"name": "s", "description": "old", "sha256": "0", "rows": 2, "generator": "hand", "created": "x"}
    (legacy / "manifest.json").write_text(json.dumps(old))
    store = ProfileStore([bundled_root(), tmp_path])
    assert store.writable == tmp_path
    assert store.manifest("s").description == "old"
    store.save("s", frame(ttft=[1.0, 2.0]), MANIFEST)
    assert store.manifest("s").description == "test set"
    assert (tmp_path / "s").is_symlink()


def test_extra_checks_run_before_writing(tmp_path: Path) -> None:
    store = ProfileStore([tmp_path])
    with pytest.raises(ProfileMissing, match=r"ttft_ms_p50 is NaN \(not measured\): rows 0"):
        store.save("s", frame(), MANIFEST, checks=[check_no_nan])
    assert store.names() == []


def test_named_table_checks_list_rows_and_points() -> None:
    with pytest.raises(ProfileMissing, match=r"1 grid point\(s\) have no row: m/d/tp1/b4/p512"):
        check_grid_complete(frame(), "d", [("m", 1, 1, 128), ("m", 1, 4, 128), ("m", 1, 4, 512)])
    bare = frame()
    bare["tbt_ms_p90"] = [5.0, None]
    with pytest.raises(ProfileMissing, match=r"no tbt_ms_p\* figure: rows 1 \(m/d/tp1/b4/p128\)"):
        check_rows_have_latencies(bare)


def test_concurrent_saves_of_one_name_never_lose_the_set(tmp_path: Path) -> None:
    """Before the per-name lock, one save could prune the version another was about to link: the name
    then pointed at a deleted directory (the set gone in 14 of 50 rounds of 6 threads). The race of two
    replace=false uploads is the next test's."""
    from concurrent.futures import ThreadPoolExecutor

    store = ProfileStore([tmp_path])

    def save(k: int) -> str:
        return store.save("s", frame(ttft=[10.0 + k, 20.0 + k]), MANIFEST).sha256

    for round_ in range(8):
        with ThreadPoolExecutor(6) as pool:
            saved = list(pool.map(save, range(round_ * 6, round_ * 6 + 6)))
        assert store.load("s").sha256 in saved  # the name resolves to one of this round's versions
        assert len([p for p in (tmp_path / VERSIONS).iterdir() if p.name.startswith("s-")]) <= 2


def test_a_first_save_races_to_exactly_one_winner(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = ProfileStore([tmp_path])

    def save(k: int) -> str:
        try:
            return store.save("new", frame(ttft=[10.0 + k, 20.0 + k]), MANIFEST, replace=False).sha256
        except ProfileSetExists:
            return "exists"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(save, range(8)))
    assert results.count("exists") == 7
    (winner,) = [r for r in results if r != "exists"]
    assert store.load("new").sha256 == winner


def test_a_store_that_cannot_be_written_says_so_and_keeps_its_sets(tmp_path: Path, monkeypatch) -> None:
    import errno

    from fleetplan.profiler import store as store_module

    store = ProfileStore([tmp_path])
    good = store.save("s", frame(), MANIFEST).sha256

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module, "_write_synced", full)
    with pytest.raises(StoreNotWritable, match="cannot be written \\(No space left on device\\)") as caught:
        store.save("s", frame(ttft=[1.0, 2.0]), MANIFEST)
    assert caught.value.status_code == 503
    assert ProfileStore([tmp_path]).load("s").sha256 == good
    assert [p.name for p in (tmp_path / VERSIONS).iterdir()] == [(tmp_path / "s").resolve().name]


def test_set_names_are_ones_a_request_can_name_and_never_a_bundled_sets(tmp_path: Path) -> None:
    """`profile --name 'ünï'` and `merge --name paper` wrote sets no request could name, or that shadowed
    the bundled `paper` for every request naming it (POST /profiles already refused the latter)."""
    store = ProfileStore([bundled_root(), tmp_path], writable=tmp_path)
    with pytest.raises(InputError, match="cannot name a profile set"):
        store.save("ünï", frame(), MANIFEST)
    with pytest.raises(InputError, match="not ending in .partial.jsonl"):
        store.save("x.partial.jsonl", frame(), MANIFEST)  # the profiler's resume file of set "x"
    with pytest.raises(ProfileSetExists, match="'paper' is a bundled profile set") as caught:
        store.save("paper", frame(), MANIFEST)
    assert caught.value.status_code == 409
    assert store.names() == ["paper", "synthetic"]


def test_a_store_root_that_is_a_file_is_not_writable(tmp_path: Path) -> None:
    """FLEETPLAN_PROFILE_STORE naming a file made POST /profiles answer 500 (FileExistsError)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(StoreNotWritable, match="cannot be written"):
        ProfileStore([afile]).save("s", frame(), MANIFEST)
