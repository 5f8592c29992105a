"""Imported once, by the solve pool's fork server (its preload list): plan one small request there, so that
every solve child forked from it starts with the bundled profile sets read and the solver's code paths
(pandas, numpy, HiGHS) warmed, instead of paying for that in each request's own time limit.

The request is deliberately not a fixture a benchmark sends (its candidates are not what a client asks
for). A failure here only costs the warm-up: it is swallowed, and the children start cold.
"""

import contextlib

_WARMUP = (
    b'{"devices": [{"name": "a6000ada", "count": 1}], "workloads": [{"name": "warmup", '
    b'"model": "llama-3.2-1b", "prompt_tokens": 256, "output_tokens": 64, "rate_rps": 1.0, '
    b'"slo": {"ttft_ms": 1000, "tbt_ms": 100}}], "options": {"time_limit_s": 5}}'
)


def warm() -> None:
    from fleetplan import solver
    from fleetplan.models.codec import decode_request
    from fleetplan.profiler.store import ProfileStore

    store = ProfileStore()
    for name in store.names():
        store.load(name)  # cached by file identity: children find the tables read
    solver.plan(decode_request(_WARMUP), store)


with contextlib.suppress(Exception):  # noqa: BLE001 - see the module docstring
    warm()
