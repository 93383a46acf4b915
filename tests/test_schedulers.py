"""Tests for the three batching policies, driven by hand.

``EngineStandIn`` below is a test driver only: it plays the engine's part in the smallest way
(queue arrivals, apply a plan to the requests, call ``remove_ended``) and checks the plan contract
on every step. The real engine lives in ``batchlab/engine.py``.
"""

from __future__ import annotations

import math
import random

import pytest

from batchlab.kv_space import TokenKVSpace
from batchlab.plan import ScheduledChunk, StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers import (ContinuousBatcher, DynamicBatcher, Scheduler, StaticBatcher,
                                 make_scheduler)


def make_request(rid: str, prompt_len: int = 4, max_new_tokens: int = 3, arrival: float = 0.0,
                 stop_token_ids: tuple[int, ...] = ()) -> Request:
    return Request(rid, None, max_new_tokens, arrival_time=arrival, prompt_len=prompt_len,
                   stop_token_ids=stop_token_ids)


def promises(scheduler: Scheduler, plan: StepPlan) -> bool:
    """The simulator's fast-path promise (``batchlab.schedulers.steady``) after ``plan``."""
    return scheduler.decodes_steadily(tuple(c.request_id for c in plan.chunks), plan.held_slots, plan.batch_id)


class EngineStandIn:
    """Test driver: arrivals → schedule → apply the plan → remove_ended, with contract checks.

    The "model" samples token ``k`` as a request's k-th output (0, 1, 2, ...), so a request with
    ``stop_token_ids=(2,)`` stops after 3 tokens. Every step takes ``step_time`` seconds.
    """

    def __init__(self, scheduler: Scheduler, kv_tokens: int = 100_000, step_time: float = 1.0) -> None:
        self.scheduler = scheduler
        self.kv = TokenKVSpace(kv_tokens)
        scheduler.bind(self.kv)
        self.step_time = step_time
        self.now = 0.0
        self.requests: dict[str, Request] = {}
        self.released_at: dict[str, float] = {}
        self.plans: list[StepPlan] = []
        # The simulator's fast-path promise (batchlab.schedulers.steady), checked on every step:
        # the last plan if every chunk sampled and nobody finished, whether the promise was made,
        # and whether a request arrived since.
        self.decoding_plan: StepPlan | None = None
        self.promised = False
        self.arrived_since_step = False
        self.num_promises = 0

    def arrive(self, *reqs: Request) -> None:
        for req in reqs:
            self.requests[req.request_id] = req
            reason = self.scheduler.why_unschedulable(req)
            if reason is not None:
                req.status, req.finish_reason, req.finish_detail = RequestStatus.REJECTED, "rejected", reason
            else:
                self.scheduler.add_request(req)
                self.arrived_since_step = True

    def step(self) -> StepPlan:
        last, promised_before = self.decoding_plan, self.promised
        self.promised = last is not None and promises(self.scheduler, last)
        if promised_before and last is not None and not self.arrived_since_step:
            assert self.promised, "a fast-path promise was withdrawn with no arrival and no finish"
        self.arrived_since_step = False
        plan = self.scheduler.schedule(self.now)
        self.plans.append(plan)
        if self.promised:   # then this plan is one decode per request of the last, in order
            self.num_promises += 1
            assert plan.chunks == [ScheduledChunk(c.request_id, c.start + c.num_tokens, 1, True)
                                   for c in last.chunks]
            assert (plan.held_slots, plan.batch_id) == (last.held_slots, last.batch_id)
        if plan.is_empty:
            self.decoding_plan = None
            return plan
        ids = [c.request_id for c in plan.chunks]
        assert len(ids) == len(set(ids)), f"a request was planned twice in one step: {ids}"
        end = self.now + self.step_time
        all_sampled, num_finished = True, 0
        for chunk in plan.chunks:
            req = self.requests[chunk.request_id]
            assert req.status is RequestStatus.RUNNING
            assert chunk.start == req.num_computed_tokens
            assert chunk.start + chunk.num_tokens <= req.num_known_tokens
            assert chunk.samples == (chunk.start + chunk.num_tokens == req.num_known_tokens)
            if req.num_computed_tokens >= req.prompt_len:
                assert chunk.num_tokens == 1, "a decode must be exactly one token"
            if req.first_scheduled_time is None:
                req.first_scheduled_time = self.now
            req.num_computed_tokens += chunk.num_tokens
            all_sampled &= chunk.samples
            if chunk.samples:
                token = len(req.output_ids)
                req.output_ids.append(token)
                req.token_times.append(end)
                if token in req.stop_token_ids or len(req.output_ids) == req.max_new_tokens:
                    req.status = RequestStatus.FINISHED
                    req.finish_reason = "stop" if token in req.stop_token_ids else "length"
                    num_finished += 1
        self.now = end
        released = self.scheduler.remove_ended()
        if self.promised and not num_finished:
            assert released == [], "a promised decode step released someone"
        for req in released:
            assert req.request_id not in self.released_at, f"{req.request_id} released twice"
            assert req.is_done
            self.released_at[req.request_id] = self.now
        self.decoding_plan = plan if all_sampled and not num_finished else None
        return plan

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_pending():
                return
            plan = self.step()
            if plan.is_empty:
                assert plan.wake_at is not None, "nothing runs and nothing will wake the scheduler"
                self.now = max(self.now, plan.wake_at)
        raise AssertionError("scheduler did not finish")


def ids(plan: StepPlan) -> list[str]:
    return [c.request_id for c in plan.chunks]


# ============================================================================================
# Static batching
# ============================================================================================

def test_static_waits_for_a_full_batch():
    eng = EngineStandIn(StaticBatcher(batch_size=8))
    eng.arrive(*[make_request(f"r{i}", prompt_len=5 + i) for i in range(7)])
    plan = eng.step()
    assert plan.is_empty and plan.wake_at is None   # the 7th waits for the 8th
    assert eng.kv.used_tokens == 0
    eng.arrive(make_request("r7", prompt_len=12))
    plan = eng.step()
    assert ids(plan) == [f"r{i}" for i in range(8)]
    # first step: every member's whole prompt, one chunk each, each samples its first token
    assert [(c.start, c.num_tokens, c.samples) for c in plan.chunks] == [(0, 5 + i, True) for i in range(8)]
    assert plan.batch_id == 0 and plan.held_slots == 0
    assert eng.kv.used_tokens == sum(5 + i + 3 for i in range(8))


def test_static_partial_batch_only_when_draining():
    sched = StaticBatcher(batch_size=4)
    eng = EngineStandIn(sched)
    eng.arrive(*[make_request(f"r{i}") for i in range(6)])
    assert ids(eng.step()) == ["r0", "r1", "r2", "r3"]
    while sched.batch:
        eng.step()
    assert eng.step().is_empty          # r4, r5 wait: only 2 of 4
    assert eng.step().is_empty
    sched.start_draining()
    plan = eng.step()
    assert ids(plan) == ["r4", "r5"] and plan.batch_id == 1
    eng.run_until_idle()
    assert all(r.status is RequestStatus.FINISHED for r in eng.requests.values())


def test_static_nobody_joins_a_running_batch():
    sched = StaticBatcher(batch_size=2)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=4), make_request("b", max_new_tokens=4))
    first = eng.step()
    assert ids(first) == ["a", "b"]
    eng.arrive(make_request("c"), make_request("d"))   # a full batch's worth arrives mid-batch
    batch0 = [eng.step() for _ in range(3)]
    assert all(ids(p) == ["a", "b"] and p.batch_id == 0 for p in batch0)
    assert not sched.batch and len(sched.waiting) == 2
    nxt = eng.step()
    assert ids(nxt) == ["c", "d"] and nxt.batch_id == 1
    assert eng.requests["c"].first_scheduled_time == eng.requests["a"].token_times[-1]


def test_static_held_slots_and_decode_steps():
    eng = EngineStandIn(StaticBatcher(batch_size=3))
    eng.arrive(make_request("a", prompt_len=4, max_new_tokens=1),
               make_request("b", prompt_len=6, max_new_tokens=3),
               make_request("c", prompt_len=5, max_new_tokens=5))
    eng.run_until_idle()
    plans = [p for p in eng.plans if not p.is_empty]
    assert [ids(p) for p in plans] == [["a", "b", "c"], ["b", "c"], ["b", "c"], ["c"], ["c"]]
    assert [p.held_slots for p in plans] == [0, 1, 1, 2, 2]
    # after the prompts, each unfinished member computes exactly its last sampled token
    assert [(c.start, c.num_tokens) for c in plans[1].chunks] == [(6, 1), (5, 1)]
    assert [(c.start, c.num_tokens) for c in plans[4].chunks] == [(8, 1)]
    assert [r.num_output_tokens for r in eng.requests.values()] == [1, 3, 5]


@pytest.mark.parametrize("stream", [False, True])
def test_static_release_and_kv_free_at_batch_end(stream):
    sched = StaticBatcher(batch_size=3, stream=stream)
    assert sched.streams_tokens is stream
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=1), make_request("b", max_new_tokens=2),
               make_request("c", max_new_tokens=4, stop_token_ids=(2,)))   # c stops after 3
    used = []
    while sched.has_pending():
        eng.step()
        used.append(eng.kv.used_tokens)
    # KV stays reserved for the whole batch until its last member (c) finishes at step 3
    assert used == [5 + 6 + 8] * 2 + [0]
    assert eng.requests["c"].finish_reason == "stop"
    if stream:
        assert eng.released_at == {"a": 1.0, "b": 2.0, "c": 3.0}
    else:
        assert eng.released_at == {"a": 3.0, "b": 3.0, "c": 3.0}


def test_static_runs_the_members_that_fit_in_kv():
    sched = StaticBatcher(batch_size=3)
    eng = EngineStandIn(sched, kv_tokens=20)   # each request needs 4 + 3 = 7: two fit
    eng.arrive(*[make_request(f"r{i}") for i in range(3)])
    assert ids(eng.step()) == ["r0", "r1"]
    while sched.batch:
        eng.step()
    sched.start_draining()   # r2 alone is now a partial batch
    assert ids(eng.step()) == ["r2"]


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size=0"),
    ({"batch_size": -2}, "batch_size=-2"),
    ({"batch_size": 2.5}, "batch_size=2.5"),
    ({"batch_size": True}, "batch_size=True"),
    ({"batch_size": "8"}, "batch_size='8'"),
    ({"batch_size": 4, "stream": "yes"}, "stream='yes'"),
])
def test_static_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StaticBatcher(**kwargs)


def test_scheduler_without_kv_says_so():
    sched = StaticBatcher(batch_size=1)
    sched.add_request(make_request("a"))
    with pytest.raises(RuntimeError, match="bind"):
        sched.schedule(0.0)
    cont = ContinuousBatcher()
    cont.add_request(make_request("a"))
    with pytest.raises(RuntimeError, match="bind"):
        cont.schedule(0.0)


# ============================================================================================
# Dynamic batching
# ============================================================================================

def test_dynamic_timer_starts_at_first_arrival():
    sched = DynamicBatcher(max_batch_size=4, timeout=0.5)
    eng = EngineStandIn(sched)
    eng.now = 1.0
    eng.arrive(make_request("a", arrival=1.0))
    plan = eng.step()
    assert plan.is_empty and plan.wake_at == pytest.approx(1.5)
    eng.now = 1.2
    eng.arrive(make_request("b", arrival=1.2))
    assert eng.step().wake_at == pytest.approx(1.5)   # a later arrival does not restart the timer
    eng.now = 1.5
    plan = eng.step()
    assert ids(plan) == ["a", "b"] and plan.batch_id == 0


def test_dynamic_leaves_when_full_before_the_timer():
    sched = DynamicBatcher(max_batch_size=3, timeout=10.0)
    eng = EngineStandIn(sched)
    for i, t in enumerate([0.0, 0.1, 0.2, 0.3]):
        eng.now = t
        eng.arrive(make_request(f"r{i}", arrival=t))
    plan = eng.step()   # four waiting: the first three leave at once
    assert ids(plan) == ["r0", "r1", "r2"]
    assert eng.now == pytest.approx(0.3 + eng.step_time)


def test_dynamic_arrivals_while_busy():
    sched = DynamicBatcher(max_batch_size=3, timeout=1.5)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=4))
    assert eng.step().wake_at == 1.5
    eng.now = 1.5
    assert ids(eng.step()) == ["a"]          # batch 0 runs from 1.5 to 5.5
    eng.arrive(make_request("b", arrival=2.0))
    eng.step()
    eng.arrive(make_request("c", arrival=3.0, max_new_tokens=1))
    while sched.batch:
        assert ids(eng.step()) == ["a"]      # nobody joins
    assert eng.now == 5.5
    # b has waited 3.5 s >= timeout: it leaves at once, taking c along
    plan = eng.step()
    assert ids(plan) == ["b", "c"] and plan.batch_id == 1
    while sched.batch:
        eng.step()
    # d arrived at 8.0, during batch 1 (which ends at 8.5), and has not waited 1.5 s yet:
    # the timer runs from its arrival
    assert eng.now == 8.5
    eng.arrive(make_request("d", arrival=8.0))
    assert eng.step().wake_at == pytest.approx(9.5)


def test_dynamic_full_queue_leaves_as_soon_as_the_batch_ends():
    sched = DynamicBatcher(max_batch_size=2, timeout=100.0)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a"), make_request("b"))
    eng.step()
    eng.arrive(*[make_request(f"w{i}", arrival=1.0) for i in range(3)])
    while sched.batch:
        eng.step()
    plan = eng.step()
    assert ids(plan) == ["w0", "w1"]        # full: no timer
    while sched.batch:
        eng.step()
    assert eng.step().wake_at == pytest.approx(101.0)   # w2 alone waits for its own timer


def test_dynamic_timeout_zero_leaves_with_whoever_is_there():
    sched = DynamicBatcher(max_batch_size=8, timeout=0)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a"), make_request("b"))
    assert ids(eng.step()) == ["a", "b"]
    eng.arrive(make_request("c", arrival=0.5))
    while sched.batch:
        eng.step()
    assert ids(eng.step()) == ["c"]


def test_dynamic_release_non_streaming_by_default():
    sched = DynamicBatcher(max_batch_size=2, timeout=0.0)
    assert sched.streams_tokens is False
    assert DynamicBatcher(max_batch_size=2, timeout=0.0, stream=True).streams_tokens is True
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=1), make_request("b", max_new_tokens=3))
    eng.run_until_idle()
    assert eng.released_at == {"a": 3.0, "b": 3.0}


@pytest.mark.parametrize("kwargs, match", [
    ({"max_batch_size": 0, "timeout": 0.1}, "max_batch_size=0"),
    ({"max_batch_size": 1.5, "timeout": 0.1}, "max_batch_size=1.5"),
    ({"max_batch_size": True, "timeout": 0.1}, "max_batch_size=True"),
    ({"max_batch_size": 4, "timeout": -0.1}, "timeout=-0.1"),
    ({"max_batch_size": 4, "timeout": math.inf}, "timeout=inf"),
    ({"max_batch_size": 4, "timeout": math.nan}, "timeout=nan"),
    ({"max_batch_size": 4, "timeout": "0.1"}, "timeout='0.1'"),
    ({"max_batch_size": 4, "timeout": 0.1, "stream": 1}, "stream=1"),
])
def test_dynamic_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicBatcher(**kwargs)


# ============================================================================================
# Continuous batching
# ============================================================================================

def test_continuous_decodes_come_first():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64))
    eng.arrive(make_request("a", prompt_len=4, max_new_tokens=5))
    eng.step()
    eng.arrive(make_request("b", prompt_len=30))
    plan = eng.step()
    assert [(c.request_id, c.start, c.num_tokens) for c in plan.chunks] == [("a", 4, 1), ("b", 0, 30)]
    assert plan.batch_id is None and plan.held_slots == 0


def test_continuous_chunked_prefill_splits_a_long_prompt():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=16))
    eng.arrive(make_request("dec", prompt_len=3, max_new_tokens=10))
    eng.step()
    eng.arrive(make_request("long", prompt_len=40, max_new_tokens=2))
    plans = [eng.step() for _ in range(4)]
    long_chunks = [(c.start, c.num_tokens, c.samples) for p in plans for c in p.chunks
                   if c.request_id == "long"]
    # the decoding request takes 1 token of every step's 16; the prompt gets the other 15
    assert long_chunks == [(0, 15, False), (15, 15, False), (30, 10, True), (40, 1, True)]
    assert all(p.num_tokens <= 16 for p in plans)
    assert all(ids(p)[0] == "dec" for p in plans)


def test_continuous_without_chunked_prefill_waits_for_room_in_order():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=10, chunked_prefill=False))
    eng.arrive(make_request("a", prompt_len=4, max_new_tokens=3))
    eng.step()
    # 'big' needs all 10 tokens but 'a' decodes (1 token): it waits, and 'small' may not jump it
    eng.arrive(make_request("big", prompt_len=10, max_new_tokens=1), make_request("small", prompt_len=2))
    assert ids(eng.step()) == ["a"]
    assert ids(eng.step()) == ["a"]          # a finishes here
    plan = eng.step()
    assert ids(plan) == ["big"] and plan.chunks[0].num_tokens == 10
    assert ids(eng.step()) == ["small"]


def test_continuous_budget_and_seq_limit_hold_on_a_busy_run():
    rng = random.Random(0)
    sched = ContinuousBatcher(max_num_seqs=5, max_num_batched_tokens=24)
    eng = EngineStandIn(sched, kv_tokens=400)
    eng.arrive(*[make_request(f"r{i}", prompt_len=rng.randint(1, 60), max_new_tokens=rng.randint(1, 20))
                 for i in range(60)])
    sched.start_draining()
    eng.run_until_idle()
    assert all(p.num_tokens <= 24 and p.num_seqs <= 5 for p in eng.plans)
    assert max(p.num_tokens for p in eng.plans) == 24
    assert all(r.status is RequestStatus.FINISHED for r in eng.requests.values())
    assert eng.kv.used_tokens == 0


def test_continuous_running_requests_use_the_budget_before_admissions():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=2))
    eng.arrive(*[make_request(f"r{i}", prompt_len=1, max_new_tokens=3) for i in range(3)])
    assert ids(eng.step()) == ["r0", "r1"]
    assert ids(eng.step()) == ["r0", "r1"]   # decodes fill the budget; r2 waits to be admitted
    assert ids(eng.step()) == ["r0", "r1"]   # r0, r1 finish
    assert ids(eng.step()) == ["r2"]


def test_continuous_finished_request_kv_is_reused_next_step():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64), kv_tokens=10)
    eng.arrive(make_request("a", prompt_len=5, max_new_tokens=3), make_request("b", prompt_len=6, max_new_tokens=2))
    assert ids(eng.step()) == ["a"]          # b (8 tokens) does not fit beside a (8 of 10)
    assert ids(eng.step()) == ["a"]
    assert ids(eng.step()) == ["a"]          # a's last token
    assert eng.kv.used_tokens == 0 and eng.released_at == {"a": 3.0}
    plan = eng.step()                        # the very next step admits b into a's space
    assert ids(plan) == ["b"] and eng.kv.used_tokens == 8


def test_continuous_kv_full_waits_and_keeps_order():
    # 'big' needs 20 of 24 tokens; while 'first' holds 8, big waits and 'tiny' may not jump it
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=100), kv_tokens=24)
    eng.arrive(make_request("first", prompt_len=4, max_new_tokens=4))
    eng.step()
    eng.arrive(make_request("big", prompt_len=16, max_new_tokens=4), make_request("tiny", prompt_len=1, max_new_tokens=1))
    for _ in range(3):
        assert ids(eng.step()) == ["first"]
    assert eng.kv.used_tokens == 0          # first's space is free; big goes first, tiny after it
    assert ids(eng.step()) == ["big", "tiny"]
    assert eng.kv.used_tokens == 20 and eng.released_at["tiny"] == eng.now   # tiny made its 1 token and left


def test_continuous_admits_fcfs_up_to_max_num_seqs():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=100))
    eng.arrive(*[make_request(f"r{i}", prompt_len=3, max_new_tokens=2) for i in range(5)])
    eng.run_until_idle()
    order = sorted(eng.requests.values(), key=lambda r: (r.first_scheduled_time, r.request_id))
    assert [r.request_id for r in order] == [f"r{i}" for i in range(5)]
    assert [ids(p) for p in eng.plans[:3]] == [["r0", "r1"], ["r0", "r1"], ["r2", "r3"]]


def test_continuous_long_prefill_threshold_shares_the_step():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=32,
                                          long_prefill_token_threshold=12))
    eng.arrive(make_request("a", prompt_len=30), make_request("b", prompt_len=30))
    plan = eng.step()
    assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [("a", 12), ("b", 12)]
    plan = eng.step()
    assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [("a", 12), ("b", 12)]
    plan = eng.step()
    assert [(c.request_id, c.num_tokens, c.samples) for c in plan.chunks] == [("a", 6, True), ("b", 6, True)]


def test_continuous_releases_each_request_when_it_finishes():
    sched = ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64)
    assert sched.streams_tokens is True
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=1), make_request("b", max_new_tokens=3),
               make_request("c", max_new_tokens=9, stop_token_ids=(1,)))
    eng.run_until_idle()
    assert eng.released_at == {"a": 1.0, "b": 3.0, "c": 2.0}
    assert eng.requests["c"].finish_reason == "stop"


def test_continuous_why_unschedulable():
    strict = ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=16, chunked_prefill=False)
    strict.bind(TokenKVSpace(1000))
    reason = strict.why_unschedulable(make_request("x", prompt_len=17))
    assert reason is not None and "17" in reason and "max_num_batched_tokens=16" in reason
    assert strict.why_unschedulable(make_request("ok", prompt_len=16)) is None
    chunked = ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=16)
    chunked.bind(TokenKVSpace(1000))
    assert chunked.why_unschedulable(make_request("x", prompt_len=17)) is None
    # the base rule still applies: more than the whole cache is refused
    assert "KV tokens" in chunked.why_unschedulable(make_request("huge", prompt_len=998, max_new_tokens=3))


def test_continuous_rejected_request_is_reported_not_lost():
    eng = EngineStandIn(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=8, chunked_prefill=False))
    eng.arrive(make_request("too_long", prompt_len=9), make_request("fine", prompt_len=8))
    eng.run_until_idle()
    assert eng.requests["too_long"].status is RequestStatus.REJECTED
    assert "max_num_batched_tokens=8" in eng.requests["too_long"].finish_detail
    assert eng.requests["fine"].status is RequestStatus.FINISHED


def test_continuous_fast_path_promise_waits_until_the_plan_is_in_running_order():
    sched = ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=10)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", prompt_len=25, max_new_tokens=9), make_request("b", prompt_len=4, max_new_tokens=9))
    eng.step()                                   # a 10, b 4
    eng.step()                                   # b decodes, a 10
    third = eng.step()                           # b decodes, a's last 5: everyone sampled
    assert [(c.request_id, c.samples) for c in third.chunks] == [("b", True), ("a", True)]
    # the next step lists a before b (running order), not as the last plan did: no promise
    assert not promises(sched, third)
    fourth = eng.step()
    assert ids(fourth) == ["a", "b"]
    assert promises(sched, fourth)      # now pure decodes in the same order
    eng.arrive(make_request("c", prompt_len=3))
    assert not promises(sched, fourth)  # c can be admitted: the next plan differs


def test_continuous_fast_path_promise_holds_while_the_head_cannot_be_admitted():
    sched = ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=64)
    eng = EngineStandIn(sched)
    eng.arrive(*[make_request(f"r{i}", max_new_tokens=5) for i in range(3)])
    plan = eng.step()
    assert promises(sched, plan)        # r2 waits for a free seat
    tight = ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64)
    eng = EngineStandIn(tight, kv_tokens=16)
    eng.arrive(*[make_request(f"r{i}", max_new_tokens=4) for i in range(3)])   # 8 KV tokens each
    plan = eng.step()
    assert ids(plan) == ["r0", "r1"] and promises(tight, plan)        # r2 waits for KV


def test_request_level_fast_path_promise_ends_with_a_finish():
    sched = StaticBatcher(batch_size=2)
    eng = EngineStandIn(sched)
    eng.arrive(make_request("a", max_new_tokens=2), make_request("b", max_new_tokens=4))
    first = eng.step()
    assert promises(sched, first)
    eng.step()                                   # a finishes
    assert not promises(sched, first)   # a stale plan (two members) is not continued
    third = eng.step()
    assert third.held_slots == 1 and promises(sched, third)
    eng.run_until_idle()
    assert not promises(sched, third)   # no batch is running


@pytest.mark.parametrize("kwargs, match", [
    ({"max_num_seqs": 0}, "max_num_seqs=0"),
    ({"max_num_seqs": 2.0}, "max_num_seqs=2.0"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens=0"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens=-5"),
    ({"max_num_batched_tokens": None}, "max_num_batched_tokens=None"),
    ({"chunked_prefill": "no"}, "chunked_prefill='no'"),
    ({"long_prefill_token_threshold": 0}, "long_prefill_token_threshold=0"),
    ({"long_prefill_token_threshold": 8, "chunked_prefill": False}, "needs chunked_prefill=True"),
])
def test_continuous_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ContinuousBatcher(**kwargs)


# ============================================================================================
# All policies
# ============================================================================================

POLICIES = [
    ("static", {"batch_size": 4}),
    ("static", {"batch_size": 3, "stream": True}),
    ("dynamic", {"max_batch_size": 4, "timeout": 2.5}),
    ("dynamic", {"max_batch_size": 1, "timeout": 0}),
    ("continuous", {"max_num_seqs": 6, "max_num_batched_tokens": 20}),
    ("continuous", {"max_num_seqs": 3, "max_num_batched_tokens": 64, "chunked_prefill": False}),
]


@pytest.mark.parametrize("name, kwargs", POLICIES)
def test_every_request_finishes_and_is_released_once(name, kwargs):
    rng = random.Random(42)
    sched = make_scheduler(name, **kwargs)
    eng = EngineStandIn(sched, kv_tokens=200)
    pending = sorted((make_request(f"r{i}", prompt_len=rng.randint(1, 40), max_new_tokens=rng.randint(1, 12),
                                   arrival=rng.uniform(0, 60)) for i in range(50)),
                     key=lambda r: r.arrival_time)
    for _ in range(100_000):
        while pending and pending[0].arrival_time <= eng.now:
            eng.arrive(pending.pop(0))
        if not pending:
            sched.start_draining()
        if not pending and not sched.has_pending():
            break
        plan = eng.step()
        if plan.is_empty:   # idle: jump to the next arrival or the scheduler's timer
            nxt = [t for t in (plan.wake_at, pending[0].arrival_time if pending else None) if t is not None]
            eng.now = max(eng.now, min(nxt))
    assert all(r.status is RequestStatus.FINISHED for r in eng.requests.values())
    assert set(eng.released_at) == set(eng.requests)
    assert all(r.num_output_tokens == r.max_new_tokens for r in eng.requests.values())
    assert eng.kv.used_tokens == 0
    assert all(eng.released_at[r.request_id] >= r.token_times[-1] for r in eng.requests.values())
    # the fast-path promise was made, and each time checked by the stand-in
    assert eng.num_promises > 0


def test_make_scheduler():
    assert isinstance(make_scheduler("static", batch_size=2), StaticBatcher)
    assert isinstance(make_scheduler("dynamic", max_batch_size=2, timeout=0.1), DynamicBatcher)
    assert isinstance(make_scheduler("continuous"), ContinuousBatcher)
    with pytest.raises(ValueError, match=r"'orca'.*\['continuous', 'dynamic', 'static'\]"):
        make_scheduler("orca")


# ============================================================================================
# End to end with the real engine and the simulator (skipped if they are not there)
# ============================================================================================

E2E_POLICIES = [
    ("static", {"batch_size": 4, "stream": True}),
    ("dynamic", {"max_batch_size": 3, "timeout": 0.05}),
    ("dynamic", {"max_batch_size": 8, "timeout": 0}),
    ("continuous", {"max_num_seqs": 6, "max_num_batched_tokens": 32}),
    ("continuous", {"max_num_seqs": 16, "max_num_batched_tokens": 48, "long_prefill_token_threshold": 12}),
    ("continuous", {"max_num_seqs": 4, "max_num_batched_tokens": 64, "chunked_prefill": False}),
]


@pytest.mark.parametrize("name, kwargs", E2E_POLICIES)
def test_engine_fast_path_gives_the_same_trace_as_scheduling_every_step(name, kwargs):
    """The simulator may skip ``schedule`` while ``fast_path.steady`` promises pure decodes; the
    trace must be exactly the one made by calling the scheduler every step."""
    engine_module = pytest.importorskip("batchlab.engine")
    from batchlab.backends import CostModel
    from batchlab.sim import SimBackend
    cost = CostModel(fixed_s=0.01, per_seq_s=0.001, per_token_s=0.002, per_attention_pair_s=1e-6)
    rng = random.Random(5)
    t, requests = 0.0, []
    for i in range(80):
        t += rng.expovariate(30.0)
        requests.append(make_request(f"r{i:02d}", prompt_len=rng.randint(1, 60),
                                     max_new_tokens=rng.randint(1, 30), arrival=t))
    traces = [engine_module.Engine(make_scheduler(name, **kwargs), SimBackend(cost, kv_capacity_tokens=300),
                                   fast_decode_runs=fast).run(requests)
              for fast in (False, True)]
    slow, fast = traces
    assert fast.meta["num_fast_steps"] > 0
    assert fast.requests_df().equals(slow.requests_df())
    assert fast.steps_df().equals(slow.steps_df())
    assert fast.chunks_df().equals(slow.chunks_df())
    assert (slow.requests_df()["status"] == "finished").all()
