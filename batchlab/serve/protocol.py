"""The OpenAI-compatible wire format: the fields, errors and checks every body shares; a
validated request (``GenerationRequest``). Parsing a body is in ``parsing.py``, building
responses in ``responses.py``.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

from batchlab.checks import is_number
from batchlab.requests import SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16      # OpenAI's and vLLM's default for /v1/completions
MAX_STOP_STRINGS = 4
CHAT_ROLES = ("system", "user", "assistant")

COMMON_FIELDS = ("model", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                 "seed", "stop",
                 "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
                 "ignore_eos", "n", "stream", "stream_options", "user", "kv_transfer_params")
IMPLEMENTED_FIELDS = {
    "completion": COMMON_FIELDS + ("prompt", "echo", "logprobs"),
    "chat": COMMON_FIELDS + ("messages", "max_completion_tokens", "add_generation_prompt",
                             "logprobs", "top_logprobs"),
}
MAX_LOGPROBS = 20                        # vLLM's default --max-logprobs
# Known to vLLM, not done by batchlab's engine: accepted at the value that asks for nothing
# (what clients send by default), refused otherwise.
DO_NOTHING_VALUES = {
    "prompt_logprobs": (None,), "best_of": (None, 1), "suffix": (None, ""),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1), "response_format": (None, {"type": "text"}), "tools": (None, []),
    "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False),
    "priority": (None, 0), "truncate_prompt_tokens": (None,), "echo": (None, False),
    "continue_final_message": (None, False),
    "chat_template": (None,), "chat_template_kwargs": (None, {}), "documents": (None,),
    "add_special_tokens": (None,), "store": (None, False), "metadata": (None, {}),
    "bad_words": (None, []), "allowed_token_ids": (None, []), "guided_json": (None,),
    "guided_regex": (None,),
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
       for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                    "structured_outputs")},
}
IGNORED_LOG = logging.getLogger("batchlab.serve")


class APIError(Exception):
    """An error answered to the client: HTTP status, message, the field at fault, and its type."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
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
    # temperature, top_p, top_k, penalties, min_tokens, logprobs, ...
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    model: str = ""
    stop_token_ids: tuple[int, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True
    # completions with echo: the prompt, put before the answer
    echo_text: str | None = None
    # disaggregated serving's hand-off (serve/kv_transfer.py)
    kv_transfer_params: dict | None = None


# --- field checks -------------------------------------------------------------------------------
def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(None, f"the request body is not valid JSON ({e}); send a JSON object") from None
    if not isinstance(body, dict):
        raise bad(None,
                  f"the request body is a JSON {type(body).__name__}; it must be a JSON object")
    return body


def optional(body: dict, name: str, default):
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
            raise bad(name, f"{name}={short(value)}; must be one of {list(allowed)} ({why})")
    if ignored:
        IGNORED_LOG.warning("The following fields were present in the request but ignored: %s",
                            sorted(ignored))
    return ignored


def _same(value: object, allowed: object) -> bool:
    """Equal, with booleans kept apart from numbers (``logprobs: 0`` asks for something;
    ``false`` does not)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return value == allowed


def check_model(body: dict, served_model: str, root: str | None) -> None:
    """The model must be the served name (or its ``root``, the folder ``/v1/models`` reports)."""
    model = body.get("model")
    if model is not None and model != served_model and model != root:
        raise APIError(404, f"model {model!r} does not exist; this server serves {served_model!r}",
                       "model", "not_found_error")


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- responses ----------------------------------------------------------------------------------


def number_field(body: dict, name: str, default: float, low: float, high: float, *,
                 open_low: bool = False,
            hint: str = "") -> float:
    value = optional(body, name, default)
    if not is_number(value) or not (low < value if open_low else low <= value) or value > high:
        allowed = (f"a number {'>' if open_low else '>='} {low:g}" if high == math.inf
                   else f"a number in {'(' if open_low else '['}{low:g}, {high:g}]")
        raise bad(name, f"{name}={value!r}; must be {allowed}" + (f" ({hint})" if hint else ""))
    return float(value)
