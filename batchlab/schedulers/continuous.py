"""Continuous batching: the batch is re-formed at every step, within a token budget.

Continuous (iteration-level) batching, introduced by Orca and used by vLLM, does not wait for a
batch to end. Every step it asks each request "how many of your tokens are computed, and how many
do you need?" and hands out tokens from a per-step budget until requests catch up. A request that
finishes leaves after the step that produced its last token, and a waiting one may take its place
at the very next step. With chunked prefill, a long prompt is split across several steps so it
never stalls the decoding requests beside it for long.

The order of one step follows vLLM's v1 scheduler:

1. running requests that are decoding, one token each;
2. running requests still in their prompt, continuing it with what is left of the budget;
3. waiting requests, first come first served, while there is room.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from batchlab.checks import check_bool, check_int
from batchlab.plan import ScheduledChunk, StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers.base import Scheduler, split_ended


@dataclass(frozen=True)
class ContinuousBatcherConfig:
    """The budgets of one step.

    ``max_num_seqs``: the most requests running at once (each holds KV space).
    ``max_num_batched_tokens``: the most tokens computed in one step, prompt chunks and decodes together.
    ``chunked_prefill``: split a prompt across steps when it does not fit the step's remaining budget.
    ``long_prefill_token_threshold``: if set, no request gets more than this many prompt tokens in
    one step, so several long prompts share a step instead of one taking the whole budget
    (needs ``chunked_prefill``). The defaults of the first two are vLLM's usual ones.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens,
                  hint="a step must be able to compute at least one token")
        check_bool("chunked_prefill", self.chunked_prefill)
        threshold = self.long_prefill_token_threshold
        check_int("long_prefill_token_threshold", threshold, allow_none=True, hint="None: no cap")
        if threshold is not None:
            if not self.chunked_prefill:
                raise ValueError(f"long_prefill_token_threshold={threshold} needs chunked_prefill=True: "
                                 "capping a prompt's tokens per step means splitting the prompt")


class ContinuousBatcher(Scheduler):
    """Plan every step from a token budget, letting requests join and leave at any step.

    Rules for one step (budget = ``max_num_batched_tokens`` tokens):

    1. **Decodes first.** Every running request that has finished its prompt gets exactly one
       token (the one it sampled last step). This always fits: a request is admitted only when
       every running request has been served and budget is left over, so there are never more
       running requests than ``max_num_batched_tokens``.
    2. **Unfinished prompts next.** A running request still in its prompt (chunked prefill)
       continues with ``min(rest of its prompt, remaining budget)`` tokens, capped by
       ``long_prefill_token_threshold`` if set. They are served in admission order, so an
       earlier long prompt may use up the budget and a later one waits a step (the cap prevents
       that).
    3. **Then waiting requests, first come first served.** The request at the head of the queue
       is admitted while fewer than ``max_num_seqs`` requests run, the budget has room, and the
       KV cache can reserve its prompt plus all its possible output
       (``kv.can_allocate(prompt_len + max_new_tokens)``). Its first chunk is
       ``min(prompt, remaining budget)`` tokens with chunked prefill; without it, the whole
       prompt, and only if the whole prompt fits the remaining budget.
    4. **No overtaking.** When the head of the queue cannot be admitted (no KV room, or its prompt
       does not fit the remaining budget without chunked prefill), admission stops for this step:
       later, smaller requests do not jump ahead of it. This keeps service in arrival order and
       guarantees the head is admitted as soon as room appears, at the cost of some idle room.
    5. **Leaving.** A request leaves after the step that produced its last token: its response is
       released then (tokens stream as they are computed) and its KV space is freed, so a waiting
       request can use it at the very next step.
    6. **No preemption.** KV space is reserved in full at admission, so a running request can
       never run out of cache; when the cache is full, new requests simply wait.

    A request is never planned twice in one step, and a decode is always exactly one token.
    """

    streams_tokens = True

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 chunked_prefill: bool = True, long_prefill_token_threshold: int | None = None) -> None:
        super().__init__()
        self.config = ContinuousBatcherConfig(max_num_seqs, max_num_batched_tokens, chunked_prefill,
                                              long_prefill_token_threshold)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # in admission order
        # Did the last plan list every running request, in running order? (continues_decoding)
        self._plan_in_running_order = False

    # --- config, read-only ---------------------------------------------------------------------
    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.config.max_num_batched_tokens

    @property
    def chunked_prefill(self) -> bool:
        return self.config.chunked_prefill

    @property
    def long_prefill_token_threshold(self) -> int | None:
        return self.config.long_prefill_token_threshold

    # --- the contract ------------------------------------------------------------------------
    def why_unschedulable(self, req: Request) -> str | None:
        """Besides the KV check: without chunked prefill a prompt must fit one step's budget."""
        reason = super().why_unschedulable(req)
        if reason is None and not self.config.chunked_prefill and req.prompt_len > self.config.max_num_batched_tokens:
            reason = (f"prompt of {req.prompt_len} tokens exceeds max_num_batched_tokens="
                      f"{self.config.max_num_batched_tokens}, and chunked_prefill=False means a prompt "
                      "must be computed in one step")
        return reason

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)

    def has_pending(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def schedule(self, now: float) -> StepPlan:
        """Plan one step: decodes, then unfinished prompts, then new requests (see the class rules)."""
        kv = self.kv
        if kv is None:
            raise RuntimeError("ContinuousBatcher has no KV space; call bind(kv) before schedule()")
        config = self.config
        budget = config.max_num_batched_tokens
        chunked = config.chunked_prefill
        # Per-request cap on prompt tokens in one step (the budget itself when there is no cap).
        prefill_cap = config.long_prefill_token_threshold or budget
        chunks: list[ScheduledChunk] = []

        # 1. Decodes: one token each, in admission order. Prompts in progress are set aside.
        in_prompt: list[Request] = []
        for req in self.running:
            computed = req.num_computed_tokens
            if computed < req.prompt_len:
                in_prompt.append(req)
                continue
            # The token it sampled last step is its one uncomputed token. (The engine checks that
            # every chunk continues its cache and samples at the last known token.)
            chunks.append(ScheduledChunk(req.request_id, computed, 1, True))
            budget -= 1
        # Were all prompts in progress at the end of the running list? (Then the plan lists the
        # running requests in their own order; see ``continues_decoding``.)
        prompts_last = not in_prompt or in_prompt[0] is self.running[len(self.running) - len(in_prompt)]

        # 2. Prompts already started (only with chunked prefill): continue them.
        for req in in_prompt:
            if budget == 0:
                break
            start = req.num_computed_tokens
            rest = req.prompt_len - start
            num_tokens = min(rest, budget, prefill_cap) if chunked else rest
            if num_tokens > budget:
                continue  # only without chunked prefill: the whole rest must fit
            chunks.append(ScheduledChunk(req.request_id, start, num_tokens,
                                         start + num_tokens == req.num_known_tokens))
            budget -= num_tokens

        # 3. Waiting requests, first come first served; stop at the first that cannot start.
        waiting = self.waiting
        while waiting and len(self.running) < config.max_num_seqs:
            req = waiting[0]
            num_tokens = self._first_chunk_tokens(req, budget)
            if num_tokens == 0:
                break
            waiting.popleft()
            kv.allocate(req.request_id, req.max_total_tokens)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            chunks.append(ScheduledChunk(req.request_id, 0, num_tokens,
                                         num_tokens == req.num_known_tokens))
            budget -= num_tokens

        self._plan_in_running_order = prompts_last and len(chunks) == len(self.running)
        return StepPlan(chunks=chunks)

    def _first_chunk_tokens(self, req: Request, budget: int) -> int:
        """How many prompt tokens a waiting ``req`` would compute if admitted now with ``budget``
        tokens left in the step; 0 if it cannot start now (no budget, or no KV room)."""
        if budget <= 0 or not self.kv.can_allocate(req.max_total_tokens):
            return 0
        config = self.config
        if not config.chunked_prefill:
            return req.prompt_len if req.prompt_len <= budget else 0
        return min(req.prompt_len, budget, config.long_prefill_token_threshold or budget)

    may_continue_decoding = True

    def continues_decoding(self, plan: StepPlan) -> bool:
        """True when the next steps are pure decodes of ``plan``'s requests until someone arrives
        or finishes, so the simulator may compute them without asking (see ``Scheduler``).

        The engine asks after a step in which every chunk sampled and nobody finished. Then the
        answer is yes when (a) that plan held every running request, in running order (so now
        each of them decodes, in the order ``schedule`` would list them), and (b) the head of the
        queue cannot be admitted: the running list is full, the decodes use the whole budget, or
        the head does not fit (KV or budget). Neither can change before a request arrives or
        finishes: no KV space is freed and the number of decodes stays the same.
        """
        running = self.running
        if not (running and self._plan_in_running_order and len(plan.chunks) == len(running)):
            return False
        waiting = self.waiting
        if not waiting or len(running) >= self.config.max_num_seqs:
            return True
        return self._first_chunk_tokens(waiting[0], self.config.max_num_batched_tokens - len(running)) == 0

    def on_step_end(self, plan: StepPlan, now: float) -> list[Request]:
        """Remove the requests that finished in this step, free their KV, and release them."""
        finished, still_running = split_ended(self.running)
        if finished:
            self.running = still_running
            self._plan_in_running_order = False
            for req in finished:
                self.kv.free(req.request_id)
        return finished

    def __repr__(self) -> str:
        c = self.config
        return (f"ContinuousBatcher(max_num_seqs={c.max_num_seqs}, max_num_batched_tokens="
                f"{c.max_num_batched_tokens}, chunked_prefill={c.chunked_prefill}, "
                f"long_prefill_token_threshold={c.long_prefill_token_threshold})")
