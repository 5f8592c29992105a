"""The MILP of docs/formulation.md as sparse blocks: one `define_*` per constraint family.

Columns: x[pool] (integer instances) | f[use] (RPS of a class through a pool; for prefill uses, per
destination key) | s[w, key, tier] (KV-flow slack carried down the bandwidth tiers) | phi (only for
max_min_fraction) | d[k] (only for a churn-limited re-plan: instances moved per pool key k) | b[k] (integer
devices bought, only for purchasable types: `Device.max_count`) | u[k] (integer devices used per type; on
every model since session 22, with the budget rows: define_device_use, budget_row) | n[s] (integer
instances per pool shape with more than one pool: define_shapes) | z[o] (binary: owner o's pools serve at
all; on the strengthened model: define_switches).
Each family returns a Block of COO
triplets; `build_matrix` stacks them into one CSR matrix, the only form a backend sees.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np
import pandas as pd
import scipy.sparse as sp

from fleetplan.models.codec import encode
from fleetplan.models.plan import PlanRequest
from fleetplan.solver.candidates import ANY_DEVICE, Candidates
from fleetplan.solver.headroom import kept_on

INF = np.inf
# a budget within this of the fleet's cost ($/h) counts as reaching it (spends_all)
BUDGET_SLACK = 1e-9
# matrix_for keeps this many models per sweep's tables: a budget sweep's request and one per device type
# for the marginal values (each one more device); the L bench instance's model is 2 MB
MATRIX_MEMO_SIZE = 8
_MATRIX_LOCK = threading.Lock()


@dataclass(frozen=True)
class Block:
    """Rows of one constraint family: lo <= A_block @ v <= hi."""

    name: str
    n_rows: int
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


@dataclass(frozen=True)
class Columns:
    """Where each variable family lives in the column vector."""

    n_pools: int
    n_uses: int
    chain: pd.DataFrame  # one row per s variable: w, key, tier
    has_phi: bool
    n_churn: int = 0  # d[k] columns, one per pool key of a churn-limited re-plan
    buy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # device rows with a b column
    n_used: int = 0  # u[k] columns (devices used per type; define_device_use, on every model: budget_row)
    # per pool: its shape's n[s] column number s (define_shapes), or -1 where the pool is its shape's only one
    shape: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per pool: its owner's z[o] column number o (define_switches); empty where the model has no z columns
    switch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def use_offset(self) -> int:
        return self.n_pools

    @property
    def chain_offset(self) -> int:
        return self.n_pools + self.n_uses

    @property
    def phi(self) -> int:
        return self.chain_offset + len(self.chain)

    @property
    def churn_offset(self) -> int:
        return self.phi + int(self.has_phi)

    @property
    def buy_offset(self) -> int:
        return self.churn_offset + self.n_churn

    @property
    def used_offset(self) -> int:
        return self.buy_offset + len(self.buy)

    @property
    def shape_offset(self) -> int:
        return self.used_offset + self.n_used

    @property
    def n_shapes(self) -> int:
        return _numbered(self.shape)

    @property
    def switch_offset(self) -> int:
        return self.shape_offset + self.n_shapes

    @property
    def n_switches(self) -> int:
        return _numbered(self.switch)

    @property
    def size(self) -> int:
        return self.switch_offset + self.n_switches


def _numbered(numbers: np.ndarray) -> int:
    """How many columns a per-pool numbering 0..K-1 (-1: none) calls for: K."""
    return int(numbers.max(initial=-1)) + 1


@dataclass(frozen=True)
class ModelArrays:
    """The columns of the candidate tables that the model's rows and bounds read, as numpy arrays, taken
    once per set of tables (`model_arrays`). On these models a pandas lookup (a column, a map, a groupby)
    costs more than the arithmetic it feeds: build_matrix made some 200 of them, 20-35 ms a model."""

    # per use (a row of cand.uses)
    w: np.ndarray  # its class
    pool: np.ndarray
    role: np.ndarray  # "colocated", "prefill" or "decode"
    rate: np.ndarray  # r[w, pool]: the full-batch rate of one instance (requests/s)
    kv_gbit: np.ndarray
    key: np.ndarray  # the decode device its KV flow is resolved to, or ANY_DEVICE
    tier: np.ndarray  # a decode use's bandwidth tier
    level: np.ndarray  # a prefill use's KV level
    device: np.ndarray
    demand: np.ndarray  # lambda_w of its class (use_demand)
    # per pool (a row of cand.pools)
    pool_device: np.ndarray  # its device's position in cand.devices
    pool_tp: np.ndarray
    pool_rho: np.ndarray
    pool_nic_rho: np.ndarray
    pool_role: np.ndarray
    pool_key: np.ndarray  # pool_keys
    pool_owner: np.ndarray  # owner_numbers
    # per device type (a row of cand.devices)
    nic: np.ndarray
    price: np.ndarray
    count: np.ndarray
    capacity: np.ndarray  # count plus what may be bought (`_capacity_column`)
    # per class (a row of cand.classes)
    class_demand: np.ndarray
    class_weight: np.ndarray


def model_arrays(cand: Candidates) -> ModelArrays:
    """cand's ModelArrays, kept on it for these very frames (headroom.kept_on)."""
    frames = (cand.pools, cand.uses, cand.classes, cand.devices)
    return kept_on(cand, "model_arrays", frames, lambda: _model_arrays(*frames))


def _model_arrays(
    pools: pd.DataFrame, uses: pd.DataFrame, classes: pd.DataFrame, devices: pd.DataFrame
) -> ModelArrays:
    class_demand = classes["rate_rps"].to_numpy(float)
    w = uses["w"].to_numpy(np.int64)
    names = devices["device"].to_numpy()
    order = np.argsort(names, kind="stable")
    pool_names = pools["device"].to_numpy()
    pool_device = order[np.minimum(np.searchsorted(names[order], pool_names), max(len(names) - 1, 0))]
    if len(pool_names) and not (names[pool_device] == pool_names).all():
        msg = "internal: a candidate pool on a device type the tables do not list"
        raise AssertionError(msg)
    view = ModelArrays(
        w=w,
        pool=uses["pool"].to_numpy(np.int64),
        role=uses["role"].to_numpy(),
        rate=uses["rate_rps"].to_numpy(float),
        kv_gbit=uses["kv_gbit"].to_numpy(float),
        key=uses["key"].to_numpy(),
        tier=uses["tier"].to_numpy(np.int64),
        level=uses["level"].to_numpy(np.int64),
        device=uses["device"].to_numpy(),
        demand=class_demand[w],
        pool_device=pool_device,
        pool_tp=pools["tp"].to_numpy(float),
        pool_rho=pools["rho"].to_numpy(float),
        pool_nic_rho=pools["nic_rho"].to_numpy(float),
        pool_role=pools["role"].to_numpy(),
        pool_key=_sorted_numbers([pools[column].to_numpy() for column in KEY]),
        pool_owner=np.unique(pools["owner"].to_numpy(), return_inverse=True)[1].astype(np.int64),
        nic=devices["nic_gbps"].to_numpy(float),
        price=devices["cost_per_hour"].to_numpy(float),
        count=devices["count"].to_numpy(float),
        capacity=devices[_capacity_column(devices)].to_numpy(float),
        class_demand=class_demand,
        class_weight=classes["weight"].to_numpy(float),
    )
    for name in ModelArrays.__dataclass_fields__:
        getattr(view, name).flags.writeable = False  # shared by every caller of these tables: read-only
    return view


def _sorted_numbers(columns: list[np.ndarray]) -> np.ndarray:
    """Per row, the number 0..K-1 of its tuple of values among the distinct tuples in sorted order (what
    pandas' `groupby(columns, sort=True).ngroup()` gives)."""
    if not len(columns[0]):
        return np.zeros(0, np.int64)
    codes = np.stack([np.unique(c, return_inverse=True)[1].ravel() for c in columns], axis=1)
    return np.unique(codes, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


@dataclass
class MatrixForm:
    """A backend-neutral MILP: optimize c @ v subject to row_lo <= A v <= row_hi, col bounds, integrality."""

    A: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integer: np.ndarray
    row_blocks: list[tuple[str, int, int]]
    objectives: dict[str, np.ndarray] = field(default_factory=dict)

    def with_row(self, name: str, coefficients: np.ndarray, lo: float, hi: float) -> "MatrixForm":
        """A copy with one more dense row (locks a lexicographic stage's optimum)."""
        row = sp.csr_matrix(coefficients.reshape(1, -1))
        start = self.A.shape[0]
        return MatrixForm(
            A=sp.vstack([self.A, row], format="csr"),
            row_lo=np.append(self.row_lo, lo),
            row_hi=np.append(self.row_hi, hi),
            col_lo=self.col_lo,
            col_hi=self.col_hi,
            integer=self.integer,
            row_blocks=[*self.row_blocks, (name, start, start + 1)],
            objectives=self.objectives,
        )

    def with_fixed(self, columns: np.ndarray, values: np.ndarray) -> "MatrixForm":
        """A copy with each of `columns` held at its entry of `values` (both bounds)."""
        col_lo, col_hi = self.col_lo.copy(), self.col_hi.copy()
        col_lo[columns] = col_hi[columns] = values
        return replace(self, col_lo=col_lo, col_hi=col_hi)

    @property
    def nonzeros(self) -> int:
        return int(self.A.nnz)


def chain_columns(cand: Candidates) -> pd.DataFrame:
    """The s[w, key, j] variables: j = 0 .. J-2 for every (class, key) with J decode tiers, ordered by
    (w, key, j)."""
    t = model_arrays(cand)
    decode = t.role == "decode"
    keys, key_code = np.unique(t.key[decode], return_inverse=True)
    group = t.w[decode] * len(keys) + key_code
    groups, member = np.unique(group, return_inverse=True)
    count = np.zeros(len(groups), np.int64)  # J - 1 slack variables per (w, key)
    np.maximum.at(count, member, t.tier[decode])
    of = np.repeat(np.arange(len(groups)), count)
    tier = np.arange(len(of)) - np.repeat(np.cumsum(count) - count, count)
    n_keys = max(len(keys), 1)
    key = pd.Series(keys[groups[of] % n_keys], dtype=cand.uses["key"].dtype)
    return pd.DataFrame({"w": groups[of] // n_keys, "key": key, "tier": tier})


def _use_rate_coefficients(cand: Candidates) -> np.ndarray:
    return 1.0 / model_arrays(cand).rate


def use_demand(cand: Candidates) -> np.ndarray:
    """Per use (row of cand.uses): its class's demand lambda_w in requests/s (read-only: `model_arrays`)."""
    return model_arrays(cand).demand


def pool_ceilings(cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """(D, T) per pool: the most load (sum_w f / r) and KV traffic (sum_w f * 8 S_w / 1e9) it can ever carry.

    Every class's flow through a pool is at most its demand: served[w] <= lambda_w bounds its colocated and
    prefill flows (a prefill use's keys share one rate, so lambda_w / r once per (w, pool) covers all of
    them), and the last KV-flow row makes its decode flow equal its prefill flow. So D = sum over the
    distinct (w, pool) of lambda_w / r[w, pool], T likewise with lambda_w * kv_gbit[w].
    """
    t = model_arrays(cand)
    n_pools = len(t.pool_tp)
    first = np.zeros(len(t.pool), dtype=bool)  # the first use of each (w, pool)
    first[np.unique(t.w * n_pools + t.pool, return_index=True)[1]] = True
    pool = t.pool[first]
    load = np.bincount(pool, weights=(t.demand / t.rate)[first], minlength=n_pools)
    traffic = np.bincount(pool, weights=(t.demand * t.kv_gbit)[first], minlength=n_pools)
    return load, traffic


def define_capacity(cand: Candidates, cols: Columns, strengthen: bool = True) -> Block:
    """sum_w f[w, pool] / r[w, pool] - min(rho[pool], D[pool]) * x[pool] <= 0 for every pool.

    rho[pool] is the pool's headroom level: max_utilization under the flat model (v1), the admissible
    utilization of the classes it may carry under the queueing model (fleetplan/solver/capacity.py).

    Coefficient strengthening (docs/formulation.md, "Strengthening"): D[pool] (pool_ceilings) is the most
    load the pool can carry at all. At x = 0 both forms force the load to 0; at an integer x >= 1 the load
    is at most D <= D * x. So every integer point of the rho form satisfies the min(rho, D) form and vice
    versa; only fractional x (the LP relaxation) is cut, where a pool that could never fill one instance
    no longer gets its load for a fraction of an instance."""
    t = model_arrays(cand)
    n_pools = cols.n_pools
    rho = t.pool_rho
    if strengthen:
        rho = np.minimum(rho, pool_ceilings(cand)[0])
    rows = np.concatenate([t.pool, np.arange(n_pools)])
    columns = np.concatenate([cols.use_offset + np.arange(len(t.pool)), np.arange(n_pools)])
    vals = np.concatenate([_use_rate_coefficients(cand), -rho])
    return Block("capacity", n_pools, rows, columns, vals, np.full(n_pools, -INF), np.zeros(n_pools))


def define_kv_flow(cand: Candidates, cols: Columns) -> Block:
    """For every (w, key, tier j): sum_{decode at j} f - sum_{prefill at level j} f + s[j-1] - s[j] = 0.

    Summed over j' <= j this says: KV flow that can only land in tiers 0..j fits in their decode capacity
    (Hall's condition for nested reachable sets), and at the last tier, prefill flow = decode flow.
    Rows are ordered by (w, key, j); each (w, key, j) is one integer code, so rows are found by sorting.
    """
    t = model_arrays(cand)
    disagg = np.flatnonzero(t.role != "colocated")
    decode = t.role[disagg] == "decode"
    j = np.where(decode, t.tier[disagg], t.level[disagg]).astype(np.int64)
    keys, key_code = np.unique(t.key[disagg], return_inverse=True)
    n_keys, n_j = len(keys), int(j.max(initial=0)) + 2  # room for the chain's j + 1 past the last tier
    code = (t.w[disagg] * n_keys + key_code) * n_j + j
    row_codes, use_rows = np.unique(code, return_inverse=True)

    chain = cols.chain
    chain_cols = cols.chain_offset + np.arange(len(chain))
    chain_key = np.searchsorted(keys, chain["key"].to_numpy())
    at_code = (chain["w"].to_numpy(np.int64) * n_keys + chain_key) * n_j + chain["tier"].to_numpy(np.int64)
    at, nxt = _rows_of(row_codes, at_code), _rows_of(row_codes, at_code + 1)
    if len(chain) and ((at < 0).any() or (nxt < 0).any()):
        # every tier 0..J-1 holds a decode use by construction (candidates.flow_tiers)
        msg = "internal: KV chain tier without a flow row"
        raise AssertionError(msg)
    rows = np.concatenate([use_rows, at, nxt])
    columns = np.concatenate([cols.use_offset + disagg, chain_cols, chain_cols])
    vals = np.concatenate([np.where(decode, 1.0, -1.0), -np.ones(len(chain)), np.ones(len(chain))])
    n = len(row_codes)
    return Block("kv_flow", n, rows, columns, vals, np.zeros(n), np.zeros(n))


def _rows_of(row_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The position of each of `codes` in the sorted `row_codes`, -1 where it is not there."""
    at = np.minimum(np.searchsorted(row_codes, codes), max(len(row_codes) - 1, 0))
    found = (row_codes[at] == codes) if len(row_codes) else np.zeros(len(codes), bool)
    return np.where(found, at, -1)


def servable_demand(cand: Candidates) -> np.ndarray:
    """Each class's demand (RPS) where some candidate pool can serve it, 0 where none can: all the demand
    any plan can serve, class by class (what "serving everything" means for max_goodput's one-solve fold
    and the window guard's serving in full; min_cost keeps every class's whole demand)."""
    t = model_arrays(cand)
    return np.where(np.isin(np.arange(len(t.class_demand)), t.w), t.class_demand, 0.0)


def served_coefficients(cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """(use index, class) of the columns whose sum is served[w]: colocated and prefill flows."""
    t = model_arrays(cand)
    counted = t.role != "decode"
    return np.flatnonzero(counted), t.w[counted]


def define_demand(cand: Candidates, cols: Columns, full: bool) -> Block:
    """served[w] <= lambda_w (== lambda_w when `full`, for min_cost)."""
    index, w = served_coefficients(cand)
    demand = model_arrays(cand).class_demand
    n = len(demand)
    lo = demand if full else np.full(n, -INF)
    return Block("demand", n, w, cols.use_offset + index, np.ones(len(index)), lo, demand)


def define_devices(cand: Candidates, cols: Columns) -> Block:
    """sum_{pools on k} t * x[pool] - b[k] <= N_k for every device type k (b[k] only where purchasable),
    written over the instance counts of instance_units: n[s] for a shape's pools, x for a pool alone."""
    t = model_arrays(cand)
    unit_cols, unit_pools = instance_units(cand, cols)
    rows = t.pool_device[unit_pools]
    n = len(t.count)
    tp = t.pool_tp[unit_pools]
    buy_rows, buy_cols, buy_vals = define_purchases(cand, cols)
    return Block(
        "devices",
        n,
        np.concatenate([rows, buy_rows]),
        np.concatenate([unit_cols, buy_cols]),
        np.concatenate([tp, buy_vals]),
        np.full(n, -INF),
        t.count,
    )


def shape_numbers(cand: Candidates) -> np.ndarray:
    """Per pool, the number s (0, 1, ...) of its pool shape (KEY: owner, role, device, tp, batch) among the
    shapes offered as more than one pool (headroom levels, mixes), or -1 where the pool is its shape's only
    one."""
    key = model_arrays(cand).pool_key
    multi = np.bincount(key)[key] > 1
    numbers = np.full(len(key), -1)
    numbers[multi] = np.unique(key[multi], return_inverse=True)[1]
    return numbers


def instance_units(cand: Candidates, cols: Columns | None) -> tuple[np.ndarray, np.ndarray]:
    """(column, a pool of it) for every instance count the device rows add up: the n[s] column of each
    shape with several pools (define_shapes) and the x column of each pool alone in its shape. The pools of
    one shape share device and tp, so one pool stands for the shape. Without shape columns: every x."""
    n_pools = len(cand.pools)
    shape = cols.shape if cols is not None and len(cols.shape) else np.full(n_pools, -1)
    alone = np.flatnonzero(shape < 0)
    numbers, first = np.unique(shape, return_index=True)
    first = first[numbers >= 0]
    offset = cols.shape_offset if cols is not None else 0
    return np.concatenate([alone, offset + shape[first]]), np.concatenate([alone, first])


def device_use_row(cand: Candidates, cols: Columns, device: str) -> np.ndarray:
    """The coefficients of `sum_{pools on device} t * x` over the full column vector (written over
    instance_units, as the device rows are): how many devices of that type a plan uses, bought ones
    included."""
    t = model_arrays(cand)
    unit_cols, unit_pools = instance_units(cand, cols)
    on = cand.pools["device"].to_numpy()[unit_pools] == device
    row = np.zeros(cols.size)
    row[unit_cols[on]] = t.pool_tp[unit_pools[on]]
    return row


def define_shapes(cand: Candidates, cols: Columns) -> Block:
    """sum_{pools of shape s} x[pool] - n[s] = 0 for every pool shape with several pools (its headroom
    levels and mixes: near-twin integer columns).

    n[s] is x's image, so the integer points, the optima and the LP relaxation are those of the model over
    x alone; the device rows are written over n (instance_units), so HiGHS sees "how many instances of this
    shape" as one integer column and branches on it. Measured in docs/solvers.md ("Shape columns"):
    paper.json's goodput MIP at 13 budgets x 3 HiGHS seeds, 27,927 -> 11,066 nodes. An n[s] that only sat in
    its own equality row would be substituted away by presolve (measured: 1,008 nodes, unchanged)."""
    if not cols.n_shapes:
        return _empty("shapes")
    member = np.flatnonzero(cols.shape >= 0)
    n = cols.n_shapes
    return Block(
        "shapes",
        n,
        np.concatenate([cols.shape[member], np.arange(n)]),
        np.concatenate([member, cols.shape_offset + np.arange(n)]),
        np.concatenate([np.ones(len(member)), -np.ones(n)]),
        np.zeros(n),
        np.zeros(n),
    )


def owner_numbers(cand: Candidates) -> np.ndarray:
    """Per pool, the number o (0, 1, ...) of its owner (a model, or a class under per-class pooling)."""
    return model_arrays(cand).pool_owner


def define_switches(cand: Candidates, cols: Columns) -> Block:
    """Per owner o with pools: served[o] - Lambda_o * z[o] <= 0, sum_{units of o that prefill} n - z[o] >= 0
    and sum_{units of o that decode} n - z[o] >= 0, with z[o] binary (a valid inequality per owner).

    served[o] is the sum of served[w] over the owner's classes and Lambda_o their demand; a unit prefills
    when its role is prefill or colocated, decodes when decode or colocated (instance_units: n[s] for a
    shape's pools, x for a pool alone). Valid: an integer plan that serves any of o's requests has a
    colocated instance, or a prefill instance whose KV flow lands on a decode instance (the KV-flow rows),
    so z[o] = 1 keeps all three rows; one that serves none takes z[o] = 0. Every integer plan extends, so
    the optima are unchanged.

    What it buys is a branch the solver can take: z[o] = 0 takes the owner out (its flows to 0), z[o] = 1
    pays for a whole prefill and a whole decode instance before any of its demand counts. Under a budget
    the LP relaxation serves a sliver of an owner with slivers of instances bought from the last dollars;
    branching on x alone proves that no whole pair fits only after thousands of nodes (docs/solvers.md,
    "Owner switches": paper.json at 20.61 $/h, 754-7,796 nodes -> 7-8). On every strengthened model since
    session 22, whose budget rows are there without a budget too (budget_row).
    """
    n = cols.n_switches
    if not n:
        return _empty("switches")
    t = model_arrays(cand)
    index, w = served_coefficients(cand)
    served_owner = cols.switch[t.pool[index]]
    pairs = np.unique(np.stack([served_owner, w]), axis=1)
    demand = np.bincount(pairs[0], weights=t.class_demand[pairs[1]], minlength=n)
    unit_cols, unit_pools = instance_units(cand, cols)
    role, owner = t.pool_role[unit_pools], cols.switch[unit_pools]
    prefills, decodes = role != "decode", role != "prefill"
    z = cols.switch_offset + np.arange(n)
    return Block(
        "switches",
        3 * n,
        np.concatenate([served_owner, n + owner[prefills], 2 * n + owner[decodes], np.arange(3 * n)]),
        np.concatenate([cols.use_offset + index, unit_cols[prefills], unit_cols[decodes], z, z, z]),
        np.concatenate([np.ones(len(index) + prefills.sum() + decodes.sum()), -demand, -np.ones(2 * n)]),
        np.concatenate([np.full(n, -INF), np.zeros(2 * n)]),
        np.concatenate([np.zeros(n), np.full(2 * n, INF)]),
    )


def switch_values(cand: Candidates, cols: Columns, x: np.ndarray) -> np.ndarray:
    """z[o] for integer instances `x` (per pool): 1 where owner o has an instance that prefills and one that
    decodes, else 0. With any flows x carries, the switch rows of define_switches then hold."""
    n = cols.n_switches
    if not n:
        return np.zeros(0)
    role = model_arrays(cand).pool_role
    held = np.asarray(x, float) >= 1 - 1e-9
    prefill = np.bincount(cols.switch[held & (role != "decode")], minlength=n) > 0
    decode = np.bincount(cols.switch[held & (role != "prefill")], minlength=n) > 0
    return (prefill & decode).astype(float)


def purchasable(cand: Candidates) -> np.ndarray:
    """Device rows (positions in cand.devices) whose type may be bought beyond its count."""
    t = model_arrays(cand)  # capacity is count where the table has no capacity column
    return np.flatnonzero(t.capacity > t.count)


def define_purchases(cand: Candidates, cols: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The b[k] entries of the device rows: -1 * b[k], 0 <= b[k] <= max_count_k - N_k, b integer.

    Bought devices cost what owned ones do (c_k per device in use, already in the budget row and the cost
    objective through x), so b[k] only lifts the device row; the plan reports bought = max(0, used - N_k).
    """
    return cols.buy, cols.buy_offset + np.arange(len(cols.buy)), -np.ones(len(cols.buy))


def define_linking(cand: Candidates, cols: Columns) -> Block:
    """f[use] - min(lambda_w, rho * r) * x[pool] <= 0 for every use whose class's demand is below what one
    instance carries (lambda_w < rho * r): a valid inequality per pool and class.

    Valid: at x = 0 the capacity row already forces f = 0; at an integer x >= 1, f <= lambda_w (its column
    bound) <= lambda_w * x. Where lambda_w >= rho * r the capacity row alone implies it (the other flows
    are >= 0), so those rows are left out. A prefill use with several keys gets one row per key (each key's
    flow is at most lambda_w too). It stops the LP relaxation from buying a small class's whole demand with
    a sliver of an instance.
    """
    t = model_arrays(cand)
    pool, demand = t.pool, t.demand
    per_instance = t.pool_rho[pool] * t.rate
    small = np.flatnonzero(demand < per_instance * (1 - 1e-9))
    n = len(small)
    rows = np.concatenate([np.arange(n), np.arange(n)])
    columns = np.concatenate([cols.use_offset + small, pool[small]])
    vals = np.concatenate([np.ones(n), -demand[small]])
    return Block("linking", n, rows, columns, vals, np.full(n, -INF), np.zeros(n))


def define_device_cuts(cand: Candidates, cols: Columns) -> Block:
    """Chvatal-Gomory cuts of the device rows: sum_{pools on k, t >= d} floor(t / d) * x <= floor(N_k / d)
    for every device type k and every tp d > 1 of its pools with N_k % d != 0 (a valid inequality per
    device type), over the same instance counts as the device rows (instance_units).

    Valid: divide sum t * x <= N_k by d, round every coefficient down (x >= 0) and then the right-hand side
    (the left-hand side is an integer). With N_k % d == 0 the cut is implied by the device row itself, so
    only the others are added. For example N = 7 GPUs and tp 2 or 4 pools: x2 + 2 x4 <= 3, where the LP
    could otherwise use 3.5 tp-2 instances. For a purchasable type N_k is its capacity (count plus what
    may be bought, `Device.max_count`): sum t x <= N_k + b_k <= capacity, so the cut stays valid.
    """
    t = model_arrays(cand)
    unit_cols, unit_pools = instance_units(cand, cols)
    # a purchasable type may reach its capacity (count + what may be bought): the cut holds at that N_k
    return device_cuts(t.capacity, t.pool_device[unit_pools], t.pool_tp.astype(int)[unit_pools], unit_cols)


def device_cuts(capacity: np.ndarray, device: np.ndarray, tp: np.ndarray, unit_cols: np.ndarray) -> Block:
    """define_device_cuts' rows from N_k per device type (`capacity`) and, per instance count (column
    `unit_cols`), its device type's position and its tp."""
    rows, columns, vals, hi = [], [], [], []
    for k, n_k in enumerate(capacity):
        on_k = device == k
        for d in np.unique(tp[on_k & (tp > 1)]):
            if n_k % d == 0:
                continue
            hit = np.flatnonzero(on_k & (tp >= d))
            rows.append(np.full(len(hit), len(hi)))
            columns.append(unit_cols[hit])
            vals.append(np.floor(tp[hit] / d))
            hi.append(np.floor(n_k / d))
    if not hi:
        return _empty("device_cuts")
    n = len(hi)
    return Block(
        "device_cuts",
        n,
        np.concatenate(rows),
        np.concatenate(columns),
        np.concatenate(vals).astype(float),
        np.full(n, -INF),
        np.array(hi),
    )


def define_nic(cand: Candidates, cols: Columns, strengthen: bool = True) -> Block:
    """Per disaggregated pool on a device with a NIC: sum_w f * 8 S_w / 1e9 - min(nic_rho * t * NIC_k, T) * x
    <= 0, T the most KV traffic the pool can carry (pool_ceilings; strengthened as in define_capacity)."""
    t = model_arrays(cand)
    nic = t.nic[t.pool_device]
    limited = np.flatnonzero((t.pool_role != "colocated") & np.isfinite(nic))
    row_of_pool = np.full(len(nic), -1)
    row_of_pool[limited] = np.arange(len(limited))
    use_rows = row_of_pool[t.pool]
    mine = use_rows >= 0
    kv = t.kv_gbit
    rows = np.concatenate([use_rows[mine], np.arange(len(limited))])
    columns = np.concatenate([cols.use_offset + np.flatnonzero(mine), limited])
    capacity = t.pool_tp * nic * t.pool_nic_rho
    if strengthen:
        capacity = np.minimum(capacity, pool_ceilings(cand)[1])
    capacity = capacity[limited]
    vals = np.concatenate([kv[mine], -capacity])
    n = len(limited)
    return Block("nic", n, rows, columns, vals, np.full(n, -INF), np.zeros(n))


def define_links(cand: Candidates, cols: Columns) -> Block:
    """sum_{w, P on k_p -> decode on k_d} f * 8 S_w / 1e9 <= rho_L * L[k_p -> k_d]; over k_p != k_d:
    <= rho_B * kv_budget.

    rho on these shared budgets goes beyond the v1 contract: a link planned at 100% queues without bound
    (docs/simulation.md). Flat: max_utilization; queueing: the M/D/1 cap of the tightest class that may
    cross it (candidates.link_headroom).
    """
    request = cand.request
    t = model_arrays(cand)
    prefill = t.role == "prefill"
    kv, source, target = t.kv_gbit, t.device, t.key
    rho = cand.link_rho
    rows, columns, vals, hi = [], [], [], []
    limits = [(link.source, link.target, link.gbps) for link in request.links]
    for index, (src, dst, gbps) in enumerate(limits):
        hit = np.flatnonzero(prefill & (source == src) & (target == dst))
        rows.append(np.full(len(hit), index))
        columns.append(cols.use_offset + hit)
        vals.append(kv[hit])
        hi.append(rho[(src, dst)] * gbps)
    if request.kv_budget_gbps is not None:
        hit = np.flatnonzero(prefill & (source != target) & (target != ANY_DEVICE))
        rows.append(np.full(len(hit), len(limits)))
        columns.append(cols.use_offset + hit)
        vals.append(kv[hit])
        hi.append(rho[None] * request.kv_budget_gbps)
    n = len(hi)
    if n == 0:
        return _empty("links")
    return Block(
        "links",
        n,
        np.concatenate(rows),
        np.concatenate(columns),
        np.concatenate(vals),
        np.full(n, -INF),
        np.array(hi),
    )


def fleet_cost(request: PlanRequest) -> float:
    """What every device at its capacity (owned plus purchasable) costs per hour: the most the budget row
    can ever charge, so any budget from here up constrains nothing."""
    return float(sum(d.cost_per_hour * d.capacity for d in request.devices))


def budget_row(request: PlanRequest) -> float:
    """The right-hand side of the model's budget rows: options.budget_per_hour where it is below the
    fleet's cost (`fleet_cost`, the most the rows can charge), else that cost, which binds nothing.

    Every request's model has the rows, its device-use columns u[k] and its owner switches z[o]
    (define_device_use, define_switches), budgeted or not (session 22). A budget at or above the fleet's
    cost, and no budget at all, are then one model with one plan. Before, the rows' right-hand side
    alone, binding nothing, steered the solver to one or another plan of the same MILP value, which the
    passes after the MILP credit differently (paper.json: 56.019 SLO RPS under 40 $/h, 55.990 under 23.64
    or 60 $/h, 56.010 without a budget; now 56.019 for all four), and the request without a budget ran
    the model without u and z, whose MIP takes paper.json 1.2 s against 0.55 s (docs/solvers.md, "Budget
    rows on every model")."""
    budget = request.options.budget_per_hour
    if budget is None or spends_all(request, budget):
        return fleet_cost(request)
    return float(budget)


def budget_binds(request: PlanRequest) -> bool:
    """Whether the request's budget may cut a plan off: there is one, below the fleet's cost."""
    budget = request.options.budget_per_hour
    return budget is not None and not spends_all(request, budget)


def spends_all(request: PlanRequest, budget: float) -> bool:
    """Whether `budget` buys every device of the request at its capacity (`fleet_cost`): it cuts no plan
    off."""
    return budget >= fleet_cost(request) - BUDGET_SLACK


def define_budget(cand: Candidates, cols: Columns) -> Block:
    """sum_k c_k * sum_{pools on k} t * x[pool] <= budget_per_hour, and the same over the device counts:
    sum_k c_k * u[k] <= budget_per_hour (define_device_use), the budget taken at most at the fleet's cost
    (`budget_row`)."""
    budget = budget_row(cand.request)
    cost = pool_cost(cand)
    nz = np.flatnonzero(cost)
    price = model_arrays(cand).price
    on = np.flatnonzero(price[: cols.n_used])
    rows = np.concatenate([np.zeros(len(nz), int), np.ones(len(on), int)])
    columns = np.concatenate([nz, cols.used_offset + on])
    n = 1 + int(cols.n_used > 0)
    return Block(
        "budget",
        n,
        rows,
        columns,
        np.concatenate([cost[nz], price[on]]),
        np.full(n, -INF),
        np.full(n, budget),
    )


def define_device_use(cand: Candidates, cols: Columns) -> Block:
    """sum_{pools on k} t * x[pool] - u[k] = 0: u[k], integer in [0, capacity_k], counts the devices of
    type k a plan uses (bought ones included). The budget row over u (define_budget) is a knapsack over a
    handful of integers whose cover cuts HiGHS derives at once; over the pools' x it is one over hundreds.
    The same integer points and optima (u is x's image); measured in docs/solvers.md ("HiGHS options":
    1.3-2.5x fewer CPU ms on paper.json's budget points). On every model, a budget or not (budget_row)."""
    if not cols.n_used:
        return _empty("device_use")
    t = model_arrays(cand)
    unit_cols, unit_pools = instance_units(cand, cols)
    rows = t.pool_device[unit_pools]
    n = cols.n_used
    return Block(
        "device_use",
        n,
        np.concatenate([rows, np.arange(n)]),
        np.concatenate([unit_cols, cols.used_offset + np.arange(n)]),
        np.concatenate([t.pool_tp[unit_pools], -np.ones(n)]),
        np.zeros(n),
        np.zeros(n),
    )


def define_fairness(cand: Candidates, cols: Columns) -> Block:
    """served[w] - phi * lambda_w >= 0 for every class with demand and a candidate (max_min_fraction)."""
    if not cols.has_phi:
        return _empty("fairness")
    index, w = served_coefficients(cand)
    demand = servable_demand(cand)  # a class no pool can serve would pin phi at 0
    with_demand = np.flatnonzero(demand > 0)
    rows = np.concatenate([w, with_demand])
    columns = np.concatenate([cols.use_offset + index, np.full(len(with_demand), cols.phi)])
    vals = np.concatenate([np.ones(len(index)), -demand[with_demand]])
    n = len(demand)
    lo = np.where(demand > 0, 0.0, -INF)
    return Block("fairness", n, rows, columns, vals, lo, np.full(n, INF))


KEY = ["owner", "role", "device", "tp", "batch"]


@dataclass(frozen=True)
class Churn:
    """The plan in force, for a churn-limited re-plan (docs/formulation.md, "Churn").

    `previous`: one row per pool of that plan: owner (model, or class under pooling = "class"), role,
    device, tp, batch, rho (its headroom level) and instances. `max_moves`: at most this many instances
    added or removed in all (None: no limit). `penalty`: added to the cost objective per instance moved.
    """

    previous: pd.DataFrame
    max_moves: int | None
    penalty: float

    @classmethod
    def from_pools(cls, pools, pooling: str, max_moves: int | None, penalty: float) -> "Churn":
        """From a Plan's `pools` (models.plan.Pool)."""
        rows = [
            {
                "owner": p.workload if pooling == "class" and p.workload else p.model,
                "role": p.role,
                "device": p.device,
                "tp": p.tp,
                "batch": p.batch,
                "rho": p.headroom,
                "instances": p.instances,
            }
            for p in pools
        ]
        frame = pd.DataFrame(rows, columns=[*KEY, "rho", "instances"])
        return cls(frame, max_moves, float(penalty))


def pool_keys(cand: Candidates) -> np.ndarray:
    """The key k (owner, role, device, tp, batch) of each pool column, numbered 0..K-1: the headroom
    levels of one kind of pool share a key, so moving load between levels is not churn."""
    return model_arrays(cand).pool_key


def previous_by_key(cand: Candidates) -> tuple[np.ndarray, float]:
    """Instances of the plan in force per key k, and those on keys no candidate pool has (all removed)."""
    churn: Churn = cand.churn  # type: ignore[assignment]
    keys = cand.pools[KEY].assign(k=pool_keys(cand)).drop_duplicates(KEY)
    previous = churn.previous.groupby(KEY, as_index=False)["instances"].sum()
    merged = previous.merge(keys, on=KEY, how="left")
    known = merged["k"].notna().to_numpy()
    per_key = np.zeros(len(keys))
    np.add.at(per_key, merged.loc[known, "k"].to_numpy(int), merged.loc[known, "instances"].to_numpy(float))
    return per_key, float(merged.loc[~known, "instances"].sum())


def previous_instances(cand: Candidates) -> np.ndarray:
    """Instances of the plan in force per pool column: a pool of the old plan goes to the column of its
    key and headroom level, or to its key's column with the lowest headroom when that level is gone."""
    churn: Churn = cand.churn  # type: ignore[assignment]
    pools = cand.pools.assign(col=np.arange(len(cand.pools)))
    x = np.zeros(len(pools))
    lowest = pools.sort_values("rho", kind="stable").drop_duplicates(KEY)
    for _, row in churn.previous.iterrows():  # one row per pool of the old plan: tens at most
        same = pools[(pools[KEY] == row[KEY].to_numpy()).all(axis=1)]
        exact = same[np.isclose(same["rho"].to_numpy(float), float(row["rho"]))]
        if len(exact):
            x[int(exact["col"].iloc[0])] += row["instances"]
        elif len(same):
            x[int(lowest.loc[lowest.index.isin(same.index), "col"].iloc[0])] += row["instances"]
    return x


def define_churn(cand: Candidates, cols: Columns) -> Block:
    """d[k] >= |sum_{pools of key k} x - x_prev[k]| for every key k, and with max_moves:
    sum_k d[k] <= max_moves - (instances of the plan in force on keys no candidate has).

    Linearized: sum x - d[k] <= x_prev[k] and sum x + d[k] >= x_prev[k]; d costs `penalty` in the cost
    objective (objective_vectors), so a re-plan only moves instances that buy goodput or savings."""
    if not cols.n_churn:
        return _empty("churn")
    churn: Churn = cand.churn  # type: ignore[assignment]
    key = pool_keys(cand)
    per_key, gone = previous_by_key(cand)
    n_keys = cols.n_churn
    d = cols.churn_offset + np.arange(n_keys)
    pools = np.arange(cols.n_pools)
    # rows 0..K-1: sum x - d <= prev; rows K..2K-1: sum x + d >= prev
    rows = [key, np.arange(n_keys), n_keys + key, n_keys + np.arange(n_keys)]
    columns = [pools, d, pools, d]
    vals = [np.ones(cols.n_pools), -np.ones(n_keys), np.ones(cols.n_pools), np.ones(n_keys)]
    lo = [np.full(n_keys, -INF), per_key]
    hi = [per_key, np.full(n_keys, INF)]
    if churn.max_moves is not None:
        rows.append(np.full(n_keys, 2 * n_keys))
        columns.append(d)
        vals.append(np.ones(n_keys))
        lo.append(np.array([-INF]))
        hi.append(np.array([churn.max_moves - gone]))
    n = 2 * n_keys + int(churn.max_moves is not None)
    return Block(
        "churn",
        n,
        np.concatenate(rows),
        np.concatenate(columns),
        np.concatenate(vals),
        np.concatenate(lo),
        np.concatenate(hi),
    )


def churn_bounds(cand: Candidates, cols: Columns, hi: np.ndarray) -> np.ndarray:
    """Let x keep the plan in force's instances (within the devices) even where the demand no longer
    needs them: removing them is a move, the solver's choice under max_moves and the penalty."""
    t = model_arrays(cand)
    fit = np.floor(t.count[t.pool_device] / t.pool_tp)
    hi = hi.copy()
    hi[: cols.n_pools] = np.maximum(hi[: cols.n_pools], np.minimum(fit, previous_instances(cand)))
    hi[cols.shape_offset : cols.switch_offset] = _shape_bounds(cols, hi[: cols.n_pools], _fit(cand))  # n[s]
    return hi


def _empty(name: str) -> Block:
    nothing = np.zeros(0)
    return Block(name, 0, nothing.astype(int), nothing.astype(int), nothing, nothing, nothing)


def pool_cost(cand: Candidates) -> np.ndarray:
    """Cost per hour of one instance of each pool: c_k * t."""
    t = model_arrays(cand)
    return t.price[t.pool_device] * t.pool_tp


def column_bounds(
    cand: Candidates, cols: Columns, strengthen: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x in [0, min(N_k // t, instances needed for all demand)], f in [0, min(lambda_w, r * rho * x_hi)],
    s >= 0, phi in [0, 1].

    The instance cap is what serving every class of the pool fully would need (capacity and NIC); more
    instances can never serve more, so the cap keeps every optimum while shrinking the branch-and-bound tree.
    A flow is at most its class's demand and at most what the pool's capacity row allows at the cap
    (f / r <= rho * x <= rho * x_hi, the other flows being >= 0).
    """
    t = model_arrays(cand)
    tp = t.pool_tp
    fit = _fit(cand)
    rho = t.pool_rho
    load, traffic = pool_ceilings(cand)
    nic = t.nic[t.pool_device]
    nic_cap = tp * nic * t.pool_nic_rho
    with np.errstate(divide="ignore", invalid="ignore"):  # colocated pools and devices without a NIC: 0
        nic_need = np.where(np.isfinite(nic) & (t.pool_role != "colocated"), traffic / nic_cap, 0.0)
    need = np.ceil(np.maximum(load / rho, nic_need) - 1e-9)
    x_hi = np.minimum(fit, need)
    pool = t.pool
    demand = t.demand
    f_hi = demand
    if strengthen:
        f_hi = np.minimum(demand, t.rate * rho[pool] * x_hi[pool])
    lo = np.zeros(cols.size)
    spare = (t.capacity - t.count)[cols.buy]
    hi = np.concatenate(
        [
            x_hi,
            f_hi,
            np.full(len(cols.chain), INF),
            np.ones(int(cols.has_phi)),
            np.full(cols.n_churn, INF),
            spare,
            t.capacity[: cols.n_used],
            _shape_bounds(cols, x_hi, fit),
            np.ones(cols.n_switches),
        ]
    )
    integer = np.zeros(cols.size, dtype=bool)
    integer[: cols.n_pools] = True
    integer[cols.buy_offset :] = True  # b[k], u[k], n[s] and z[o]
    return lo, hi, integer


def _fit(cand: Candidates) -> np.ndarray:
    """Per pool: how many of its instances fit on every device of its type (count plus purchasable)."""
    t = model_arrays(cand)
    return np.floor(t.capacity[t.pool_device] / t.pool_tp)


def _shape_bounds(cols: Columns, x_hi: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """n[s] in [0, min(sum of its pools' x bounds, N_k // t)] (the pools of a shape share device and tp)."""
    member = np.flatnonzero(cols.shape >= 0)
    summed = np.bincount(cols.shape[member], weights=x_hi[member], minlength=cols.n_shapes)
    fits = np.full(cols.n_shapes, INF)
    np.minimum.at(fits, cols.shape[member], fit[member])
    return np.minimum(summed, fits)


def _capacity_column(devices: pd.DataFrame) -> str:
    """ "capacity" (owned plus purchasable) where the device table has it, else "count"."""
    return "capacity" if "capacity" in devices else "count"


def objective_vectors(cand: Candidates, cols: Columns) -> dict[str, np.ndarray]:
    """goodput (sum_w v_w served_w), cost (per hour; device count when no device has a price), phi."""
    goodput = np.zeros(cols.size)
    index, w = served_coefficients(cand)
    t = model_arrays(cand)
    goodput[cols.use_offset + index] = t.class_weight[w]
    cost = np.zeros(cols.size)
    price = pool_cost(cand)
    cost[: cols.n_pools] = price if price.any() else t.pool_tp
    vectors = {"goodput": goodput, "cost": cost}
    if cols.has_phi:
        phi = np.zeros(cols.size)
        phi[cols.phi] = 1.0
        vectors["phi"] = phi
    if cols.n_churn:
        cost[cols.churn_offset : cols.buy_offset] = cand.churn.penalty  # type: ignore[union-attr]
    return vectors


def build_matrix(cand: Candidates, strengthen: bool = True) -> tuple[MatrixForm, Columns]:
    """Stack every constraint family into one CSR matrix, in the order of docs/formulation.md.

    `strengthen=False` builds the plain model (no coefficient strengthening, no tightened flow bounds, no
    valid inequalities, no shape columns n[s], no owner switches z[o]): the same integer points and optima, a
    weaker LP relaxation; tests compare the two. The shape and switch columns come last, so the plain model's
    columns are a prefix.
    """
    objective = cand.request.options.objective
    cols = model_columns(cand, strengthen)
    blocks = [
        define_capacity(cand, cols, strengthen),
        define_kv_flow(cand, cols),
        define_demand(cand, cols, full=objective == "min_cost"),
        define_devices(cand, cols),
        define_nic(cand, cols, strengthen),
        define_links(cand, cols),
        define_budget(cand, cols),
        define_fairness(cand, cols),
        define_churn(cand, cols),
        define_device_use(cand, cols),
        define_shapes(cand, cols),
    ]
    if strengthen:  # valid inequalities (docs/formulation.md, "Strengthening"): they cut fractional x only
        blocks += [define_linking(cand, cols), define_device_cuts(cand, cols), define_switches(cand, cols)]
    lo, hi, integer = column_bounds(cand, cols, strengthen)
    if cand.churn is not None:
        hi = churn_bounds(cand, cols, hi)
    A, row_lo, row_hi, row_blocks = stack_blocks(blocks, cols.size)
    form = MatrixForm(
        A=A,
        row_lo=row_lo,
        row_hi=row_hi,
        col_lo=lo,
        col_hi=hi,
        integer=integer,
        row_blocks=row_blocks,
        objectives=objective_vectors(cand, cols),
    )
    return form, cols


def model_columns(cand: Candidates, strengthen: bool = True) -> Columns:
    """The column layout of build_matrix's model: the pools, the uses and the optional blocks the request
    asks for (phi, churn moves, purchases), u[k] on every model (budget_row), and on the strengthened
    model the shape columns n[s] and the owner switches z[o] (with the budget rows on every model)."""
    churn_keys = pool_keys(cand) if cand.churn is not None else None
    return Columns(
        len(cand.pools),
        len(cand.uses),
        chain_columns(cand),
        cand.request.options.objective == "max_min_fraction",
        0 if churn_keys is None else int(churn_keys.max(initial=-1)) + 1,
        purchasable(cand),
        len(cand.devices),
        shape_numbers(cand) if strengthen else np.full(len(cand.pools), -1),
        owner_numbers(cand) if strengthen else np.zeros(0, np.int64),
    )


def stack_blocks(
    blocks: list[Block], n_cols: int
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, list[tuple[str, int, int]]]:
    """The constraint families one under the other: the CSR matrix (duplicates summed, zeros dropped), the
    row bounds and each family's (name, first row, end row)."""
    offsets = np.cumsum([0] + [b.n_rows for b in blocks])
    rows = np.concatenate([b.rows + off for b, off in zip(blocks, offsets, strict=False)])
    columns = np.concatenate([b.cols for b in blocks])
    vals = np.concatenate([b.vals for b in blocks])
    A = sp.csr_matrix((vals, (rows, columns)), shape=(int(offsets[-1]), n_cols))
    A.sum_duplicates()
    A.eliminate_zeros()
    row_blocks = [(b.name, int(s), int(s + b.n_rows)) for b, s in zip(blocks, offsets, strict=False)]
    return A, np.concatenate([b.lo for b in blocks]), np.concatenate([b.hi for b in blocks]), row_blocks


def with_matrix_memo(cand: Candidates) -> Candidates:
    """A copy of `cand` whose models matrix_for keeps (for a what-if sweep's shared tables). Its memo is its
    own, so the candidate cache's sets, which a service keeps across requests, never hold models."""
    return replace(cand, memo={**cand.memo, "matrices": OrderedDict()})


def matrix_for(cand: Candidates) -> tuple[MatrixForm, Columns]:
    """build_matrix(cand); on tables from with_matrix_memo, built once per request but for the budget's value.

    A what-if budget sweep (and its marginal values) plans one request at many budgets on the same tables:
    only the budget rows' right-hand side differs, so the model is kept in `cand.memo` (shared by the
    copies a sweep makes of the tables; at most MATRIX_MEMO_SIZE models) and each call gets a copy with its
    own budget and bounds. A kept model is used only for the very pools, uses and classes frames and the
    same devices and link headroom it was built from (a copy with other tables builds anew); a
    churn-limited re-plan always builds.
    """
    kept = cand.memo.get("matrices")
    if kept is None or cand.churn is not None:
        return build_matrix(cand)
    options = cand.request.options
    budget = budget_row(cand.request)
    # the request but for the budget's value (every model has the same budget rows and columns)
    unbudgeted = msgspec.structs.replace(options, budget_per_hour=None)
    key = (encode(msgspec.structs.replace(cand.request, options=unbudgeted)), cand.keyed)
    tables = (cand.pools, cand.uses, cand.classes)
    with _MATRIX_LOCK:
        hit = kept.get(key)
        if hit is not None and _same_tables(hit, cand, tables):
            kept.move_to_end(key)
            return _with_budget(hit[3], budget), hit[4]
    form, cols = build_matrix(cand)
    with _MATRIX_LOCK:
        kept[key] = (tables, cand.devices, dict(cand.link_rho), form, cols)
        while len(kept) > MATRIX_MEMO_SIZE:
            kept.popitem(last=False)
    return _with_budget(form, budget), cols


def _same_tables(hit: tuple, cand: Candidates, tables: tuple) -> bool:
    kept_tables, devices, link_rho = hit[0], hit[1], hit[2]
    return (
        all(a is b for a, b in zip(kept_tables, tables, strict=True))
        and devices.equals(cand.devices)
        and link_rho == dict(cand.link_rho)
    )


def _with_budget(form: MatrixForm, budget: float) -> MatrixForm:
    """A copy of `form` (bounds copied, matrix and objective vectors shared: no step writes to them) whose
    budget rows (define_budget) allow `budget`."""
    row_hi = form.row_hi.copy()
    for name, begin, end in form.row_blocks:
        if name == "budget":
            row_hi[begin:end] = budget
    return replace(
        form,
        row_lo=form.row_lo.copy(),
        row_hi=row_hi,
        col_lo=form.col_lo.copy(),
        col_hi=form.col_hi.copy(),
        objectives=dict(form.objectives),
    )
