"""The issue's promise: `fleetplan profile --backend transformers` on the bundled tiny model gives a valid
set, and the solver plans from it."""

import msgspec
import pytest

# real CPU timings: run alone, after the parallel part of `make test` (pyproject: markers)
pytestmark = pytest.mark.serial

pytest.importorskip(
    "torch", reason="the transformers engine needs the profile-cpu extra (make test installs it)"
)


def test_profile_tiny_model_then_plan_from_it(tmp_path):
    from click.testing import CliRunner

    from fleetplan.api.cli import main
    from fleetplan.models.plan import PlanRequest
    from fleetplan.profiler.store import ProfileStore, bundled_root
    from fleetplan.solver import plan
    from fleetplan.solver.verify import verify

    args = [
        *"profile --backend transformers --device cpu --models tiny-llama".split(),
        *"--batches 1,4 --prompts 16,128 --output-tokens 6 --warmup 1 --runs 3".split(),
        *["--out", str(tmp_path), "--name", "tiny", "--no-progress"],
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    store = ProfileStore([bundled_root(), tmp_path])
    table = store.load("tiny")
    assert len(table.frame) == 4
    assert table.frame["source"].str.startswith("measured:transformers:cpu").all()
    assert table.sha256 == store.manifest("tiny").sha256
    request = msgspec.convert(
        {
            "devices": [{"name": "cpu", "count": 2}],
            "workloads": [
                {
                    "name": "chat",
                    "model": "tiny-llama",
                    "prompt_tokens": 64,
                    "output_tokens": 6,
                    "rate_rps": 5,
                    "slo": {"ttft_ms": 5000, "tbt_ms": 5000},
                }
            ],
            "profiles": {"set": "tiny"},
            # the served-RPS check below is the flat model's arithmetic; the queueing model's admissible
            # load depends on the spread of these noisy CPU timings
            "options": {"capacity_model": "flat"},
        },
        PlanRequest,
    )
    planned = plan(request, store)
    verify(request, planned, table)
    assert planned.status == "optimal"
    assert planned.slo_rps == pytest.approx(5.0)
