"""Workload files: a workload saved as JSON lines and read back (schema: ``data/README.md``).

The first line is a header (``"format": "batchlab-workload"``, version, request count, free
``meta``); every other line is one request. (A *workload file* is an input; what an engine run
records is a *trace*, saved by ``batchlab.analysis.trace_io``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from batchlab.checks import fail, is_int
from batchlab.requests import Request, SamplingParams
from batchlab.workloads.prompts import PromptSource, _check_prompt_ids, _make_prompt, _prompt_source

WORKLOAD_FORMAT = "batchlab-workload"
WORKLOAD_VERSION = 1
_REQUIRED_KEYS = ("request_id", "arrival_time", "prompt_len", "max_new_tokens")
_OPTIONAL_KEYS = ("prompt_ids", "sampling", "stop_token_ids")
_SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))


def save_workload(requests: Iterable[Request], path: str | Path, *, meta: Mapping | None = None,
                  include_prompt_ids: bool = False) -> Path:
    """Write requests as JSONL: a header line, then one request per line in the given order.

    Stored: id, arrival time (to the microsecond), prompt length, max new tokens, and the
    sampling parameters and stop tokens when they differ from the defaults. Prompt ids are left
    out unless ``include_prompt_ids`` (the file then stays tokenizer-independent, and
    ``load_workload`` rebuilds corpus prompts from the ids). ``meta`` is any JSON-able record of
    how the workload was made. The output is byte-identical for identical inputs.
    """
    requests = list(requests)
    header = {"format": WORKLOAD_FORMAT, "version": WORKLOAD_VERSION, "num_requests": len(requests),
              "meta": dict(meta or {})}
    lines = [json.dumps(header, sort_keys=True)]
    for req in requests:
        row: dict[str, Any] = {"request_id": req.request_id,
                               "arrival_time": round(req.arrival_time, 6),
                               "prompt_len": req.prompt_len,
                               "max_new_tokens": req.max_new_tokens}
        if include_prompt_ids and req.prompt_ids is not None:
            row["prompt_ids"] = req.prompt_ids
        if req.sampling != SamplingParams():
            default = SamplingParams()   # temperature, top_p and seed always; the rest when set
            row["sampling"] = {k: v for k in _SAMPLING_KEYS
                               if (v := getattr(req.sampling, k)) != getattr(default, k)
                               or k in ("temperature", "top_p", "seed")}
        if req.stop_token_ids:
            row["stop_token_ids"] = list(req.stop_token_ids)
        lines.append(json.dumps(row))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _sampling(given: dict) -> SamplingParams:
    """A file's sampling object (JSON has lists where ``logit_bias`` holds tuples)."""
    bias = given.get("logit_bias")
    if isinstance(bias, list):
        given = {**given, "logit_bias": tuple(tuple(p) if isinstance(p, list) else p for p in bias)}
    return SamplingParams(**given)


def read_workload_header(path: str | Path) -> dict:
    """The header line of a workload file (``format``, ``version``, ``num_requests``, ``meta``)."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    header = _parse_line(first, path, 1)
    if header.get("format") != WORKLOAD_FORMAT:
        raise ValueError(f"{path}:1: not a {WORKLOAD_FORMAT} header: {first.strip()[:80]!r}")
    return header


def _parse_line(line: str, path: str | Path, lineno: int) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}): "
                         f"{line.strip()[:80]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}:{lineno}: must be a JSON object, got {line.strip()[:80]!r}")
    return obj


def load_workload(path: str | Path, tokenizer: Any = None,
                  prompt_source: PromptSource | None = None) -> list[Request]:
    """Read a workload file written by ``save_workload`` (or by hand; schema in ``data/README.md``).

    Checks every line and raises ``ValueError`` naming the file, line and bad value for: bad
    JSON, missing or unknown keys, ids that are empty or repeated, lengths that are not ints >= 1,
    arrival times that are negative or out of order, bad sampling values, and a request count
    that disagrees with the header. Lines without ``prompt_ids`` become simulated requests,
    unless ``tokenizer`` (corpus text) or ``prompt_source`` is given to rebuild their prompts.
    """
    source = _prompt_source(tokenizer, prompt_source)
    vocab_size = getattr(source, "vocab_size", None)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{path}:1: empty file; the first line must be the "
                         f"{WORKLOAD_FORMAT} header")
    header = _parse_line(lines[0], path, 1)
    if header.get("format") != WORKLOAD_FORMAT:
        raise ValueError(f"{path}:1: the first line must be a header with "
                         f"\"format\": \"{WORKLOAD_FORMAT}\", got {lines[0].strip()[:80]!r}")
    if header.get("version") != WORKLOAD_VERSION:
        raise ValueError(f"{path}:1: version={header.get('version')!r}; this code reads version "
                         f"{WORKLOAD_VERSION}")

    requests: list[Request] = []
    seen: dict[str, int] = {}
    last_arrival = 0.0
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # tolerate blank lines (e.g. a trailing one added by an editor)
        row = _parse_line(line, path, lineno)
        where = f"{path}:{lineno}"
        missing = [k for k in _REQUIRED_KEYS if k not in row]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(row) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed are "
                             f"{', '.join(_REQUIRED_KEYS + _OPTIONAL_KEYS)}")
        request_id = row["request_id"]
        if request_id in seen:
            raise ValueError(f"{where}: request_id {request_id!r} repeats line {seen[request_id]}")
        seen[request_id] = lineno
        arrival = row["arrival_time"]
        given = row.get("sampling", {})
        if not isinstance(given, dict) or set(given) - set(_SAMPLING_KEYS):
            raise ValueError(f"{where}: sampling={given!r}; must be an object with keys from "
                             f"{', '.join(_SAMPLING_KEYS)}")
        ids = row.get("prompt_ids")
        stops = row.get("stop_token_ids", [])
        try:   # Request checks every field; the message gains the file and line
            if ids is not None:
                if not isinstance(ids, list) or len(ids) != row["prompt_len"] \
                        or not all(is_int(t) and t >= 0 for t in ids):
                    fail("prompt_ids", ids, f"a list of {row['prompt_len']!r} ints >= 0",
                         "one per prompt token: prompt_len of them")
                _check_prompt_ids(ids, row["prompt_len"], vocab_size, request_id)
            elif source is not None and is_int(row["prompt_len"]) and row["prompt_len"] >= 1:
                ids = _make_prompt(source, request_id, row["prompt_len"])
            if not isinstance(stops, list) or not all(is_int(t) and t >= 0 for t in stops):
                fail("stop_token_ids", stops, "a list of ints >= 0")
            req = Request(request_id, ids, row["max_new_tokens"], arrival, _sampling(given),
                          prompt_len=row["prompt_len"], stop_token_ids=tuple(stops))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if req.arrival_time < last_arrival:
            raise ValueError(f"{where}: arrival_time={arrival!r} is earlier than the line before "
                             f"({last_arrival!r}); requests must be sorted by arrival time")
        last_arrival = req.arrival_time
        requests.append(req)

    expected = header.get("num_requests")
    if expected is not None and expected != len(requests):
        raise ValueError(f"{path}: the header says num_requests={expected!r} but the file holds "
                         f"{len(requests)} requests (truncated or edited?)")
    return requests
