"""The traffic a deployment is predicted for: generated like ``vllm bench serve``'s random dataset,
or replayed from the user's own logged requests.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchlab.checks import check_choice, check_fraction, check_int, check_number, fail
from batchlab.requests import Request
from batchlab.workloads.arrivals import arrivals_fixed, arrivals_gamma
from batchlab.workloads.lengths import range_around

TRACE_FIELDS = ("arrival_s", "input_tokens", "output_tokens")
OPTIONAL_FIELDS = ("prefix_group", "prefix_len")
ARRIVAL_KINDS = ("poisson", "gamma", "constant")
_PREFIX_BASE, _UNIQUE_BASE = 1 << 32, 1 << 40     # id ranges: group prefixes, then unique tokens


@dataclass(frozen=True)
class Traffic:
    """Per-request arrays, sorted by arrival: seconds, prompt tokens (prefix included), output
    tokens, prefix group (-1: none) and the group's shared prefix length."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_len: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.arrival_s)

    def requests(self) -> list[Request]:
        """The engine's requests: ids ``r0, r1, ...``, ``ignore_eos``-style fixed output lengths."""
        out, start = [], _UNIQUE_BASE
        for i in range(len(self)):
            n, group, shared = (int(self.input_tokens[i]), int(self.prefix_group[i]),
                                int(self.prefix_len[i]))
            shared = min(shared, n) if group >= 0 else 0
            prefix = range(_PREFIX_BASE * (group + 1), _PREFIX_BASE * (group + 1) + shared)
            ids = [*prefix, *range(start, start + n - shared)]
            start += n
            out.append(Request(f"r{i}", ids, int(self.output_tokens[i]), float(self.arrival_s[i])))
        return out

    def describe(self) -> str:
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0
        rate = (len(self) - 1) / span if span > 0 else math.inf
        shared = self.prefix_len[self.prefix_group >= 0]
        groups = len(np.unique(self.prefix_group[self.prefix_group >= 0]))
        return (f"{len(self):,} requests over {span:,.1f} s ({rate:.3g} req/s), "
                f"input {np.mean(self.input_tokens):.0f} tokens on average, "
                f"output {np.mean(self.output_tokens):.0f}; "
                + (f"{groups} prefix group{'s' if groups > 1 else ''} "
                   f"sharing {np.mean(shared):.0f} tokens"
                   if len(shared) else "no shared prefix")
                + f" ({self.source})")


@dataclass(frozen=True)
class TrafficSpec:
    """Generated traffic (see the module docstring); defaults are ``vllm bench serve``'s."""

    num_prompts: int = 1000
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrival: str = "poisson"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_prompts", self.num_prompts, hint="--num-prompts")
        check_number("request_rate", self.request_rate, strict=True, allow_inf=True,
                     hint="--request-rate, req/s")
        check_number("burstiness", self.burstiness, strict=True,
                     hint="--burstiness: 1 = Poisson, < 1 burstier")
        check_choice("arrival", self.arrival, ARRIVAL_KINDS)
        if self.burstiness != 1.0 and self.arrival == "poisson":
            object.__setattr__(self, "arrival", "gamma")
        check_int("input_len", self.input_len, hint="--input-len")
        check_int("output_len", self.output_len, hint="--output-len")
        check_fraction("range_ratio", self.range_ratio, "[0, 1)", hint="--random-range-ratio")
        check_int("prefix_len", self.prefix_len, minimum=0, hint="--prefix-len")
        check_int("num_prefix_groups", self.num_prefix_groups, hint="--num-prefix-groups")
        check_int("seed", self.seed, minimum=0, hint="--seed")

    def generate(self) -> Traffic:
        n, rng = self.num_prompts, np.random.default_rng(self.seed)
        if self.arrival == "constant":
            arrivals = (arrivals_fixed(n, self.request_rate) if math.isfinite(self.request_rate)
                        else np.zeros(n))
        else:
            arrivals = arrivals_gamma(n, self.request_rate, self.burstiness, rng)

        def lengths(mean: int) -> np.ndarray:
            lo, hi = (max(x, 1) for x in range_around(mean, self.range_ratio))
            return rng.integers(lo, hi + 1, size=n)

        inputs, outputs = lengths(self.input_len), lengths(self.output_len)
        groups = np.arange(n) % self.num_prefix_groups if self.prefix_len else np.full(n, -1)
        return Traffic(arrivals, inputs + (self.prefix_len if self.prefix_len else 0), outputs,
                       groups, np.full(n, self.prefix_len),
                       f"generated: {self.arrival} at {self.request_rate:g} req/s, "
                       f"seed {self.seed}")


# --- a logged trace ------------------------------------------------------------------------------
def _rows(path: Path):
    """(row number, dict of strings or values) for each request row of a CSV or JSONL file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".jsonl", ".json") or text.lstrip().startswith("{"):
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path.name} row {number}: not a JSON object "
                                     f"({e.msg})") from None
                if not isinstance(row, dict):
                    fail(f"{path.name} row {number}", row,
                         "a JSON object with fields " + ", ".join(TRACE_FIELDS))
                yield number, row
        return
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in TRACE_FIELDS if f not in (reader.fieldnames or [])]
    if missing:
        fail(f"{path.name} header", reader.fieldnames, f"a CSV header naming {list(TRACE_FIELDS)}",
             f"lacks {missing}; optional: {list(OPTIONAL_FIELDS)}")
    for number, row in enumerate(reader, start=2):      # row 1 is the header
        yield number, {k: v for k, v in row.items() if v not in (None, "")}


def _field(path: Path, number: int, row: dict, name: str, kind: type, minimum: float, default=None):
    value = row.get(name, default)
    if value is None:
        fail(f"{path.name} row {number}: {name}", None,
             f"present (fields: {', '.join(TRACE_FIELDS)})")
    try:
        number_value = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number_value = None
    if number_value is None or (kind is int and float(value) != number_value) \
            or not math.isfinite(number_value) or number_value < minimum:
        what = "an int" if kind is int else "a number"
        fail(f"{path.name} row {number}: {name}", value, f"{what} >= {minimum:g}")
    return number_value


def read_trace(path: str | Path) -> Traffic:
    """A logged trace (see the module docstring), sorted by arrival; arrivals shifted to start
    at 0."""
    path = Path(path)
    if not path.is_file():
        fail("trace", str(path), "an existing CSV or JSONL file",
             f"fields {', '.join(TRACE_FIELDS)}")
    columns: dict[str, list] = {k: [] for k in TRACE_FIELDS + OPTIONAL_FIELDS}
    for number, row in _rows(path):
        columns["arrival_s"].append(_field(path, number, row, "arrival_s", float, 0))
        columns["input_tokens"].append(_field(path, number, row, "input_tokens", int, 1))
        columns["output_tokens"].append(_field(path, number, row, "output_tokens", int, 1))
        group = _field(path, number, row, "prefix_group", int, -1, default=-1)
        shared = _field(path, number, row, "prefix_len", int, 0, default=0)
        if shared and group < 0:
            fail(f"{path.name} row {number}: prefix_group", row.get("prefix_group"), "an int >= 0",
                 "a prefix_len needs the group that shares it")
        columns["prefix_group"].append(group)
        columns["prefix_len"].append(shared)
    if not columns["arrival_s"]:
        fail("trace", str(path), "a file with at least one request row")
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    order = np.argsort(arrays["arrival_s"], kind="stable")
    arrays = {k: v[order] for k, v in arrays.items()}
    arrays["arrival_s"] = arrays["arrival_s"] - arrays["arrival_s"][0]
    return Traffic(**arrays, source=f"trace {path.name}")


__all__ = ["ARRIVAL_KINDS", "OPTIONAL_FIELDS", "TRACE_FIELDS", "Traffic", "TrafficSpec",
           "read_trace"]
