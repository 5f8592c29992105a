"""Admissible loads: the capacity model (fleetplan/solver/capacity.py) applied to the candidate uses.

headroom_levels gives every (class, pool) use its admissible utilization `rho` and NIC cap, offers pool
shapes as mixes of their shorter classes (mix_groups) and splits each into headroom levels
(docs/formulation.md, "Capacity model", "Mixes", "Headroom levels"). The flat model (v1) gives every use
`max_utilization`. candidates.py calls it between the flow tiers and the pools.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pandas as pd

from fleetplan.models.plan import Options, PlanRequest
from fleetplan.models.profile import PERCENTILES
from fleetplan.solver import capacity

if TYPE_CHECKING:
    from fleetplan.solver.candidates import Candidates

FLAT_DEFAULT = 0.5  # flat headroom when max_utilization is not given (the v1 default, headroom sweep)


def flat_headroom(options) -> float:
    """The flat model's one headroom: max_utilization, or FLAT_DEFAULT when it is not given."""
    return options.max_utilization if options.max_utilization is not None else FLAT_DEFAULT


def transfer_ms(kv_gbit: np.ndarray, prefill_bw: np.ndarray, decode_bw: np.ndarray) -> np.ndarray:
    """t_kv in ms: 8 * S_w / (1e9 * min(NIC_kp * t_p, NIC_kd * t_d)); 0 where either NIC is absent (inf)."""
    both = np.isfinite(prefill_bw) & np.isfinite(decode_bw)
    bandwidth = np.where(both, np.minimum(prefill_bw, decode_bw), 1.0)
    return np.where(both, 1e3 * kv_gbit / bandwidth, 0.0)


LEVEL_STEP = 1.0 / capacity.LEVELS  # admissible utilizations lie on this grid: few distinct pool levels


@dataclass(frozen=True)
class CurveBook:
    """p50/p90/p99 of TTFT and TBT of every class at its prompt over the profiled batches of each (device,
    tp): group g = one (w, device, tp), `batches` (G, K) ascending padded with +inf, `ttft`/`tbt` (G, K, 3).
    Built once per request (`curve_book`); `curves(uses)` gives the capacity model's per-use view."""

    groups: pd.DataFrame  # w, device, tp, g
    batches: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray

    def curves(self, uses: pd.DataFrame) -> capacity.Curves:
        keys = ["w", "device", "tp"]
        of_use = uses[keys].merge(self.groups, on=keys, how="left")["g"].to_numpy()
        return capacity.Curves(self.batches[of_use], self.ttft[of_use], self.tbt[of_use])


def curve_book(points: pd.DataFrame) -> CurveBook:
    """The CurveBook of `class_points`: the service-time distributions the capacity model integrates."""
    columns = {m: [f"{m}_ms_p{q}" for q in PERCENTILES] for m in ("ttft", "tbt")}
    frame = points[np.isfinite(points[columns["ttft"]].to_numpy(float)).any(axis=1)]
    frame = frame.sort_values(["w", "device", "tp", "batch"], kind="stable")
    k = frame.groupby(["w", "device", "tp"]).cumcount().to_numpy()
    groups = frame[["w", "device", "tp"]].drop_duplicates().reset_index(drop=True)
    groups["g"] = np.arange(len(groups))
    g = frame[["w", "device", "tp"]].merge(groups, on=["w", "device", "tp"])["g"].to_numpy()
    width = int(k.max()) + 1 if len(frame) else 1
    batches = np.full((len(groups), width), np.inf)
    batches[g, k] = frame["batch"].to_numpy(float)
    values = {m: np.full((len(groups), width, 3), np.nan) for m in columns}
    for m, names in columns.items():
        values[m][g, k] = frame[names].to_numpy(float)
    return CurveBook(groups, batches, values["ttft"], values["tbt"])


def use_table(uses: pd.DataFrame, classes: pd.DataFrame) -> capacity.UseTable:
    """The capacity model's view of every use. A decode use's transfer is its class's slowest: from the
    slowest prefill NIC that class may use; its KV reserve is the smallest of its class's prefill uses."""
    c = classes.loc[uses["w"]].reset_index(drop=True)
    # plan each class at a fraction of its tail probability: the promise is judged on finite windows
    epsilon = capacity.TAIL_MARGIN * (1.0 - c["percentile"].to_numpy(float) / 100.0)
    prefill = uses["role"].to_numpy() == "prefill"
    own = uses["bw_gbps"].to_numpy(float)
    slowest_source = uses[prefill].groupby("w")["bw_gbps"].min()
    source_bw = uses["w"].map(slowest_source).to_numpy(float)
    min_bw = np.where(prefill, np.minimum(own, uses["decode_bw"].to_numpy(float)), np.minimum(own, source_bw))
    t_kv = np.where(
        prefill, uses["t_kv_ms"].to_numpy(float), transfer_ms(c["kv_gbit"].to_numpy(), own, min_bw)
    )
    t_kv = np.where(uses["role"].to_numpy() == "colocated", 0.0, np.nan_to_num(t_kv))
    return capacity.UseTable(
        w=uses["w"].to_numpy(np.int64),
        role=uses["role"].to_numpy(),
        batch=uses["batch"].to_numpy(float),
        rate=uses["rate_rps"].to_numpy(float),
        ttft_q=uses["ttft_ms"].to_numpy(float),
        tbt_q=uses["tbt_ms"].to_numpy(float),
        ttft_slo=c["ttft_slo_ms"].to_numpy(float),
        tbt_slo=c["tbt_slo_ms"].to_numpy(float),
        epsilon=epsilon,
        steps=c["output_tokens"].to_numpy(float) - 1.0,
        t_kv=t_kv,
        own_bw=own,
        min_bw=min_bw,
        kv_slack_ms=np.zeros(len(uses)),
        share=_share(uses, c),
        kv_share=_kv_share(uses, t_kv),
        kv_links=uses["kv_links"].to_numpy(float),
    )


def _share(uses: pd.DataFrame, c: pd.DataFrame) -> np.ndarray:
    """Per use: the longest service (prefill: TTFT_q) or slot holding time (decode: steps x TBT_q;
    colocated: TTFT_q + steps x TBT_q) among the classes that may share its pool (its shape and mix), over
    its own."""
    own = _holding_ms(uses, c)
    shape = _shape(uses)
    longest = uses[shape].assign(own=own).groupby(shape)["own"].transform("max").to_numpy()
    return np.maximum(longest / np.maximum(own, 1e-9), 1.0)


def _holding_ms(uses: pd.DataFrame, c: pd.DataFrame) -> np.ndarray:
    """How long one request of each use holds what a class behind it waits for: its prefill (prefill), its
    decode slot (decode: steps x TBT_q) or both (colocated), at the full-batch percentile (ms)."""
    steps = np.maximum(c["output_tokens"].to_numpy(float) - 1.0, 1.0)
    ttft, tbt = uses["ttft_ms"].to_numpy(float), uses["tbt_ms"].to_numpy(float)
    role = uses["role"].to_numpy()
    return np.where(role == "prefill", ttft, np.where(role == "decode", 0.0, ttft) + steps * tbt)


def _shape(uses: pd.DataFrame) -> list[str]:
    """The columns of a pool's shape: which uses share one queue (with `mix` once mix_groups has run)."""
    shape = ["owner", "role", "device", "tp", "batch"]
    return [*shape, "mix"] if "mix" in uses.columns else shape


def _kv_share(uses: pd.DataFrame, t_kv: np.ndarray) -> np.ndarray:
    """Per use whose KV moves: the longest transfer that may share its NIC (a FIFO server), over its own. A
    short prompt's transfer waits behind a long one's. What may share it: its own transfer and those of
    every other (class, key) that may share its pool shape, at the slowest of their levels. A pool carries
    a class's flows of one key at one KV level (`_slowest_level`; docs/formulation.md, "KV levels"), so
    the transfers of that (class, key)'s other level never share the NIC with this one; a class's flows
    of another key (a link budget resolves flows by decode device) may."""
    shape = _shape(uses)
    group = uses.groupby(shape, sort=False).ngroup().to_numpy()
    rider = uses.groupby(["w", "key"] if "key" in uses.columns else ["w"], sort=False).ngroup().to_numpy()
    longest = _longest_of_others(group, rider, t_kv)
    return np.where(t_kv > 0, np.maximum(np.maximum(longest, t_kv) / np.maximum(t_kv, 1e-9), 1.0), 1.0)


def _longest_of_others(group: np.ndarray, rider: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per row: the largest `value` among the rows of its group of another `rider` (0 if none)."""
    if len(value) == 0:
        return np.zeros(0)
    frame = pd.DataFrame({"g": group, "r": rider, "v": value})
    per_rider = frame.groupby(["g", "r"], sort=False)["v"].max().reset_index()
    ranked = per_rider.sort_values(["g", "v"], ascending=[True, False], kind="stable")
    g, r, v = (ranked[name].to_numpy() for name in ("g", "r", "v"))
    n_groups = int(group.max()) + 1
    top_rider, top, runner_up = np.full(n_groups, -1), np.zeros(n_groups), np.zeros(n_groups)
    head = np.r_[True, g[1:] != g[:-1]]  # each group's largest rider maximum comes first
    top_rider[g[head]], top[g[head]] = r[head], v[head]
    second = np.r_[False, head[:-1]] & ~head  # the next row within its group: the second largest
    runner_up[g[second]] = v[second]
    return np.where(rider == top_rider[group], runner_up[group], top[group])


def headroom_levels(
    uses: pd.DataFrame, classes: pd.DataFrame, request: PlanRequest, book: "CurveBook"
) -> pd.DataFrame:
    """Give every use its admissible utilization `rho` and NIC cap `nic_rho`, and expand pools into levels.

    flat: rho = max_utilization everywhere (NICs too). queueing: per use from capacity.py, capped by
    max_utilization when given, rounded down to LEVEL_STEP for its level (a decode level then runs at the
    least refined load among its classes, capacity.REFINE). A pool shared by classes runs at one load,
    so a pool of level L may carry a class only if that class's rho >= L: every use is repeated in each
    level of its pool up to its own rho, and the pool identity includes the level.
    """
    options = request.options
    if options.capacity_model == "flat":
        rho = flat_headroom(options)
        # v1: NIC rows not derated, one mix per shape, each prefill use at its slowest KV level only (the
        # one that reaches the most; without queues a faster level admits no more)
        uses = _slowest_level(uses, ["owner", "role", "device", "tp", "batch"])
        return uses.assign(rho=rho, nic_rho=1.0, kv_slack_ms=0.0, nic_u=0.0, mix=0).reset_index(drop=True)
    uses = mix_groups(uses, classes)
    uses = admissible_loads(uses, classes, book, options, survival=True)
    # once more over the uses that remain: a class that can never use a pool shape (its SLO is out of
    # reach there) no longer lengthens the FIFO waits (share, kv_share) of those that can
    uses = useful_levels(useful_mixes(admissible_loads(uses, classes, book, options)))
    base = ["owner", "role", "device", "tp", "batch", "mix"]
    levels = uses[[*base, "use_rho"]].drop_duplicates().rename(columns={"use_rho": "rho"})
    expanded = uses.merge(levels, on=base)
    expanded = expanded[expanded["use_rho"] >= expanded["rho"] - 1e-9]
    expanded = _slowest_level(expanded, [*base, "rho"])
    # a level's headroom and NIC cap are the tightest of the classes it carries: its headroom is the least
    # admissible utilization (use_fine) among them, at or above the level's grid point (above it only for
    # decode levels, whose loads capacity.py refines below the grid)
    level = expanded.groupby([*base, "rho"])
    expanded["nic_rho"] = _pool_nic_cap(expanded, [*base, "rho"])
    expanded["rho"] = level["use_fine"].transform("min")
    return expanded.drop(columns=["use_rho", "use_fine", "nic_speed"]).reset_index(drop=True)


def _slowest_level(uses: pd.DataFrame, pool: list[str]) -> pd.DataFrame:
    """Per pool and (class, key), the prefill use of the highest level (the slowest decode tier it may send
    to) among those admitted there: one prefill row per (class, pool, key), as the flow chain needs."""
    return uses[(uses["role"] != "prefill").to_numpy() | _at_level(uses, pool, "max")]


def _at_level(uses: pd.DataFrame, keys: list[str], how: str) -> np.ndarray:
    """Per row: a prefill use at the highest (`how` "max": slowest) or lowest ("min") KV level among the
    prefill rows of its (keys, class, key); False for the other roles."""
    prefill = (uses["role"] == "prefill").to_numpy()
    out = np.zeros(len(uses), dtype=bool)
    p = uses[prefill]
    out[prefill] = p["level"].to_numpy() == p.groupby([*keys, "w", "key"])["level"].transform(how).to_numpy()
    return out


def _pool_nic_cap(uses: pd.DataFrame, pool: list[str]) -> np.ndarray:
    """A pool's NIC cap as traffic over its NIC's bandwidth: the least time cap among the classes it carries
    times the slowest speed they send at (`capacity.nic_speed`). The NIC row bounds traffic, the caps bound
    the NIC's time, and a Gbit of the slowest class holds the NIC longest; the least of cap x speed would
    let a slow class fill the time a fast class's cap was sized for."""
    time_cap = uses["nic_rho"] / np.maximum(uses["nic_speed"], 1e-12)
    grouped = uses.assign(time_cap=time_cap).groupby(pool)
    return (grouped["time_cap"].transform("min") * grouped["nic_speed"].transform("min")).to_numpy()


# A pool shape is also offered as pools that carry only its shorter classes (mix_groups): at most this many
# mixes per shape, cut where the next longer class holds the pool or its NIC at least MIX_RATIO times longer.
MAX_MIXES = 3
MIX_RATIO = 1.25
MIX_GAIN = 1.5  # useful_mixes
KV_LEVEL_GAIN = 1.1  # useful_levels


def mix_groups(uses: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """Repeat each use in every *mix* of its pool shape that admits it, so short classes need not queue
    behind long ones.

    A FIFO wait is the residual of whoever is ahead, so a class sharing a pool with a longer one is admitted
    at `share` = (longest holding time in the pool) / (its own), and its KV transfers wait behind the
    longest transfer through the same NIC (`kv_share`): a 128-token class beside a 1024-token one may get
    no load at all. Mix 0 of a shape admits every class (the pool as before). Each further mix admits the
    classes at or below a cut in one of the two: the holding time (`_holding_ms`) or the KV size (where the
    KV moves); the cuts are the largest jumps (by ratio, at least MIX_RATIO) between the sorted values of
    the shape's classes, at most MAX_MIXES - 1 per shape. Each mix is its own group of instances
    (Pool.group), so the waits of the classes it admits really are bounded by its longest one. A mix that
    admits nothing better than another pool is dropped again by drop_dominated_pools."""
    shape = ["owner", "role", "device", "tp", "batch"]
    uses = uses.reset_index(drop=True)
    c = classes.loc[uses["w"]].reset_index(drop=True)
    values = {
        "own": _holding_ms(uses, c),
        "kv": np.where(uses["role"].to_numpy() == "colocated", 0.0, uses["kv_gbit"].to_numpy(float)),
    }
    cuts = pd.concat([_cuts(uses[shape].assign(value=v), shape).assign(dim=d) for d, v in values.items()])
    cuts = cuts.sort_values([*shape, "jump"], ascending=False, kind="stable")
    cuts = cuts[cuts.groupby(shape).cumcount() < MAX_MIXES - 1]
    cuts["mix"] = cuts.groupby(shape).cumcount() + 1
    parts = [uses.assign(mix=0)]
    for dim, value in values.items():
        mine = cuts[cuts["dim"] == dim][[*shape, "value", "mix"]].rename(columns={"value": "cut"})
        joined = uses.assign(value=value).merge(mine, on=shape)
        parts.append(joined[joined["value"] <= joined["cut"] * (1 + 1e-9)].drop(columns=["value", "cut"]))
    return pd.concat(parts, ignore_index=True)


def useful_levels(uses: pd.DataFrame, gain: float = KV_LEVEL_GAIN) -> pd.DataFrame:
    """Keep a prefill use's faster KV level (`candidates._kv_levels`) only where it is admitted at `gain`
    times the load of the use's slowest admitted level or more: a faster level reaches fewer decoders and
    is one more pool level of its shape for the MILP where its load differs (paper.json: 105 pools with
    every admitted level, 98 at 1.1; the 100-point budget sweep's MIPs 15.5 -> 11.0 s of solves, every
    point's SLO RPS the same or higher; the fidelity requests unchanged)."""
    prefill = (uses["role"] == "prefill").to_numpy()
    p = uses[prefill]
    slowest = _at_level(uses, _shape(uses), "max")[prefill]
    per_use = [p[k] for k in [*_shape(uses), "w", "key"]]
    slow_rho = p["use_rho"].where(slowest).groupby(per_use).transform("max").to_numpy(float)
    keep = np.ones(len(uses), dtype=bool)
    keep[prefill] = slowest | (p["use_rho"].to_numpy(float) >= gain * slow_rho - 1e-12)
    return uses[keep].reset_index(drop=True)


def useful_mixes(uses: pd.DataFrame) -> pd.DataFrame:
    """Keep a mix (> 0) of a shape only where it admits some class at MIX_GAIN times its admissible load in
    mix 0 or more (or admits a class mix 0 cannot take): every further group of a shape is more integer
    columns and near-twin pools for the MILP (on paper.json three mixes took the goodput MIP from 0.3 s to
    over 10 s for +2% SLO RPS)."""
    shape = ["owner", "role", "device", "tp", "batch"]
    base = uses.loc[uses["mix"] == 0, [*shape, "w", "key", "level", "use_rho"]].rename(
        columns={"use_rho": "rho0"}
    )
    others = uses.reset_index().merge(base, on=[*shape, "w", "key", "level"], how="left")
    rho0 = others["rho0"].to_numpy(float)
    with np.errstate(invalid="ignore"):
        gain = np.isnan(rho0) | (others["use_rho"].to_numpy() >= MIX_GAIN * rho0)
    others = others.assign(gain=gain & (others["mix"].to_numpy() > 0))
    useful = others.groupby([*shape, "mix"])["gain"].transform("any").to_numpy()
    keep = np.zeros(len(uses), dtype=bool)
    keep[others["index"].to_numpy()] = useful | (others["mix"].to_numpy() == 0)
    return uses[keep].reset_index(drop=True)


def _cuts(frame: pd.DataFrame, shape: list[str]) -> pd.DataFrame:
    """Per shape, the values below a jump of at least MIX_RATIO to the next larger value (`jump`: ratio)."""
    ladder = frame[frame["value"] > 0].drop_duplicates().sort_values([*shape, "value"], kind="stable")
    nxt = ladder.groupby(shape)["value"].shift(-1)
    ladder = ladder.assign(jump=(nxt / ladder["value"]).to_numpy())
    return ladder[ladder["jump"] >= MIX_RATIO]


def admissible_loads(
    uses: pd.DataFrame, classes: pd.DataFrame, book: "CurveBook", options: Options, survival: bool = False
) -> pd.DataFrame:
    """The queueing model's admissible utilization (`use_rho`, on the LEVEL_STEP grid; `use_fine`, a decode
    use's to 1 / 160 of it, capacity.REFINE), NIC cap and KV
    reserve of every use; uses below RHO_MIN or whose NICs would throttle their pool are dropped.

    A prefill use comes at its levels (flow_tiers, `candidates._kv_levels`: the slowest decode tier its KV
    can reach within the SLO, and a faster one), its KV queues sized by the level's slowest transfer. Where
    none of its levels admitted anything, its fastest level is tried once more at the shortest transfer it
    has (`_fastest_tier`): a class whose long transfers to slow decoders leave no TTFT room may still
    prefill for the fast ones.

    `survival`: only which uses are admitted at all (and their tiers), each tried at the lowest level
    (`capacity.bisect_rate`'s probe: one evaluation instead of a search); use_rho and use_fine are then that
    level or 0. headroom_levels' first pass, which only decides which uses the FIFO shares count."""
    uses = _admit(uses.reset_index(drop=True), classes, book, options, survival=survival)
    while (lowered := _fastest_tier(uses)) is not None:
        uses, moved = lowered
        uses = _admit(uses, classes, book, options, moved, survival)
    return uses[uses.pop("admitted").to_numpy()].reset_index(drop=True)


ADMITTED = ["kv_slack_ms", "nic_u", "use_rho", "use_fine", "nic_rho", "nic_speed", "admitted"]


def _admit(
    uses: pd.DataFrame,
    classes: pd.DataFrame,
    book: "CurveBook",
    options: Options,
    rows: np.ndarray | None = None,
    survival: bool = False,
) -> pd.DataFrame:
    """`uses` with use_rho, use_fine, nic_rho, nic_u, kv_slack_ms and `admitted` (use_rho >= RHO_MIN, NICs
    usable); `survival` as admissible_loads'.

    `rows`: evaluate only those (prefill uses moved to a faster tier; the others keep their values). Their
    FIFO shares are taken over every use; a decode use's KV reserve (its class's smallest prefill reserve)
    is not raised by a prefill use that moved, nor another use's kv_share lowered: both err low."""
    table, curves = use_table(uses, classes), book.curves(uses)
    if rows is not None:
        table, curves = capacity.take_rows(table, rows), capacity.take_rows(curves, rows)
    t = capacity.with_kv_reserve(table, curves)
    fine = _capped(capacity.rates(t, curves, capacity.LEVELS, survival) / t.rate, options)
    rho = _on_grid(fine)
    nic, usable = capacity.nic_caps(t)
    if options.max_utilization is not None:
        nic = np.minimum(nic, options.max_utilization)
    speed = capacity.nic_speed(t)
    values = [t.kv_slack_ms, t.nic_u, rho, fine, nic, speed, (rho >= capacity.RHO_MIN) & usable]
    if rows is None:
        return uses.assign(**dict(zip(ADMITTED, values, strict=True)))
    uses = uses.copy()
    for name, value in zip(ADMITTED, values, strict=True):
        uses.loc[rows, name] = value
    return uses


def _fastest_tier(uses: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray] | None:
    """(`uses` with the fastest level (`candidates._kv_levels`) of every prefill use none of whose levels
    was admitted moved to the tier of its shortest transfer, the slowest such tier (its level, decode
    bandwidth and transfer time that tier's: the admissible load only grows as the transfer shortens, so if
    that admits nothing no tier does), the positions moved); None when there is none to move."""
    prefill = (uses["role"] == "prefill").to_numpy()
    none = np.zeros(len(uses), dtype=bool)
    none[prefill] = ~uses[prefill].groupby([*_shape(uses), "w", "key"])["admitted"].transform("any").to_numpy(
        bool
    )
    move = np.flatnonzero(_at_level(uses, _shape(uses), "min") & none & (uses["level"] > 0).to_numpy())
    if not len(move):
        return None
    tiers = uses.loc[uses["role"] == "decode", ["w", "key", "tier", "bw_gbps"]].drop_duplicates(
        ["w", "key", "tier"]
    )
    tiers = tiers.rename(columns={"tier": "to", "bw_gbps": "faster_bw"})
    moving = uses.loc[move, ["w", "key", "level", "kv_gbit", "bw_gbps", "t_kv_ms"]].assign(row=move)
    pairs = moving.merge(tiers, on=["w", "key"])
    t_kv = transfer_ms(pairs["kv_gbit"].to_numpy(float), pairs["bw_gbps"].to_numpy(float), pairs["faster_bw"])
    shorter = (pairs["to"] < pairs["level"]).to_numpy() & (t_kv < pairs["t_kv_ms"].to_numpy() * (1 - 1e-9))
    # the shortest transfer; among tiers that give it (the sender's NIC the slower end), the slowest
    candidates = pairs[shorter].assign(t_kv=t_kv[shorter])
    best = candidates.sort_values(["t_kv", "to"], ascending=[True, False]).groupby("row").first()
    if best.empty:
        return None
    rows = best.index.to_numpy()
    uses = uses.copy()
    uses.loc[rows, "level"] = best["to"].to_numpy()
    uses.loc[rows, "decode_bw"] = best["faster_bw"].to_numpy(float)
    uses.loc[rows, "t_kv_ms"] = best["t_kv"].to_numpy(float)
    return uses, rows


def pool_queues(cand: "Candidates", rows: np.ndarray, servers: np.ndarray | None) -> tuple:
    """(UseTable, Curves) of the uses at positions `rows` of cand.uses as their pools run them: the FIFO
    shares taken among these uses of each pool only (a pool's instances queue only what it carries), the
    NIC caps and KV reserves the uses' own, and `servers` instances per pool behind join-shortest-queue.
    The per-use arrays of the whole candidate set are built once per candidate set (`_use_arrays`)."""
    t_all, curves_all, holding = _use_arrays(cand)
    t, curves = capacity.take_rows(t_all, rows), capacity.take_rows(curves_all, rows)
    pool = cand.uses["pool"].to_numpy()[rows]
    return dataclasses.replace(
        t,
        share=_ratio_to_pool_max(pool, holding[rows]),
        kv_share=np.where(t.t_kv > 0, _ratio_to_pool_max(pool, t.t_kv), 1.0),
        servers=None if servers is None else np.asarray(servers, dtype=np.int64),
    ), curves


def _ratio_to_pool_max(pool: np.ndarray, value: np.ndarray) -> np.ndarray:
    """max(value over the same pool) / value, at least 1 (the `share` of a FIFO queue)."""
    longest = np.zeros(int(pool.max(initial=-1)) + 1)
    np.maximum.at(longest, pool, value)
    return np.maximum(longest[pool] / np.maximum(value, 1e-9), 1.0)


T = TypeVar("T")


def kept_on(cand: "Candidates", name: str, frames: tuple, build: Callable[[], T]) -> T:
    """`build()`, kept in `cand.memo` under `name` for these very `frames` (compared by identity): a copy
    of the tables shares the memo, and a copy with other frames builds anew."""
    kept = cand.memo.get(name)
    if kept is None or any(a is not b for a, b in zip(kept[0], frames, strict=True)):
        kept = cand.memo[name] = (frames, build())
    return kept[1]


def _use_arrays(cand: "Candidates") -> tuple:
    """The capacity model's arrays of every use of a candidate set (UseTable with the uses' NIC caps and KV
    reserves, Curves, holding times), kept on it: they depend on the classes' shapes, not their demand."""
    uses = cand.uses

    def build() -> tuple:
        t = dataclasses.replace(
            use_table(uses, cand.classes),
            kv_slack_ms=uses["kv_slack_ms"].to_numpy(float),
            nic_u=uses["nic_u"].to_numpy(float),
        )
        c = cand.classes.loc[uses["w"]].reset_index(drop=True)
        holding = _holding_ms(uses.reset_index(drop=True), c)
        return t, cand.curves.curves(uses), holding

    return kept_on(cand, "use_arrays", (uses,), build)


def pooled_rho(
    cand: "Candidates", rows: np.ndarray, servers: np.ndarray, window: np.ndarray | None = None
) -> np.ndarray:
    """The admissible utilization of the uses at positions `rows` of cand.uses (on the LEVEL_STEP grid, a
    decode use's to 1 / 160 of it, capped by max_utilization) when each one's pool runs `servers` instances
    behind join-shortest-queue and carries exactly these uses (`pool_queues`), at the NIC utilization the
    MILP planned for them. Only the waits for a prefill batch and for a decode slot pool over the instances
    (capacity.pooled_wait_prob, slot_wait_prob, queue_stretch). `window`: per use, its class's requests in
    one judged window, for the window guard (solver/window.py; capacity.window_epsilon)."""
    t, curves = pool_queues(cand, rows, servers)
    if window is not None:
        t = dataclasses.replace(t, window=np.asarray(window, dtype=float))
    return _capped(capacity.rates(t, curves, capacity.LEVELS) / t.rate, cand.request.options)


def _capped(rho: np.ndarray, options: Options) -> np.ndarray:
    """Admissible utilizations clipped to [0, 1] and capped by max_utilization."""
    rho = np.clip(rho, 0.0, 1.0)
    if options.max_utilization is not None:
        rho = np.minimum(rho, options.max_utilization)
    return rho


def _on_grid(rho: np.ndarray) -> np.ndarray:
    """Admissible utilizations rounded down to LEVEL_STEP: a use's pool level."""
    return np.floor(rho / LEVEL_STEP + 1e-9) * LEVEL_STEP
