"""`fleetplan serve` on SIGTERM, as a real server process (bench/server.py starts it on 127.0.0.1 and stops it
by its pid): a solve still running when the grace period ends is answered, not dropped."""

import signal
import threading
import time

import httpx
import msgspec

from bench.instances import instance
from bench.server import running_server
from fleetplan.api.server import ANSWER_S, kill_at
from fleetplan.models.codec import encode


def test_kill_at_leaves_the_request_time_to_answer_before_the_grace_period_ends():
    assert kill_at(2.0) == 2.0 - ANSWER_S
    assert kill_at(0.4) == 0.2  # at most half of a short grace period
    assert kill_at(0.0) == 0.0
    assert kill_at(None) == float("inf")


def test_a_solve_running_past_the_grace_period_answers_503_with_a_log_line():
    """Session 34's operator test: with grace 2 s, the request whose solve still ran got no HTTP answer at all
    (the connection dropped; no access line, no metric): uvicorn cancels the request tasks when the grace
    period ends, before the app's shutdown hook killed the solves. Killed ANSWER_S before, it answers 503."""
    request = instance("M")  # a MILP that runs its whole limit on these machines
    options = msgspec.structs.replace(request.options, time_limit_s=30.0)
    body = encode(msgspec.structs.replace(request, options=options))
    env = {"FLEETPLAN_SHUTDOWN_GRACE_S": "2", "FLEETPLAN_MAX_CONCURRENT_SOLVES": "1"}
    answers: list[httpx.Response | Exception] = []
    with running_server(env) as server:

        def post() -> None:
            try:
                answers.append(
                    httpx.post(
                        f"{server.base}/plan",
                        content=body,
                        headers={"content-type": "application/json"},
                        timeout=60,
                    )
                )
            except httpx.HTTPError as error:
                answers.append(error)

        client = threading.Thread(target=post)
        client.start()
        deadline = time.monotonic() + 60
        while not server.solving() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.solving(), "the solve did not start"
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
        exited = time.monotonic() - began
        client.join(30)
        log = server.log_path.read_text()
    assert len(answers) == 1
    answer = answers[0]
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 503
    assert "the server shut down before the work was done" in answer.json()["detail"]
    assert answer.headers["retry-after"]
    assert "POST /plan 503" in log  # its access line
    assert exited < 2.0 + 5.0
