"""The candidate tables kept on disk (fleetplan/solver/table_cache.py): a process that has not built a fleet's
tables reads them from the directory FLEETPLAN_CANDIDATE_CACHE names, equal to a fresh build, and plans the
same; other code, a damaged file or a directory others may write is never read; the `fleetplan` command turns
the cache on at the user's cache directory."""

import fcntl
import logging
import multiprocessing
import os
import pickle
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from fleetplan import fixtures
from fleetplan.api.cli import main
from fleetplan.models.codec import read_request
from fleetplan.solver import candidates, plan, table_cache
from fleetplan.solver.deadline import CANDIDATES, SOLVE, Deadline
from fleetplan.solver.pipeline import resolve_profiles

FRAMES = ("classes", "latency", "pools", "uses", "devices")


@pytest.fixture
def paper():
    request = read_request(fixtures.request_path("paper"))
    return request, resolve_profiles(request)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    where = tmp_path / "candidates"
    monkeypatch.setenv(table_cache.ENV, str(where))
    candidates.clear_candidates_cache()
    yield where
    candidates.clear_candidates_cache()


def _no_builds(monkeypatch):
    """From here on, a build fails the test: what build_candidates returns came from a cache."""

    def refuse(*_args):
        raise AssertionError("the tables were built, not read from the disk cache")

    monkeypatch.setattr(candidates, "_build_candidates", refuse)


def _kept(where):
    return sorted(where.glob("*.pkl"))


def test_a_new_process_reads_the_tables_another_built(paper, folder, monkeypatch):
    request, table = paper
    built = candidates.build_candidates(request, table)
    (path,) = _kept(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o077 == 0  # the user's alone, like the directory
    candidates.clear_candidates_cache()  # what a new process has in memory: nothing
    _no_builds(monkeypatch)
    read = candidates.build_candidates(request, table)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(read, name), getattr(built, name))
    assert read.request is request
    assert read.memo == {}  # derived arrays are rebuilt on use, never read back


def test_a_plan_from_the_disk_cache_is_the_plan_from_a_fresh_build(paper, folder, monkeypatch):
    request, _ = paper
    fresh = plan(request, with_baselines=False)
    assert len(_kept(folder)) == 1
    candidates.clear_candidates_cache()
    _no_builds(monkeypatch)
    again = plan(request, with_baselines=False)
    assert again.slo_rps == pytest.approx(fresh.slo_rps, rel=1e-9)
    assert again.cost_per_hour == pytest.approx(fresh.cost_per_hour, rel=1e-9)
    assert [(p.role, p.device, p.tp, p.batch, p.instances) for p in again.pools] == [
        (p.role, p.device, p.tp, p.batch, p.instances) for p in fresh.pools
    ]


def test_other_code_never_reads_the_tables(paper, folder, monkeypatch):
    request, table = paper
    candidates.build_candidates(request, table)
    (old,) = _kept(folder)
    monkeypatch.setattr(table_cache, "code_fingerprint", lambda: "another version of fleetplan")
    candidates.clear_candidates_cache()
    assert table_cache.load(candidates.candidates_key(request, table)) is None  # another file name
    # a file under the right name whose fingerprint is another's (a hash collision, or an edited file)
    key = candidates.candidates_key(request, table)
    path = table_cache._path(folder, key)
    path.write_bytes(pickle.dumps(("yet another", key, "not tables")))
    path.chmod(0o600)
    assert table_cache.load(key) is None
    assert not path.exists()  # removed
    assert old.exists()  # the other version's file stays until it is pruned


def test_a_damaged_file_is_a_miss_and_the_plan_goes_on(paper, folder, caplog):
    request, table = paper
    candidates.build_candidates(request, table)
    (path,) = _kept(folder)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    candidates.clear_candidates_cache()
    with caplog.at_level(logging.INFO, logger="fleetplan.solver"):
        rebuilt = candidates.build_candidates(request, table)
    assert len(rebuilt.pools) > 0
    assert "unreadable" in caplog.text
    (again,) = _kept(folder)  # the rebuilt tables replaced it
    candidates.clear_candidates_cache()
    assert table_cache.load(candidates.candidates_key(request, table)) is not None
    assert again == path


def test_a_directory_others_may_write_is_not_used(paper, folder, caplog):
    request, table = paper
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="fleetplan.solver"):
        built = candidates.build_candidates(request, table)
    assert len(built.pools) > 0  # planned without it
    assert _kept(folder) == []
    assert "writable by group or others" in caplog.text
    table_cache._warned.clear()


def test_a_directory_that_cannot_be_made_is_a_warning_not_a_failure(paper, tmp_path, monkeypatch, caplog):
    request, table = paper
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(table_cache.ENV, str(blocker / "candidates"))
    candidates.clear_candidates_cache()
    with caplog.at_level(logging.WARNING, logger="fleetplan.solver"):
        built = candidates.build_candidates(request, table)
    assert len(built.pools) > 0
    assert "cannot create it" in caplog.text
    table_cache._warned.clear()
    candidates.clear_candidates_cache()


@pytest.mark.parametrize("value", ["off", "", "0", "none", "OFF"])
def test_off_or_unset_writes_nothing(paper, tmp_path, monkeypatch, value):
    request, table = paper
    monkeypatch.setenv(table_cache.ENV, value)
    monkeypatch.chdir(tmp_path)  # a relative path would land here
    candidates.clear_candidates_cache()
    candidates.build_candidates(request, table)
    assert table_cache.directory() is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv(table_cache.ENV)
    assert table_cache.directory() is None
    candidates.clear_candidates_cache()


def test_default_is_the_users_cache_directory(monkeypatch):
    monkeypatch.setenv(table_cache.ENV, "default")
    assert table_cache.directory() == table_cache.default_directory()
    assert table_cache.default_directory().parts[-2:] == ("fleetplan", "candidates")


def test_a_link_in_place_of_a_file_is_not_read(paper, folder, tmp_path, caplog):
    """Checked on the open file: a symbolic link where a table set belongs (to a file elsewhere, which
    could be anyone's) is not followed."""
    request, table = paper
    candidates.build_candidates(request, table)
    (path,) = _kept(folder)
    elsewhere = tmp_path / "elsewhere.pkl"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    candidates.clear_candidates_cache()
    with caplog.at_level(logging.INFO, logger="fleetplan.solver"):
        assert table_cache.load(candidates.candidates_key(request, table)) is None


def test_a_file_others_may_write_is_not_read(paper, folder, caplog):
    request, table = paper
    candidates.build_candidates(request, table)
    (path,) = _kept(folder)
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="fleetplan.solver"):
        assert table_cache.load(candidates.candidates_key(request, table)) is None
    assert "writable by group or others" in caplog.text


def test_nothing_in_the_cache_fails_a_plan(paper, folder, monkeypatch):
    """A file that cannot be removed, tables that cannot be pickled, a code hash that cannot be taken:
    each is a miss or a skipped write, never an error out of build_candidates."""
    request, table = paper
    candidates.build_candidates(request, table)
    (path,) = _kept(folder)
    path.write_bytes(b"not a pickle")

    def refuse(*_args, **_kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(type(path), "unlink", refuse)
    candidates.clear_candidates_cache()
    assert len(candidates.build_candidates(request, table).pools) > 0  # the damaged file stays; a miss
    monkeypatch.undo()
    monkeypatch.setenv(table_cache.ENV, str(folder))
    monkeypatch.setattr(table_cache.pickle, "dumps", refuse)
    path.unlink()
    candidates.clear_candidates_cache()
    assert len(candidates.build_candidates(request, table).pools) > 0
    assert _kept(folder) == []  # not written, and no error


def test_the_least_recently_used_files_go_first(tmp_path):
    for i in range(5):
        path = tmp_path / f"{i}.pkl"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / ".tmp-being-written.pkl").write_bytes(b"x" * 100)  # another process's write: never pruned
    assert table_cache.prune(tmp_path, max_files=3) == 2
    names = sorted(p.name for p in tmp_path.glob("*.pkl"))
    assert names == [".tmp-being-written.pkl", "2.pkl", "3.pkl", "4.pkl"]
    assert table_cache.prune(tmp_path, max_files=10, max_bytes=250) == 1  # 4 and 3 fit, 2 does not
    assert table_cache.clear(tmp_path) == 2
    assert [p.name for p in tmp_path.glob("*.pkl")] == [".tmp-being-written.pkl"]
    # a temporary file whose writer was killed: removed once it is STALE_TEMPORARY_S old
    old = time.time() - table_cache.STALE_TEMPORARY_S - 1
    os.utime(tmp_path / ".tmp-being-written.pkl", (old, old))
    assert table_cache.prune(tmp_path) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_fleetplan_command_turns_the_cache_on(tmp_path, monkeypatch):
    """Unset, `fleetplan` keeps the tables in the user's cache directory (here a temporary one): a later
    command, or the server's workers, read them instead of building them."""
    where = tmp_path / "user-cache"
    monkeypatch.setattr(table_cache, "default_directory", lambda: where)
    monkeypatch.delenv(table_cache.ENV)
    candidates.clear_candidates_cache()
    result = CliRunner().invoke(main, ["plan", "paper", "--json"])  # monkeypatch restores the variable
    assert result.exit_code == 0, result.output
    assert os.environ.get(table_cache.ENV) == "default"
    assert len(_kept(where)) == 1
    candidates.clear_candidates_cache()


def test_the_command_leaves_an_explicit_setting_alone(tmp_path, monkeypatch):
    monkeypatch.setenv(table_cache.ENV, "off")
    candidates.clear_candidates_cache()
    result = CliRunner().invoke(main, ["plan", "paper", "--json"])
    assert result.exit_code == 0, result.output
    assert os.environ[table_cache.ENV] == "off"


def test_the_cache_command_counts_and_clears(paper, folder):
    request, table = paper
    candidates.build_candidates(request, table)
    shown = CliRunner().invoke(main, ["cache"])
    assert shown.exit_code == 0, shown.output
    assert str(folder) in shown.output
    assert "1 table sets" in shown.output
    cleared = CliRunner().invoke(main, ["cache", "--clear"])
    assert "removed 1 table sets" in cleared.output
    assert _kept(folder) == []
    off = CliRunner().invoke(main, ["cache"], env={table_cache.ENV: "off"})
    assert "off" in off.output


def test_a_plan_reports_its_candidate_build_to_its_deadline(paper, folder):
    """What the service reads to let a build finish past its deadline (fleetplan/api/workers.py): solver.plan
    enters the candidates stage before the build and the solve stage after it."""
    request, _ = paper
    stages: list[str] = []
    deadline = Deadline(time.monotonic() + 60, 60, on_stage=stages.append)
    plan(request, with_baselines=False, deadline=deadline)
    assert stages == [CANDIDATES, SOLVE]


def _build_in_child(folder: str, log_file: str, pause_s: float) -> None:
    """A process of its own asking for paper's tables; each build it makes is logged (and slowed)."""
    os.environ[table_cache.ENV] = folder
    candidates.clear_candidates_cache()
    real = candidates._build_candidates

    def logged(request, table):
        with open(log_file, "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(pause_s)
        return real(request, table)

    candidates._build_candidates = logged
    request = read_request(fixtures.request_path("paper"))
    built = candidates.build_candidates(request, resolve_profiles(request))
    os._exit(0 if len(built.pools) > 0 else 1)


def test_two_processes_asking_for_the_same_new_tables_build_them_once(tmp_path):
    """The second waits for the first's build (the lock) and reads its tables."""
    context = multiprocessing.get_context("fork")
    log_file = tmp_path / "builds"
    args = (str(tmp_path / "cache"), str(log_file), 1.0)
    children = [context.Process(target=_build_in_child, args=args) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    assert len(log_file.read_text().split()) == 1


def test_a_builder_that_is_killed_holds_no_one_up(tmp_path):
    context = multiprocessing.get_context("fork")
    log_file = tmp_path / "builds"
    folder = str(tmp_path / "cache")
    stuck = context.Process(target=_build_in_child, args=(folder, str(log_file), 60.0))
    stuck.start()
    for _ in range(200):  # until it holds the lock and builds
        if log_file.exists():
            break
        time.sleep(0.05)
    stuck.kill()
    stuck.join()
    began = time.monotonic()
    other = context.Process(target=_build_in_child, args=(folder, str(log_file), 0.0))
    other.start()
    other.join(60)
    assert other.exitcode == 0
    assert time.monotonic() - began < 30  # not the killed builder's 60 s
    assert len(log_file.read_text().split()) == 2  # it built the tables itself


def test_old_lock_files_no_one_holds_are_pruned(tmp_path):
    held, free = tmp_path / "a.lock", tmp_path / "b.lock"
    for path in (held, free):
        path.write_bytes(b"")
        old = time.time() - table_cache.STALE_TEMPORARY_S - 1
        os.utime(path, (old, old))
    handle = os.open(held, os.O_RDWR)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        assert table_cache.prune(tmp_path) == 1
        assert held.exists()
        assert not free.exists()
    finally:
        os.close(handle)
