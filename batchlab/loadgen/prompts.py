"""Where a load's prompts come from: a JSONL file of your own, or the course's corpus as text.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

from batchlab.checks import check_int
from batchlab.loadgen.client import LoadRequest

ROLES = ("system", "user", "assistant")


def _fail(path: Path, line_no: int, why: str) -> None:
    raise ValueError(f"prompts={str(path)!r} line {line_no}: {why}; must be a JSON object with "
                     "\"prompt\" (a non-empty string) or \"messages\" (a list of "
                     "{\"role\", \"content\"}), and optionally \"max_tokens\" (an int >= 1)")


def _count_tokens(tokenizer, prompt: str | None, messages: list[dict] | None) -> int:
    if tokenizer is None:
        return -1
    if messages is not None:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return len(tokenizer(prompt)["input_ids"])


def read_prompts(path: str | Path, output_len: int, tokenizer=None) -> list[LoadRequest]:
    """The prompts of a JSONL file as load requests ``p0, p1, ...`` (arrival times: see
    ``with_arrivals``)."""
    check_int("output_len", output_len)
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts={str(path)!r}; must be a JSONL file of prompts (no such file)")
    out: list[LoadRequest] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                _fail(path, line_no, f"not JSON ({e})")
            if not isinstance(row, dict):
                _fail(path, line_no, f"a JSON {type(row).__name__}")
            unknown = set(row) - {"prompt", "messages", "max_tokens"}
            if unknown:
                _fail(path, line_no, f"unknown keys {sorted(unknown)}")
            prompt, messages = row.get("prompt"), row.get("messages")
            if (prompt is None) == (messages is None):
                _fail(path, line_no, "give exactly one of \"prompt\" and \"messages\"")
            if prompt is not None and not (isinstance(prompt, str) and prompt):
                _fail(path, line_no, f"prompt={prompt!r}")
            if messages is not None and not (
                    isinstance(messages, list) and messages
                    and all(isinstance(m, dict) and m.get("role") in ROLES
                            and isinstance(m.get("content"), str)
                            for m in messages)):
                _fail(path, line_no, f"messages={json.dumps(messages)[:80]}")
            max_tokens = row.get("max_tokens", output_len)
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                _fail(path, line_no, f"max_tokens={max_tokens!r}")
            out.append(LoadRequest(f"p{len(out)}", prompt, max_tokens,
                                   prompt_len=_count_tokens(tokenizer, prompt, messages),
                                   messages=messages))
    if not out:
        raise ValueError(f"prompts={str(path)!r}; must hold at least one prompt "
                         "(the file is empty)")
    return out


def with_arrivals(requests: list[LoadRequest], n: int, arrival: str = "poisson",
                  rate: float | None = None,
                  burstiness: float = 1.0, seed: int = 0) -> list[LoadRequest]:
    """``n`` requests cycling through ``requests`` (ids made unique), arriving by ``arrival``."""
    from dataclasses import replace

    from batchlab.workloads import make_arrivals
    check_int("n", n)
    times = make_arrivals(n, arrival, rate, burstiness, seed)
    return [replace(requests[i % len(requests)], request_id=f"r{i:04d}",
                    arrival_time=float(times[i]))
            for i in range(n)]


def as_text(requests: list[LoadRequest], tokenizer) -> list[LoadRequest]:
    """Token-id prompts decoded to text (for the chat endpoint, or a server with another
    tokenizer)."""
    from dataclasses import replace
    return [replace(r, prompt=tokenizer.decode(r.prompt)) if isinstance(r.prompt, list) else r
            for r in requests]
