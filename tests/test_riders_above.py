"""headroom.riders_above: a prefill use admitted again above its first admission, behind only the transfers
of riders whose own admission could reach that high. What must hold on every candidate set: each use of
every pool is admissible at the pool's level behind the transfers of the uses that pool actually carries."""

import numpy as np
import pytest

from bench.fidelity import generated
from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import headroom
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.pipeline import resolve_profiles


def _cand(name: str):
    if name.startswith("gen-"):
        request = generated(int(name[4:]))
    else:
        request = read_request(fixtures.request_path(name))
    return build_candidates(request, resolve_profiles(request))


@pytest.mark.parametrize("name", ["paper", "scarce_gpus", "link_bound", "gen-16", "gen-23", "gen-28"])
def test_every_prefill_use_holds_at_its_pools_level_behind_that_pools_own_transfers(name):
    cand = _cand(name)
    uses = cand.uses
    prefill = np.flatnonzero((uses["role"] == "prefill").to_numpy())
    pool = uses["pool"].to_numpy()
    level = cand.pools["rho"].to_numpy(float)[pool]
    # one instance per pool; the FIFO and KV shares among the uses of each pool (headroom.pool_queues)
    rows = np.flatnonzero(np.isin(pool, pool[prefill]))
    admissible = headroom.pooled_rho(cand, rows, np.ones(len(rows), dtype=np.int64))
    held = dict(zip(rows, admissible, strict=True))
    short = [int(i) for i in prefill if held[i] < level[i] - 1e-9]
    assert not short, uses.loc[short, ["w", "device", "batch", "level", "t_kv_ms"]].assign(at=level[short])


def test_a_use_is_raised_only_where_slower_riders_cannot_reach_its_level():
    # gen-16: llama-3.2-3b prefill on the A6000 at batch 4 carries three classes; two send their KV cache
    # into Inferentia2 at a second level (112.7 ms transfers) admitted only at 0.35, so behind them 3b-long-1
    # is admitted at 0.5; above 0.35 they never share its NIC, and behind its own 37.6 ms it holds 0.75
    cand = _cand("gen-16")
    uses = cand.uses
    shape = (
        (uses["device"] == "a6000ada")
        & (uses["role"] == "prefill")
        & (uses["batch"] == 4)
        & (uses["mix"] == 0)
        & (uses["w"] == 1)
    ).to_numpy()
    levels = sorted(set(uses.loc[shape, "rho"].round(6)))
    assert levels == [0.75]
    slow = shape & (uses["t_kv_ms"].to_numpy() > 100)
    assert not slow.any()  # its own slower KV level is not offered at all on this shape
