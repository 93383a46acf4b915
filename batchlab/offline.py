"""The offline driver: serve a known workload to the end with ``Engine.step``.

``Engine.run(workload)`` calls ``serve_offline``. Each pass of its loop:

    admit the arrivals up to now          (the engine queues or rejects each)
    once every request has arrived        tell the scheduler (``start_draining``)
    step                                  plan, run, apply (``Engine.step``)
    if the plan was empty                 jump (virtual clock) or sleep (wall clock) to the next
                                          arrival or the scheduler's timer; stop when none is left

On the simulator (virtual clock) the fast path (``fast_path.py``) may stand in for a run of steps
that it can predict whole; the trace is the same.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

from batchlab.contract import EngineError
from batchlab.fast_path import DecodeRuns
from batchlab.listener import EngineListener
from batchlab.plan import Idle
from batchlab.requests import Request

if TYPE_CHECKING:   # the engine imports this driver, not the other way round
    from batchlab.engine import Engine
    from batchlab.trace import Trace


class ProgressBar(EngineListener):
    """A tqdm bar over ended requests (finished and released, rejected)."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, unit="req", desc=desc)

    def on_end(self, req: Request, t: float) -> None:
        self.bar.update(1)


def serve_offline(engine: "Engine", workload: list[Request], progress: bool = False) -> "Trace":
    """Serve ``workload`` (fresh requests, sorted by arrival) to the end; return the trace."""
    bar = ProgressBar(len(workload), type(engine.scheduler).__name__) if progress else None
    wall_start = time.perf_counter()
    # A large run creates millions of small objects and no reference cycles; Python's cyclic
    # garbage collector would scan them all again and again (about a third of a simulation's
    # time), so it is paused for the run. Reference counting still frees everything.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        num_fast_steps = _loop(engine, workload, bar)
        trace = engine.finish(num_fast_steps=num_fast_steps)
    finally:
        if gc_was_enabled:
            gc.enable()
        if bar is not None:
            bar.bar.close()
    trace.meta["wall_seconds"] = time.perf_counter() - wall_start
    return trace


def _loop(engine: "Engine", workload: list[Request], listener: EngineListener | None) -> int:
    """The driver's loop; returns how many steps the fast path computed."""
    scheduler, clock = engine.scheduler, engine.clock
    fast = DecodeRuns(engine) if DecodeRuns.applies(engine) else None
    now = engine.start(listener)
    i, n = 0, len(workload)              # the next request to arrive
    while True:
        now = clock.now(now)
        while i < n and workload[i].arrival_time <= now:
            engine.add_request(workload[i], now)
            i += 1
        if i == n and not scheduler.draining:
            scheduler.start_draining()
        next_arrival = workload[i].arrival_time if i < n else None
        if fast is not None and (end := fast.advance(now, next_arrival)) is not None:
            now = end                    # a run of predicted decode steps
            continue
        out = engine.step(now)
        if fast is not None:
            fast.after_step(out)
        if not isinstance(out, Idle):
            now = out.end
            continue
        targets = [t for t in (next_arrival, out.wake_at) if t is not None]
        if not targets:
            _check_nothing_pending(engine)
            return 0 if fast is None else fast.num_steps
        if out.wake_at is not None and not out.wake_at > now:
            raise EngineError(f"{scheduler!r} planned nothing at now={now} but set wake_at={out.wake_at}, "
                              "which is not in the future; it would never make progress")
        now = clock.wait_until(now, min(targets))


def _check_nothing_pending(engine: "Engine") -> None:
    """With nothing left to arrive and no timer, a scheduler that still holds work is stuck."""
    if engine.scheduler.has_pending():
        stuck = [rid for rid, r in engine.requests.items() if not r.is_done]
        raise EngineError(f"deadlock: {engine.scheduler!r} holds {len(stuck)} unfinished requests (first: "
                          f"{stuck[:5]}) but planned nothing, set no timer, and no request is left to arrive")
