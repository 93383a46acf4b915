"""The engine loop, its clocks, the simulator backend, and the fast path's equality with the slow one.

Step times come from a cost model written here with explicit coefficients (it is not a
measurement, only a ruler for hand-computed expectations):

    t_step = 10 ms + 1 ms per sequence + 2 ms per token   (no attention term)
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from batchlab.backends import Backend, CostModel, StepResult
from batchlab.sim import SimBackend
from batchlab.engine import Engine, EngineError
from batchlab.kv_blocks import check_books
from batchlab.plan import DecodeChunks, ScheduledChunk, StepPlan
from batchlab.requests import FinishReason, Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher
from batchlab.schedulers.base import Scheduler
from batchlab.trace import StepRecord

RULER = CostModel(fixed_s=0.010, per_seq_s=0.001, per_token_s=0.002, per_attention_pair_s=0.0)
# A ruler with every term non-zero, for the fast path (attention pairs change every step).
RULER_KV = CostModel(fixed_s=0.010, per_seq_s=0.001, per_token_s=0.002, per_attention_pair_s=1e-6)


def sim(capacity: int = 100_000, cost: CostModel = RULER, **kw) -> SimBackend:
    return SimBackend(cost, kv_capacity_tokens=capacity, **kw)


def req(i: int, arrival: float, prompt: int = 10, out: int = 4, **kw) -> Request:
    return Request(f"r{i}", None, out, arrival_time=arrival, prompt_len=prompt, **kw)


def workload(n: int, seed: int, rate: float, burst: bool = False) -> list[Request]:
    """Requests with varied lengths; ``burst`` packs them into clumps of near-simultaneous arrivals."""
    import random
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if burst:
            t += rng.expovariate(rate / 8) if i % 8 == 0 else rng.uniform(0, 0.001)
        else:
            t += rng.expovariate(rate)
        out.append(req(i, t, prompt=rng.randint(1, 60), out=rng.randint(1, 30)))
    return out


POLICIES = {
    "static": lambda: StaticBatcher(4),
    "static-stream": lambda: StaticBatcher(4, stream=True),
    "dynamic": lambda: DynamicBatcher(4, timeout=0.05),
    "continuous": lambda: ContinuousBatcher(max_num_seqs=6, max_num_batched_tokens=64),
    "continuous-no-chunking": lambda: ContinuousBatcher(max_num_seqs=6, max_num_batched_tokens=64,
                                                        chunked_prefill=False),
    "continuous-tight": lambda: ContinuousBatcher(max_num_seqs=6, max_num_batched_tokens=8),
}


def check_served_exactly(requests: list[Request], trace) -> None:
    """Every request appears once, finished with exactly its tokens, computed exactly once."""
    assert [r.request_id for r in trace.requests] == [r.request_id for r in requests]
    by_id = {r.request_id: r for r in requests}
    computed = {r.request_id: 0 for r in requests}
    for step in trace.steps:
        ids = [c.request_id for c in step.chunks]
        assert len(ids) == len(set(ids)), f"step {step.index} plans a request twice"
        for c in step.chunks:
            computed[c.request_id] += c.num_tokens
    for rec in trace.requests:
        r = by_id[rec.request_id]
        assert rec.status is RequestStatus.FINISHED and rec.finish_reason == "length"
        assert rec.num_output_tokens == len(rec.output_ids) == r.max_new_tokens
        assert rec.token_times == sorted(rec.token_times)
        assert rec.first_scheduled_time >= rec.arrival_time
        assert rec.release_time >= rec.token_times[-1]
        # Every prompt token and every output token but the last is fed through the model once.
        assert computed[rec.request_id] == r.prompt_len + r.max_new_tokens - 1
    assert sum(rec.num_output_tokens for rec in trace.requests) == sum(r.max_new_tokens for r in requests)
    starts = [s.start for s in trace.steps]
    assert starts == sorted(starts)
    assert all(a.end <= b.start + 1e-12 for a, b in zip(trace.steps, trace.steps[1:])), "steps overlap"


# --- no loss, no duplicates ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("load", ["overload", "bursty", "light"])
def test_every_request_ends_once_with_exactly_its_tokens(policy, load):
    if load == "overload":
        requests = workload(60, seed=1, rate=1000.0)      # far more than the server can take
    elif load == "bursty":
        requests = workload(60, seed=2, rate=5.0, burst=True)
    else:
        requests = workload(30, seed=3, rate=0.5)
    trace = Engine(POLICIES[policy](), sim(capacity=400)).run(requests)
    check_served_exactly(requests, trace)


def test_the_same_workload_can_be_served_again_unchanged():
    requests = workload(20, seed=4, rate=20.0)
    first = Engine(ContinuousBatcher(4, 64), sim()).run(requests)
    assert all(r.status is RequestStatus.WAITING and not r.output_ids for r in requests)
    second = Engine(StaticBatcher(4), sim()).run(requests)
    check_served_exactly(requests, first)
    check_served_exactly(requests, second)


def test_a_request_that_can_never_fit_is_rejected_with_its_reason():
    requests = [req(0, 0.0), req(1, 0.5, prompt=90, out=20), req(2, 1.0)]
    for scheduler in (StaticBatcher(2), DynamicBatcher(2, 0.1), ContinuousBatcher(4, 64)):
        trace = Engine(scheduler, sim(capacity=100)).run(requests)
        rejected = trace.requests[1]
        assert rejected.status is RequestStatus.REJECTED
        assert rejected.finish_reason is FinishReason.REJECTED and "110 KV tokens" in rejected.finish_detail
        assert rejected.num_output_tokens == 0 and rejected.first_scheduled_time is None
        assert rejected.release_time is not None           # the client was told, at that time
        assert all(c.request_id != "r1" for s in trace.steps for c in s.chunks)
        assert [r.status for r in (trace.requests[0], trace.requests[2])] == [RequestStatus.FINISHED] * 2
        assert trace.meta["num_rejected"] == 1


def test_a_prompt_over_the_token_budget_without_chunking_is_rejected():
    trace = Engine(ContinuousBatcher(4, 32, chunked_prefill=False), sim()).run([req(0, 0.0, prompt=40)])
    assert trace.requests[0].status is RequestStatus.REJECTED
    assert "max_num_batched_tokens=32" in trace.requests[0].finish_detail


def test_a_stop_token_ends_a_request_early():
    # The simulator's every token is the placeholder -1; a request that stops on it ends at once.
    requests = [req(0, 0.0, out=5, stop_token_ids=(-1,)), req(1, 0.0, out=5)]
    trace = Engine(ContinuousBatcher(4, 64), sim()).run(requests)
    stopped, full = trace.requests
    assert (stopped.finish_reason, stopped.num_output_tokens) == ("stop", 1)
    assert (full.finish_reason, full.num_output_tokens) == ("length", 5)


# --- hand-computed expectations -----------------------------------------------------------------------
def test_static_batch_waits_for_the_eighth_arrival_and_releases_with_the_longest():
    """The article's example: batch size 8, one arrival per second (t = 0..7)."""
    requests = [req(0, 0.0, out=2)] + [req(i, float(i), out=4) for i in range(1, 8)]
    trace = Engine(StaticBatcher(8), sim()).run(requests)
    # Nothing can run before the 8th request arrives at t = 7.
    assert trace.steps[0].start == 7.0
    assert all(r.first_scheduled_time == 7.0 for r in trace.requests)
    # Prompt step: 8 seqs, 80 tokens -> 10 + 8 + 160 ms. Decode steps: 10 + 3 ms per seq.
    prefill, decode8, decode7 = 0.178, 0.034, 0.031
    assert [s.duration for s in trace.steps] == pytest.approx([prefill, decode8, decode7, decode7])
    assert [s.held_slots for s in trace.steps] == [0, 0, 1, 1]
    batch_end = 7.0 + prefill + decode8 + 2 * decode7
    short = trace.requests[0]
    assert short.finish_time == pytest.approx(7.0 + prefill + decode8)
    # Not streamed: the short answer is handed back with the longest, at the batch's end.
    assert not short.streamed
    assert all(r.release_time == pytest.approx(batch_end) for r in trace.requests)
    assert short.visible_token_times == [short.release_time] * 2


def test_dynamic_batcher_on_an_idle_server_starts_within_the_timeout():
    timeout = 0.5
    arrivals = [0.0, 0.1, 0.2, 5.0, 5.05, 20.0, 30.0, 30.0, 30.0, 30.0]
    requests = [req(i, t, out=3) for i, t in enumerate(arrivals)]
    trace = Engine(DynamicBatcher(max_batch_size=4, timeout=timeout), sim()).run(requests)
    check_served_exactly(requests, trace)
    waits = [r.first_scheduled_time - r.arrival_time for r in trace.requests]
    assert max(waits) <= timeout + 1e-12
    # A lone request leaves when the timer ends; a full batch leaves at once.
    assert trace.requests[0].first_scheduled_time == pytest.approx(0.5)
    assert trace.requests[5].first_scheduled_time == pytest.approx(20.5)
    assert all(r.first_scheduled_time == 30.0 for r in trace.requests[6:])


def test_continuous_step_times_follow_the_cost_model():
    requests = [req(0, 0.0, prompt=10, out=3), req(1, 0.0, prompt=5, out=2)]
    trace = Engine(ContinuousBatcher(4, 64), sim()).run(requests)
    # Step 0: both prompts (2 seqs, 15 tokens). Step 1: 2 decodes. Step 2: r0's last decode.
    assert [s.duration for s in trace.steps] == pytest.approx([0.042, 0.016, 0.013])
    r0, r1 = trace.requests
    assert r0.token_times == pytest.approx([0.042, 0.058, 0.071])
    assert r1.token_times == pytest.approx([0.042, 0.058])
    assert r1.release_time == pytest.approx(0.058) and r1.streamed


# --- clocks -------------------------------------------------------------------------------------------
def test_virtual_clock_jumps_over_idle_gaps():
    requests = [req(0, 0.0), req(1, 1000.0), req(2, 5000.0)]
    t0 = time.perf_counter()
    trace = Engine(ContinuousBatcher(4, 64), sim(), clock="virtual").run(requests)
    elapsed = time.perf_counter() - t0
    assert trace.requests[2].first_scheduled_time == 5000.0
    assert trace.duration > 5000
    assert elapsed < 5.0, f"{elapsed:.1f} s of real time for an 85-minute virtual trace: it did not skip"


def test_wall_clock_serves_arrivals_in_real_time():
    requests = [req(0, 0.0, out=3), req(1, 0.05, out=3), req(2, 0.15, out=3)]
    backend = sim(cost=CostModel(0.005, 0.0, 0.0002, 0.0))
    t0 = time.perf_counter()
    trace = Engine(ContinuousBatcher(4, 64), backend, clock="wall").run(requests)
    elapsed = time.perf_counter() - t0
    check_served_exactly(requests, trace)
    assert trace.meta["clock"] == "wall"
    # Nobody is served before they arrive, and the run lasts at least until the last arrival.
    assert all(r.first_scheduled_time >= r.arrival_time for r in trace.requests)
    assert elapsed >= 0.15 and trace.steps[-1].end >= 0.15
    # A simulated step is played back for at least its predicted duration.
    for step in trace.steps:
        assert step.duration >= backend.cost_model.predict(step) - 1e-9


# --- the fast path ------------------------------------------------------------------------------------
def trace_facts(trace) -> tuple:
    """Everything a run recorded except the wall time, in comparable form."""
    reqs = [(r.request_id, r.status, r.finish_reason, r.first_scheduled_time, r.token_times,
             r.release_time, r.streamed, r.output_ids) for r in trace.requests]
    steps = [(s.index, s.start, s.duration, list(s.chunks), s.held_slots, s.batch_id, s.num_seqs,
              s.num_tokens, s.num_prefill_tokens, s.num_decode_seqs) for s in trace.steps]
    return reqs, steps


@pytest.mark.parametrize("policy", ["static", "static-stream", "dynamic", "continuous",
                                    "continuous-no-chunking", "continuous-tight"])
@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_fast_path_makes_the_same_trace_as_calling_the_scheduler_every_step(policy, noise):
    """The fast path relies on each policy's ``continues_decoding`` promise; this holds them to it."""
    requests = workload(80, seed=7, rate=40.0) + [req(80 + i, 100.0 + i, out=40) for i in range(6)]
    traces = {}
    for fast in (False, True):
        traces[fast] = Engine(POLICIES[policy](), sim(cost=RULER_KV, capacity=600, noise=noise, seed=3),
                              fast_decode_runs=fast).run(requests)
    slow, fast = traces[False], traces[True]
    assert slow.meta["num_fast_steps"] == 0
    assert fast.meta["num_fast_steps"] > len(fast.steps) / 4, "the fast path was hardly used"
    assert trace_facts(fast) == trace_facts(slow)
    assert fast.steps_df().equals(slow.steps_df())
    assert fast.requests_df().equals(slow.requests_df())
    check_served_exactly(requests, fast)


def shared_prefix_workload(n: int, seed: int, rate: float) -> list[Request]:
    """Requests with token ids, half of them opening with one of two 40-token system prompts."""
    import random
    rng = random.Random(seed)
    systems = [[rng.randrange(1000) for _ in range(40)] for _ in range(2)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        own = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        prompt = (systems[i % 2] + own) if i % 4 < 2 else own
        out.append(Request(f"r{i}", prompt, rng.randint(1, 40), arrival_time=t))
    return out


@pytest.mark.parametrize("capacity, block_size, prefix", [(4000, 16, False), (4000, 16, True),
                                                          (480, 16, True), (480, 8, False), (300, 4, True)])
@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_fast_path_on_a_paged_cache_makes_the_same_trace(capacity, block_size, prefix, noise):
    """Continuous batching on blocks, with prefix caching and preemptions: the fast path grows the
    blocks in bulk and stops before they run out; the trace and the books are the same."""
    requests = shared_prefix_workload(120, seed=11, rate=30.0)
    traces, backends = {}, {}
    for fast in (False, True):
        backends[fast] = sim(cost=RULER_KV, capacity=capacity, noise=noise, seed=3, block_size=block_size,
                             enable_prefix_caching=prefix)
        traces[fast] = Engine(ContinuousBatcher(max_num_seqs=12, max_num_batched_tokens=96), backends[fast],
                              fast_decode_runs=fast).run(requests)
    slow, fast = traces[False], traces[True]
    assert fast.meta["num_fast_steps"] > len(fast.steps) / 4, "the fast path was hardly used"
    assert trace_facts(fast) == trace_facts(slow)
    assert [p for p in fast.preemptions] == [p for p in slow.preemptions]
    if capacity < 1000:
        assert slow.preemptions, "the small cache should preempt"
    for backend in backends.values():
        check_books(backend.kv)
    assert backends[True].kv.num_hit_tokens == backends[False].kv.num_hit_tokens
    assert backends[True].kv.num_evictions == backends[False].kv.num_evictions


def test_fast_path_steps_read_like_ordinary_steps():
    trace = Engine(ContinuousBatcher(4, 64), sim(cost=RULER_KV)).run([req(0, 0.0, out=6), req(1, 0.0, out=6)])
    fast_steps = [s for s in trace.steps if isinstance(s.chunks, DecodeChunks)]
    assert fast_steps
    step = fast_steps[0]
    assert isinstance(step, StepRecord) and len(step.chunks) == 2
    assert step.chunks == [ScheduledChunk("r0", step.chunks[0].start, 1, True),
                           ScheduledChunk("r1", step.chunks[1].start, 1, True)]
    assert (step.num_tokens, step.num_decode_seqs, step.num_prefill_tokens) == (2, 2, 0)
    assert step.duration == RULER_KV.predict(step)
    assert len(trace.chunks_df()) == sum(len(s.chunks) for s in trace.steps)


# --- the simulator backend ----------------------------------------------------------------------------
def test_sim_backend_predicts_with_its_cost_model_and_returns_placeholders():
    backend = sim(cost=RULER_KV)
    plan = StepPlan([ScheduledChunk("a", 0, 30, False), ScheduledChunk("b", 40, 1, True),
                     ScheduledChunk("c", 0, 5, True)])
    result = backend.run(plan, {})
    assert result.new_tokens == {"b": -1, "c": -1}
    assert result.duration == RULER_KV.predict(plan)
    assert backend.run(StepPlan(), {}).duration == 0.0


def test_sim_noise_is_seeded_and_mean_one():
    plan = StepPlan([ScheduledChunk("a", 5, 1, True)])
    base = RULER.predict(plan)
    def draws(seed):
        b = sim(noise=0.2, seed=seed)
        return [b.run(plan, {}).duration / base for _ in range(6000)]
    first = draws(1)
    assert first == draws(1) and first != draws(2)
    assert sum(first) / len(first) == pytest.approx(1.0, abs=0.02)
    assert len(set(first)) == len(first)


def test_sim_backend_checks_its_arguments():
    with pytest.raises(ValueError, match="noise"):
        SimBackend(RULER, 100, noise=-0.1)
    with pytest.raises(ValueError, match="cost_model"):
        SimBackend({"fixed_s": 1}, 100)
    with pytest.raises(ValueError, match="capacity_tokens"):
        SimBackend(RULER, 0)
    with pytest.raises(ValueError, match="seed"):
        SimBackend(RULER, 100, seed=1.5)


def test_importing_backends_does_not_load_torch():
    code = ("import sys, batchlab.backends, batchlab.engine; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- bad inputs and broken contracts ------------------------------------------------------------------
def test_unsorted_arrivals_are_refused_by_name():
    with pytest.raises(ValueError, match=r"'r1' arrives at 1.0 after 'r0' at 2.0"):
        Engine(StaticBatcher(2), sim()).run([req(0, 2.0), req(1, 1.0)])


def test_duplicate_ids_are_refused_by_name():
    with pytest.raises(ValueError, match=r"repeated: \['r0'\]"):
        Engine(StaticBatcher(2), sim()).run([req(0, 0.0), req(0, 1.0)])


def test_other_bad_arguments():
    with pytest.raises(ValueError, match="clock"):
        Engine(StaticBatcher(2), sim(), clock="sundial")
    with pytest.raises(ValueError, match="scheduler"):
        Engine("static", sim())
    with pytest.raises(ValueError, match="backend"):
        Engine(StaticBatcher(2), RULER)
    with pytest.raises(ValueError, match="list of Request"):
        Engine(StaticBatcher(2), sim()).run(req(0, 0.0))


class NeverPlans(Scheduler):
    """A broken policy: it takes requests and never plans them, with no timer."""

    def __init__(self):
        super().__init__()
        self.queue = []

    def add_request(self, req):
        self.queue.append(req)

    def schedule(self, now):
        return StepPlan()

    def remove_ended(self):
        return []

    def has_pending(self):
        return bool(self.queue)

    def running_requests(self):
        return []


def test_a_scheduler_that_holds_work_but_plans_nothing_is_a_deadlock():
    with pytest.raises(EngineError, match=r"deadlock: .* holds 2 unfinished requests .*'r0', 'r1'"):
        Engine(NeverPlans(), sim()).run([req(0, 0.0), req(1, 3.0)])


class NeverReleases(ContinuousBatcher):
    def remove_ended(self):
        super().remove_ended()
        return []


def test_a_finished_request_that_is_never_released_is_an_error():
    with pytest.raises(EngineError, match="never released"):
        Engine(NeverReleases(4, 64), sim()).run([req(0, 0.0)])


class BadDuration(SimBackend):
    def run(self, plan, requests):
        return StepResult(super().run(plan, requests).new_tokens, float("nan"))


def test_a_backend_reporting_an_impossible_duration_is_an_error():
    with pytest.raises(ValueError, match=r"StepResult.duration=nan; must be a finite number >= 0"):
        Engine(ContinuousBatcher(4, 64), BadDuration(RULER, 1000)).run([req(0, 0.0)])


class SkipsAhead(ContinuousBatcher):
    """A broken policy: it plans a decode one token too far on."""

    def schedule(self, now):
        plan = super().schedule(now)
        return StepPlan([ScheduledChunk(c.request_id, c.start + 1, c.num_tokens, c.samples)
                         if c.start > 0 else c for c in plan.chunks])


def test_a_plan_that_does_not_continue_the_cache_is_an_error():
    with pytest.raises(EngineError, match="from 11, but 10 are computed"):
        Engine(SkipsAhead(4, 64), sim(), fast_decode_runs=False).run([req(0, 0.0)])


def test_trace_meta_names_policy_clock_and_backend():
    trace = Engine(DynamicBatcher(4, 0.1), sim()).run([req(0, 0.0)], progress=True)
    meta = trace.meta
    assert meta["policy"] == "DynamicBatcher"
    assert meta["policy_params"] == {"max_batch_size": 4, "timeout": 0.1, "stream": False}
    assert meta["clock"] == "virtual" and meta["backend"].startswith("SimBackend(")
    assert meta["num_requests"] == 1 and meta["num_steps"] == len(trace.steps)


def test_a_backend_is_a_backend():
    assert isinstance(sim(), Backend)
