"""One replica of a cluster: an engine on the cluster's virtual clock, stepped by the driver.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from batchlab.sim import DecodeRuns, LazyDecodeRuns, SimBackend
from batchlab.steptime.cost_model import StepTimeModel
from batchlab.checks import check_bool, check_instance, check_int, check_number, fail
from batchlab.engine import Engine
from batchlab.kv_blocks import BlockManager
from batchlab.listener import EngineListener
from batchlab.loop import Arrivals, run_until
from batchlab.requests import Request
from batchlab.trace import Trace
from batchlab.engine_args import EngineArgs
from batchlab.vllm_sim import VllmReplica
from batchlab.vllm_sim.replica import scheduler_for, simulated_engine


# for_device's arguments that are not vLLM's flags
SPEC_ONLY = ("noise", "seed", "fast_decode_runs")
# A replica's vLLM flags where a ReplicaSpec's args leave them at None: V1's budgets on most GPUs,
# chunked prefill and prefix caching on blocks of 16; the synchronous scheduler.
REPLICA_ARGS = EngineArgs(max_num_seqs=256, max_num_batched_tokens=2048,
                          enable_chunked_prefill=True,
                          enable_prefix_caching=True, block_size=16, async_scheduling=False)


class AdmissionLog(BlockManager):
    """A ``BlockManager`` that remembers the cached prompt tokens of each request's first
    admission."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_hit: dict[str, int] = {}

    @classmethod
    def like(cls, kv: BlockManager) -> "AdmissionLog":
        return cls(kv.num_blocks, kv.block_size, kv.max_seq_len, kv.enable_prefix_caching,
                   kv.reserve_blocks)

    def admit(self, request_id: str, num_tokens: int, max_tokens: int | None = None,
              prompt_ids: Sequence[int] | None = None) -> int:
        cached = super().admit(request_id, num_tokens, max_tokens, prompt_ids)
        self.first_hit.setdefault(request_id, cached)
        return cached


@dataclass(frozen=True)
class ReplicaSpec:
    """Every replica's engine: vLLM's scheduler with ``args``' budgets (its async-scheduling variant
    with ``async_scheduling``) on a ``SimBackend(cost_model, kv_capacity_tokens, ...)``, paged in
    blocks of ``args.block_size`` or (``paged=False``) a reserving, slot-like cache; ``args`` left
    at None take ``REPLICA_ARGS``' values. Replica ``i``'s noise seed is ``seed + i``."""

    cost_model: StepTimeModel
    kv_capacity_tokens: int
    args: EngineArgs = REPLICA_ARGS
    paged: bool = True
    noise: float = 0.0
    seed: int = 0
    fast_decode_runs: bool = True
    # what ``for_device`` built it from
    vllm: VllmReplica | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.cost_model, StepTimeModel):
            raise ValueError(f"cost_model={self.cost_model!r}; must be a CostModel or a "
                             "RooflineCostModel")
        check_int("kv_capacity_tokens", self.kv_capacity_tokens)
        check_instance("args", self.args, EngineArgs, "an EngineArgs")
        object.__setattr__(self, "args", self.args.with_defaults(REPLICA_ARGS))
        check_bool("paged", self.paged)
        if self.args.enable_prefix_caching and not self.paged:
            raise ValueError("enable_prefix_caching=True needs a paged cache: paged=True, or "
                             "args=EngineArgs(enable_prefix_caching=False)")
        check_number("noise", self.noise, hint="the lognormal sigma of step times, 0 = none")
        check_int("seed", self.seed, minimum=0)
        check_bool("fast_decode_runs", self.fast_decode_runs)

    @classmethod
    def for_device(cls, model: str, device: str, tensor_parallel_size: int = 1,
                   args: EngineArgs | None = None, **kwargs: Any) -> "ReplicaSpec":
        """A replica of ``model`` on ``tensor_parallel_size`` GPUs of preset ``device``, as vLLM
        serves it (``VllmReplica``): its step time, KV blocks and budgets, vLLM's defaults for
        the GPU (an H100: 1,024 sequences, 8,192 tokens a step). ``kwargs``: vLLM's flags by
        their ``EngineArgs`` names (``max_num_seqs=256``), or ``noise``, ``seed``,
        ``fast_decode_runs``."""
        own = {k: kwargs.pop(k) for k in SPEC_ONLY if k in kwargs}
        names = {f.name for f in fields(EngineArgs)}
        for key in kwargs:
            if key not in names:
                fail(key, kwargs[key],
                     f"one of vLLM's flags ({', '.join(sorted(names))}) or {', '.join(SPEC_ONLY)}")
        args = replace(args if args is not None else EngineArgs(), **kwargs)
        vllm = VllmReplica(model, device, tensor_parallel_size, args)
        return cls(vllm.step_model, vllm.memory.kv_tokens, vllm.resolved_args, vllm=vllm, **own)

    def build(self, index: int) -> Engine:
        backend = SimBackend.for_args(self.cost_model, self.kv_capacity_tokens, self.args,
                                      paged=self.paged, noise=self.noise, seed=self.seed + index)
        if isinstance(backend.kv, BlockManager):
            backend.kv = AdmissionLog.like(backend.kv)
        return simulated_engine(scheduler_for(self.args), backend, self.fast_decode_runs)


class Replica:
    """An engine the cluster driver steps (see the module docstring); ``time`` is when its next
    step starts (or, idle, how far the driver has brought it)."""

    def __init__(self, index: int, engine: Engine) -> None:
        if not isinstance(engine, Engine) or engine.clock.name != "virtual":
            raise ValueError(f"replica {index}: {engine!r} must be an Engine on the virtual clock")
        self.index, self.engine = index, engine
        self.fast = LazyDecodeRuns(engine) if DecodeRuns.applies(engine) else None
        # the driver adds each request; ``drain`` says none will come
        self.arrivals = Arrivals()
        self.time = 0.0
        self.died_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.died_at is None

    def start(self, listener: EngineListener) -> None:
        self.time = self.engine.start(listener)

    def advance_to(self, t: float) -> None:
        """Run every step that starts before ``t`` (the serving loop, with arrivals the driver
        adds)."""
        self.time = run_until(self.engine, self.arrivals, self.time, until=t, fast=self.fast)

    def sync(self) -> None:
        """Bring any predicted decode steps forward, so the replica's state is current."""
        if self.fast is not None:
            self.fast.sync()

    def add(self, req: Request, t: float) -> None:
        """``req`` arrives here at ``t`` (the replica has been brought up to ``t``)."""
        self.sync()
        self.engine.add_request(req, max(t, self.time))
        if self.fast is not None:
            self.fast.recheck()

    def abort(self, request_id: str, why: str, t: float) -> None:
        """End ``request_id`` at ``t`` (the replica has been brought up to ``t``) with ``why``."""
        self.sync()
        self.engine.abort(request_id, why, max(t, self.time))
        if self.fast is not None:
            self.fast.recheck()

    def kill(self, t: float) -> float:
        """Die at ``t``: the step in progress completes, then every unfinished request is aborted
        with the reason in words; returns the time of the aborts (the end of that step, or
        ``t``)."""
        self.advance_to(t)
        self.sync()
        if self.fast is not None:
            self.fast.run, self.fast.limit = None, None
        at = max(t, self.time)
        why = f"replica {self.index} died at t={t:.6g} s" + (
            "" if at == t else f" (the step it was running ended at t={at:.6g} s)")
        engine = self.engine
        for rid, req in list(engine.requests.items()):
            if not req.is_done:
                engine.abort(rid, why, at)
        engine.release_ended(at)   # frees the aborted requests' KV
        self.died_at, self.time = t, math.inf
        return at

    def drain(self) -> None:
        """No more requests will arrive: run to the end (the loop fails loudly if work is stuck)."""
        self.arrivals.exhausted = True
        self.advance_to(math.inf)

    def finish(self) -> Trace:
        num_fast = self.fast.num_steps if self.fast is not None else 0
        return self.engine.finish(num_fast_steps=num_fast, replica=self.index, died_at=self.died_at)


__all__ = ["AdmissionLog", "Replica", "ReplicaSpec"]
