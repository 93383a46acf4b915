"""The OpenAI-compatible wire format: validating request bodies, and building responses and errors.

Only what batchlab's server accepts is checked here, each field with an error that names it and
says what is allowed, as an OpenAI-style error body::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": 400}}

Implemented fields (as vLLM's OpenAI server takes them): ``model``, ``prompt`` (a string or a
list of token ids; completions) or ``messages`` (chat), ``max_tokens`` (chat also
``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``, ``stop_token_ids``,
``include_stop_str_in_output``, ``skip_special_tokens``, ``ignore_eos``, ``n`` (1 only),
``stream``, ``stream_options`` (``include_usage``, ``continuous_usage_stats``), ``user``;
completions also ``echo``; chat also ``add_generation_prompt``.

Fields batchlab does not implement are refused with a 400 naming the field, never silently
ignored, except when they hold their do-nothing value (``"logprobs": null``,
``"repetition_penalty": 1.0``, ``"top_k": -1``, ...; benchmark clients send those). ``logprobs``
is among them: the engine returns sampled token ids, not the model's log-probabilities, so
answering it would need the engine core to hand back logits.

``model`` may be the served name or the model's ``root`` (its folder, as ``/v1/models`` lists it:
``vllm bench serve`` names the model by it). ``/tokenize`` and ``/detokenize`` bodies are
checked here too (vLLM's: ``prompt`` or
``messages``, ``add_special_tokens``, ``add_generation_prompt``, ``return_token_strs``; ``tokens``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

DEFAULT_COMPLETION_MAX_TOKENS = 16      # OpenAI's and vLLM's default for /v1/completions
MAX_STOP_STRINGS = 4
CHAT_ROLES = ("system", "user", "assistant")

COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "stop_token_ids",
                 "include_stop_str_in_output", "skip_special_tokens", "ignore_eos", "n", "stream",
                 "stream_options", "user")
IMPLEMENTED_FIELDS = {
    "completion": COMMON_FIELDS + ("prompt", "echo"),
    "chat": COMMON_FIELDS + ("messages", "max_completion_tokens", "add_generation_prompt"),
}
# Not implemented, but accepted at the value that asks for nothing (what clients send by default).
DO_NOTHING_VALUES = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "prompt_logprobs": (None,),
    "top_k": (None, -1, 0), "min_p": (None, 0), "min_tokens": (None, 0),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "repetition_penalty": (None, 1),
    "logit_bias": (None, {}), "best_of": (None, 1), "suffix": (None, ""), "use_beam_search": (None, False),
    "length_penalty": (None, 1), "response_format": (None, {"type": "text"}), "tools": (None, []),
    "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False), "priority": (None, 0),
    "truncate_prompt_tokens": (None,), "echo": (None, False), "continue_final_message": (None, False),
    "chat_template": (None,), "chat_template_kwargs": (None, {}), "documents": (None,),
    "add_special_tokens": (None,), "store": (None, False), "metadata": (None, {}),
    # vllm-router re-serializes each request with its own defaults of these SGLang fields (the
    # reasoning ones ask for nothing here: the course's model writes no separate reasoning).
    "no_stop_trim": (None, False), "return_hidden_states": (None, False),
    "separate_reasoning": (None, True, False), "stream_reasoning": (None, True, False),
    "include_reasoning": (None, True, False),
}
WHY_NOT = {
    "logprobs": "the engine returns sampled token ids, not the model's log-probabilities",
    "top_logprobs": "the engine returns sampled token ids, not the model's log-probabilities",
    "prompt_logprobs": "the engine returns sampled token ids, not the model's log-probabilities",
    "response_format": "there is no structured (JSON) decoding; only {\"type\": \"text\"}",
}


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
    temperature: float
    top_p: float
    seed: int | None
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


def check_fields(body: dict, implemented: tuple[str, ...]) -> None:
    """400 for a field this server does not implement (unless it holds its do-nothing value)."""
    for name, value in body.items():
        if name in implemented:
            continue
        if name not in DO_NOTHING_VALUES:
            raise bad(name, f"{name}={_short(value)}; this server does not know the field {name!r}: it "
                            f"accepts {sorted(set(implemented) | set(DO_NOTHING_VALUES))}")
        allowed = DO_NOTHING_VALUES[name]
        if not any(_same(value, a) for a in allowed):
            why = WHY_NOT.get(name, f"batchlab does not implement {name}")
            raise bad(name, f"{name}={_short(value)}; must be one of {list(allowed)} ({why})")


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

    temperature = _optional(body, "temperature", 1.0)
    if not _is_number(temperature) or not 0 <= temperature <= 2:
        raise bad("temperature", f"temperature={temperature!r}; must be a number in [0, 2] (0 = greedy)")
    top_p = _optional(body, "top_p", 1.0)
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise bad("top_p", f"top_p={top_p!r}; must be a number in (0, 1]")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad("seed", f"seed={seed!r}; must be an integer or null")
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
    if flags["echo"]:
        prompt = body["prompt"]
        echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids)
    return GenerationRequest(kind, prompt_ids, max_tokens, float(temperature), float(top_p), seed, stop,
                             flags["ignore_eos"], flags["stream"], bool(options.get("include_usage")),
                             bool(options.get("continuous_usage_stats")), served_model, tuple(stop_token_ids),
                             flags["include_stop_str_in_output"], flags["skip_special_tokens"], echo_text)


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


def response_body(gen: GenerationRequest, request_id: str, text: str, finish_reason: str | None,
                  num_tokens: int, timings: dict) -> dict:
    """A whole (non-streamed) response; ``timings`` goes in the ``batchlab`` extension field."""
    if gen.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": [choice], "usage": usage(len(gen.prompt_ids), num_tokens), "batchlab": timings}


def chunk_body(gen: GenerationRequest, request_id: str, text: str | None, finish_reason: str | None = None,
               first: bool = False) -> dict:
    """One streamed chunk with ``text`` (None: no choice, e.g. the usage-only chunk)."""
    if gen.kind == "completion":
        choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": finish_reason}]
        obj = "text_completion"
    else:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choices = [] if text is None else [{"index": 0, "delta": delta, "logprobs": None,
                                            "finish_reason": finish_reason}]
        obj = "chat.completion.chunk"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": choices}


def sse(data: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
