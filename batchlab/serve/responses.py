"""OpenAI-style response bodies: whole responses, stream chunks (server-sent events), usage and
log-probabilities, as vLLM's OpenAI server builds them."""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse

from batchlab.serve.protocol import APIError, GenerationRequest


def error_response(e: APIError) -> JSONResponse:
    """An OpenAI error object with the error's status and headers."""
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)



def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _logprob(value: float) -> float:
    return max(value, -9999.0)          # -inf as the finite number OpenAI's API uses (vLLM's clamp)


def _entries(lp) -> list[tuple[int, float]]:
    """vLLM's order for one position: the sampled token first, then the most likely ones (once
    each)."""
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
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
            "top_logprobs": tops}


def chat_logprobs(logprobs: list, num_top: int, decode) -> dict:
    """A chat choice's ``logprobs`` (``content``: token, logprob, bytes, ``top_logprobs``), as vLLM
    builds it: ``top_logprobs`` lists the first ``num_top`` of (sampled, most likely, ...)."""
    def item(token_id: int, value: float) -> dict:
        token = decode(token_id)
        return {"token": token, "logprob": _logprob(value),
                "bytes": list(token.encode("utf-8", errors="replace"))}
    return {"content": [{**item(lp.token_id, lp.logprob),
                         "top_logprobs": [item(t, v) for t, v in _entries(lp)[:num_top]]}
                        for lp in logprobs]}


def response_body(gen: GenerationRequest, request_id: str, text: str, finish_reason: str | None,
                  num_tokens: int, timings: dict, logprobs: dict | None = None) -> dict:
    """A whole (non-streamed) response; ``timings`` goes in the ``batchlab`` extension field."""
    if gen.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "chat.completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": [choice], "usage": usage(len(gen.prompt_ids), num_tokens),
            "batchlab": timings}


def chunk_body(gen: GenerationRequest, request_id: str, text: str | None,
               finish_reason: str | None = None,
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
