"""The engine's online mode (no HTTP): an inbox read at the top of each loop pass, aborts, stop.

Steps are simulated with a fixed 2 ms cost (a ruler, not a measurement) played back on the wall
clock, except the greedy-equality test, which runs the real model. Every wait in these tests is
for an event, with a generous timeout, never a timing claim.
"""

from __future__ import annotations

import threading
import time

import pytest

from batchlab.backends import CostModel
from batchlab.sim import SimBackend
from batchlab.engine import Engine
from batchlab.loop import Workload, run_until
from batchlab.online import EngineInbox, EngineListener
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher

RULER = CostModel(fixed_s=0.002, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
TIMEOUT = 30.0


class Recorder(EngineListener):
    """Keeps every event and lets a test wait for a request's end."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[tuple[int, float]]] = {}
        self.ends: dict[str, list[tuple[str, str, float]]] = {}
        self.cond = threading.Condition()

    def on_step(self, out):
        with self.cond:
            for o in out.outputs:
                self.tokens.setdefault(o.request_id, []).extend((token, out.step.end) for token in o.new_token_ids)
            self.cond.notify_all()

    def on_end(self, req, t):
        with self.cond:
            why = f"{req.finish_reason}: {req.finish_detail}" if req.finish_detail else req.finish_reason
            self.ends.setdefault(req.request_id, []).append((req.status.value, why, t))
            self.cond.notify_all()

    def wait_for(self, predicate, what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, TIMEOUT), f"timed out waiting for {what}"


class OnlineEngine:
    """An engine running ``run_online`` in a thread, as a server runs it."""

    def __init__(self, scheduler, backend=None) -> None:
        self.backend = backend or SimBackend(RULER, kv_capacity_tokens=100_000)
        self.engine = Engine(scheduler, self.backend, clock="wall")
        self.inbox = EngineInbox()
        self.rec = Recorder()
        self.trace = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.trace = self.engine.run_online(self.inbox, self.rec)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def stop(self, reason: str = "test over"):
        self.inbox.stop(reason)
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the engine loop did not end after stop()"
        if self.error is not None:
            raise self.error
        return self.trace


class StepLog(EngineListener):
    """Every step output and end, as an offline run tells them."""

    def __init__(self) -> None:
        self.outs, self.ends = [], []

    def on_step(self, out):
        assert not any(rid == o.request_id for o in out.outputs for rid, _ in self.ends), "a token after its end"
        self.outs.append(out)

    def on_end(self, req, t):
        self.ends.append((req.request_id, t))


def test_each_step_tells_its_tokens_cached_prompt_preemptions_and_finishes_once():
    """A paged cache with prefix caching, too small for everyone at once: the step outputs alone
    give back every token, each request's cached prompt, every preemption and the finishing step."""
    backend = SimBackend(RULER, kv_capacity_tokens=192, block_size=16, enable_prefix_caching=True)
    engine = Engine(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64), backend, fast_decode_runs=False)
    shared = list(range(100, 132))                          # two blocks every prompt starts with
    workload = [Request(f"r{i}", shared + [200 + i] * 9, 40, arrival_time=0.01 * i) for i in range(5)]
    log = StepLog()
    run_until(engine, Workload(workload), engine.start(log))
    trace = engine.finish()
    assert [o.step for o in log.outs] == engine.steps                     # each step once, in order
    tokens, cached, finished = {}, {}, {}
    for out in log.outs:
        for o in out.outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.num_cached_tokens is not None:
                assert o.request_id not in cached, "cached tokens told twice"
                cached[o.request_id] = o.num_cached_tokens
            if o.finish_reason is not None:
                finished[o.request_id] = (o.finish_reason, out.step.end)
    preempted = [p for out in log.outs for p in out.preempted]
    assert preempted and preempted == engine.scheduler.preemptions
    for r in trace.requests:
        assert tokens[r.request_id] == r.output_ids
        assert finished[r.request_id] == (r.finish_reason, r.token_times[-1])
    assert cached["r0"] == 0 and all(cached[f"r{i}"] == 32 for i in range(1, 5))   # the shared blocks
    assert sorted(rid for rid, _ in log.ends) == sorted(finished)


def sim_req(i: int, out: int = 5, prompt: int = 8) -> Request:
    return Request(f"r{i}", None, out, prompt_len=prompt)


def test_requests_added_while_running_finish_with_every_token_reported():
    online = OnlineEngine(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64))
    for i in range(6):
        online.inbox.add(sim_req(i, out=3 + i))
        time.sleep(0.003)
    online.rec.wait_for(lambda: len(online.rec.ends) == 6, "6 ends")
    time.sleep(0.05)
    assert online.thread.is_alive(), "an idle online engine must wait for more work, not end"
    online.inbox.add(sim_req(6, out=2))          # served after an idle spell
    online.rec.wait_for(lambda: "r6" in online.rec.ends, "r6's end")
    trace = online.stop()
    assert len(trace.requests) == 7
    for r in trace.requests:
        assert r.status is RequestStatus.FINISHED and r.finish_reason == "length"
        assert [t for _, t in online.rec.tokens[r.request_id]] == r.token_times   # each token, as computed
        assert online.rec.ends[r.request_id] == [("finished", "length", r.release_time)]
    arrivals = [r.arrival_time for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > arrivals[0]
    assert online.backend.kv.used_tokens == 0


def test_abort_running_frees_kv_at_the_next_pass_and_states_why():
    online = OnlineEngine(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64))
    online.inbox.add(sim_req(0, out=20_000))      # runs until aborted
    online.inbox.add(sim_req(1, out=3))
    online.rec.wait_for(lambda: len(online.rec.tokens.get("r0", [])) >= 5, "r0's first tokens")
    online.inbox.abort("r0", "client disconnected")
    online.rec.wait_for(lambda: "r0" in online.rec.ends, "r0's end")
    status, reason, _ = online.rec.ends["r0"][0]
    assert (status, reason) == ("aborted", "abort: client disconnected")
    online.rec.wait_for(lambda: "r1" in online.rec.ends, "r1's end")
    assert online.backend.kv.used_tokens == 0      # the aborted request's space is free
    online.inbox.abort("r0", "again")              # already ended: nothing happens
    online.inbox.abort("nobody", "unknown id")     # unknown: nothing happens
    trace = online.stop()
    r0 = next(r for r in trace.requests if r.request_id == "r0")
    assert r0.status is RequestStatus.ABORTED and 5 <= r0.num_output_tokens < 20_000
    assert len(online.rec.ends["r0"]) == 1 and trace.meta["num_aborted"] == 1


def test_abort_waiting_request_leaves_the_queue():
    online = OnlineEngine(StaticBatcher(batch_size=3))     # waits for 3: the first two wait
    online.inbox.add(sim_req(0))
    online.inbox.add(sim_req(1))
    time.sleep(0.05)
    online.inbox.abort("r0", "client disconnected")
    online.rec.wait_for(lambda: "r0" in online.rec.ends, "r0's end")
    assert online.engine.scheduler.waiting and [r.request_id for r in online.engine.scheduler.waiting] == ["r1"]
    online.inbox.add(sim_req(2))
    online.inbox.add(sim_req(3))                   # r1, r2, r3 make a batch
    online.rec.wait_for(lambda: all(f"r{i}" in online.rec.ends for i in (1, 2, 3)), "the batch's end")
    trace = online.stop()
    statuses = {r.request_id: r.status for r in trace.requests}
    assert statuses == {"r0": RequestStatus.ABORTED, "r1": RequestStatus.FINISHED,
                        "r2": RequestStatus.FINISHED, "r3": RequestStatus.FINISHED}
    assert trace.requests[0].num_output_tokens == 0


def test_non_streaming_batch_releases_members_together_and_aborted_member_keeps_its_slot():
    online = OnlineEngine(StaticBatcher(batch_size=2))     # stream=False: released at batch end
    online.inbox.add(sim_req(0, out=2))
    online.inbox.add(sim_req(1, out=20_000))
    online.rec.wait_for(lambda: "r0" in online.rec.tokens and len(online.rec.tokens.get("r1", [])) >= 3,
                        "both members' tokens")
    assert "r0" not in online.rec.ends             # finished, but its batch has not ended
    online.inbox.abort("r1", "client disconnected")
    online.rec.wait_for(lambda: "r0" in online.rec.ends, "the batch's end")
    assert online.rec.ends["r1"][0][:2] == ("aborted", "abort: client disconnected")
    assert online.backend.kv.used_tokens == 0      # the batch ended, its space is free
    online.stop()


def test_dynamic_timer_fires_online():
    online = OnlineEngine(DynamicBatcher(max_batch_size=8, timeout=0.05))
    online.inbox.add(sim_req(0, out=2))            # alone: leaves when the timer ends
    online.rec.wait_for(lambda: "r0" in online.rec.ends, "r0's end")
    trace = online.stop()
    r0 = trace.requests[0]
    assert r0.status is RequestStatus.FINISHED and r0.first_scheduled_time >= r0.arrival_time + 0.05


def test_stop_ends_in_flight_with_the_reason_and_refuses_later_adds():
    online = OnlineEngine(ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=64))
    for i in range(4):                             # two run, two wait
        online.inbox.add(sim_req(i, out=20_000))
    online.rec.wait_for(lambda: len(online.rec.tokens) == 2, "two running requests")
    trace = online.stop("server shutting down")
    assert {r.status for r in trace.requests} == {RequestStatus.ABORTED}
    assert {(r.finish_reason, r.finish_detail) for r in trace.requests} == {("abort", "server shutting down")}
    assert all(len(online.rec.ends[r.request_id]) == 1 for r in trace.requests)
    assert online.backend.kv.used_tokens == 0
    with pytest.raises(RuntimeError, match="stopping"):
        online.inbox.add(sim_req(9))


def test_rejected_and_duplicate_requests_end_with_a_reason():
    online = OnlineEngine(ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=64),
                          SimBackend(RULER, kv_capacity_tokens=100))
    online.inbox.add(sim_req(0, out=500))          # can never fit 100 KV tokens
    online.inbox.add(sim_req(1, out=2))
    online.inbox.add(sim_req(1, out=2))            # same id again
    online.rec.wait_for(lambda: len(online.rec.ends.get("r1", [])) == 2 and "r0" in online.rec.ends, "ends")
    assert online.rec.ends["r0"][0][0] == "rejected" and "needs 508 KV tokens" in online.rec.ends["r0"][0][1]
    assert sorted(e[0] for e in online.rec.ends["r1"]) == ["finished", "rejected"]
    assert any("already in use" in (e[1] or "") for e in online.rec.ends["r1"])
    online.stop()


def test_bad_uses_are_refused():
    with pytest.raises(ValueError, match="wall clock"):
        Engine(ContinuousBatcher(), SimBackend(RULER, kv_capacity_tokens=100)).run_online(EngineInbox())
    inbox = EngineInbox()
    with pytest.raises(ValueError, match="must say why"):
        inbox.abort("r0", "")
    used = sim_req(0)
    used.output_ids.append(1)
    with pytest.raises(ValueError, match="fresh"):
        inbox.add(used)


def test_online_greedy_outputs_equal_the_offline_run(lm):
    """The same loop online: the real model's greedy tokens equal an offline run's."""
    from batchlab.backends import ModelBackend
    tok = lm.tokenizer
    prompts = ["The capital of France is", "One, two, three,", "def add(a, b):", "Once upon a time"]
    reqs = [Request(f"p{i}", tok(p)["input_ids"], 6) for i, p in enumerate(prompts)]
    offline = Engine(ContinuousBatcher(max_num_seqs=4), ModelBackend(lm, num_slots=4, max_seq_len=64)).run(reqs)
    online = OnlineEngine(ContinuousBatcher(max_num_seqs=4), ModelBackend(lm, num_slots=4, max_seq_len=64))
    for r in reqs:
        online.inbox.add(r.fresh_copy())
        time.sleep(0.01)                           # staggered: they join running batches
    online.rec.wait_for(lambda: len(online.rec.ends) == 4, "4 ends")
    trace = online.stop()
    assert {r.request_id: r.output_ids for r in trace.requests} == \
        {r.request_id: r.output_ids for r in offline.requests}
