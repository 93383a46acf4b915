"""Parsing the bodies of ``/v1/completions``, ``/v1/chat/completions``, ``/tokenize`` and
``/detokenize`` into validated requests, each field checked with an error that names it
(the fields themselves: ``protocol.py``)."""

from __future__ import annotations

import math

from batchlab.checks import is_int, is_number
from batchlab.requests import SamplingParams
from batchlab.serve.protocol import (CHAT_ROLES, DEFAULT_COMPLETION_MAX_TOKENS, IMPLEMENTED_FIELDS,
                                     MAX_LOGPROBS,
                                     MAX_STOP_STRINGS, GenerationRequest, bad, check_fields,
                                     check_model, number_field, optional, short)


def parse_generation(body: dict, kind: str, *, served_model: str, tokenizer, max_model_len: int,
                     root: str | None = None) -> GenerationRequest:
    """Check a completions (``kind="completion"``) or chat (``"chat"``) body; 4xx on the first
    fault."""
    check_fields(body, IMPLEMENTED_FIELDS[kind])
    check_model(body, served_model, root)
    prompt_ids = _prompt(body, kind, tokenizer, max_model_len)
    max_tokens = _max_tokens(body, kind, len(prompt_ids), max_model_len)
    sampling = _sampling(body, kind, max_tokens, len(tokenizer))
    n = optional(body, "n", 1)
    if n != 1 or not is_int(n):
        raise bad("n", f"n={n!r}; this server makes one choice per request: n must be 1")
    stop, stop_token_ids = _stops(body, len(tokenizer))
    flags = _flags(body)
    options = _stream_options(body)
    echo_text = None
    if flags["echo"] and sampling.logprobs is not None:
        raise bad("echo", "echo=true with logprobs needs the prompt's log-probabilities "
                          "(prompt_logprobs), which the engine does not keep; send one of them")
    if flags["echo"]:
        prompt = body["prompt"]
        echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids)
    return GenerationRequest(kind, prompt_ids, max_tokens, sampling, stop,
                             flags["ignore_eos"], flags["stream"],
                             bool(options.get("include_usage")),
                             bool(options.get("continuous_usage_stats")), served_model,
                             tuple(stop_token_ids),
                             flags["include_stop_str_in_output"], flags["skip_special_tokens"],
                             echo_text, body.get("kv_transfer_params"))


def _prompt(body: dict, kind: str, tokenizer, max_model_len: int) -> list[int]:
    """The prompt's token ids (a completion's prompt, or the chat template over the messages),
    leaving room for at least one output token."""
    if kind == "completion":
        prompt_ids, prompt_field = _completion_prompt(body, tokenizer), "prompt"
    else:
        flag = optional(body, "add_generation_prompt", True)
        if not isinstance(flag, bool):
            raise bad("add_generation_prompt",
                      f"add_generation_prompt={flag!r}; must be true or false")
        prompt_ids, prompt_field = _chat_prompt(body, tokenizer, flag), "messages"
    if len(prompt_ids) >= max_model_len:
        raise bad(prompt_field,
                  f"This model's maximum context length is {max_model_len} tokens. However, your "
                  f"prompt is {len(prompt_ids)} tokens, and it must leave room for at least one "
                  "output token (max_model_len, as vLLM words it)")
    return prompt_ids


def _max_tokens(body: dict, kind: str, prompt_len: int, max_model_len: int) -> int:
    """``max_tokens`` (chat: or ``max_completion_tokens``); by default 16 for a completion, the
    rest of the window for a chat, as vLLM's defaults."""
    max_field = "max_tokens"
    max_tokens = body.get("max_tokens")
    if kind == "chat" and max_tokens is None and body.get("max_completion_tokens") is not None:
        max_field, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = (DEFAULT_COMPLETION_MAX_TOKENS if kind == "completion"
                      else max_model_len - prompt_len)   # chat: the rest of the window
        return min(max_tokens, max_model_len - prompt_len)
    if not is_int(max_tokens) or max_tokens < 1:
        raise bad(max_field, f"{max_field}={max_tokens!r}; must be an integer >= 1")
    if prompt_len + max_tokens > max_model_len:
        raise bad(max_field,
                  f"This model's maximum context length is {max_model_len} tokens. However, you "
                  f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                  f"{max_tokens} in the completion): {max_field}={max_tokens}; ask for at most "
                  f"{max_model_len - prompt_len}")
    return max_tokens


def _stops(body: dict, vocab: int) -> tuple[list[str], list[int]]:
    """``stop`` (strings) and ``stop_token_ids``."""
    stop = optional(body, "stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise bad("stop", f"stop={stop!r}; must be a non-empty string or a list of at most "
                          f"{MAX_STOP_STRINGS} non-empty strings")
    stop_token_ids = optional(body, "stop_token_ids", [])
    if not isinstance(stop_token_ids, list) or not all(is_int(t) and 0 <= t < vocab
                                                       for t in stop_token_ids):
        raise bad("stop_token_ids",
                  f"stop_token_ids={short(stop_token_ids)}; must be a list of token ids "
                                    f"in [0, {vocab})")
    return stop, stop_token_ids


def _flags(body: dict) -> dict[str, bool]:
    """The true/false fields, with their defaults."""
    flags = {}
    for name, default in (("ignore_eos", False), ("stream", False), ("echo", False),
                          ("include_stop_str_in_output", False), ("skip_special_tokens", True)):
        flags[name] = optional(body, name, default)
        if not isinstance(flags[name], bool):
            raise bad(name, f"{name}={flags[name]!r}; must be true or false")
    return flags


def _stream_options(body: dict) -> dict:
    """``stream_options``: ``include_usage`` and ``continuous_usage_stats``, true or false."""
    options = optional(body, "stream_options", {})
    if not isinstance(options, dict):
        raise bad("stream_options", f"stream_options={options!r}; must be an object")
    for name in ("include_usage", "continuous_usage_stats"):
        if not isinstance(options.get(name, False), bool):
            raise bad(f"stream_options.{name}",
                      f"stream_options.{name}={options[name]!r}; must be true or false")
    unknown = set(options) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        name = sorted(unknown)[0]
        raise bad(f"stream_options.{name}", f"stream_options.{name}: not supported; allowed: "
                                            "include_usage, continuous_usage_stats")
    return options


def _sampling(body: dict, kind: str, max_tokens: int, vocab: int) -> SamplingParams:
    """The sampling fields, with vLLM's ranges and defaults."""
    temperature = number_field(body, "temperature", 1.0, 0, 2, hint="0 = greedy")
    top_p = number_field(body, "top_p", 1.0, 0, 1, open_low=True)
    min_p = number_field(body, "min_p", 0.0, 0, 1)
    presence, frequency = (number_field(body, name, 0.0, -2, 2, hint="0 = off")
                           for name in ("presence_penalty", "frequency_penalty"))
    repetition = number_field(body, "repetition_penalty", 1.0, 0, math.inf, open_low=True,
                              hint="1 = off")
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise bad("seed", f"seed={seed!r}; must be an integer or null")
    top_k = optional(body, "top_k", 0)
    if not is_int(top_k) or top_k < -1:
        raise bad("top_k", f"top_k={top_k!r}; must be an integer >= 1, or 0 or -1 (every token)")
    min_tokens = optional(body, "min_tokens", 0)
    if not is_int(min_tokens) or not 0 <= min_tokens <= max_tokens:
        raise bad("min_tokens",
                  f"min_tokens={min_tokens!r}; must be an integer in [0, max_tokens={max_tokens}]")
    bias = optional(body, "logit_bias", {})
    pairs = []
    if not isinstance(bias, dict):
        raise bad("logit_bias", f"logit_bias={short(bias)}; must be an object of token id -> bias")
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token < vocab or not is_number(value):
            raise bad("logit_bias",
                      f"logit_bias[{key!r}]={short(value)}; keys must be token ids in [0, {vocab}) "
                                    "and values numbers (clamped to [-100, 100])")
        pairs.append((token, max(-100.0, min(100.0, float(value)))))
    return SamplingParams(temperature, top_p, seed, max(top_k, 0), min_p, presence, frequency,
                          repetition, min_tokens, tuple(pairs), _logprobs(body, kind))


def _logprobs(body: dict, kind: str) -> int | None:
    """How many top tokens' log-probabilities to return per output token (None: none asked).
    Completions: ``logprobs`` is that number; chat: ``logprobs`` true, and ``top_logprobs``."""
    if kind == "completion":
        n = body.get("logprobs")
        if n is None:
            return None
        if not is_int(n) or not 0 <= n <= MAX_LOGPROBS:
            raise bad("logprobs", f"logprobs={n!r}; must be null or an integer in "
                                  f"[0, {MAX_LOGPROBS}] (how many most likely tokens to return "
                                  "per token)")
        return n
    on = optional(body, "logprobs", False)
    if not isinstance(on, bool):
        raise bad("logprobs",
                  f"logprobs={on!r}; must be true or false (top_logprobs says how many)")
    top = body.get("top_logprobs")
    if top is not None and (not is_int(top) or not 0 <= top <= MAX_LOGPROBS):
        raise bad("top_logprobs",
                  f"top_logprobs={top!r}; must be null or an integer in [0, {MAX_LOGPROBS}]")
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
    if isinstance(prompt, list) and prompt and all(is_int(t) and 0 <= t < vocab for t in prompt):
        return list(prompt)
    raise bad("prompt", f"prompt must be a non-empty string or a non-empty list of token ids in "
                        f"[0, {vocab}); one prompt per request (got {short(prompt)})")


def _chat_prompt(body: dict, tokenizer, add_generation_prompt: bool = True) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"messages must be a non-empty list of {{role, content}} objects "
                              f"(got {short(messages)})")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]",
                      f"messages[{i}] is {short(m)}; must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise bad(f"messages[{i}].role",
                      f"messages[{i}].role={role!r}; allowed: {list(CHAT_ROLES)}")
        if isinstance(content, list):       # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str)
                       for p in content):
                raise bad(f"messages[{i}].content",
                          f"messages[{i}].content: only text parts "
                          "({\"type\": \"text\", \"text\": ...}) are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content",
                      f"messages[{i}].content={short(content)}; must be a string")
        clean.append({"role": role, "content": content})
    text = tokenizer.apply_chat_template(clean, add_generation_prompt=add_generation_prompt,
                                         tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# --- /tokenize and /detokenize (vLLM's routes) ----------------------------------------------------
def parse_tokenize(body: dict, *, served_model: str, tokenizer,
                   root: str | None = None) -> tuple[list[int], bool]:
    """``(token ids, return_token_strs)`` for a ``/tokenize`` body: ``prompt`` (a string) or
    ``messages``."""
    chat = "messages" in body
    names = ("model", "return_token_strs") + (
        ("messages", "add_generation_prompt", "add_special_tokens") if chat
        else ("prompt", "add_special_tokens"))
    for name in body:
        if name not in names:
            raise bad(name, f"{name}={short(body[name])}; /tokenize accepts {list(names)}")
    check_model(body, served_model, root)
    flags = {}
    for name, default in (("return_token_strs", False), ("add_special_tokens", not chat),
                          ("add_generation_prompt", True)):
        flags[name] = optional(body, name, default)
        if not isinstance(flags[name], bool):
            raise bad(name, f"{name}={flags[name]!r}; must be true or false")
    if chat:
        ids = _chat_prompt(body, tokenizer, flags["add_generation_prompt"])
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad("prompt", f"prompt={short(prompt)}; must be a string (or send messages)")
        ids = list(tokenizer(prompt, add_special_tokens=flags["add_special_tokens"])["input_ids"])
    return ids, flags["return_token_strs"]


def parse_detokenize(body: dict, *, served_model: str, tokenizer,
                     root: str | None = None) -> list[int]:
    """The token ids of a ``/detokenize`` body (``tokens``)."""
    for name in body:
        if name not in ("model", "tokens"):
            raise bad(name, f"{name}={short(body[name])}; /detokenize accepts ['model', 'tokens']")
    check_model(body, served_model, root)
    tokens, vocab = body.get("tokens"), len(tokenizer)
    if not isinstance(tokens, list) or not all(is_int(t) and 0 <= t < vocab for t in tokens):
        raise bad("tokens", f"tokens={short(tokens)}; must be a list of token ids in [0, {vocab})")
    return tokens
