"""formulation.model_arrays: the candidate tables' columns as numpy arrays, taken once per set of frames.

build_matrix reads every table through it. These tests pin what it must keep: the same lookups pandas
made (device of each pool, pool keys as groupby's sorted numbering), arrays nobody can write through, and
a view kept for the very frames it was taken from, never for a copy with other frames."""

import dataclasses

import msgspec
import numpy as np
import pandas as pd
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.formulation import KEY, _sorted_numbers, build_matrix, model_arrays
from fleetplan.solver.pipeline import resolve_profiles

REQUESTS = ["paper", "link_bound", "scarce_gpus"]


def _cand(name: str, **options):
    request = read_request(fixtures.request_path(name))
    if options:
        options = msgspec.structs.replace(request.options, **options)
        request = msgspec.structs.replace(request, options=options)
    return build_candidates(request, resolve_profiles(request))


@pytest.mark.parametrize("name", REQUESTS)
@pytest.mark.parametrize("pooling", ["model", "class"])
def test_the_view_reads_what_pandas_lookups_read(name, pooling):
    cand = _cand(name, pooling=pooling)
    t = model_arrays(cand)
    pools, uses, devices = cand.pools, cand.uses, cand.devices.set_index("device")
    # pool_keys' numbering is pandas' sorted groupby over (owner, role, device, tp, batch)
    assert np.array_equal(t.pool_key, pools.groupby(KEY, sort=True).ngroup().to_numpy())
    by_device = pools["device"].map(devices["cost_per_hour"]).to_numpy(float)
    assert np.array_equal(t.price[t.pool_device], by_device)
    assert np.array_equal(cand.devices["device"].to_numpy()[t.pool_device], pools["device"].to_numpy())
    assert np.array_equal(t.demand, cand.classes["rate_rps"].to_numpy(float)[uses["w"].to_numpy()])
    first = ~uses.duplicated(["w", "pool"]).to_numpy()
    assert first.sum() == len(np.unique(t.w * len(pools) + t.pool))


def test_the_arrays_are_read_only():
    t = model_arrays(_cand("paper"))
    for field in dataclasses.fields(t):
        array = getattr(t, field.name)
        with pytest.raises(ValueError, match="read-only"):
            array[...] = array


def test_the_view_is_kept_for_its_frames_and_taken_anew_for_other_frames():
    cand = _cand("paper")
    t = model_arrays(cand)
    assert model_arrays(cand) is t
    # a copy of the tables shares the memo: the same frames keep the view, other frames get their own
    assert model_arrays(dataclasses.replace(cand)) is t
    lowered = dataclasses.replace(cand, pools=cand.pools.assign(rho=cand.pools["rho"] / 2))
    half = model_arrays(lowered)
    assert half is not t
    assert np.allclose(half.pool_rho, t.pool_rho / 2)
    # and the model built on the copy reads the copy's headroom
    form, cols = build_matrix(lowered)
    capacity = next((begin, end) for name, begin, end in form.row_blocks if name == "capacity")
    x_coefficients = -form.A[capacity[0] : capacity[1], : cols.n_pools].diagonal()
    assert np.all(x_coefficients <= half.pool_rho + 1e-12)
    assert np.any(x_coefficients < t.pool_rho - 1e-9)


def test_a_pool_on_a_device_the_tables_do_not_list_is_an_internal_error():
    cand = _cand("paper")
    devices = cand.devices[cand.devices["device"] != cand.pools["device"].iloc[0]].reset_index(drop=True)
    with pytest.raises(AssertionError, match="device type the tables do not list"):
        model_arrays(dataclasses.replace(cand, devices=devices))


def test_groupby_numbering_on_drawn_keys():
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {
            "owner": rng.choice(["m-b", "m-a", "llama", "Zeta"], 200),
            "role": rng.choice(["prefill", "decode", "colocated"], 200),
            "device": rng.choice(["inf2", "a6000ada", "tpu-v5e"], 200),
            "tp": rng.choice([1, 2, 4], 200),
            "batch": rng.choice([1, 4, 16], 200),
        }
    )
    expected = frame.groupby(KEY, sort=True).ngroup().to_numpy()
    assert np.array_equal(_sorted_numbers([frame[c].to_numpy() for c in KEY]), expected)
