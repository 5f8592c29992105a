"""What the profile rows leave out of a request is said in the plan's warnings (session 34's new-user test:
each of these was silent, or blamed on something else)."""

import msgspec
import numpy as np
from store_helpers import paper_rows, tiny_request

from fleetplan.solver.explain import profile_warnings
from fleetplan.solver.pipeline import plan, resolve_profiles


def warnings_of(request) -> list[str]:
    return profile_warnings(request, resolve_profiles(request))


def with_p99(request):
    workload = request.workloads[0]
    slo = msgspec.structs.replace(workload.slo, percentile=99)
    return msgspec.structs.replace(request, workloads=[msgspec.structs.replace(workload, slo=slo)])


def test_a_device_without_rows_at_the_classs_percentile_is_named_with_the_class():
    rows = paper_rows()
    rows.loc[rows["device"] == "inf2", ["ttft_ms_p99", "tbt_ms_p99"]] = np.nan
    request = with_p99(tiny_request(rows.astype(object).where(rows.notna(), None)))  # absent, as JSON null
    expected = (
        "device 'inf2' has no rows with ttft_ms_p99 and tbt_ms_p99 for model 'llama-3.2-1b': "
        "class 'chat' (p99 SLO) cannot use it"
    )
    assert warnings_of(request) == [expected]
    assert expected in plan(request, with_baselines=False).warnings  # in the plan the user reads
    assert warnings_of(with_p99(tiny_request())) == []  # every device has its p99 rows


def test_batch_sizes_and_tp_degrees_without_rows_are_named():
    request = tiny_request(batch_sizes=[1, 64], tp_degrees=[1, 4])
    assert warnings_of(request) == [
        "options.batch_sizes: [64] has no profile rows for the classes' models "
        f"(profiled: {sorted(paper_rows()['batch'].unique().tolist())}); never planned",
        "options.tp_degrees: [4] has no profile rows for the classes' models "
        f"(profiled: {sorted(paper_rows()['tp'].unique().tolist())}); never planned",
    ]


def test_inline_rows_of_a_device_the_fleet_does_not_have_are_named():
    rows = paper_rows()
    rows.loc[rows["device"] == "inf2", "device"] = "inf-2"  # a misspelt name
    assert warnings_of(tiny_request(rows)) == [
        "device 'inf2' has no rows in profile set 'inline': it can serve nothing",
        "profiles.rows name device(s) ['inf-2'] that the fleet does not have "
        "(devices: ['a6000ada', 'inf2']); those rows serve nothing",
    ]


def test_rows_without_the_p50_are_named_once_per_model_and_device():
    """Without p50 the capacity model takes p90 as the median (the plan is more conservative) and the
    simulator refuses the rows: a new user found both only by comparing plans (session 34)."""
    rows = paper_rows()
    rows.loc[rows["device"] == "a6000ada", "tbt_ms_p50"] = np.nan
    request = tiny_request(rows.astype(object).where(rows.notna(), None))
    assert warnings_of(request) == [
        "profile rows of model 'llama-3.2-1b' on device 'a6000ada' lack ttft_ms_p50 or tbt_ms_p50: the "
        "capacity model takes the next percentile as the median (a conservative plan), and `simulate` "
        "cannot replay them; profile the p50 too"
    ]
