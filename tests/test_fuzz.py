"""schemathesis against the app's own OpenAPI document, in process (ASGI), over every operation; and
hypothesis garbage through the decoders.

Bounded for the suite's time budget: a few examples per operation, time limits capped at 2 s by the
server's own setting (a bigger one is a documented 422). Checks: no 500 ever; every status documented for
its operation; every body conforming to its documented schema (problem+json included). A 503 with
Retry-After is a documented, expected answer (no plan within the time limit on a busy test machine), so
`not_a_server_error` is replaced by "never a 500". `positive_data_acceptance` is off: the schema states
every per-field rule (types, ranges, lengths, enums), but not the cross-field ones (unique names, links
between known devices, `set` xor `rows`, known models), which a schema-valid body may break (a 400 naming
the field).
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.api.app import create_app
from fleetplan.api.settings import Settings
from fleetplan.models.codec import decode
from fleetplan.models.errors import InputError
from fleetplan.models.plan import PlanRequest
from fleetplan.models.profile import ProfileUpload
from fleetplan.profiler.store import ProfileStore, bundled_root

schemathesis = pytest.importorskip("schemathesis", reason="the test extra (make test installs it)")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

EXAMPLES_PER_OPERATION = 6


def _app(root: Path):
    store = ProfileStore([bundled_root(), root], writable=root)
    return create_app(store, settings=Settings(allow_anonymous_writes=True, max_time_limit_s=2))


_ROOT = Path(__import__("tempfile").mkdtemp(prefix="fleetplan-fuzz-"))
schema = schemathesis.openapi.from_asgi("/schema/openapi.json", _app(_ROOT))


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_operation_conforms_and_never_500(case) -> None:
    response = case.call_and_validate(excluded_checks=[not_a_server_error, positive_data_acceptance])
    assert response.status_code != 500, response.text
    if response.status_code == 503:
        assert "retry-after" in {k.lower() for k in response.headers} or "profile store" in response.text


_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    ).map(lambda v: __import__("json").dumps(v).encode()),
)


@given(_GARBAGE)
@settings(max_examples=150, deadline=None)
def test_decoders_refuse_garbage_with_an_input_error(data: bytes) -> None:
    for type_ in (PlanRequest, ProfileUpload):
        reason = "decoded"
        try:
            decode(data, type_)
        except InputError as error:  # the only exception a decoder may raise
            reason = str(error)
        assert reason  # a reason, never an empty message
