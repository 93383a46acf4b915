"""The offline driver: serve a known workload to the end.

``Engine.run(workload)`` calls ``serve_offline``: the serving loop (``loop.run_until``) over the
workload's arrivals, with a progress bar if asked, and on the simulator (virtual clock) the fast
path (``sim/fast_path.py``), which may stand in for a run of steps that it can predict whole; the
trace is the same.
"""

from __future__ import annotations

import time

from batchlab.contract import ServingEngine
from batchlab.sim import DecodeRuns
from batchlab.listener import EngineListener
from batchlab.loop import Workload, gc_paused, run_until
from batchlab.requests import Request
from batchlab.trace import Trace


class ProgressBar(EngineListener):
    """A tqdm bar over ended requests (finished and released, rejected)."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, unit="req", desc=desc)

    def on_end(self, req: Request, t: float) -> None:
        self.bar.update(1)


def serve_offline(engine: ServingEngine, workload: list[Request], progress: bool = False) -> Trace:
    """Serve ``workload`` (fresh requests, sorted by arrival) to the end; return the trace."""
    bar = ProgressBar(len(workload), type(engine.scheduler).__name__) if progress else None
    wall_start = time.perf_counter()
    fast = DecodeRuns(engine) if DecodeRuns.applies(engine) else None
    try:
        with gc_paused():
            run_until(engine, Workload(workload), engine.start(bar), fast=fast)
            trace = engine.finish(num_fast_steps=0 if fast is None else fast.num_steps)
    finally:
        if bar is not None:
            bar.bar.close()
    trace.meta["wall_seconds"] = time.perf_counter() - wall_start
    return trace
