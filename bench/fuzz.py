"""The full schemathesis run (issue 13, "Done means"): >= 1,000 generated requests over every operation of
the app's own OpenAPI document, in process (ASGI), counting server errors, schema violations and how many
generated POST /plan requests were answered 2xx (the fuzzer reaches the solver).

The in-suite run (tests/test_fuzz.py) is the same checks with a few examples per operation.

    python -m bench.fuzz [--examples 250] [--seed 0]

Writes bench/results/fuzz-<UTC timestamp>.json and bench/results/fuzz-latest.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bench.server import ROOT
from bench.solver_scaling import git_info, git_line, machine_info, machine_line
from fleetplan.api.app import create_app
from fleetplan.api.settings import Settings
from fleetplan.profiler.store import ProfileStore, bundled_root

RESULTS = ROOT / "bench" / "results"


def run_operation(operation, examples: int, seed_value: int) -> dict:
    statuses: Counter[int] = Counter()
    violations: list[str] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy())
    def fuzz(case) -> None:
        response = case.call()
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, excluded_checks=[not_a_server_error, positive_data_acceptance])
        except Exception as error:  # noqa: BLE001 - every failure is counted, not raised
            violations.append(f"{response.status_code}: {str(error).splitlines()[0][:200]}")

    fuzz()
    return {"statuses": dict(statuses), "violations": violations}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=250, help="hypothesis examples per operation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC)
    machine, git = machine_info(), git_info()
    root = Path(tempfile.mkdtemp(prefix="fleetplan-fuzz-"))
    store = ProfileStore([bundled_root(), root], writable=root)
    app = create_app(store, settings=Settings(allow_anonymous_writes=True, max_time_limit_s=5))
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)
    began = time.monotonic()
    per_operation = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        per_operation[operation.label] = run_operation(operation, args.examples, args.seed)
    seconds = time.monotonic() - began
    total = sum(sum(o["statuses"].values()) for o in per_operation.values())
    server_errors = sum(n for o in per_operation.values() for s, n in o["statuses"].items() if s == 500)
    violations = sum(len(o["violations"]) for o in per_operation.values())
    plans = per_operation.get("POST /plan", {"statuses": {}})["statuses"]
    plan_total = sum(plans.values())
    plan_2xx = sum(n for s, n in plans.items() if 200 <= s < 300)
    result = {
        "benchmark": "fuzz",
        "utc": stamp.isoformat(timespec="seconds"),
        "machine": machine,
        "git": git,
        "examples_per_operation": args.examples,
        "seconds": round(seconds, 1),
        "requests": total,
        "server_errors_500": server_errors,
        "schema_violations": violations,
        "plan_requests": plan_total,
        "plan_2xx": plan_2xx,
        "per_operation": per_operation,
    }
    print(machine_line(machine))
    print(git_line(git))
    print(f"{total} generated requests over {len(per_operation)} operations in {seconds:.0f} s")
    for label, o in per_operation.items():
        print(f"  {label:<24} {dict(sorted(o['statuses'].items()))}  violations: {len(o['violations'])}")
    print(
        f"500s: {server_errors}   schema violations: {violations}   POST /plan 2xx: {plan_2xx}/{plan_total}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (RESULTS / f"fuzz-{stamp.strftime('%Y%m%dT%H%M%SZ')}.json").write_text(text)
    (RESULTS / "fuzz-latest.json").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
