"""An exhaustive brute-force oracle for the placement model (docs/formulation.md, v1).

Written from the formulation alone, never from solver/, so that the two can check each other. It is meant
for TINY requests with inline profile rows: it enumerates every integer instance vector x over the pools
and, for each, solves the linear program over the flows y and z with scipy's linprog. Clarity over speed.

The one shortcut (optional, on by default): for a fixed set of pools the LP's feasible region only grows
when any x[pool] grows (x appears only on the right-hand side of the capacity and NIC rows), so the best
goodput over all x is attained at a *maximal* x, one where no single pool can take another instance
without breaking the device counts or the budget. `maximal_only=False` evaluates every x; the tests check
both agree.

Symbols (formulation.md -> here):
  device type k, N_k, c_k, NIC_k    -> Device.name, .count, .cost_per_hour, .network_gbps
  pool (owner, role, k, t, b)       -> OraclePool
  rP, rD, rC                        -> rate()
  TTFT_q, TBT_q                     -> Candidate.ttft_ms, Candidate.tbt_ms (interpolated)
  S_w                               -> kv_bytes_per_request()
  t_kv                              -> kv_transfer_s()
  x, y, z                           -> x vectors, ("y", w, pool) and ("z", w, P, D) LP columns
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from fleetplan.models import PlanRequest, Workload

ROLES = ("prefill", "decode", "colocated")
# Float slack for comparing a cost sum against budget_per_hour (the test strategies avoid near-ties).
BUDGET_SLACK = 1e-9


# --------------------------------------------------------------------------------------------------------
# Profile lookup and interpolation
# --------------------------------------------------------------------------------------------------------


def interpolate(points: list[tuple[int, float]], prompt: int) -> float | None:
    """Linear interpolation in prompt_tokens over (prompt_tokens, value) points; None outside their range."""
    if not points:
        return None
    points = sorted(points)
    if prompt < points[0][0] or prompt > points[-1][0]:
        return None
    for p, value in points:
        if p == prompt:
            return value
    for (p0, v0), (p1, v1) in zip(points, points[1:], strict=False):
        if p0 < prompt < p1:
            return v0 + (v1 - v0) * (prompt - p0) / (p1 - p0)
    return None  # unreachable for sorted points with distinct prompts


def profile_keys(request: PlanRequest, model: str) -> list[tuple[str, int, int]]:
    """(device, tp, batch) keys profiled for `model` on a request's device, after the options' filters."""
    assert request.profiles.rows is not None, "the oracle needs inline profile rows"
    devices = {d.name for d in request.devices}
    batch_sizes = request.options.batch_sizes
    tp_degrees = request.options.tp_degrees
    keys = set()
    for row in request.profiles.rows:
        if row.model != model or row.device not in devices:
            continue
        if batch_sizes is not None and row.batch not in batch_sizes:
            continue
        if tp_degrees is not None and row.tp not in tp_degrees:
            continue
        keys.add((row.device, row.tp, row.batch))
    return sorted(keys)


def latency_ms(
    request: PlanRequest, model: str, key: tuple[str, int, int], prompt: int, metric: str, percentile: int
) -> float | None:
    """TTFT or TBT (metric "ttft" / "tbt") at `percentile`, interpolated at `prompt`; None = no candidate.

    Rows whose column for this percentile is absent are not points of the interpolation.
    """
    assert request.profiles.rows is not None
    device, tp, batch = key
    column = f"{metric}_ms_p{percentile}"
    points = []
    for row in request.profiles.rows:
        if (row.model, row.device, row.tp, row.batch) == (model, device, tp, batch):
            value = getattr(row, column)
            if value is not None:
                points.append((row.prompt_tokens, value))
    return interpolate(points, prompt)


# --------------------------------------------------------------------------------------------------------
# Pools, rates and eligibility
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class OraclePool:
    owner: str  # model name (pooling "model") or class name (pooling "class")
    model: str
    role: str
    device: str
    tp: int
    batch: int


@dataclass
class Candidates:
    """Everything the LP needs that does not depend on x."""

    pools: list[OraclePool]  # pools some class can use, in a fixed order
    rate: dict[tuple[str, OraclePool], float]  # (class, pool) -> requests/s per instance, usable pairs only
    triples: list[tuple[str, OraclePool, OraclePool]]  # eligible (class, prefill pool, decode pool)
    ttft_ms: dict[tuple[str, OraclePool], float] = field(default_factory=dict)
    tbt_ms: dict[tuple[str, OraclePool], float] = field(default_factory=dict)


def kv_bytes_per_request(request: PlanRequest, workload: Workload) -> float:
    """S_w = p_w * kv_bytes_per_token(m_w)."""
    return workload.prompt_tokens * request.model_specs()[workload.model].kv_bytes


def kv_gbit_per_request(request: PlanRequest, workload: Workload) -> float:
    """8 * S_w / 1e9: Gbit moved per disaggregated request, so z (req/s) times this is Gbit/s."""
    return 8 * kv_bytes_per_request(request, workload) / 1e9


def kv_transfer_s(request: PlanRequest, workload: Workload, prefill: OraclePool, decode: OraclePool) -> float:
    """t_kv = 8 S_w / (1e9 min(NIC_kp t_p, NIC_kd t_d)) seconds; 0 where either NIC is absent."""
    nic = {d.name: d.network_gbps for d in request.devices}
    nic_p, nic_d = nic[prefill.device], nic[decode.device]
    if nic_p is None or nic_d is None:
        return 0.0
    return 8 * kv_bytes_per_request(request, workload) / (1e9 * min(nic_p * prefill.tp, nic_d * decode.tp))


def rate(role: str, batch: int, output_tokens: int, ttft_ms: float | None, tbt_ms: float | None) -> float:
    """Per-instance requests/s: rP = b/TTFT, rD = b/(o TBT), rC = b/(TTFT + (o-1) TBT), seconds inside."""
    if role == "prefill":
        assert ttft_ms is not None
        return batch / (ttft_ms / 1000)
    if role == "decode":
        assert tbt_ms is not None
        return batch / (output_tokens * tbt_ms / 1000)
    assert ttft_ms is not None
    assert tbt_ms is not None
    return batch / (ttft_ms / 1000 + (output_tokens - 1) * tbt_ms / 1000)


def owner_of(request: PlanRequest, workload: Workload) -> str:
    return workload.model if request.options.pooling == "model" else workload.name


def build_candidates(request: PlanRequest) -> Candidates:
    """Every pool, rate and eligible (w, P, D) triple of the formulation; unusable pools are dropped."""
    options = request.options
    workloads = request.workloads
    rate_of: dict[tuple[str, OraclePool], float] = {}
    ttft_of: dict[tuple[str, OraclePool], float] = {}
    tbt_of: dict[tuple[str, OraclePool], float] = {}
    # Per class: the prefill pools with a TTFT, and the decode pools that meet its TBT SLO.
    prefill_pools: dict[str, list[OraclePool]] = {w.name: [] for w in workloads}
    decode_pools: dict[str, list[OraclePool]] = {w.name: [] for w in workloads}
    colocated_usable: dict[tuple[str, OraclePool], float] = {}

    for w in workloads:
        q = w.slo.percentile
        owner = owner_of(request, w)
        for key in profile_keys(request, w.model):
            device, tp, batch = key
            ttft = latency_ms(request, w.model, key, w.prompt_tokens, "ttft", q)
            tbt = latency_ms(request, w.model, key, w.prompt_tokens, "tbt", q)
            if options.allow_colocated and ttft is not None and tbt is not None:
                if ttft <= w.slo.ttft_ms and tbt <= w.slo.tbt_ms:
                    pool = OraclePool(owner, w.model, "colocated", device, tp, batch)
                    colocated_usable[(w.name, pool)] = rate("colocated", batch, w.output_tokens, ttft, tbt)
                    ttft_of[(w.name, pool)] = ttft
                    tbt_of[(w.name, pool)] = tbt
            if options.allow_disaggregated:
                if ttft is not None:
                    pool = OraclePool(owner, w.model, "prefill", device, tp, batch)
                    prefill_pools[w.name].append(pool)
                    ttft_of[(w.name, pool)] = ttft
                if tbt is not None and tbt <= w.slo.tbt_ms:
                    pool = OraclePool(owner, w.model, "decode", device, tp, batch)
                    decode_pools[w.name].append(pool)
                    tbt_of[(w.name, pool)] = tbt

    triples: list[tuple[str, OraclePool, OraclePool]] = []
    for w in workloads:
        for p_pool in prefill_pools[w.name]:
            for d_pool in decode_pools[w.name]:
                t_kv = kv_transfer_s(request, w, p_pool, d_pool)
                if ttft_of[(w.name, p_pool)] / 1000 + t_kv <= w.slo.ttft_ms / 1000:
                    triples.append((w.name, p_pool, d_pool))

    by_name = {w.name: w for w in workloads}
    rate_of.update(colocated_usable)
    for w_name, p_pool, d_pool in triples:
        w = by_name[w_name]
        rate_of[(w_name, p_pool)] = rate(
            "prefill", p_pool.batch, w.output_tokens, ttft_of[(w_name, p_pool)], None
        )
        rate_of[(w_name, d_pool)] = rate(
            "decode", d_pool.batch, w.output_tokens, None, tbt_of[(w_name, d_pool)]
        )

    pools = sorted({pool for (_, pool) in rate_of})
    return Candidates(pools=pools, rate=rate_of, triples=triples, ttft_ms=ttft_of, tbt_ms=tbt_of)


# --------------------------------------------------------------------------------------------------------
# Enumeration of x
# --------------------------------------------------------------------------------------------------------


def _vectors_with_capacity(tps: list[int], capacity: int) -> Iterator[tuple[int, ...]]:
    """Every non-negative integer vector x with sum(tps[i] * x[i]) <= capacity."""
    if not tps:
        yield ()
        return
    for first in range(capacity // tps[0] + 1):
        for rest in _vectors_with_capacity(tps[1:], capacity - tps[0] * first):
            yield (first, *rest)


def pool_cost(request: PlanRequest, pool: OraclePool) -> float:
    cost = {d.name: d.cost_per_hour for d in request.devices}
    return cost[pool.device] * pool.tp


def fits(request: PlanRequest, pools: list[OraclePool], x: tuple[int, ...]) -> bool:
    """Constraint 4 (device counts) and 7 (budget)."""
    count = {d.name: d.count for d in request.devices}
    for device in count:
        if (
            sum(pool.tp * n for pool, n in zip(pools, x, strict=True) if pool.device == device)
            > count[device]
        ):
            return False
    budget = request.options.budget_per_hour
    if budget is not None:
        cost = sum(pool_cost(request, pool) * n for pool, n in zip(pools, x, strict=True))
        if cost > budget + BUDGET_SLACK * max(1.0, budget):
            return False
    return True


def enumerate_x(request: PlanRequest, pools: list[OraclePool]) -> list[tuple[int, ...]]:
    """Every integer x over `pools` that fits the device counts and the budget."""
    count = {d.name: d.count for d in request.devices}
    per_device: list[tuple[list[int], list[tuple[int, ...]]]] = []
    for device in count:
        index = [i for i, pool in enumerate(pools) if pool.device == device]
        vectors = list(_vectors_with_capacity([pools[i].tp for i in index], count[device]))
        per_device.append((index, vectors))

    result: list[tuple[int, ...]] = []

    def combine(level: int, x: list[int]) -> None:
        if level == len(per_device):
            candidate = tuple(x)
            if fits(request, pools, candidate):
                result.append(candidate)
            return
        index, vectors = per_device[level]
        for vector in vectors:
            for i, n in zip(index, vector, strict=True):
                x[i] = n
            combine(level + 1, x)
        for i in index:
            x[i] = 0

    combine(0, [0] * len(pools))
    return result


def is_maximal(request: PlanRequest, pools: list[OraclePool], x: tuple[int, ...]) -> bool:
    """No single pool can take one more instance."""
    for i in range(len(pools)):
        bigger = list(x)
        bigger[i] += 1
        if fits(request, pools, tuple(bigger)):
            return False
    return True


def count_x_vectors(request: PlanRequest) -> int:
    """How many x vectors a full enumeration visits (the strategies keep this small)."""
    return len(enumerate_x(request, build_candidates(request).pools))


# --------------------------------------------------------------------------------------------------------
# The LP for a fixed x
# --------------------------------------------------------------------------------------------------------


@dataclass
class FlowLp:
    """min c.v  s.t.  A_ub v <= b_fixed + B_x x,  A_eq v = 0,  v >= 0 ; columns are y and z flows."""

    columns: list[tuple]
    a_ub: np.ndarray
    b_fixed: np.ndarray
    b_x: np.ndarray  # rhs coefficient of x per row (capacity and NIC rows); zero elsewhere
    a_eq: np.ndarray
    served: dict[str, np.ndarray]  # class -> coefficient vector giving served[w]
    row_names: list[str]


@dataclass
class _UbRows:
    """The rows of A_ub v <= b_fixed + B_x x as they are built: one coefficient vector over the LP columns,
    a fixed right-hand side, an x coefficient per pool and a name per row."""

    col: dict[tuple, int]  # LP column -> index
    pools: list[OraclePool]
    a: list[np.ndarray] = field(default_factory=list)
    fixed: list[float] = field(default_factory=list)
    x: list[np.ndarray] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def zeros(self) -> np.ndarray:
        return np.zeros(len(self.col))

    def add(
        self, row: np.ndarray, fixed: float, name: str, x_pool: OraclePool | None = None, x_coef: float = 0.0
    ) -> None:
        """Add `row . v <= fixed + x_coef * x[x_pool]` (no x term without x_pool)."""
        x_row = np.zeros(len(self.pools))
        if x_pool is not None:
            x_row[self.pools.index(x_pool)] = x_coef
        self.a.append(row)
        self.fixed.append(fixed)
        self.x.append(x_row)
        self.names.append(name)


def _add_capacity_rows(ub: _UbRows, cand: Candidates, rho: float) -> None:
    """1. Capacity: sum_w y[w,pool] / r[w,pool] <= rho x[pool]."""
    for pool in cand.pools:
        row = ub.zeros()
        for (w, other), r in cand.rate.items():
            if other == pool:
                row[ub.col[("y", w, pool)]] = 1.0 / r
        ub.add(row, 0.0, f"capacity {pool}", pool, rho)


def _add_demand_rows(ub: _UbRows, request: PlanRequest, cand: Candidates) -> dict[str, np.ndarray]:
    """3. Demand: served[w] <= lambda_w, served = colocated y + prefill y. Returns each class's served[w]."""
    served: dict[str, np.ndarray] = {}
    for w in request.workloads:
        row = ub.zeros()
        for cw, pool in cand.rate:
            if cw == w.name and pool.role in ("colocated", "prefill"):
                row[ub.col[("y", cw, pool)]] = 1.0
        served[w.name] = row
        ub.add(row.copy(), w.rate_rps, f"demand {w.name}")
    return served


def _add_nic_rows(ub: _UbRows, request: PlanRequest, cand: Candidates, gbit: dict[str, float]) -> None:
    """5. NIC: KV traffic out of each prefill pool and into each decode pool <= x t NIC_k."""
    devices = {d.name: d for d in request.devices}
    for pool in cand.pools:
        nic = devices[pool.device].network_gbps
        if nic is None or pool.role == "colocated":
            continue
        row = ub.zeros()
        for w, p, d in cand.triples:
            if (pool.role == "prefill" and p == pool) or (pool.role == "decode" and d == pool):
                row[ub.col[("z", w, p, d)]] += gbit[w]
        ub.add(row, 0.0, f"nic {pool}", pool, pool.tp * nic)


def _add_link_rows(
    ub: _UbRows, request: PlanRequest, cand: Candidates, gbit: dict[str, float], rho: float
) -> None:
    """6. Links and the fleet-wide KV budget between different device types, at rho of their budgets (the
    project puts max_utilization on these shared budgets, beyond the contract: docs/formulation.md)."""
    for link in request.links:
        row = ub.zeros()
        for w, p, d in cand.triples:
            if p.device == link.source and d.device == link.target:
                row[ub.col[("z", w, p, d)]] += gbit[w]
        ub.add(row, rho * link.gbps, f"link {link.source}->{link.target}")
    if request.kv_budget_gbps is not None:
        row = ub.zeros()
        for w, p, d in cand.triples:
            if p.device != d.device:
                row[ub.col[("z", w, p, d)]] += gbit[w]
        ub.add(row, rho * request.kv_budget_gbps, "kv_budget")


def _flow_conservation_rows(cand: Candidates, col: dict[tuple, int]) -> list[np.ndarray]:
    """2. Flow conservation: y[w,P] = sum_D z[w,P,D], y[w,D] = sum_P z[w,P,D]."""
    eq_rows: list[np.ndarray] = []
    for w, pool in sorted(cand.rate):
        if pool.role == "colocated":
            continue
        row = np.zeros(len(col))
        row[col[("y", w, pool)]] = 1.0
        for tw, p, d in cand.triples:
            if tw == w and ((pool.role == "prefill" and p == pool) or (pool.role == "decode" and d == pool)):
                row[col[("z", tw, p, d)]] -= 1.0
        eq_rows.append(row)
    return eq_rows


def build_flow_lp(request: PlanRequest, cand: Candidates) -> FlowLp:
    # the flat capacity model (v1): one headroom on every pool, NIC and link (docs/formulation.md)
    assert request.options.capacity_model == "flat", "the oracle implements the flat capacity model"
    rho = request.options.max_utilization if request.options.max_utilization is not None else 0.5
    pools = cand.pools

    columns: list[tuple] = [("y", w, pool) for (w, pool) in sorted(cand.rate)]
    columns += [("z", w, p, d) for (w, p, d) in cand.triples]
    col = {c: i for i, c in enumerate(columns)}
    n = len(columns)

    gbit = {w.name: kv_gbit_per_request(request, w) for w in request.workloads}
    ub = _UbRows(col, pools)
    _add_capacity_rows(ub, cand, rho)
    served = _add_demand_rows(ub, request, cand)
    _add_nic_rows(ub, request, cand, gbit)
    _add_link_rows(ub, request, cand, gbit, rho)
    eq_rows = _flow_conservation_rows(cand, col)

    return FlowLp(
        columns=columns,
        a_ub=np.array(ub.a).reshape(len(ub.a), n),
        b_fixed=np.array(ub.fixed),
        b_x=np.array(ub.x).reshape(len(ub.a), len(pools)),
        a_eq=np.array(eq_rows).reshape(len(eq_rows), n),
        served=served,
        row_names=ub.names,
    )


def _linprog(c: np.ndarray, a_ub: np.ndarray, b_ub: np.ndarray, a_eq: np.ndarray):
    return linprog(
        c,
        A_ub=a_ub if a_ub.size else None,
        b_ub=b_ub if a_ub.size else None,
        A_eq=a_eq if a_eq.size else None,
        b_eq=np.zeros(a_eq.shape[0]) if a_eq.size else None,
        bounds=(0, None),
        method="highs",
    )


def goodput_for_x(request: PlanRequest, lp: FlowLp, x: tuple[int, ...]) -> float:
    """max sum_w v_w served[w] for a fixed x."""
    if not lp.columns:
        return 0.0
    weights = {w.name: w.weight for w in request.workloads}
    c = -sum(weights[w] * coef for w, coef in lp.served.items())
    b_ub = lp.b_fixed + lp.b_x @ np.array(x, dtype=float)
    result = _linprog(c, lp.a_ub, b_ub, lp.a_eq)
    assert result.status == 0, f"flow LP failed for x={x}: {result.message}"  # y = z = 0 is always feasible
    return float(-result.fun)


# --------------------------------------------------------------------------------------------------------
# The oracles
# --------------------------------------------------------------------------------------------------------


@dataclass
class OracleAnswer:
    value: float
    x: tuple[int, ...] | None
    pools: list[OraclePool]
    vectors: int  # how many x vectors were evaluated


def solve_max_goodput(request: PlanRequest, maximal_only: bool = True) -> OracleAnswer:
    cand = build_candidates(request)
    if not cand.pools:
        return OracleAnswer(0.0, None, [], 0)
    lp = build_flow_lp(request, cand)
    best, best_x, evaluated = 0.0, None, 0
    for x in enumerate_x(request, cand.pools):
        if maximal_only and not is_maximal(request, cand.pools, x):
            continue
        evaluated += 1
        value = goodput_for_x(request, lp, x)
        if best_x is None or value > best:
            best, best_x = value, x
    return OracleAnswer(best, best_x, cand.pools, evaluated)


def brute_force_goodput(request: PlanRequest, maximal_only: bool = True) -> float:
    """The optimal weighted goodput sum_w v_w served[w] of the formulation (max_goodput objective)."""
    return solve_max_goodput(request, maximal_only).value


def brute_force_min_cost(request: PlanRequest) -> float | None:
    """Objective min_cost: the least sum_k c_k * devices used that serves every class's full demand.

    None when no x can serve every class in full. Costs only depend on x; feasibility is an LP per x.
    """
    cand = build_candidates(request)
    workloads = request.workloads
    if all(w.rate_rps == 0 for w in workloads):
        return 0.0
    if not cand.pools:
        return None
    lp = build_flow_lp(request, cand)
    # served[w] >= lambda_w, i.e. -served[w] <= -lambda_w (with served <= lambda_w already in the LP).
    extra_rows = np.array([-lp.served[w.name] for w in workloads])
    extra_b = np.array([-w.rate_rps for w in workloads])
    a_ub = np.vstack([lp.a_ub, extra_rows])
    vectors = enumerate_x(request, cand.pools)
    costs = [sum(pool_cost(request, p) * n for p, n in zip(cand.pools, x, strict=True)) for x in vectors]
    for cost, x in sorted(zip(costs, vectors, strict=True), key=lambda item: item[0]):
        b_ub = np.concatenate([lp.b_fixed + lp.b_x @ np.array(x, dtype=float), extra_b])
        result = _linprog(np.zeros(len(lp.columns)), a_ub, b_ub, lp.a_eq)
        if result.status == 0:
            return float(cost)
    return None


def brute_force_max_min_fraction(request: PlanRequest) -> float:
    """Objective max_min_fraction, first level only: max over x of min_w served[w] / lambda_w.

    Classes with zero demand are left out of the minimum (their fraction is undefined).
    """
    cand = build_candidates(request)
    if not cand.pools:
        return 0.0
    lp = build_flow_lp(request, cand)
    n = len(lp.columns)
    # Extra column t (last): maximize t s.t. t lambda_w - served[w] <= 0, t <= 1.
    demanding = [w for w in request.workloads if w.rate_rps > 0]
    if not demanding:
        return 1.0
    a_ub = np.hstack([lp.a_ub, np.zeros((lp.a_ub.shape[0], 1))])
    extra = np.array([np.append(-lp.served[w.name], w.rate_rps) for w in demanding])
    a_ub = np.vstack([a_ub, extra])
    a_eq = np.hstack([lp.a_eq, np.zeros((lp.a_eq.shape[0], 1))])
    c = np.zeros(n + 1)
    c[-1] = -1.0
    best = 0.0
    for x in enumerate_x(request, cand.pools):
        if not is_maximal(request, cand.pools, x):
            continue  # the LP only grows with x, so a maximal x attains the maximum
        b_ub = np.concatenate([lp.b_fixed + lp.b_x @ np.array(x, dtype=float), np.zeros(len(demanding))])
        result = linprog(
            c,
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=a_eq if a_eq.shape[0] else None,
            b_eq=np.zeros(a_eq.shape[0]) if a_eq.shape[0] else None,
            bounds=[(0, None)] * n + [(0, 1)],
            method="highs",
        )
        assert result.status == 0, result.message
        best = max(best, float(-result.fun))
    return best


__all__ = [
    "Candidates",
    "OracleAnswer",
    "OraclePool",
    "brute_force_goodput",
    "brute_force_max_min_fraction",
    "brute_force_min_cost",
    "build_candidates",
    "count_x_vectors",
    "enumerate_x",
    "interpolate",
    "kv_transfer_s",
    "solve_max_goodput",
]
