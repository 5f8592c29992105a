"""Request + profile table -> the candidate tables the formulation is built from (docs/formulation.md).

Everything here is vectorized with pandas merges and numpy: one row per (class, device, tp, batch) latency
point, one row per pool, one row per (class, pool) use. SLO-ineligible uses never become rows.

KV-transfer eligibility is aggregated exactly (docs/formulation.md, "Flow aggregation"): whether class w may
move its KV cache from prefill pool P to a decode pool depends on P and on the decode pool's per-instance
bandwidth NIC_kd * t_d only, and t_kv falls as that bandwidth grows. So decode pools are grouped into
bandwidth *tiers*, and each prefill use gets a *level*: the last tier (in order of falling bandwidth) it can
reach. The reachable sets are nested, which is what lets the solver replace z[w, P, D] by a short chain.
"""

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd

from fleetplan.models.errors import ProfileMissing
from fleetplan.models.plan import PlanRequest
from fleetplan.models.profile import PERCENTILES
from fleetplan.profiler.tables import ProfileTable, latency_at_prompt
from fleetplan.solver import capacity, table_cache
from fleetplan.solver.headroom import (
    CurveBook,
    curve_book,
    flat_headroom,
    headroom_levels,
    pool_queues,
    transfer_ms,
)

ROLES = ("prefill", "decode", "colocated")
ANY_DEVICE = "*"
_GROUP = ["model", "device", "tp", "batch"]


@dataclass(frozen=True)
class Candidates:
    """The index sets of one model instance.

    classes: one row per workload class w (index = w).
    latency: one row per (w, device, tp, batch) with ttft_ms / tbt_ms at the class's percentile (NaN where
        the prompt is outside the profiled range or the percentile is not profiled).
    pools: one row per pool (index = pool id): owner, model, role, device, tp, batch.
    uses: one row per (w, pool) the class may use: rate_rps per instance, latencies, and for decode uses the
        bandwidth tier; for prefill uses one row per (w, pool, key) with its level.
    keys: "*" when no link budget needs flows resolved by decode device, else the decode device names.
    """

    request: PlanRequest
    classes: pd.DataFrame
    latency: pd.DataFrame
    pools: pd.DataFrame
    uses: pd.DataFrame
    devices: pd.DataFrame
    keyed: bool
    link_rho: dict  # (source, target) -> headroom of that link budget; None -> of kv_budget_gbps
    curves: "CurveBook | None" = None  # latency distributions, for the capacity model's predictions
    churn: object | None = None  # formulation.Churn: the plan in force, for a churn-limited re-plan
    # arrays derived from the uses and classes' shapes, built on first use (headroom._use_arrays) and kept
    # for the very `uses` frame they were built from; shared by the copies build_candidates hands out
    memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def class_table(request: PlanRequest) -> pd.DataFrame:
    """Per class: model, owner of its pools, shape, demand, SLO and KV Gbit per request (8 * S_w / 1e9)."""
    specs = request.model_specs()
    pooling = request.options.pooling
    rows = [
        {
            "name": w.name,
            "model": w.model,
            "owner": w.model if pooling == "model" else w.name,
            "prompt_tokens": w.prompt_tokens,
            "output_tokens": w.output_tokens,
            "rate_rps": w.rate_rps,
            "weight": w.weight,
            "percentile": w.slo.percentile,
            "ttft_slo_ms": w.slo.ttft_ms,
            "tbt_slo_ms": w.slo.tbt_ms,
            "kv_gbit": specs[w.model].kv_gbit(w.prompt_tokens),
        }
        for w in request.workloads
    ]
    return pd.DataFrame(rows)


def device_table(request: PlanRequest) -> pd.DataFrame:
    """Per device type: count, capacity (count, or max_count when purchasable), cost, NIC (inf where absent:
    never a bottleneck)."""
    return pd.DataFrame(
        {
            "device": [d.name for d in request.devices],
            "count": [d.count for d in request.devices],
            "capacity": [d.capacity for d in request.devices],
            "cost_per_hour": [d.cost_per_hour for d in request.devices],
            "nic_gbps": [np.inf if d.network_gbps is None else d.network_gbps for d in request.devices],
        }
    )


def check_profiles_cover(request: PlanRequest, table: ProfileTable) -> None:
    """Every class's model has rows in the set, with the percentile its SLO uses."""
    frame = table.frame
    for index, workload in enumerate(request.workloads):
        rows = frame[frame["model"] == workload.model]
        if rows.empty:
            msg = (
                f"no profile rows for model {workload.model!r} in set {table.name!r} "
                f"(it has {sorted(frame['model'].unique())})"
            )
            if table.name == "paper":  # also what a request without `profiles` gets
                msg += "; 'paper' is the default set: name yours in profiles.set or give profiles.rows"
            raise ProfileMissing(msg, field=f"workloads[{index}].model")
        q = workload.slo.percentile
        for metric in ("ttft", "tbt"):
            if rows[f"{metric}_ms_p{q}"].isna().all():
                msg = f"set {table.name!r} has no {metric}_ms_p{q} for model {workload.model!r}"
                raise ProfileMissing(msg, field=f"workloads[{index}].slo.percentile")


def class_points(classes: pd.DataFrame, table: ProfileTable) -> pd.DataFrame:
    """Every profiled (device, tp, batch) of each class's model at its prompt length, all six latency
    columns (`profiler.tables.latency_at_prompt`, the one interpolator shared with the simulator), with the
    class index `w`. Computed once per request: the candidates and the capacity model both read it."""
    queries = classes.reset_index(names="w")[["w", "model", "prompt_tokens", "percentile"]]
    return latency_at_prompt(table.frame, queries)


def interpolate_latency(
    classes: pd.DataFrame, table: ProfileTable, points: pd.DataFrame | None = None
) -> pd.DataFrame:
    """TTFT and TBT of every class on every profiled (device, tp, batch) of its model, at its prompt length
    and at its SLO percentile.

    The one latency-at-prompt interpolator, shared with the simulator (`profiler.tables.latency_at_prompt`):
    linear in prompt_tokens between the two profiled rows bracketing the prompt; NaN outside the profiled
    range (never extrapolated) and NaN where the percentile is missing at one of the bracketing rows.
    `points` (class_points of the same classes) may be passed in when already computed.
    """
    points = class_points(classes, table) if points is None else points
    which = np.searchsorted(PERCENTILES, points["percentile"].to_numpy())
    rows = np.arange(len(points))
    out = points[["w", "device", "tp", "batch"]].copy()
    for metric in ("ttft", "tbt"):
        out[f"{metric}_ms"] = points[[f"{metric}_ms_p{q}" for q in PERCENTILES]].to_numpy(float)[rows, which]
    out["in_range"] = points["in_range"].to_numpy()
    return out


def _usable(latency: pd.DataFrame, request: PlanRequest, devices: pd.DataFrame) -> pd.DataFrame:
    """Latency points on fleet devices where one instance fits in the capacity (owned plus purchasable),
    within the option filters."""
    options = request.options
    merged = latency.merge(devices, on="device")
    keep = merged["capacity"].to_numpy() >= merged["tp"].to_numpy()
    if options.batch_sizes is not None:
        keep &= merged["batch"].isin(options.batch_sizes).to_numpy()
    if options.tp_degrees is not None:
        keep &= merged["tp"].isin(options.tp_degrees).to_numpy()
    keep &= np.isfinite(merged["ttft_ms"].to_numpy()) & np.isfinite(merged["tbt_ms"].to_numpy())
    return merged[keep].reset_index(drop=True)


def role_uses(points: pd.DataFrame, classes: pd.DataFrame, request: PlanRequest) -> pd.DataFrame:
    """SLO-eligible (class, role, device, tp, batch) rows with the per-instance rate of formulation.md.

    rP = b / TTFT, rD = b / (o * TBT), rC = b / (TTFT + (o - 1) * TBT), latencies in seconds.
    """
    c = classes.loc[points["w"]].reset_index(drop=True)
    ttft_s = points["ttft_ms"].to_numpy() / 1e3
    tbt_s = points["tbt_ms"].to_numpy() / 1e3
    batch = points["batch"].to_numpy(float)
    out_tokens = c["output_tokens"].to_numpy(float)
    ttft_ok = points["ttft_ms"].to_numpy() <= c["ttft_slo_ms"].to_numpy()
    tbt_ok = points["tbt_ms"].to_numpy() <= c["tbt_slo_ms"].to_numpy()
    options = request.options
    parts = []
    spec = {
        "colocated": (options.allow_colocated, ttft_ok & tbt_ok, batch / (ttft_s + (out_tokens - 1) * tbt_s)),
        "prefill": (options.allow_disaggregated, ttft_ok, batch / ttft_s),
        "decode": (options.allow_disaggregated, tbt_ok, batch / (out_tokens * tbt_s)),
    }
    for role, (allowed, eligible, rate) in spec.items():
        if not allowed:
            continue
        part = points.loc[eligible, ["w", "device", "tp", "batch", "ttft_ms", "tbt_ms", "nic_gbps"]].copy()
        part["role"] = role
        part["rate_rps"] = rate[eligible]
        parts.append(part)
    uses = pd.concat(parts, ignore_index=True) if parts else points.iloc[:0].assign(role="", rate_rps=0.0)
    uses["owner"] = classes.loc[uses["w"], "owner"].to_numpy()
    uses["model"] = classes.loc[uses["w"], "model"].to_numpy()
    uses["kv_gbit"] = classes.loc[uses["w"], "kv_gbit"].to_numpy()  # KV Gbit per request, for NIC/link rows
    return uses


def flow_tiers(uses: pd.DataFrame, classes: pd.DataFrame, keyed: bool) -> pd.DataFrame:
    """Give decode uses a tier and expand prefill uses to (key, level); drop prefill uses that reach nothing.

    Per (class, key) the tiers are the distinct per-instance decode bandwidths of that class's decode uses,
    in falling order (inf first). A prefill use's level is the last tier it may send to; each prefill use
    comes at up to KV_LEVELS levels (`_kv_levels`): the last tier it reaches within its TTFT SLO, and a
    faster one whose transfer leaves more of the SLO to its queue.
    """
    uses = uses.copy()
    uses["bw_gbps"] = uses["nic_gbps"] * uses["tp"]
    uses["key"] = uses["device"] if keyed else ANY_DEVICE
    decode = uses["role"] == "decode"
    tiers = (
        uses.loc[decode, ["w", "key", "bw_gbps"]]
        .drop_duplicates()
        .sort_values(["w", "key", "bw_gbps"], ascending=[True, True, False], kind="stable")
    )
    tiers["tier"] = tiers.groupby(["w", "key"]).cumcount()
    uses = uses.merge(tiers, on=["w", "key", "bw_gbps"], how="left")
    uses["tier"] = uses["tier"].fillna(-1).astype(np.int64)
    uses.loc[uses["role"] != "decode", "tier"] = -1

    prefill = uses[uses["role"] == "prefill"].drop(columns=["key", "tier"])
    pairs = prefill.merge(tiers.rename(columns={"bw_gbps": "decode_bw"}), on="w")
    kv = pairs["kv_gbit"].to_numpy()
    slo = classes.loc[pairs["w"], "ttft_slo_ms"].to_numpy()
    t_kv = transfer_ms(kv, pairs["bw_gbps"].to_numpy(), pairs["decode_bw"].to_numpy())
    reaches = pairs["ttft_ms"].to_numpy() + t_kv <= slo * (1 + 1e-12)
    reach = pairs[reaches].assign(t_kv_ms=t_kv[reaches])
    # one row per tier reached: at level l the use may send to tiers 0..l, and its transfer is the slowest
    # of those (tier l's); a faster level leaves more TTFT for the prefill queue (headroom_levels keeps, per
    # headroom level of a pool, the slowest level admitted there)
    levels = reach[["w", "device", "tp", "batch", "key", "tier", "t_kv_ms", "decode_bw"]]
    levels = _kv_levels(levels)
    prefill = prefill.merge(levels, on=["w", "device", "tp", "batch"]).rename(columns={"tier": "level"})
    prefill["tier"] = -1
    others = uses[uses["role"] != "prefill"].assign(level=-1, t_kv_ms=0.0, decode_bw=np.inf)
    return pd.concat([others, prefill], ignore_index=True)


# A prefill use is offered at its slowest tier and at the slowest of those whose transfer is at least
# KV_LEVEL_STEP times shorter: KV_LEVELS levels. Each level is one more capacity-model evaluation of the use,
# and the synthetic M and L instances reach up to 10 and 13 distinct transfer times per use (every level:
# candidates 2.4x slower on M, 3.1x on L; three levels at a step of 2: 1.4x and 1.6x; two: 1.1-1.2x and
# 1.0-1.1x, bench/README.md "Session 19").
KV_LEVEL_STEP = 2.0
KV_LEVELS = 2


def _kv_levels(levels: pd.DataFrame) -> pd.DataFrame:
    """Of the tiers each prefill use reaches (rows of `levels`), the ones it is offered at: per bucket of
    transfer times KV_LEVEL_STEP^k times shorter than its slowest (k = 0..KV_LEVELS - 1, the last bucket
    open-ended, a tier without a NIC in it), the bucket's slowest tier, which reaches the most."""
    use = ["w", "device", "tp", "batch", "key"]
    levels = levels.sort_values("tier", kind="stable")
    slowest = levels.groupby(use)["t_kv_ms"].transform("last").to_numpy(float)
    t_kv = levels["t_kv_ms"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(t_kv > 0, slowest / t_kv, np.where(slowest > 0, np.inf, 1.0))
    bucket = np.minimum(
        np.floor(np.log(np.maximum(ratio, 1.0)) / np.log(KV_LEVEL_STEP) + 1e-9), KV_LEVELS - 1
    )
    return levels.assign(bucket=bucket).drop_duplicates([*use, "bucket"], keep="last").drop(columns="bucket")


def attach_pools(uses: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Number the pools (owner, role, device, tp, batch, mix, rho) that at least one use needs."""
    key = ["owner", "role", "device", "tp", "batch", "mix", "rho"]
    columns = [*key, "model", "nic_rho"]
    pools = uses[columns].drop_duplicates(key).sort_values(key, kind="stable").reset_index(drop=True)
    pools.index.name = "pool"
    uses = uses.merge(pools.reset_index()[[*key, "pool"]], on=key)
    return pools, uses


def drop_dominated_pools(pools: pd.DataFrame, uses: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Drop pools another pool of the same (owner, role, device, tp) makes useless, and renumber.

    Pool A dominates pool B when every (class, key) use of B is also a use of A with at least B's
    admissible per-instance rate (rate x headroom), NIC headroom and (prefill) level. Both use the same
    devices, cost and NIC per instance, so any plan with B instances can run them as A instances instead:
    dropping B loses no optimum. Of pools that dominate each other, the lowest-numbered stays.
    """
    group = ["owner", "role", "device", "tp"]
    left = uses[[*group, "w", "key", "pool", "level"]].assign(
        admissible=uses["rate_rps"] * uses["rho"], nic_rho=uses["nic_rho"], use=np.arange(len(uses))
    )
    pairs = left.merge(left, on=[*group, "w", "key"], suffixes=("_a", "_b"))
    pairs = pairs[pairs["pool_a"] != pairs["pool_b"]]
    covers = (
        (pairs["admissible_a"] >= pairs["admissible_b"] * (1 - 1e-12))
        & (pairs["level_a"] >= pairs["level_b"])
        & (pairs["nic_rho_a"] >= pairs["nic_rho_b"] * (1 - 1e-12))
    )
    # a use of B counts once however many uses of A cover it
    covered_uses = pairs[covers].drop_duplicates(["pool_a", "use_b"])
    covered = covered_uses.groupby(["pool_a", "pool_b"]).size().rename("covered").reset_index()
    n_uses = uses.groupby("pool").size()
    dominates = covered[covered["covered"].to_numpy() == n_uses.loc[covered["pool_b"]].to_numpy()]
    pair_set = set(zip(dominates["pool_a"], dominates["pool_b"], strict=True))
    mutual = np.array([(b, a) in pair_set for a, b in pair_set], dtype=bool)
    a_idx = np.array([a for a, _ in pair_set], dtype=np.int64)
    b_idx = np.array([b for _, b in pair_set], dtype=np.int64)
    drop = b_idx[~mutual | (a_idx < b_idx)] if len(pair_set) else np.zeros(0, np.int64)
    if not len(drop):
        return pools, uses
    return keep_pools(pools, uses, ~pools.index.isin(drop))


def keep_pools(
    pools: pd.DataFrame, uses: pd.DataFrame, keep: np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pools where `keep` holds, renumbered 0..n-1, and the uses of those pools."""
    kept = pools[keep].reset_index(drop=True)
    kept.index.name = "pool"
    renumber = np.full(len(pools), -1)
    renumber[np.flatnonzero(keep)] = np.arange(len(kept))
    uses = uses[keep[uses["pool"].to_numpy()]].copy()
    uses["pool"] = renumber[uses["pool"].to_numpy()]
    return kept, uses.reset_index(drop=True)


# What the candidate tables depend on besides the profile set: every request field except the classes' demand
# (rate_rps, weight: read only by the formulation, from `classes`) and the options below that are not listed.
CANDIDATE_OPTIONS = (
    "capacity_model",
    "max_utilization",
    "pooling",
    "batch_sizes",
    "tp_degrees",
    "allow_colocated",
    "allow_disaggregated",
)
CACHE_SIZE = 64  # candidate sets kept per process (an autoscaler loop or a what-if sweep re-plans one fleet)
_cache: "OrderedDict[bytes, Candidates]" = OrderedDict()
_cache_lock = threading.Lock()


def build_candidates(request: PlanRequest, table: ProfileTable) -> Candidates:
    """All candidate tables for one request: the only place that reads the profile table.

    The tables of the last CACHE_SIZE (profile set, fleet, classes, options) are kept: a request that
    differs from one of them only in demand, weights, budget, objective or solver options reuses them (the
    capacity model is most of the time of a plan) with its own `classes` demand and `request`. A process
    that has not built them reads them from the disk cache when one is configured (`table_cache`), and
    waits for another process that is building them."""
    key = candidates_key(request, table)
    hit = _cached(key)
    if hit is None:
        with table_cache.building(key):  # another process building the same tables: wait, then read them
            hit = _cached(key)
            if hit is None:
                hit = table_cache.load(key)
            if hit is None:
                hit = _build_candidates(request, table)
                # kept on disk without the request (each hit takes its own) or derived arrays (rebuilt on use)
                table_cache.save(key, dataclasses.replace(hit, request=None, memo={}))
            with _cache_lock:
                _cache[key] = hit
                while len(_cache) > CACHE_SIZE:
                    _cache.popitem(last=False)
    demand = class_table(request)[["rate_rps", "weight"]]
    return dataclasses.replace(hit, request=request, classes=hit.classes.assign(**demand))


def _cached(key: bytes) -> Candidates | None:
    """The tables kept in this process's memory under `key` (now the most recently used), or None."""
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    return hit


def candidates_key(request: PlanRequest, table: ProfileTable) -> bytes:
    """What `build_candidates` reads: the profile set's hash, the fleet, the classes without their demand,
    and CANDIDATE_OPTIONS."""
    workloads = [msgspec.structs.replace(w, rate_rps=1.0, weight=1.0) for w in request.workloads]
    options = {name: getattr(request.options, name) for name in CANDIDATE_OPTIONS}
    parts = (table.name, table.sha256, request.devices, request.links, request.kv_budget_gbps)
    return msgspec.json.encode((*parts, request.model_specs(), workloads, options))


def clear_candidates_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _build_candidates(request: PlanRequest, table: ProfileTable) -> Candidates:
    classes = class_table(request)
    devices = device_table(request)
    at_prompt = class_points(classes, table)
    latency = interpolate_latency(classes, table, at_prompt)
    points = _usable(latency, request, devices)
    uses = role_uses(points, classes, request)
    keyed = bool(request.links) or request.kv_budget_gbps is not None
    uses = flow_tiers(uses, classes, keyed)
    uses["kv_links"] = kv_links(uses, request)
    # A decode use nobody's prefill can reach, or a prefill use with no decode tier, carries no flow.
    uses = _drop_unreachable(uses)
    book = curve_book(at_prompt)
    uses = headroom_levels(uses, classes, request, book)
    uses, link_rho = link_headroom(uses, request)
    uses = _renumber_tiers(_drop_unreachable(uses))
    pools, uses = attach_pools(uses)
    pools, uses = drop_dominated_pools(pools, uses)
    uses = uses.sort_values(["pool", "w", "key", "level"], kind="stable").reset_index(drop=True)
    return Candidates(request, classes, latency, pools, uses, devices, keyed, link_rho, book)


def kv_links(uses: pd.DataFrame, request: PlanRequest) -> np.ndarray:
    """Per use, how many link queues its KV transfers cross, as the simulator books them (simulator/kv.py):
    a prefill use's (source, target) link budget and the fleet's `kv_budget_gbps` for a move between
    device types; a decode use takes the most among its class's prefill uses that send to its device (the
    same key); 0 for colocated uses and wherever nothing is budgeted (an unkeyed set)."""
    source, target = uses["device"].to_numpy(), uses["key"].to_numpy()
    prefill = (uses["role"] == "prefill").to_numpy() & (target != ANY_DEVICE)
    budgeted = {(link.source, link.target) for link in request.links if link.gbps > 0}
    on_link = np.array([(s, t) in budgeted for s, t in zip(source, target, strict=True)], dtype=bool)
    shared = request.kv_budget_gbps is not None and request.kv_budget_gbps > 0
    crossing = np.where(prefill, on_link.astype(float) + (shared & (source != target)), 0.0)
    senders = uses.assign(links=crossing)[prefill].groupby(["w", "key"])["links"].max()
    received = pd.MultiIndex.from_arrays([uses["w"], uses["key"]]).map(senders).to_numpy(float)
    decode = (uses["role"] == "decode").to_numpy()
    return np.where(decode, np.nan_to_num(received), crossing)


def _drop_unreachable(uses: pd.DataFrame) -> pd.DataFrame:
    """Remove decode uses below every prefill level of their (class, key): no KV can ever arrive there."""
    prefill = uses[uses["role"] == "prefill"]
    top = prefill.groupby(["w", "key"])["level"].max().rename("max_level").reset_index()
    decode = uses["role"] == "decode"
    merged = uses[decode].merge(top, on=["w", "key"], how="left")
    keep_decode = merged["tier"].to_numpy() <= merged["max_level"].fillna(-1).to_numpy()
    return pd.concat([uses[~decode], uses[decode][keep_decode]], ignore_index=True)


LINK_FLOOR = 0.3  # a prefill use that could send over a link budget only below this headroom does not use it


def link_headroom(uses: pd.DataFrame, request: PlanRequest) -> tuple[pd.DataFrame, dict]:
    """Headroom of each link budget (and of kv_budget_gbps, key None), and the uses that may cross them.

    flat: max_utilization. queueing: the tightest link_cap of the prefill uses that send over it; a use
    whose own cap is below LINK_FLOOR would throttle everyone's budget, so it may not send there."""
    options = request.options
    budgets = {(link.source, link.target): link.gbps for link in request.links}
    if request.kv_budget_gbps is not None:
        budgets[None] = request.kv_budget_gbps
    if options.capacity_model == "flat":
        rho = flat_headroom(options)
        return uses, dict.fromkeys(budgets, rho)
    out, dropped = {}, np.zeros(len(uses), dtype=bool)
    percentile = np.array([w.slo.percentile for w in request.workloads], dtype=float)
    prefill = (uses["role"] == "prefill").to_numpy()
    source, target = uses["device"].to_numpy(), uses["key"].to_numpy()
    # each sender's part of its KV reserve, shared with its two NICs and any other budget on its way
    part = (uses["kv_slack_ms"] / (capacity.NIC_SERVERS + uses["kv_links"])).to_numpy(float)
    for key, gbps in budgets.items():
        if key is None:
            crossing = prefill & (source != target) & (target != ANY_DEVICE)
        else:
            crossing = prefill & (source == key[0]) & (target == key[1])
        # a FIFO link: every sender's wait is set by the longest transfer that may cross it
        hold = 1e3 * uses["kv_gbit"].to_numpy(float)[crossing] / max(gbps, 1e-9)
        allowance = part[crossing]
        epsilon = capacity.TAIL_MARGIN * (1.0 - percentile[uses["w"].to_numpy()[crossing]] / 100.0)
        kept = np.ones(len(hold), dtype=bool)
        for _ in range(2):  # once more without the senders the longest transfer pushed out
            caps = capacity.link_cap(np.full(len(hold), hold[kept].max(initial=0.0)), allowance, epsilon)
            if options.max_utilization is not None:
                caps = np.minimum(caps, options.max_utilization)
            kept = kept & (caps >= LINK_FLOOR)
        dropped[np.flatnonzero(crossing)[~kept]] = True
        out[key] = float(caps[kept].min()) if kept.any() and gbps > 0 else 1.0
    return uses[~dropped].reset_index(drop=True), out


def predicted_latency(
    cand: Candidates, rows: np.ndarray, rate: np.ndarray, servers: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TBT) at the SLO percentile of the uses at positions `rows` of cand.uses when one instance
    takes `rate` requests/s of each (capacity.predict: the same queueing model that set the admissible
    loads, at the class's percentile itself rather than the margin it was planned at), its pool running
    `servers` instances behind join-shortest-queue and queueing these uses only (headroom.pool_queues)."""
    if len(rows) == 0 or cand.curves is None:
        return np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    t, curves = pool_queues(cand, rows, servers)
    # reported at the class's own percentile (planned at TAIL_MARGIN of its tail probability)
    t = dataclasses.replace(t, epsilon=t.epsilon / capacity.TAIL_MARGIN)
    return capacity.predict(t, curves, rate)


def _renumber_tiers(uses: pd.DataFrame) -> pd.DataFrame:
    """Close the gaps that dropped decode uses leave in the tiers of each (class, key): tiers become
    0..J-1 again, and a prefill level becomes the last remaining tier at or below it (nested sets kept)."""
    decode = uses["role"] == "decode"
    tiers = (
        uses.loc[decode, ["w", "key", "tier"]]
        .drop_duplicates()
        .sort_values(["w", "key", "tier"], kind="stable")
    )
    tiers["new"] = tiers.groupby(["w", "key"]).cumcount()
    uses = uses.copy()
    mapped = uses[decode].merge(tiers, on=["w", "key", "tier"], how="left")["new"].to_numpy()
    uses.loc[decode, "tier"] = mapped
    prefill = uses["role"] == "prefill"
    left = uses.loc[prefill, ["w", "key", "level"]].reset_index()
    left = left.sort_values("level", kind="stable")
    right = tiers.rename(columns={"tier": "level_old"}).sort_values("level_old", kind="stable")
    merged = pd.merge_asof(
        left, right, left_on="level", right_on="level_old", by=["w", "key"], direction="backward"
    )
    new_level = pd.Series(merged["new"].to_numpy(), index=merged["index"].to_numpy())
    uses.loc[prefill, "level"] = new_level.reindex(uses.index[prefill]).to_numpy()
    keep = ~prefill | uses["level"].notna()
    uses = uses[keep].copy()
    uses["level"] = uses["level"].astype(np.int64)
    uses["tier"] = uses["tier"].astype(np.int64)
    return uses.reset_index(drop=True)
