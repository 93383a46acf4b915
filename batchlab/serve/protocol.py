"""The OpenAI-compatible wire format: validating request bodies, and building responses and errors.

Only what batchlab's server accepts is checked here, each field with an error that names it and
says what is allowed, as an OpenAI-style error body::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": 400}}

Implemented fields (as vLLM's OpenAI server takes them): ``model``, ``prompt`` (a string or a
list of token ids; completions) or ``messages`` (chat), ``max_tokens`` (chat also
``max_completion_tokens``), ``min_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``logit_bias``, ``seed``,
``stop``, ``stop_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``,
``ignore_eos``, ``n`` (1 only), ``stream``, ``stream_options`` (``include_usage``,
``continuous_usage_stats``), ``user``; completions also ``echo`` and ``logprobs`` (an integer:
how many top tokens); chat also ``add_generation_prompt``, ``logprobs`` (true/false) and
``top_logprobs``. Log-probabilities are the model's raw ones, as vLLM returns by default.
``kv_transfer_params`` (disaggregated serving's hand-off, vLLM's NIXL fields) is read by a server
started with ``--kv-transfer-config`` (``kv_transfer.py``) and ignored, with a warning, by others.

A field vLLM knows but batchlab's engine cannot do (``n`` > 1, beam search, ``best_of``,
structured output, tools, ``prompt_logprobs``, ...) is refused with a 400 naming the field and
why, unless it holds its do-nothing value (``"best_of": 1``, ``"tools": []``; clients send
those). A field nobody knows is ignored with a logged warning, as vLLM's ``OpenAIBaseModel``
does, so a client or router that adds a defaulted field of its own still gets answers.

``model`` may be the served name or the model's ``root`` (its folder, as ``/v1/models`` lists it:
``vllm bench serve`` names the model by it). ``/tokenize`` and ``/detokenize`` bodies are
checked here too (vLLM's: ``prompt`` or
``messages``, ``add_special_tokens``, ``add_generation_prompt``, ``return_token_strs``; ``tokens``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field

from batchlab.requests import SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16      # OpenAI's and vLLM's default for /v1/completions
MAX_STOP_STRINGS = 4
CHAT_ROLES = ("system", "user", "assistant")

COMMON_FIELDS = ("model", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "seed", "stop",
                 "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "ignore_eos", "n",
                 "stream", "stream_options", "user", "kv_transfer_params")
IMPLEMENTED_FIELDS = {
    "completion": COMMON_FIELDS + ("prompt", "echo", "logprobs"),
    "chat": COMMON_FIELDS + ("messages", "max_completion_tokens", "add_generation_prompt", "logprobs",
                             "top_logprobs"),
}
MAX_LOGPROBS = 20                        # vLLM's default --max-logprobs
# Known to vLLM, not done by batchlab's engine: accepted at the value that asks for nothing
# (what clients send by default), refused otherwise.
DO_NOTHING_VALUES = {
    "prompt_logprobs": (None,), "best_of": (None, 1), "suffix": (None, ""), "use_beam_search": (None, False),
    "length_penalty": (None, 1), "response_format": (None, {"type": "text"}), "tools": (None, []),
    "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False), "priority": (None, 0),
    "truncate_prompt_tokens": (None,), "echo": (None, False), "continue_final_message": (None, False),
    "chat_template": (None,), "chat_template_kwargs": (None, {}), "documents": (None,),
    "add_special_tokens": (None,), "store": (None, False), "metadata": (None, {}),
    "bad_words": (None, []), "allowed_token_ids": (None, []), "guided_json": (None,), "guided_regex": (None,),
    "guided_choice": (None,), "guided_grammar": (None,), "structured_outputs": (None,),
    "return_tokens_as_token_ids": (None, False), "spaces_between_special_tokens": (None, True),
    # vllm-router re-serializes each request with its own defaults of these SGLang fields (the
    # reasoning ones ask for nothing here: the course's model writes no separate reasoning).
    "no_stop_trim": (None, False), "return_hidden_states": (None, False),
    "separate_reasoning": (None, True, False), "stream_reasoning": (None, True, False),
    "include_reasoning": (None, True, False),
}
WHY_NOT = {
    "prompt_logprobs": "the engine keeps the logits of sampled positions only, not of the prompt's",
    "response_format": "there is no structured (JSON) decoding; only {\"type\": \"text\"}",
    "best_of": "the engine makes one sequence per request",
    "use_beam_search": "the engine makes one sequence per request",
    "priority": "the schedulers serve in arrival order, without priorities",
    "tools": "the server parses no tool calls out of the model's text",
    "tool_choice": "the server parses no tool calls out of the model's text",
    **{name: "there is no structured decoding (no grammar masks the logits)"
       for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")},
}
IGNORED_LOG = logging.getLogger("batchlab.serve")


class APIError(Exception):
    """An error answered to the client: HTTP status, message, the field at fault, and its type."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


def bad(param: str | None, message: str) -> APIError:
    return APIError(400, message, param)


@dataclass
class GenerationRequest:
    """A validated request: the prompt as token ids and how to generate."""

    kind: str                        # "completion" or "chat"
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams         # temperature, top_p, top_k, penalties, min_tokens, logprobs, ...
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    model: str = ""
    stop_token_ids: tuple[int, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True
    echo_text: str | None = None           # completions with echo: the prompt, put before the answer
    kv_transfer_params: dict | None = None  # disaggregated serving's hand-off (serve/kv_transfer.py)


# --- field checks -------------------------------------------------------------------------------
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(None, f"the request body is not valid JSON ({e}); send a JSON object") from None
    if not isinstance(body, dict):
        raise bad(None, f"the request body is a JSON {type(body).__name__}; it must be a JSON object")
    return body


def _optional(body: dict, name: str, default):
    value = body.get(name)
    return default if value is None else value


def check_fields(body: dict, implemented: tuple[str, ...]) -> list[str]:
    """400 for a field vLLM knows that this server cannot do (unless it holds its do-nothing
    value); the names of fields nobody knows, which are ignored (logged, as vLLM logs them)."""
    ignored = []
    for name, value in body.items():
        if name in implemented:
            continue
        if name not in DO_NOTHING_VALUES:
            ignored.append(name)
            continue
        allowed = DO_NOTHING_VALUES[name]
        if not any(_same(value, a) for a in allowed):
            why = WHY_NOT.get(name, f"batchlab does not implement {name}")
            raise bad(name, f"{name}={_short(value)}; must be one of {list(allowed)} ({why})")
    if ignored:
        IGNORED_LOG.warning("The following fields were present in the request but ignored: %s", sorted(ignored))
    return ignored


def _same(value: object, allowed: object) -> bool:
    """Equal, with booleans kept apart from numbers (``logprobs: 0`` asks for something; ``false`` does not)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return value == allowed


def _check_model(body: dict, served_model: str, root: str | None) -> None:
    """The model must be the served name (or its ``root``, the folder ``/v1/models`` reports)."""
    model = body.get("model")
    if model is not None and model != served_model and model != root:
        raise APIError(404, f"model {model!r} does not exist; this server serves {served_model!r}",
                       "model", "not_found_error")


def parse_generation(body: dict, kind: str, *, served_model: str, tokenizer, max_model_len: int,
                     root: str | None = None) -> GenerationRequest:
    """Check a completions (``kind="completion"``) or chat (``"chat"``) body; 4xx on the first fault."""
    check_fields(body, IMPLEMENTED_FIELDS[kind])
    _check_model(body, served_model, root)
    if kind == "completion":
        prompt_ids, prompt_field = _completion_prompt(body, tokenizer), "prompt"
    else:
        flag = _optional(body, "add_generation_prompt", True)
        if not isinstance(flag, bool):
            raise bad("add_generation_prompt", f"add_generation_prompt={flag!r}; must be true or false")
        prompt_ids, prompt_field = _chat_prompt(body, tokenizer, flag), "messages"
    if len(prompt_ids) >= max_model_len:
        raise bad(prompt_field, f"This model's maximum context length is {max_model_len} tokens. However, your "
                                f"prompt is {len(prompt_ids)} tokens, and it must leave room for at least one "
                                "output token (max_model_len, as vLLM words it)")

    max_field = "max_tokens"
    max_tokens = body.get("max_tokens")
    if kind == "chat" and max_tokens is None and body.get("max_completion_tokens") is not None:
        max_field, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = (DEFAULT_COMPLETION_MAX_TOKENS if kind == "completion"
                      else max_model_len - len(prompt_ids))   # chat: the rest of the window
        max_tokens = min(max_tokens, max_model_len - len(prompt_ids))
    elif not _is_int(max_tokens) or max_tokens < 1:
        raise bad(max_field, f"{max_field}={max_tokens!r}; must be an integer >= 1")
    elif len(prompt_ids) + max_tokens > max_model_len:
        raise bad(max_field, f"This model's maximum context length is {max_model_len} tokens. However, you "
                             f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, "
                             f"{max_tokens} in the completion): {max_field}={max_tokens}; ask for at most "
                             f"{max_model_len - len(prompt_ids)}")

    sampling = _sampling(body, kind, max_tokens, len(tokenizer))
    n = _optional(body, "n", 1)
    if n != 1 or not _is_int(n):
        raise bad("n", f"n={n!r}; this server makes one choice per request: n must be 1")
    stop = _optional(body, "stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise bad("stop", f"stop={stop!r}; must be a non-empty string or a list of at most "
                          f"{MAX_STOP_STRINGS} non-empty strings")
    vocab = len(tokenizer)
    stop_token_ids = _optional(body, "stop_token_ids", [])
    if not isinstance(stop_token_ids, list) or not all(_is_int(t) and 0 <= t < vocab for t in stop_token_ids):
        raise bad("stop_token_ids", f"stop_token_ids={_short(stop_token_ids)}; must be a list of token ids "
                                    f"in [0, {vocab})")
    flags = {}
    for name, default in (("ignore_eos", False), ("stream", False), ("echo", False),
                          ("include_stop_str_in_output", False), ("skip_special_tokens", True)):
        flags[name] = _optional(body, name, default)
        if not isinstance(flags[name], bool):
            raise bad(name, f"{name}={flags[name]!r}; must be true or false")
    options = _optional(body, "stream_options", {})
    if not isinstance(options, dict):
        raise bad("stream_options", f"stream_options={options!r}; must be an object")
    for name in ("include_usage", "continuous_usage_stats"):
        if not isinstance(options.get(name, False), bool):
            raise bad(f"stream_options.{name}", f"stream_options.{name}={options[name]!r}; must be true or false")
    unknown = set(options) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        name = sorted(unknown)[0]
        raise bad(f"stream_options.{name}", f"stream_options.{name}: not supported; allowed: "
                                            "include_usage, continuous_usage_stats")
    echo_text = None
    if flags["echo"] and sampling.logprobs is not None:
        raise bad("echo", "echo=true with logprobs needs the prompt's log-probabilities (prompt_logprobs), which "
                          "the engine does not keep; send one of them")
    if flags["echo"]:
        prompt = body["prompt"]
        echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids)
    return GenerationRequest(kind, prompt_ids, max_tokens, sampling, stop,
                             flags["ignore_eos"], flags["stream"], bool(options.get("include_usage")),
                             bool(options.get("continuous_usage_stats")), served_model, tuple(stop_token_ids),
                             flags["include_stop_str_in_output"], flags["skip_special_tokens"], echo_text,
                             body.get("kv_transfer_params"))


def _number(body: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False,
            hint: str = "") -> float:
    value = _optional(body, name, default)
    if not _is_number(value) or not (low < value if open_low else low <= value) or value > high:
        allowed = (f"a number {'>' if open_low else '>='} {low:g}" if high == math.inf
                   else f"a number in {'(' if open_low else '['}{low:g}, {high:g}]")
        raise bad(name, f"{name}={value!r}; must be {allowed}" + (f" ({hint})" if hint else ""))
    return float(value)


def _sampling(body: dict, kind: str, max_tokens: int, vocab: int) -> SamplingParams:
    """The sampling fields, with vLLM's ranges and defaults."""
    temperature = _number(body, "temperature", 1.0, 0, 2, hint="0 = greedy")
    top_p = _number(body, "top_p", 1.0, 0, 1, open_low=True)
    min_p = _number(body, "min_p", 0.0, 0, 1)
    presence, frequency = (_number(body, name, 0.0, -2, 2, hint="0 = off")
                           for name in ("presence_penalty", "frequency_penalty"))
    repetition = _number(body, "repetition_penalty", 1.0, 0, math.inf, open_low=True, hint="1 = off")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad("seed", f"seed={seed!r}; must be an integer or null")
    top_k = _optional(body, "top_k", 0)
    if not _is_int(top_k) or top_k < -1:
        raise bad("top_k", f"top_k={top_k!r}; must be an integer >= 1, or 0 or -1 (every token)")
    min_tokens = _optional(body, "min_tokens", 0)
    if not _is_int(min_tokens) or not 0 <= min_tokens <= max_tokens:
        raise bad("min_tokens", f"min_tokens={min_tokens!r}; must be an integer in [0, max_tokens={max_tokens}]")
    bias = _optional(body, "logit_bias", {})
    pairs = []
    if not isinstance(bias, dict):
        raise bad("logit_bias", f"logit_bias={_short(bias)}; must be an object of token id -> bias")
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token < vocab or not _is_number(value):
            raise bad("logit_bias", f"logit_bias[{key!r}]={_short(value)}; keys must be token ids in [0, {vocab}) "
                                    "and values numbers (clamped to [-100, 100])")
        pairs.append((token, max(-100.0, min(100.0, float(value)))))
    return SamplingParams(temperature, top_p, seed, max(top_k, 0), min_p, presence, frequency, repetition,
                          min_tokens, tuple(pairs), _logprobs(body, kind))


def _logprobs(body: dict, kind: str) -> int | None:
    """How many top tokens' log-probabilities to return per output token (None: none asked).
    Completions: ``logprobs`` is that number; chat: ``logprobs`` true, and ``top_logprobs``."""
    if kind == "completion":
        n = body.get("logprobs")
        if n is None:
            return None
        if not _is_int(n) or not 0 <= n <= MAX_LOGPROBS:
            raise bad("logprobs", f"logprobs={n!r}; must be null or an integer in [0, {MAX_LOGPROBS}] (how many "
                                  "most likely tokens to return per token)")
        return n
    on = _optional(body, "logprobs", False)
    if not isinstance(on, bool):
        raise bad("logprobs", f"logprobs={on!r}; must be true or false (top_logprobs says how many)")
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_LOGPROBS):
        raise bad("top_logprobs", f"top_logprobs={top!r}; must be null or an integer in [0, {MAX_LOGPROBS}]")
    if top and not on:
        raise bad("top_logprobs", f"top_logprobs={top}; needs logprobs=true")
    return (top or 0) if on else None


def _completion_prompt(body: dict, tokenizer) -> list[int]:
    if "prompt" not in body or body["prompt"] is None:
        raise bad("prompt", "prompt is required: a string, or a list of token ids")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]                  # a batch of one string
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "prompt is an empty string; it needs at least one token")
        return list(tokenizer(prompt)["input_ids"])
    vocab = len(tokenizer)
    if isinstance(prompt, list) and prompt and all(_is_int(t) and 0 <= t < vocab for t in prompt):
        return list(prompt)
    raise bad("prompt", f"prompt must be a non-empty string or a non-empty list of token ids in "
                        f"[0, {vocab}); one prompt per request (got {_short(prompt)})")


def _chat_prompt(body: dict, tokenizer, add_generation_prompt: bool = True) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"messages must be a non-empty list of {{role, content}} objects "
                              f"(got {_short(messages)})")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"messages[{i}] is {_short(m)}; must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise bad(f"messages[{i}].role", f"messages[{i}].role={role!r}; allowed: {list(CHAT_ROLES)}")
        if isinstance(content, list):       # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad(f"messages[{i}].content", f"messages[{i}].content: only text parts "
                                                    "({\"type\": \"text\", \"text\": ...}) are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content", f"messages[{i}].content={_short(content)}; must be a string")
        clean.append({"role": role, "content": content})
    text = tokenizer.apply_chat_template(clean, add_generation_prompt=add_generation_prompt, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# --- /tokenize and /detokenize (vLLM's routes) ----------------------------------------------------
def parse_tokenize(body: dict, *, served_model: str, tokenizer, root: str | None = None) -> tuple[list[int], bool]:
    """``(token ids, return_token_strs)`` for a ``/tokenize`` body: ``prompt`` (a string) or ``messages``."""
    chat = "messages" in body
    names = ("model", "return_token_strs") + (
        ("messages", "add_generation_prompt", "add_special_tokens") if chat else ("prompt", "add_special_tokens"))
    for name in body:
        if name not in names:
            raise bad(name, f"{name}={_short(body[name])}; /tokenize accepts {list(names)}")
    _check_model(body, served_model, root)
    flags = {}
    for name, default in (("return_token_strs", False), ("add_special_tokens", not chat),
                          ("add_generation_prompt", True)):
        flags[name] = _optional(body, name, default)
        if not isinstance(flags[name], bool):
            raise bad(name, f"{name}={flags[name]!r}; must be true or false")
    if chat:
        ids = _chat_prompt(body, tokenizer, flags["add_generation_prompt"])
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad("prompt", f"prompt={_short(prompt)}; must be a string (or send messages)")
        ids = list(tokenizer(prompt, add_special_tokens=flags["add_special_tokens"])["input_ids"])
    return ids, flags["return_token_strs"]


def parse_detokenize(body: dict, *, served_model: str, tokenizer, root: str | None = None) -> list[int]:
    """The token ids of a ``/detokenize`` body (``tokens``)."""
    for name in body:
        if name not in ("model", "tokens"):
            raise bad(name, f"{name}={_short(body[name])}; /detokenize accepts ['model', 'tokens']")
    _check_model(body, served_model, root)
    tokens, vocab = body.get("tokens"), len(tokenizer)
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < vocab for t in tokens):
        raise bad("tokens", f"tokens={_short(tokens)}; must be a list of token ids in [0, {vocab})")
    return tokens


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- responses ----------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _logprob(value: float) -> float:
    return max(value, -9999.0)          # -inf as the finite number OpenAI's API uses (vLLM's clamp)


def _entries(lp) -> list[tuple[int, float]]:
    """vLLM's order for one position: the sampled token first, then the most likely ones (once each)."""
    out = {lp.token_id: lp.logprob}
    for token, value in lp.top:
        out.setdefault(token, value)
    return list(out.items())


def completion_logprobs(logprobs: list, num_top: int, decode, text_offset: int = 0) -> dict:
    """A completions choice's ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``) for ``logprobs`` (``TokenLogprobs`` per token), as vLLM builds it: each
    ``top_logprobs`` holds the sampled token and the ``num_top`` most likely (so up to
    ``num_top + 1`` entries). ``decode``: token id -> its text."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs:
        token = decode(lp.token_id)
        tokens.append(token)
        values.append(_logprob(lp.logprob))
        tops.append({decode(t): _logprob(v) for t, v in _entries(lp)[:num_top + 1]})
        offsets.append(text_offset)
        text_offset += len(token)
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}


def chat_logprobs(logprobs: list, num_top: int, decode) -> dict:
    """A chat choice's ``logprobs`` (``content``: token, logprob, bytes, ``top_logprobs``), as vLLM
    builds it: ``top_logprobs`` lists the first ``num_top`` of (sampled, most likely, ...)."""
    def item(token_id: int, value: float) -> dict:
        token = decode(token_id)
        return {"token": token, "logprob": _logprob(value), "bytes": list(token.encode("utf-8", errors="replace"))}
    return {"content": [{**item(lp.token_id, lp.logprob),
                         "top_logprobs": [item(t, v) for t, v in _entries(lp)[:num_top]]} for lp in logprobs]}


def response_body(gen: GenerationRequest, request_id: str, text: str, finish_reason: str | None,
                  num_tokens: int, timings: dict, logprobs: dict | None = None) -> dict:
    """A whole (non-streamed) response; ``timings`` goes in the ``batchlab`` extension field."""
    if gen.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": [choice], "usage": usage(len(gen.prompt_ids), num_tokens), "batchlab": timings}


def chunk_body(gen: GenerationRequest, request_id: str, text: str | None, finish_reason: str | None = None,
               first: bool = False, logprobs: dict | None = None) -> dict:
    """One streamed chunk with ``text`` (None: no choice, e.g. the usage-only chunk)."""
    if gen.kind == "completion":
        choices = [] if text is None else [{"index": 0, "text": text, "logprobs": logprobs,
                                            "finish_reason": finish_reason}]
        obj = "text_completion"
    else:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choices = [] if text is None else [{"index": 0, "delta": delta, "logprobs": logprobs,
                                            "finish_reason": finish_reason}]
        obj = "chat.completion.chunk"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": choices}


def sse(data: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
