"""Runs on real databases (SQLite file, PostgreSQL server): heartbeats and leases, abandoned runs marked
failed, and two re-plans of one fleet at once, in threads and in processes: never two promotions."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from postgres_server import database_url_fixture, postgres_root_url_fixture  # noqa: F401 (fixtures)
from store_helpers import QUICK_GATE, tiny_request

from fleetplan.api.cli import main
from fleetplan.models.store import ProfileSetRecord, ReplanRequest
from fleetplan.replan import replan, service
from fleetplan.solver.pipeline import plan
from fleetplan.store import Repository, make_engine, open_repository
from fleetplan.store.tables import runs

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ProfileSetRecord(name="inline", sha256="0" * 64, models=["m"], devices=["d"], created_at="t")
FOREIGN_KEY = "another-boot/pid:[4026531836]|4242|123"  # an owner on another host: only its lease tells


@pytest.fixture
def repo(database_url):
    repository = open_repository(database_url, migrate=True)
    repository.put_fleet("f", tiny_request())
    yield repository
    repository.engine.dispose()


def _set(repo: Repository, run_id: int, **values) -> None:
    with repo.engine.begin() as connection:
        connection.execute(runs.update().where(runs.c.id == run_id).values(**values))


def _stamp(seconds_ago: float) -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat(timespec="microseconds")


def test_a_live_run_refuses_a_second_and_its_heartbeat_keeps_it_alive(repo):
    first = repo.start_run("f")
    assert first.status == "running"
    second = repo.start_run("f")
    assert second.status == "failed"
    assert second.reason.startswith(
        f"refused: run {first.id} of fleet f is still running (pid {os.getpid()} on "
    )
    assert second.finished_at is not None
    # the heartbeat thread moves heartbeat_at while the block runs, and stops with it
    fast = Repository(repo.engine, heartbeat_s=0.05)
    with repo.engine.connect() as connection:
        start = connection.execute(sa.select(runs.c.heartbeat_at).where(runs.c.id == first.id)).scalar_one()
    with fast.heartbeat(first.id):
        time.sleep(0.5)
    with repo.engine.connect() as connection:
        beat = connection.execute(sa.select(runs.c.heartbeat_at).where(runs.c.id == first.id)).scalar_one()
    assert beat > start
    time.sleep(0.2)
    with repo.engine.connect() as connection:
        after = connection.execute(sa.select(runs.c.heartbeat_at).where(runs.c.id == first.id)).scalar_one()
    assert after == beat  # no beat once the block ended
    assert repo.get_run(first.id).status == "running"


def test_a_run_of_another_host_is_abandoned_only_after_its_lease(repo):
    """Its process cannot be checked from here: a heartbeat within the lease keeps it running (and a new
    run is refused); past the lease, the next listing, get or start marks it failed with the reason."""
    other = repo.start_run("f")
    _set(repo, other.id, owner="pid 4242 on elsewhere", owner_key=FOREIGN_KEY, heartbeat_at=_stamp(290))
    assert [r.status for r in repo.list_runs("f")] == ["running"]
    assert repo.get_run(other.id).status == "running"
    assert repo.start_run("f").status == "failed"  # refused
    _set(repo, other.id, heartbeat_at=_stamp(310))
    marked = repo.get_run(other.id)
    assert marked.status == "failed"
    assert marked.reason.startswith("abandoned: no heartbeat from pid 4242 on elsewhere since ")
    assert marked.reason.endswith("(lease 300 s)")
    assert marked.finished_at is not None
    assert repo.start_run("f").status == "running"


def test_a_run_whose_process_is_gone_is_abandoned_at_once(repo):
    """Same boot and PID namespace: a finished process is seen at once, heartbeat fresh or not, and so is a
    pid now used by another process (its start time differs)."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(gone.stdout)
    scope = _owner_key_of_this_process().split("|")[0]
    run = repo.start_run("f")
    _set(repo, run.id, owner=f"pid {pid} on here", owner_key=f"{scope}|{pid}|1", heartbeat_at=_stamp(0))
    assert repo.list_runs("f")[0].status == "failed"
    assert repo.list_runs("f")[0].reason.startswith(f"abandoned: its process stopped (pid {pid} on here;")
    reused = repo.start_run("f")
    _set(repo, reused.id, owner_key=f"{scope}|{os.getpid()}|0")  # this pid, another start time
    assert repo.get_run(reused.id).status == "failed"


def _owner_key_of_this_process() -> str:
    from fleetplan.store.leases import owner

    key = owner()[1]
    if key is None:
        pytest.skip("no /proc: process identity is Linux-only, the lease applies alone")
    return key


def test_a_run_declared_abandoned_never_promotes_over_another(repo):
    """The second guard, in finish_run: a run promotes only while it is still `running` and over the plan
    it started from. Here run A, alive but declared abandoned (a lease of 0 s), finishes after run B
    promoted: A is `kept`, B's plan stays current."""
    low, high = tiny_request(rate_rps=20.0), tiny_request(rate_rps=30.0)
    low_plan, high_plan = plan(low, with_baselines=False), plan(high, with_baselines=False)
    a = repo.start_run("f")
    impatient = Repository(repo.engine, lease_s=0.0)
    b = impatient.start_run("f")
    assert b.status == "running"
    assert impatient.get_run(a.id).status == "failed"
    b = repo.finish_run(
        b.id, status="promoted", reason=None, plan=(high, 1, high_plan, PROFILE), promote=True
    )
    late = repo.finish_run(
        a.id, status="promoted", reason=None, plan=(low, 1, low_plan, PROFILE), promote=True
    )
    assert late.status == "kept"
    assert late.reason.startswith("not promoted: this run was marked failed while it computed (abandoned: ")
    assert repo.get_plan(late.plan_id).state == "candidate"
    assert repo.current_plan("f").id == b.plan_id
    # and with its row still `running` (a writer that missed the mark), the moved pointer stops it
    c = repo.start_run("f")
    _set(repo, c.id, previous_plan_id=None)  # as if it had started before B's promotion
    stale = repo.finish_run(c.id, status="unchanged", reason="same")
    assert stale.status == "kept"
    assert stale.reason == (
        f"not promoted: plan {b.plan_id} became current while this run computed from plan None; re-plan again"
    )
    assert repo.current_plan("f").id == b.plan_id


def test_two_replans_in_threads_one_promotes_the_other_is_refused(repo, monkeypatch):
    """Run A waits inside its gate until run B has finished: B is refused (failed, exit 1 on the CLI),
    A promotes; the runs say which is which."""
    real_gate, entered, release = service.run_gate, threading.Event(), threading.Event()

    def slow_gate(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return real_gate(*args, **kwargs)

    monkeypatch.setattr(service, "run_gate", slow_gate)
    order = ReplanRequest(gate=QUICK_GATE)
    result = {}
    a = threading.Thread(target=lambda: result.setdefault("a", replan(repo, "f", order)))
    a.start()
    try:
        assert entered.wait(60)
        b = replan(repo, "f", order)
    finally:
        release.set()
        a.join(120)
    assert b.status == "failed"
    assert b.reason.startswith(f"refused: run {result['a'].id} of fleet f is still running")
    assert result["a"].status == "promoted"
    assert repo.current_plan("f").id == result["a"].plan_id
    assert sorted(r.status for r in repo.list_runs("f")) == ["failed", "promoted"]


# A re-plan in its own process; it waits for the go file so that both processes start together.
RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fleetplan.models.store import GateSpec, ReplanRequest
    from fleetplan.replan import replan
    from fleetplan.store import open_repository

    url, go = sys.argv[1], Path(sys.argv[2])
    repo = open_repository(url)
    order = ReplanRequest(gate=GateSpec(seeds=1, duration_s=20.0, warmup_s=5.0))
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    run = replan(repo, "f", order)
    print(run.id, run.status, run.reason, flush=True)
    """
)


def test_two_replans_in_processes_never_both_promote(repo, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    go = tmp_path / "go"
    url = repo.engine.url.render_as_string(hide_password=False)
    argv = [sys.executable, "-c", RACER, url, str(go)]
    racers = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in "ab"
    ]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
        go.touch()
        outputs = [racer.communicate(timeout=300) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    assert all(r.returncode == 0 for r in racers), [err for _, err in outputs]
    statuses = sorted(out.split()[1] for out, _ in outputs)
    assert statuses == ["failed", "promoted"], outputs
    refused = next(out for out, _ in outputs if out.split()[1] == "failed")
    assert "refused: run" in refused
    listed = repo.list_runs("f")
    promoted = [r for r in listed if r.status == "promoted"]
    assert len(promoted) == 1
    assert repo.current_plan("f").id == promoted[0].plan_id
    assert [p.state for p in repo.list_plans("f")] == ["current"]


def test_fleetplan_runs_marks_an_abandoned_run_and_replan_exits_1_when_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    repo = open_repository(url, migrate=True)
    repo.put_fleet("f", tiny_request())
    live = repo.start_run("f")
    runner = CliRunner()
    refused = runner.invoke(main, ["replan", "f", "--no-gate", "--database-url", url])
    assert refused.exit_code == 1
    assert f"failed: refused: run {live.id} of fleet f is still running" in refused.stderr
    _set(repo, live.id, owner_key=FOREIGN_KEY, heartbeat_at=_stamp(3600))
    listed = runner.invoke(main, ["runs", "f", "--database-url", url])
    assert listed.exit_code == 0
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:2] == ["id", "status"]
    row = next(line for line in lines[2:] if line.split()[0] == str(live.id))
    assert row.split()[1] == "failed"
    assert "abandoned: no heartbeat from pid" in row
    assert runner.invoke(main, ["replan", "f", "--no-gate", "--database-url", url]).exit_code == 0
    repo.engine.dispose()
    make_engine(url).dispose()


def test_a_failed_heartbeat_does_not_stop_the_next(repo, monkeypatch):
    """The store unreachable for one beat: the thread logs it and beats again (the lease is ten beats)."""
    from contextlib import contextmanager

    from fleetplan.models.errors import StoreUnavailable

    run = repo.start_run("f")
    fast = Repository(repo.engine, heartbeat_s=0.05)
    real, calls = fast._write, []

    @contextmanager
    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailable("database error: the network blinked")
        with real() as db:
            yield db

    monkeypatch.setattr(fast, "_write", flaky)
    with fast.heartbeat(run.id):
        time.sleep(0.5)
    assert len(calls) >= 3
    with repo.engine.connect() as connection:
        beat = connection.execute(sa.select(runs.c.heartbeat_at).where(runs.c.id == run.id)).scalar_one()
    assert beat > run.started_at


def test_http_reads_of_runs_mark_an_abandoned_run(tmp_path):
    from litestar.testing import TestClient

    from fleetplan.api.app import create_app
    from fleetplan.api.settings import Settings

    url = f"sqlite:///{tmp_path / 'api.db'}"
    repo = open_repository(url, migrate=True)
    repo.put_fleet("f", tiny_request())
    stale = repo.start_run("f")
    _set(repo, stale.id, owner="pid 4242 on elsewhere", owner_key=FOREIGN_KEY, heartbeat_at=_stamp(600))
    with TestClient(create_app(database_url=url, settings=Settings(api_token="t"))) as client:
        one = client.get(f"/runs/{stale.id}").json()
        assert one["status"] == "failed"
        assert one["reason"].startswith("abandoned: no heartbeat from pid 4242 on elsewhere since ")
        other = repo.start_run("f")
        _set(repo, other.id, owner_key=FOREIGN_KEY, heartbeat_at=_stamp(600))
        listed = client.get("/fleets/f/runs").json()
    assert [(r["id"], r["status"]) for r in listed] == [(other.id, "failed"), (stale.id, "failed")]
    repo.engine.dispose()


def test_a_plan_for_an_older_version_of_the_fleet_never_promotes(repo):
    """A PUT that removed a device while a re-plan computed: the re-plan promoted a plan for version 1,
    using that device, over a fleet at version 2."""
    request = tiny_request()
    result = plan(request, with_baselines=False)
    run = repo.start_run("f")
    assert repo.get_fleet("f").version == 1
    repo.put_fleet("f", tiny_request(rate_rps=25.0))  # edited while the run computes
    finished = repo.finish_run(
        run.id, status="promoted", reason=None, plan=(request, 1, result, PROFILE), promote=True
    )
    assert finished.status == "kept"
    assert finished.reason == (
        "not promoted: the fleet changed while this run computed (version 1 -> 2); re-plan again"
    )
    assert repo.get_plan(finished.plan_id).state == "candidate"
    assert repo.current_plan("f") is None
