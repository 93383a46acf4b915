"""Requests: what a client submits, and the state a request carries through a server.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from batchlab.checks import check_fraction, check_int, check_number, fail, is_int, is_number


class RequestStatus(str, enum.Enum):
    WAITING = "waiting"      # arrived, not yet admitted (no KV space held)
    RUNNING = "running"      # admitted: holds KV space, being prefilled or decoded
    FINISHED = "finished"    # produced all its tokens (or a stop token)
    REJECTED = "rejected"    # could never be served; ``finish_reason`` says why
    # ended early by the server (client gone, stop string, shutdown); ``finish_reason`` says why
    ABORTED = "aborted"


class FinishReason(enum.StrEnum):
    """Why a request ended (vLLM's ``FinishReason``, plus REJECTED); the words are in
    ``finish_detail``.

    A string enum: ``FinishReason.LENGTH == "length"`` and ``str(FinishReason.LENGTH) == "length"``,
    so it compares, prints and serializes as its value.
    """

    LENGTH = "length"        # produced max_new_tokens
    STOP = "stop"            # produced a stop token
    # ended early (client gone, shutdown): FinishReason.ABORT, status ABORTED
    ABORT = "abort"
    REJECTED = "rejected"    # could never be served: status REJECTED

    @property
    def status(self) -> RequestStatus:
        """The status a request ends with for this reason."""
        return _STATUS_OF[self]


def parse_finish_reason(text: str | None) -> tuple[FinishReason | None, str | None]:
    """A stored finish reason as ``(FinishReason, detail)``. Also reads the older one-string form,
    ``"aborted: <why>"`` and ``"rejected: <why>"``."""
    if text is None:
        return None, None
    for old, reason in (("aborted: ", FinishReason.ABORT), ("rejected: ", FinishReason.REJECTED)):
        if text.startswith(old):
            return reason, text[len(old):]
    try:
        return FinishReason(text), None
    except ValueError:
        raise ValueError(f"finish_reason={text!r}; must be one of "
                         f"{[r.value for r in FinishReason]} "
                         "(or 'aborted: <why>', 'rejected: <why>')") from None


_STATUS_OF = {FinishReason.LENGTH: RequestStatus.FINISHED,
              FinishReason.STOP: RequestStatus.FINISHED, FinishReason.ABORT: RequestStatus.ABORTED,
              FinishReason.REJECTED: RequestStatus.REJECTED}


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen, with vLLM's names and meanings. ``temperature == 0`` means
    greedy: the most likely token after penalties and ``min_tokens`` (as vLLM's sampler does).

    ``seed`` makes a sampled request reproducible on its own: each request draws from its own
    generator, so its output does not depend on which other requests shared its steps.

    The logit processors, in vLLM's order (``batchlab.model.sampling`` applies them):
    ``min_tokens``: the request's stop tokens cannot be sampled until it has this many tokens.
    ``repetition_penalty`` (> 0, 1 = off): a token already in the prompt or the output has its
    logit divided by it when positive, multiplied when negative. ``frequency_penalty`` and
    ``presence_penalty`` (in [-2, 2], 0 = off): subtracted once per earlier occurrence in the
    output, and once if it occurred at all. Then temperature, ``min_p`` (drop tokens less likely
    than ``min_p`` times the most likely one), ``top_k`` (0 = off) and ``top_p``.
    ``logit_bias``: ``(token id, bias)`` pairs added to the logits first (with ``min_tokens``).
    ``logprobs``: return the sampled token's log-probability and the ``logprobs`` most likely
    tokens' (None = not asked; 0 = only the sampled token's), from the model's raw logits.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, hint="0 = greedy")
        check_fraction("top_p", self.top_p)
        check_int("seed", self.seed, minimum=None, allow_none=True)
        check_int("top_k", self.top_k, minimum=0, hint="0 = every token")
        check_fraction("min_p", self.min_p, "[0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            check_number(name, getattr(self, name), minimum=-2.0, maximum=2.0, hint="0 = off")
        check_number("repetition_penalty", self.repetition_penalty, strict=True, hint="1 = off")
        check_int("min_tokens", self.min_tokens, minimum=0)
        check_int("logprobs", self.logprobs, minimum=0, allow_none=True)
        if not isinstance(self.logit_bias, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and is_int(pair[0]) and pair[0] >= 0
                and is_number(pair[1])
                for pair in self.logit_bias):
            fail("logit_bias", self.logit_bias, "a tuple of (token id >= 0, finite bias) pairs")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the logits depend on the tokens so far (a penalty is on)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits first: the argmax of the raw logits."""
        return self.greedy and not self.penalized and self.min_tokens == 0 and not self.logit_bias


GREEDY = SamplingParams()        # the default, shared: it is frozen


@dataclass(frozen=True)
class TokenLogprobs:
    """The model's log-probabilities at one output position, from its raw logits (before
    penalties, temperature and filters: vLLM's default ``raw_logprobs``)."""

    token_id: int                            # the token that was sampled
    logprob: float                           # its log-probability
    rank: int                                # 1 = the most likely token
    top: tuple[tuple[int, float], ...] = ()  # the most likely (token id, logprob), best first


@dataclass
class KVTransfer:
    """Prompt KV computed elsewhere that a request brings along (a disaggregated decode worker's
    request; vLLM's ``kv_transfer_params``, its connector's "external computed tokens").

    ``tokens``: the leading prompt tokens whose keys and values arrive; at most ``prompt_len - 1``,
    since the last prompt token is computed where the request decodes and samples its first token.
    ``kv``: those keys and values, (num_layers, >= tokens, 2, num_kv_heads, head_dim), for a cache
    that stores values; None in the simulator, which counts tokens. ``seconds``: how long they take
    to arrive once the request holds KV space, and not before ``not_before`` (the link is busy).
    ``arrival_time``, set when a scheduler admits the request: when they land.
    """

    tokens: int
    kv: Any = field(default=None, repr=False)
    seconds: float = 0.0
    not_before: float = 0.0
    arrival_time: float | None = None

    def __post_init__(self) -> None:
        check_int("kv_transfer.tokens", self.tokens, hint="prompt tokens whose KV arrives")
        for name in ("seconds", "not_before"):
            check_number(f"kv_transfer.{name}", getattr(self, name), hint="seconds")
        shape = getattr(self.kv, "shape", None)
        if self.kv is not None and (shape is None or len(shape) != 5 or shape[1] < self.tokens):
            raise ValueError(f"kv_transfer.kv of shape {shape}; must be a tensor (num_layers, "
                             f">= tokens = {self.tokens}, 2, num_kv_heads, head_dim), or None")

    def start(self, now: float) -> None:
        """The request is admitted at ``now``: the pull starts into the KV space it now holds."""
        self.arrival_time = max(now + self.seconds, self.not_before)

    def in_flight(self, now: float) -> bool:
        """Pulled, and not landed yet at ``now``."""
        return self.arrival_time is not None and now < self.arrival_time

    def fresh(self) -> "KVTransfer":
        return KVTransfer(self.tokens, self.kv, self.seconds, self.not_before)


@dataclass
class KVCopy:
    """A sequence's prompt KV copied out of a cache as its request finishes (a prefill worker's
    export, what a ``KVTransfer`` later brings): ``kv`` (layers, tokens, 2, KV heads, head dim),
    None where the cache stores no values; ``block_ids``: the blocks (or slot) it lay in."""

    kv: Any
    block_ids: list[int]


@dataclass(slots=True)
class SpecState:
    """A request's speculative decoding: its draft for the next step (the backend's proposal) and,
    per step that checked one of its drafts, ``(drafted, accepted)`` token counts."""

    draft_ids: list[int] = field(default_factory=list)
    checks: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Request:
    """One client request and its life in the server.

    Inputs: ``request_id``, ``prompt_ids`` (or only ``prompt_len`` for simulated requests),
    ``max_new_tokens``, ``arrival_time`` (seconds on the workload's timeline), ``sampling``, and
    ``stop_token_ids`` (empty by default, so every request makes exactly ``max_new_tokens``
    tokens, as serving benchmarks do with ``ignore_eos``). Disaggregated serving: ``kv_transfer``,
    prompt KV computed elsewhere that comes with it (``KVTransfer``); ``kv_export``, a prefill
    worker's request, whose prompt KV the engine hands to its listener when it finishes.

    State, written by the engine only: ``status``, ``num_computed_tokens``, ``output_ids``,
    ``token_times`` (when each output token was computed), ``output_logprobs`` (one
    ``TokenLogprobs`` per output token, when ``sampling.logprobs`` asks), ``first_scheduled_time``,
    ``finish_reason`` (a ``FinishReason``) and ``finish_detail`` (why, in words, when it was
    aborted or rejected), ``spec`` (its ``SpecState`` when a backend speculates, else None).
    """

    request_id: str
    prompt_ids: list[int] | None
    max_new_tokens: int
    arrival_time: float = 0.0
    sampling: SamplingParams = GREEDY
    prompt_len: int = -1
    stop_token_ids: tuple[int, ...] = ()
    kv_transfer: KVTransfer | None = None
    kv_export: bool = False

    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    first_scheduled_time: float | None = None
    finish_reason: FinishReason | None = None
    finish_detail: str | None = None
    spec: SpecState | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id={self.request_id!r}; must be a non-empty string")
        if self.prompt_ids is not None:
            ids = self.prompt_ids       # a list of Python ints is copied as it is (a fast check)
            self.prompt_ids = (list(ids) if type(ids) is list and set(map(type, ids)) <= {int}
                               else list(map(int, ids)))
            if self.prompt_len not in (-1, len(self.prompt_ids)):
                raise ValueError(
                    f"request {self.request_id!r}: prompt_len={self.prompt_len} but prompt_ids has "
                    f"{len(self.prompt_ids)} tokens; give one or make them agree")
            self.prompt_len = len(self.prompt_ids)
        if not is_int(self.prompt_len) or self.prompt_len < 1:
            raise ValueError(
                f"request {self.request_id!r}: prompt_len={self.prompt_len!r}; must be an int >= 1 "
                "(a prompt needs at least 1 token)")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(
                f"request {self.request_id!r}: max_new_tokens={self.max_new_tokens!r}; "
                "must be an int >= 1")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"request {self.request_id!r}: sampling={self.sampling!r}; "
                             "must be a SamplingParams")
        if self.sampling.min_tokens > self.max_new_tokens:
            raise ValueError(f"request {self.request_id!r}: min_tokens={self.sampling.min_tokens}; "
                             f"must be at most max_new_tokens={self.max_new_tokens}")
        if not is_number(self.arrival_time) or self.arrival_time < 0:
            raise ValueError(
                f"request {self.request_id!r}: arrival_time={self.arrival_time!r}; must be a "
                "finite number of seconds >= 0")
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not all(is_int(t) for t in stops):
            raise ValueError(f"request {self.request_id!r}: stop_token_ids={stops!r}; must be a "
                             "list of token ids (ints)")
        self.stop_token_ids = tuple(int(t) for t in stops)
        transfer = self.kv_transfer
        if transfer is not None and (not isinstance(transfer, KVTransfer)
                                     or transfer.tokens >= self.prompt_len):
            raise ValueError(f"request {self.request_id!r}: kv_transfer={transfer!r}; must be a "
                             f"KVTransfer of at most prompt_len - 1 = {self.prompt_len - 1} tokens "
                             "(the last prompt token is computed where the request decodes), "
                             "or None")
        if not isinstance(self.kv_export, bool):
            raise ValueError(f"request {self.request_id!r}: kv_export={self.kv_export!r}; "
                             "must be True or False")

    # --- sizes -------------------------------------------------------------------------------
    @property
    def max_total_tokens(self) -> int:
        """KV slots this request can ever need: the prompt plus every token it may generate."""
        return self.prompt_len + self.max_new_tokens

    @property
    def num_known_tokens(self) -> int:
        """Tokens that exist so far (prompt + generated); the cache must catch up to this."""
        return self.prompt_len + len(self.output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def is_done(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.REJECTED,
                               RequestStatus.ABORTED)

    def stops_on(self, token: int) -> bool:
        """Whether sampling ``token`` last ends this request: a stop token, once it has
        ``min_tokens``."""
        return token in self.stop_token_ids and len(self.output_ids) >= self.sampling.min_tokens

    def ends_on(self, token: int) -> FinishReason | None:
        """The end rule, for ``token`` just appended: STOP on a stop token (once it has
        ``min_tokens``), LENGTH at ``max_new_tokens``, else None (it goes on)."""
        if self.stops_on(token):
            return FinishReason.STOP
        return FinishReason.LENGTH if len(self.output_ids) >= self.max_new_tokens else None

    def tokens_to_end(self, token: int) -> int:
        """How many more tokens end it if every one is ``token`` (the end rule above, run ahead: the
        simulator's fast path sizes its decode runs with it)."""
        n = len(self.output_ids)
        if token in self.stop_token_ids:
            return min(self.max_new_tokens, max(n + 1, self.sampling.min_tokens)) - n
        return self.max_new_tokens - n

    def token_ids(self, start: int, num: int) -> list[int]:
        """Known tokens ``[start, start + num)`` of ``prompt_ids + output_ids``."""
        if self.prompt_ids is None:
            raise ValueError(f"request {self.request_id!r} is simulated (no prompt_ids); it can "
                             "only run on the simulator")
        if start < 0 or num < 1 or start + num > self.num_known_tokens:
            raise ValueError(f"request {self.request_id!r}: tokens [{start}, {start + num}) are "
                             f"outside the {self.num_known_tokens} known tokens")
        seq = self.prompt_ids + self.output_ids
        return seq[start:start + num]

    # --- state changes (engine only) -----------------------------------------------------------
    def fresh_copy(self, **inputs) -> "Request":
        """A new request with the same inputs, except the ``inputs`` given (``max_new_tokens=1``,
        ...), and no run state."""
        # The prompt, checked token by token when this request was made, is copied after (a
        # simulation copies every request of its workload; long prompts made that scan its cost).
        same_prompt = (self.prompt_ids is not None
                       and "prompt_ids" not in inputs and "prompt_len" not in inputs
                       and len(self.prompt_ids) == self.prompt_len)
        same = {"request_id": self.request_id, "max_new_tokens": self.max_new_tokens,
                # (else copied by __post_init__)
                "prompt_ids": None if same_prompt else self.prompt_ids,
                "arrival_time": self.arrival_time, "sampling": self.sampling,
                "prompt_len": self.prompt_len,
                "stop_token_ids": self.stop_token_ids, "kv_export": self.kv_export,
                "kv_transfer": None if self.kv_transfer is None else self.kv_transfer.fresh()}
        copy = Request(**{**same, **inputs})
        if same_prompt:
            copy.prompt_ids = list(self.prompt_ids)
        return copy
