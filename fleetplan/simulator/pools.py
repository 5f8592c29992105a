"""The plan as runtime state: pools with their latency curves, instances with their queues, and per class
the routes a request may take (docs/simulation.md, "Routing")."""

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.models.plan import Plan, PlanRequest, Pool
from fleetplan.profiler.tables import ProfileTable
from fleetplan.simulator.curves import Curve, CurveBook
from fleetplan.simulator.kv import KvNetwork

# Pool roles.
PREFILL, DECODE, COLOCATED = 0, 1, 2
ROLE_CODE = {"prefill": PREFILL, "decode": DECODE, "colocated": COLOCATED}

# Instance phases.
IDLE, PREFILLING, DECODING = 0, 1, 2


class PoolState:
    """One pool of the plan: its instances and, per class it serves, the TTFT and TBT curves."""

    __slots__ = ("batch", "classes", "index", "instances", "pool", "role", "single", "tbt", "ttft")

    def __init__(self, index: int, pool: Pool) -> None:
        self.index = index
        self.pool = pool
        self.role = ROLE_CODE[pool.role]
        self.batch = pool.batch
        self.classes: dict[int, int] = {}  # class index -> local index into ttft / tbt
        self.ttft: list[Curve] = []
        self.tbt: list[Curve] = []
        self.instances: list[Instance] = []
        self.single = True  # serves one class: no per-member curve lookup


class Instance:
    """One instance: FIFO queue, the requests in its current prefill batch and its decode slots."""

    __slots__ = (
        "b",
        "batch",
        "busy",
        "device",
        "inbound",
        "nic_bw",
        "nic_free",
        "phase",
        "pool",
        "queue",
        "role",
        "running",
        "seg_dt",
        "seg_k",
        "seg_start",
        "slot_time",
        "steps",
        "version",
    )

    def __init__(self, pool: PoolState, nic_bw: float, device: str) -> None:
        self.pool = pool
        self.role = pool.role
        self.b = pool.batch
        self.queue: deque[int] = deque()
        self.running: list[int] = []  # requests holding a decode slot
        self.batch: list[int] = []  # requests in the prefill batch under way
        self.phase = IDLE
        self.seg_start = self.seg_dt = 0.0  # start of the current prefill / segment; seconds per step
        self.seg_k = 0  # steps in the current segment
        self.steps = 0  # decode steps done so far (a request leaves when steps reaches its finish)
        self.version = 0  # bumped per segment: a segment-end event of an older version is stale
        self.inbound = 0  # KV transfers under way to this instance
        self.busy = 0.0  # seconds prefilling or stepping inside the measured window
        self.slot_time = 0.0  # slot-seconds used inside the measured window
        self.nic_bw = nic_bw
        self.nic_free = 0.0
        self.device = device


def pick(pool: PoolState) -> Instance:
    """Join-shortest-queue: load = queued + running + in the prefill batch + inbound KV; ties to the lowest
    index."""
    best = None
    best_load = 1 << 60
    for inst in pool.instances:
        ld = len(inst.queue) + len(inst.running) + len(inst.batch) + inst.inbound
        if ld < best_load:
            best, best_load = inst, ld
    return best


@dataclass
class Fleet:
    """Runtime pools and, per class, its routes with rps > 0: (first pool, decode pool or None) and the
    cumulative route shares rps / served."""

    pools: list[PoolState]
    routes: list[list[tuple[PoolState, PoolState | None]]]
    route_cum: list[list[float]]
    kv_gbit: list[float]
    network: KvNetwork


def check_plan_matches(request: PlanRequest, plan: Plan) -> None:
    """InputError (field "plan") unless `plan` can be a plan of `request`: the same classes in order, no
    class served above its demand or other than its routes carry, and no device type used beyond what
    the request has. A plan of another request (`fleetplan simulate PLAN --request OTHER`) was replayed
    as given: 4 GPUs simulated for a request with 1, a class renamed, 16 RPS admitted of a 1 RPS demand."""
    mine = [w.name for w in request.workloads]
    theirs = [r.name for r in plan.workloads]
    if mine != theirs:
        raise InputError(f"the plan's classes {theirs} are not the request's {mine}", field="plan")
    for w, result in zip(request.workloads, plan.workloads, strict=True):
        carried = sum(route.rps for route in result.routes)
        over = result.served_rps > w.rate_rps * (1 + 1e-6) + 1e-9
        if over or abs(carried - result.served_rps) > 1e-6 * max(1.0, result.served_rps):
            msg = (
                f"class {w.name!r}: the plan serves {result.served_rps:g} rps over routes carrying "
                f"{carried:g}, against a demand of {w.rate_rps:g} rps"
            )
            raise InputError(msg, field="plan")
    capacity = {d.name: d.capacity for d in request.devices}
    used: dict[str, int] = {}
    for pool in plan.pools:
        used[pool.device] = used.get(pool.device, 0) + pool.instances * pool.tp
    for name, n in used.items():
        if n > capacity.get(name, 0):
            msg = f"the plan uses {n} {name}, the request has {capacity.get(name, 0)}"
            raise InputError(msg, field="plan")


def build_fleet(request: PlanRequest, plan: Plan, table: ProfileTable) -> Fleet:
    """Pools and instances as the plan provisions them, each class's routes and the KV network (after
    check_plan_matches)."""
    check_plan_matches(request, plan)
    nic = {d.name: (math.inf if d.network_gbps is None else d.network_gbps) for d in request.devices}
    pools: list[PoolState] = []
    by_key: dict = {}
    for i, p in enumerate(plan.pools):
        rp = PoolState(i, p)
        rp.instances = [Instance(rp, nic[p.device] * p.tp, p.device) for _ in range(p.instances)]
        pools.append(rp)
        # a plan may run several separate groups of one pool shape (Pool.group: headroom levels)
        by_key[(p.workload or p.model, p.role, p.device, p.tp, p.batch, p.group)] = rp
    book = CurveBook(table)
    specs = request.model_specs()
    routes, route_cum, kv_gbit = [], [], []
    for w_index, (w, result) in enumerate(zip(request.workloads, plan.workloads, strict=True)):
        owner = w.name if request.options.pooling == "class" else w.model
        rps, mine = [], []
        for route in result.routes:
            if route.rps <= 0:
                continue
            if route.colocated is not None:
                refs = [("colocated", route.colocated)]
            else:
                refs = [("prefill", route.prefill), ("decode", route.decode)]
            hops = [_serve(by_key, book, w_index, w, owner, role, ref) for role, ref in refs]
            mine.append((hops[0], hops[1] if len(hops) > 1 else None))
            rps.append(route.rps)
        shares = np.array(rps, float)
        routes.append(mine)
        route_cum.append((np.cumsum(shares) / shares.sum()).tolist() if len(shares) else [])
        kv_gbit.append(specs[w.model].kv_gbit(w.prompt_tokens))
    for pool in pools:
        pool.single = len(pool.classes) <= 1
    return Fleet(pools, routes, route_cum, kv_gbit, KvNetwork.of(request))


def _serve(by_key: dict, book: CurveBook, w_index: int, w, owner: str, role: str, ref) -> PoolState:
    """The pool a route hop names; the first time it serves class w, its TTFT and TBT curves for w."""
    key = (owner, role, ref.device, ref.tp, ref.batch, ref.group)
    if key not in by_key or not by_key[key].instances:
        msg = f"class {w.name!r}: route uses pool {key} that the plan does not provision"
        raise InputError(msg, field="plan")
    pool = by_key[key]
    if w_index not in pool.classes:
        pool.classes[w_index] = len(pool.ttft)
        pool.ttft.append(book.curve(w.model, ref.device, ref.tp, w.prompt_tokens, "ttft", ref.batch))
        pool.tbt.append(book.curve(w.model, ref.device, ref.tp, w.prompt_tokens, "tbt", ref.batch))
    return pool
