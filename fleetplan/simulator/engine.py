"""The event loop: a heap of timed events merged with the sorted arrivals, one handler per event kind.

    arrival      -> on_arrival       join the shortest queue of the route's first pool
    PREFILL_DONE -> on_prefill_done  a prefill batch ends: first tokens (colocated) or KV sent to decode
    SEGMENT_END  -> on_segment_end   a decode segment (k steps at one occupancy) ends: finished ones leave
    KV_LANDED    -> on_kv_landed     a KV cache reached its decode instance: first token, wait for a slot

Hot-path choices (docs/simulation.md, "Engine"): events are `(time, seq, kind, subject, version)` tuples;
per-request state lives in plain Python lists indexed by request; a decode instance advances a whole
*segment* of steps with one event, and a segment cut short by a join leaves a stale event behind that its
version number tells apart.
"""

import heapq
import math

from fleetplan.simulator.kv import KvNetwork
from fleetplan.simulator.pools import COLOCATED, DECODE, DECODING, IDLE, PREFILLING, Instance, PoolState, pick
from fleetplan.simulator.service import ServiceTimes

# Event kinds on the heap (arrivals are not on the heap: they are merged from their sorted list).
PREFILL_DONE, SEGMENT_END, KV_LANDED = 0, 1, 2


class Engine:
    """The state of one replay. Requests are numbered in arrival order; `first_pool[r]` is the pool its route
    starts at (prefill or colocated), `decode_pool[r]` its decode pool (None when colocated)."""

    def __init__(
        self,
        arrival: list[float],
        outputs: list[int],
        first_pool: list[PoolState],
        decode_pool: list[PoolState | None],
        kv_gbit: list[float],
        network: KvNetwork,
        service: ServiceTimes,
        window: tuple[float, float],
        t_stop: float,
    ) -> None:
        n = len(arrival)
        self.arrival = arrival
        self.out = outputs
        self.first_pool = first_pool
        self.decode_pool = decode_pool
        self.kv_gbit = kv_gbit
        self.network = network
        self.prefill_s = service.prefill_s
        self.step_s = service.step_s
        self.win_lo, self.win_hi = window
        self.t_stop = t_stop
        self.t_start = [math.nan] * n  # prefill start
        self.t_first = [math.nan] * n  # first token (prefill done, or KV landed when disaggregated)
        self.t_done = [math.nan] * n
        self.t_ready = [math.nan] * n  # KV landed: ready for a decode slot
        self.kv_ms = [0.0] * n
        self.d_wait = [0.0] * n  # seconds waiting for a decode slot
        self.finish = [0] * n  # the instance step count at which the request leaves
        self.dec_of: list[Instance | None] = [None] * n
        self.heap: list = []
        self.seq = 0
        self.events = 0
        self.handlers = {
            PREFILL_DONE: self.on_prefill_done,
            SEGMENT_END: self.on_segment_end,
            KV_LANDED: self.on_kv_landed,
        }

    def run(self) -> None:
        """Pop-handle-push until t_stop: the earlier of the next heap event and the next arrival goes first
        (an event at the same time as an arrival goes before it)."""
        heap, arrival, handlers, t_stop = self.heap, self.arrival, self.handlers, self.t_stop
        pop = heapq.heappop
        n, i, events = len(arrival), 0, 0
        while True:
            if heap and (i >= n or heap[0][0] <= arrival[i]):
                now, _, kind, subject, version = pop(heap)
                if now > t_stop:
                    break
                events += 1
                handlers[kind](now, subject, version)
            elif i < n:
                events += 1
                self.on_arrival(arrival[i], i)
                i += 1
            else:
                break
        self.events = events

    def schedule(self, at: float, kind: int, subject, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, subject, version))

    def clip(self, a: float, b: float) -> float:
        """Length of [a, b] inside the measured window."""
        lo = a if a > self.win_lo else self.win_lo
        hi = b if b < self.win_hi else self.win_hi
        return hi - lo if hi > lo else 0.0

    # --- handlers, one per event kind -------------------------------------------------------------------

    def on_arrival(self, now: float, r: int) -> None:
        inst = pick(self.first_pool[r])
        inst.queue.append(r)
        if inst.phase == IDLE:
            self.try_start(inst, now)
        elif inst.role == COLOCATED and inst.phase == DECODING and len(inst.running) < inst.b:
            self.interrupt(inst, now)

    def on_prefill_done(self, now: float, inst: Instance, _version: int) -> None:
        batch = inst.batch
        inst.batch = []
        busy = self.clip(inst.seg_start, now)
        inst.busy += busy
        inst.slot_time += len(batch) * busy
        inst.phase = IDLE
        if inst.role == COLOCATED:
            self.first_tokens_here(inst, batch, now)
        else:
            for r in batch:
                self.send_kv(r, inst, now)
        self.try_start(inst, now)

    def on_segment_end(self, now: float, inst: Instance, version: int) -> None:
        if version != inst.version:
            return  # superseded: the segment was cut short by a join
        inst.steps += inst.seg_k
        busy = self.clip(inst.seg_start, now)
        inst.busy += busy
        inst.slot_time += len(inst.running) * busy
        steps, finish, t_done = inst.steps, self.finish, self.t_done
        keep = []
        for r in inst.running:
            if finish[r] <= steps:
                t_done[r] = now
            else:
                keep.append(r)
        inst.running = keep
        inst.phase = IDLE
        self.try_start(inst, now)

    def on_kv_landed(self, now: float, r: int, _version: int) -> None:
        dst = self.dec_of[r]
        dst.inbound -= 1
        self.t_first[r] = now
        if self.out[r] <= 1:
            self.t_done[r] = now
            return
        self.t_ready[r] = now
        dst.queue.append(r)
        if dst.phase == IDLE:
            self.try_start(dst, now)
        elif len(dst.running) < dst.b:
            self.interrupt(dst, now)

    # --- steps the handlers share -----------------------------------------------------------------------

    def first_tokens_here(self, inst: Instance, batch: list[int], now: float) -> None:
        """Colocated: the batch's first tokens are out; one-token requests are done, others take a slot."""
        t_first, t_done, out, finish = self.t_first, self.t_done, self.out, self.finish
        for r in batch:
            t_first[r] = now
            if out[r] <= 1:
                t_done[r] = now
            else:
                finish[r] = inst.steps + out[r] - 1
                inst.running.append(r)

    def send_kv(self, r: int, src: Instance, now: float) -> None:
        """Disaggregated: pick the decode instance (JSQ) and book the KV transfer to it."""
        dst = pick(self.decode_pool[r])
        dst.inbound += 1
        self.dec_of[r] = dst
        end = self.network.transfer(self.kv_gbit[r], src, dst, now)
        self.kv_ms[r] = 1e3 * (end - now)
        self.schedule(end, KV_LANDED, r)

    def try_start(self, inst: Instance, now: float) -> None:
        """An instance between batches or steps picks its next work."""
        if inst.role == DECODE:
            self.admit_decodes(inst, now)
        else:
            self.start_prefill(inst, now)

    def admit_decodes(self, inst: Instance, now: float) -> None:
        """Decode pool: waiting requests take free slots FIFO, then the next segment starts."""
        queue, running, b = inst.queue, inst.running, inst.b
        while queue and len(running) < b:
            r = queue.popleft()
            self.d_wait[r] = now - self.t_ready[r]
            self.finish[r] = inst.steps + self.out[r] - 1
            running.append(r)
        if running:
            self.start_segment(inst, now)
        else:
            inst.phase = IDLE

    def start_prefill(self, inst: Instance, now: float) -> None:
        """Prefill or colocated: take up to the free slots' worth of waiting requests as one batch (prefill
        first); else, colocated, run a decode segment."""
        queue = inst.queue
        free = inst.b - len(inst.running) if inst.role == COLOCATED else inst.b
        if queue and free > 0:
            n = min(free, len(queue))
            batch = [queue.popleft() for _ in range(n)]
            t_start = self.t_start
            for r in batch:
                t_start[r] = now
            dt = self.prefill_s(inst.pool, batch, n)
            inst.batch = batch
            inst.phase = PREFILLING
            inst.seg_start = now
            self.schedule(now + dt, PREFILL_DONE, inst)
        elif inst.running:
            self.start_segment(inst, now)
        else:
            inst.phase = IDLE

    def start_segment(self, inst: Instance, now: float) -> None:
        """Step the running batch until its next request leaves, at one sampled time per step."""
        running = inst.running
        finish = self.finish
        k = min(finish[r] for r in running) - inst.steps
        dt = self.step_s(inst.pool, running, len(running))
        inst.phase = DECODING
        inst.seg_start = now
        inst.seg_dt = dt
        inst.seg_k = k
        inst.version += 1
        self.schedule(now + k * dt, SEGMENT_END, inst, inst.version)

    def interrupt(self, inst: Instance, now: float) -> None:
        """End the running segment at the next step boundary so a waiting request can join."""
        j = int((now - inst.seg_start) / inst.seg_dt) + 1
        if j < inst.seg_k:
            inst.seg_k = j
            inst.version += 1
            self.schedule(inst.seg_start + j * inst.seg_dt, SEGMENT_END, inst, inst.version)
