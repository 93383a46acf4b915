"""Saving a ``Trace`` to a JSON file and loading it back, so a run can be studied later.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from batchlab.checks import check_instance, is_int, shown
from batchlab.plan import ScheduledChunk
from batchlab.requests import RequestStatus, parse_finish_reason
from batchlab.trace import RequestRecord, StepRecord, Trace

TRACE_FILE_FORMAT = "batchlab-trace"
TRACE_FILE_VERSION = 1
SPECULATIVE_FILE_VERSION = 2            # a trace with checked drafts (the "checks" column)
PLACEHOLDER_TOKEN = -1                  # the simulator's output token (backends.sim)
_US = 1_000_000                         # microseconds per second


def _to_us(t: float | None) -> int | None:
    """Seconds to integer microseconds (None stays None)."""
    if t is None:
        return None
    if not math.isfinite(t):
        raise ValueError(f"time {t!r} is not finite; a trace file stores finite times only")
    return int(round(t * _US))


def _from_us(us: int | None) -> float | None:
    return None if us is None else us / _US


# --- replaying steps ------------------------------------------------------------------------------
class _Replay:
    """Follows the engine's rules over a list of steps: how many tokens each request has
    computed and produced, which chunk samples, and when each token appears."""

    def __init__(self, prompt_lens: list[int]) -> None:
        self.prompt_lens = prompt_lens
        self.computed = [0] * len(prompt_lens)
        self.num_out = [0] * len(prompt_lens)
        self.token_times_us: list[list[int]] = [[] for _ in prompt_lens]
        self.expected_decodes: list[int] = []     # sampled last step and not finished

    def step(self, decodes: list[int], prefills: list[tuple[int, int]], end_us: int,
             max_new_tokens: list[int], where: str,
             checks: dict[int, tuple[int, int]] | None = None
             ) -> list[tuple[int, int, int, bool, int]]:
        """Apply one step; returns its chunks as (request index, start, num_tokens, samples,
        drafted). ``checks``: request index -> (drafted, accepted) for decodes that checked a
        draft."""
        chunks, sampled, checks = [], [], checks or {}
        for r, num_tokens in [(r, 1) for r in decodes] + prefills:
            if not 0 <= r < len(self.computed):
                raise ValueError(f"{where}: request index {r} is outside "
                                 f"0..{len(self.computed) - 1}")
            start = self.computed[r]
            known = self.prompt_lens[r] + self.num_out[r]
            if num_tokens < 1 or start + num_tokens > known:
                raise ValueError(f"{where}: request {r} computes tokens "
                                 f"[{start}, {start + num_tokens}) "
                                 f"but has only {known} known tokens")
            samples = start + num_tokens == known
            drafted, accepted = checks.get(r, (0, 0)) if num_tokens == 1 else (0, 0)
            # a check's accepted drafts are computed too
            self.computed[r] = start + num_tokens + accepted
            if samples:
                # ... and emitted at the step's end
                self.num_out[r] += 1 + accepted
                self.token_times_us[r] += [end_us] * (1 + accepted)
                sampled.append(r)
            chunks.append((r, start, num_tokens + drafted, samples, drafted))
        self.expected_decodes = [r for r in sampled if self.num_out[r] < max_new_tokens[r]]
        return chunks


# --- to and from a dict ---------------------------------------------------------------------------
def trace_to_dict(trace: Trace, meta: dict | None = None) -> dict:
    """The JSON-able form of ``trace`` (see the module docstring). ``meta`` replaces the trace's
    own ``meta`` when given (e.g. to leave out labels a reader should not see)."""
    check_instance("trace", trace, Trace, "a batchlab Trace")
    meta = dict(trace.meta if meta is None else meta)
    try:
        json.dumps(meta)
    except TypeError as err:
        raise ValueError(f"meta must be JSON-able (str, numbers, lists, dicts): {err}") from None

    reqs = trace.requests
    index: dict[str, int] = {}
    for i, r in enumerate(reqs):
        if r.request_id in index:
            raise ValueError(f"request id {r.request_id!r} appears twice in the trace")
        index[r.request_id] = i

    # Steps: idle gap + duration in whole microseconds; decodes (or null) and prompt chunks.
    replay = _Replay([r.prompt_len for r in reqs])
    max_new = [r.max_new_tokens for r in reqs]
    columns: dict[str, list] = {k: [] for k in ("idle_before", "duration", "held_slots", "batch_id",
                                                 "decodes", "prefills", "checks")}
    checks_seen = [0] * len(reqs)           # each request's checks, in order, from its spec_checks
    previous_end_us = 0
    for s in sorted(trace.steps, key=lambda s: s.start):
        start_us, end_us = _to_us(s.start), _to_us(s.end)
        decodes, prefills, checks = [], [], {}
        for c in s.chunks:
            if c.request_id not in index:
                raise ValueError(f"step {s.index} computes {c.request_id!r}, which is not a "
                                 "request of this trace")
            if c.start != replay.computed[index[c.request_id]]:
                raise ValueError(f"step {s.index}: {c.request_id!r} starts at token {c.start}, "
                                 "not where its computed tokens end; "
                                 "traces with preemptions or prefix-cache "
                                 "hits (paged KV) cannot be saved in this format yet")
            if c.draft:
                i = index[c.request_id]
                checks[i] = _check_of(reqs[i], c, checks_seen[i], s.index)
                checks_seen[i] += 1
            if c.is_decode:
                decodes.append(index[c.request_id])
            else:
                prefills.append((index[c.request_id], c.num_tokens))
        expected = replay.expected_decodes
        replay.step(decodes, prefills, end_us, max_new, f"step {s.index}", checks)
        columns["idle_before"].append(start_us - previous_end_us)
        columns["duration"].append(end_us - start_us)
        columns["held_slots"].append(s.held_slots)
        columns["batch_id"].append(s.batch_id)
        columns["decodes"].append(None if decodes == expected else decodes)
        columns["prefills"].append([x for pair in prefills for x in pair])
        columns["checks"].append([x for r, pair in checks.items() for x in (r, *pair)])
        previous_end_us = end_us
    speculative = any(columns["checks"])
    if not speculative:
        del columns["checks"]

    requests: dict[str, list] = {
        "request_id": [r.request_id for r in reqs],
        "arrival": [_to_us(r.arrival_time) for r in reqs],
        "prompt_len": [r.prompt_len for r in reqs],
        "max_new_tokens": max_new,
        "status": [RequestStatus(r.status).value for r in reqs],
        "finish_reason": [None if r.finish_reason is None else str(r.finish_reason) for r in reqs],
        "first_scheduled": [_to_us(r.first_scheduled_time) for r in reqs],
        "release": [_to_us(r.release_time) for r in reqs],
        "streamed": [bool(r.streamed) for r in reqs],
    }
    details = [getattr(r, "finish_detail", None) for r in reqs]
    if any(d is not None for d in details):     # why requests were aborted or rejected, in words
        requests["finish_detail"] = details
    stored_us = [[_to_us(t) for t in r.token_times] for r in reqs]
    if stored_us != replay.token_times_us:
        # Token times that the steps do not explain: store them (arrival -> first, then gaps).
        requests["token_gaps"] = [[b - a for a, b in zip([arr] + ts, ts)]
                                  for arr, ts in zip(requests["arrival"], stored_us)]
    if any(t != PLACEHOLDER_TOKEN for r in reqs for t in r.output_ids):
        requests["output_ids"] = [[int(t) for t in r.output_ids] for r in reqs]
    version = SPECULATIVE_FILE_VERSION if speculative else TRACE_FILE_VERSION
    return {"format": TRACE_FILE_FORMAT, "version": version, "time_unit": "us",
            "meta": meta, "requests": requests, "steps": columns}


def _check_of(record: RequestRecord, chunk: ScheduledChunk, nth: int, step: int) -> tuple[int, int]:
    """The (drafted, accepted) pair of a chunk's checked draft: its request's ``nth`` check."""
    if nth >= len(record.spec_checks) or record.spec_checks[nth][0] != len(chunk.draft):
        raise ValueError(f"step {step} checks a draft of {len(chunk.draft)} tokens of "
                         f"{record.request_id!r}, but "
                         f"its spec_checks {shown(record.spec_checks)} have no such check #{nth}")
    return record.spec_checks[nth]


def _column(table: dict, key: str, length: int | None, where: str) -> list:
    if key not in table:
        raise ValueError(f"{where}: missing column {key!r}")
    values = table[key]
    if not isinstance(values, list) or (length is not None and len(values) != length):
        raise ValueError(f"{where}: column {key!r} must be a list of {length} items")
    return values


def trace_from_dict(data: dict, where: str = "trace") -> Trace:
    """Rebuild a ``Trace`` from ``trace_to_dict``'s output; ``where`` names it in errors."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FILE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{where}: not a {TRACE_FILE_FORMAT} file (format={found!r})")
    version = data.get("version")
    if version not in (TRACE_FILE_VERSION, SPECULATIVE_FILE_VERSION):
        raise ValueError(f"{where}: version={version!r}; this code reads versions "
                         f"{TRACE_FILE_VERSION} and {SPECULATIVE_FILE_VERSION}")
    if data.get("time_unit") != "us":
        raise ValueError(f"{where}: time_unit={data.get('time_unit')!r}; expected 'us'")
    req_table, step_table = data.get("requests"), data.get("steps")
    if not isinstance(req_table, dict) or not isinstance(step_table, dict):
        raise ValueError(f"{where}: needs 'requests' and 'steps' objects")

    ids = _column(req_table, "request_id", None, where)
    n = len(ids)
    req = {k: _column(req_table, k, n, where) for k in
           ("arrival", "prompt_len", "max_new_tokens", "status", "finish_reason",
            "first_scheduled", "release", "streamed")}

    # Replay the steps: chunk starts, which chunk samples, and token times.
    m = len(_column(step_table, "duration", None, where))
    st = {k: _column(step_table, k, m, where) for k in
          ("idle_before", "duration", "held_slots", "batch_id", "decodes", "prefills")}
    st["checks"] = (_column(step_table, "checks", m, where) if version == SPECULATIVE_FILE_VERSION
                    else [[]] * m)
    replay = _Replay(req["prompt_len"])
    spec_checks: list[list[tuple[int, int]]] = [[] for _ in ids]
    steps, end_us = [], 0
    for k in range(m):
        step_where = f"{where}: step {k}"
        start_us = end_us + st["idle_before"][k]
        end_us = start_us + st["duration"][k]
        decodes = st["decodes"][k]
        decodes = list(replay.expected_decodes) if decodes is None else decodes
        flat = st["prefills"][k]
        if not isinstance(flat, list) or len(flat) % 2:
            raise ValueError(f"{step_where}: prefills must be a flat list of "
                             "(request, num_tokens) pairs")
        prefills = list(zip(flat[0::2], flat[1::2]))
        checks = _step_checks(st["checks"][k], decodes, step_where)
        chunks = replay.step(decodes, prefills, end_us, req["max_new_tokens"], step_where, checks)
        for r, pair in checks.items():
            spec_checks[r].append(pair)
        steps.append(StepRecord(k, start_us / _US, (end_us - start_us) / _US,
                                [ScheduledChunk(ids[r], s, num, samples,
                                                (PLACEHOLDER_TOKEN,) * drafted)
                                 for r, s, num, samples, drafted in chunks],
                                st["held_slots"][k], st["batch_id"][k]))

    if "token_gaps" in req_table:
        gaps = _column(req_table, "token_gaps", n, where)
        token_us = []
        for rid, arrival, g in zip(ids, req["arrival"], gaps):
            if not isinstance(g, list) or any(not is_int(x) or x < 0 for x in g):
                raise ValueError(f"{where}: request {rid!r}: token_gaps={shown(g)}; "
                                 "must be a list of ints >= 0")
            times, t = [], arrival
            for x in g:
                t += x
                times.append(t)
            token_us.append(times)
    else:
        token_us = replay.token_times_us
    output_ids = _column(req_table, "output_ids", n, where) if "output_ids" in req_table else None
    details = (_column(req_table, "finish_detail", n, where) if "finish_detail" in req_table
               else [None] * n)

    records = []
    for i, rid in enumerate(ids):
        outs = (list(output_ids[i]) if output_ids is not None
                else [PLACEHOLDER_TOKEN] * len(token_us[i]))
        if len(outs) != len(token_us[i]):
            raise ValueError(f"{where}: request {rid!r} has {len(token_us[i])} token times but "
                             f"{len(outs)} output ids")
        try:
            status = RequestStatus(req["status"][i])
        except ValueError:
            raise ValueError(f"{where}: request {rid!r}: status={req['status'][i]!r}; allowed: "
                             f"{[s.value for s in RequestStatus]}") from None
        try:   # (files from before finish_detail existed say "aborted: <why>" in one string)
            reason, detail = parse_finish_reason(req["finish_reason"][i])
        except ValueError as e:
            raise ValueError(f"{where}: request {rid!r}: {e}") from None
        records.append(RequestRecord(
            request_id=rid, arrival_time=req["arrival"][i] / _US, prompt_len=req["prompt_len"][i],
            max_new_tokens=req["max_new_tokens"][i], status=status,
            finish_reason=reason, finish_detail=details[i] if details[i] is not None else detail,
            first_scheduled_time=_from_us(req["first_scheduled"][i]),
            token_times=[t / _US for t in token_us[i]], release_time=_from_us(req["release"][i]),
            streamed=bool(req["streamed"][i]), output_ids=outs, spec_checks=spec_checks[i]))
    return Trace(requests=records, steps=steps, meta=dict(data.get("meta") or {}))


def _step_checks(flat: object, decodes: list[int], where: str) -> dict[int, tuple[int, int]]:
    """A step's ``checks`` column: request index -> (drafted, accepted), each a decode of the step
    with 0 <= accepted <= drafted, drafted >= 1."""
    if not isinstance(flat, list) or len(flat) % 3 or not all(is_int(x) for x in flat):
        raise ValueError(f"{where}: checks={shown(flat)}; must be a flat list of "
                         "(request, drafted, accepted) ints")
    checks = {}
    for r, drafted, accepted in zip(flat[0::3], flat[1::3], flat[2::3]):
        if r not in decodes or r in checks or not 0 <= accepted <= drafted or drafted < 1:
            raise ValueError(f"{where}: check ({r}, {drafted}, {accepted}) must be one of the "
                             "step's decodes (once) with 1 <= drafted and 0 <= accepted <= drafted")
        checks[r] = (drafted, accepted)
    return checks


# --- files ----------------------------------------------------------------------------------------
def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def format_trace_json(data: dict) -> str:
    """JSON text with one line per top-level key and per column, so a diff shows which column
    changed (``json.loads`` reads it like any JSON)."""
    lines = []
    for key in sorted(data):
        value = data[key]
        if key in ("requests", "steps") and isinstance(value, dict):
            columns = [f" {_dumps(col)}: {_dumps(value[col])}" for col in sorted(value)]
            lines.append(f"{_dumps(key)}: {{\n" + ",\n".join(columns) + "\n}")
        else:
            lines.append(f"{_dumps(key)}: {_dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def save_trace(trace: Trace, path: str | Path, meta: dict | None = None) -> Path:
    """Write ``trace`` to ``path`` as JSON (byte-identical for identical traces); returns the path.

    ``meta`` replaces the trace's ``meta`` in the file when given.
    """
    path = Path(path)
    path.write_text(format_trace_json(trace_to_dict(trace, meta)), encoding="utf-8")
    return path


def load_trace(path: str | Path) -> Trace:
    """Read a trace written by ``save_trace``."""
    path = Path(path)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return trace_from_dict(data, where=str(path))
