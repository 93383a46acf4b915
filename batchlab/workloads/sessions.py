"""Workloads with prefix sharing: multi-turn chat sessions over shared system prompts.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from batchlab.checks import check_int, check_number
from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE, chain_hash
from batchlab.requests import Request
from batchlab.workloads.arrivals import Seed, _child_rngs
from batchlab.workloads.lengths import LengthDist, Range, _as_length_dist

SMOLLM2_VOCAB = 49152   # the course model's vocabulary; any id below it is a valid token


@dataclass(frozen=True)
class SessionShape:
    """What a session workload looks like (see the module docstring for each knob's meaning).

    Lengths are token counts: an int, or a ``Fixed`` / ``Range`` / ``Mixture`` distribution.
    """

    num_sessions: int
    turns: LengthDist | int = Range(1, 4)
    system_prompt_len: int = 256
    num_system_prompts: int = 1
    system_prompt_skew: float = 0.0
    user_len: LengthDist | int = Range(16, 96)
    output_len: LengthDist | int = Range(32, 160)
    session_rate: float = 1.0
    think_time_s: float = 5.0
    vocab_size: int = SMOLLM2_VOCAB

    def __post_init__(self) -> None:
        check_int("num_sessions", self.num_sessions)
        check_int("system_prompt_len", self.system_prompt_len, minimum=0)
        check_int("num_system_prompts", self.num_system_prompts,
                  hint="how many distinct system prompts the sessions pick from")
        check_number("system_prompt_skew", self.system_prompt_skew,
                     hint="0 = every system prompt equally likely")
        check_number("session_rate", self.session_rate, strict=True, hint="new sessions per second")
        check_number("think_time_s", self.think_time_s,
                     hint="mean seconds between a session's turns")
        check_int("vocab_size", self.vocab_size, minimum=2)
        for name in ("turns", "user_len", "output_len"):
            object.__setattr__(self, name, _as_length_dist(getattr(self, name), name))


@dataclass
class SessionWorkload:
    """The requests (sorted by arrival, ids ``s0003-t01``), and the session of each request id."""

    requests: list[Request]
    session_of: dict[str, str]
    shape: SessionShape
    system_prompt_of: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)


def _tokens(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    return rng.integers(0, vocab_size, size=n).tolist()


def _system_prompt_picks(shape: SessionShape, rng: np.random.Generator) -> np.ndarray:
    """Which system prompt each session starts with: in turn when ``skew`` is 0 (every prompt
    as often as any other), else drawn from a Zipf law of exponent ``skew``."""
    if shape.system_prompt_skew == 0:
        return np.arange(shape.num_sessions) % shape.num_system_prompts
    weights = 1.0 / np.arange(1, shape.num_system_prompts + 1) ** shape.system_prompt_skew
    return rng.choice(shape.num_system_prompts, size=shape.num_sessions, p=weights / weights.sum())


def _session_turns(session: int, system: list[int], num_turns: int, shape: SessionShape,
                   start: float, rngs: list[np.random.Generator]) -> list[Request]:
    """One session's requests: each turn's prompt is the previous prompt, its answer, a new
    message."""
    length_rng, think_rng, token_rng = rngs
    user_lens = shape.user_len.sample(num_turns, length_rng)
    output_lens = shape.output_len.sample(num_turns, length_rng)
    history, t, out = list(system), start, []
    for k in range(num_turns):
        prompt = history + _tokens(token_rng, int(user_lens[k]), shape.vocab_size)
        out.append(Request(f"s{session:04d}-t{k:02d}", prompt, int(output_lens[k]), t))
        history = prompt + _tokens(token_rng, int(output_lens[k]), shape.vocab_size)  # the answer
        t += float(think_rng.exponential(shape.think_time_s)) if shape.think_time_s > 0 else 0.0
    return out


def make_sessions(shape: SessionShape, seed: Seed = 0) -> SessionWorkload:
    """Build the session workload ``shape`` describes, reproducibly from ``seed``.

    Session starts, system-prompt choices, turn counts, lengths, think times and token ids come
    from separate random streams, so changing the rate keeps the very same prompts.
    """
    if not isinstance(shape, SessionShape):
        raise ValueError(f"shape={shape!r}; must be a SessionShape")
    start_rng, pick_rng, turn_rng, system_rng, length_rng, think_rng, token_rng = \
        _child_rngs(seed, 7)
    starts = np.cumsum(start_rng.exponential(1.0 / shape.session_rate, size=shape.num_sessions))
    starts -= starts[0]                                            # the first session at t = 0
    systems = [_tokens(system_rng, shape.system_prompt_len, shape.vocab_size)
               for _ in range(shape.num_system_prompts)]
    picks = _system_prompt_picks(shape, pick_rng)
    turns = shape.turns.sample(shape.num_sessions, turn_rng)
    requests, session_of, system_of = [], {}, {}
    for s in range(shape.num_sessions):
        for req in _session_turns(s, systems[picks[s]], int(turns[s]), shape, float(starts[s]),
                                  [length_rng, think_rng, token_rng]):
            requests.append(req)
            session_of[req.request_id] = f"s{s:04d}"
            system_of[req.request_id] = int(picks[s])
    requests.sort(key=lambda r: (r.arrival_time, r.request_id))
    return SessionWorkload(requests, session_of, shape, system_of)


def ideal_prefix_reuse(requests: list[Request], block_size: int = DEFAULT_BLOCK_SIZE) -> float:
    """Share of prompt tokens an unbounded prefix cache would already hold, in arrival order.

    Each prompt's full blocks are identified by chained hashes (as ``kv_blocks`` does); a block
    counts as reused when an earlier request had the same block at the same place after the same
    prefix. This is the ceiling for any cache and any router: a finite cache evicts, and a
    cluster splits the cache over replicas.
    """
    check_int("block_size", block_size)
    seen: set[int] = set()
    reused = total = 0
    for req in sorted(requests, key=lambda r: r.arrival_time):
        total += req.prompt_len
        if req.prompt_ids is None:
            continue
        parent = None
        for b in range(len(req.prompt_ids) // block_size):
            parent = chain_hash(parent, req.prompt_ids[b * block_size:(b + 1) * block_size])
            if parent in seen:
                reused += block_size
            seen.add(parent)
    return reused / total if total else math.nan


__all__ = ["SMOLLM2_VOCAB", "SessionShape", "SessionWorkload", "ideal_prefix_reuse",
           "make_sessions"]
