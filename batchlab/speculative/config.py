"""``SpeculativeConfig``: vLLM's ``--speculative-config``, by its names, defaults and rules.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from batchlab.checks import check_choice, check_int, fail, is_int

METHODS = ("ngram", "early_exit", "draft_model")
# the drafters the course's engine runs on its one real model
CPU_METHODS = ("ngram", "early_exit")
DEFAULT_PROMPT_LOOKUP = 5          # vLLM 0.32's value when neither bound is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """How requests are drafted for; see the module docstring. ``SpeculativeConfig.parse`` takes
    vLLM's JSON (or a dict)."""

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    early_exit_layer: int | None = None
    model: str | None = None             # the draft model (``draft_model`` only)

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS, hint="the drafters batchlab has")
        check_int("num_speculative_tokens", self.num_speculative_tokens,
                  hint="k, the tokens drafted per step")
        check_int("prompt_lookup_min", self.prompt_lookup_min, allow_none=True)
        check_int("prompt_lookup_max", self.prompt_lookup_max, allow_none=True)
        check_int("early_exit_layer", self.early_exit_layer, allow_none=True,
                  hint="the layers an early-exit draft runs")
        if self.num_speculative_tokens_per_batch_size is not None:
            object.__setattr__(self, "num_speculative_tokens_per_batch_size",
                               _check_schedule(self.num_speculative_tokens_per_batch_size))
        if (self.method == "draft_model") != (self.model is not None):
            if self.model is None:
                raise ValueError('method "draft_model" needs model: the drafter, a MODEL_SHAPES '
                                 "name or a config.json path (e.g. \"Llama-3.2-1B\")")
            raise ValueError(f'model={self.model!r} belongs to method "draft_model", '
                             f"not {self.method!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            fail("model", self.model,
                 "the drafter's name: a MODEL_SHAPES name or a config.json path")
        if (self.method == "early_exit") != (self.early_exit_layer is not None):
            if self.early_exit_layer is None:
                raise ValueError('method "early_exit" needs early_exit_layer: how many of the '
                                 "model's layers the draft runs (1 to its layers - 1)")
            raise ValueError(f"early_exit_layer={self.early_exit_layer!r} belongs to method "
                             f'"early_exit", not {self.method!r}')
        if self.method != "ngram":
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                if getattr(self, name) is not None:
                    raise ValueError(f'{name}={getattr(self, name)!r} belongs to method "ngram", '
                                     f"not {self.method!r}")
            return
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        low, high = (high, high) if low is None else (low, low) if high is None else (low, high)
        if low > high:
            raise ValueError(f"prompt_lookup_min={low} must be <= prompt_lookup_max={high}")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    def tokens_for_batch(self, batch_size: int) -> int:
        """``k`` for a step of ``batch_size`` requests: the schedule's, at most
        ``num_speculative_tokens`` (all of it without a schedule)."""
        k = self.num_speculative_tokens
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is None:
            return k
        chosen = schedule[0][2]
        for first, _, tokens in schedule:
            if first > batch_size:
                break
            chosen = tokens
        return min(k, chosen)

    @classmethod
    def parse(cls, value: "str | dict | SpeculativeConfig") -> "SpeculativeConfig":
        """From vLLM's ``--speculative-config`` JSON
        (``{"method": "ngram", "num_speculative_tokens": 3, ...}``) or its dict. Keys batchlab
        does not know are an error, named."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative config {value!r} is not JSON: {e}") from None
        if not isinstance(value, dict):
            fail("speculative_config", value, "a JSON object or dict, e.g. "
                 '{"method": "ngram", "num_speculative_tokens": 3}')
        if "model" in value and "method" not in value:
            value = {**value, "method": "draft_model"}     # vLLM's reading of a bare drafter
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative config keys {unknown} are not supported; batchlab "
                             f"takes {sorted(known)}")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative config needs num_speculative_tokens (k, the tokens "
                             "drafted per step)")
        schedule = value.get("num_speculative_tokens_per_batch_size")
        if isinstance(schedule, list):
            value = {**value, "num_speculative_tokens_per_batch_size": tuple(
                tuple(e) if isinstance(e, list) else e for e in schedule)}
        return cls(**value)

    def to_json(self) -> str:
        """vLLM's JSON for this config (``--speculative-config``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if getattr(self, f.name) is not None}
        return json.dumps(out)


def check_runs_on_the_model(spec: SpeculativeConfig) -> None:
    """Refuse a drafter the real-model engine cannot run: it serves one model, so a draft model
    is priced by the simulator only."""
    if spec.method not in CPU_METHODS:
        fail("speculative method", spec.method, f"one of {CPU_METHODS} with the real model",
             f"a draft model ({spec.model!r}) is priced by the simulator only: SimBackend over "
             "VllmReplica(...).step_model")


def _check_schedule(schedule: object) -> tuple[tuple[int, int, int], ...]:
    """vLLM's rules for ``num_speculative_tokens_per_batch_size``; the ranges sorted."""
    name, allowed = ("num_speculative_tokens_per_batch_size",
                     "a non-empty list of (first, last, k) batch-size ranges")
    if not isinstance(schedule, (list, tuple)) or not schedule:
        fail(name, schedule, allowed)
    for entry in schedule:
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or not all(is_int(x) for x in entry)):
            fail(name, schedule, allowed, f"entry {entry!r} is not three ints")
        if entry[0] < 1 or entry[1] < entry[0] or entry[2] < 0:
            fail(name, schedule, allowed,
                 f"entry {tuple(entry)}: need 1 <= first <= last and k >= 0")
    ranges = tuple(sorted((tuple(map(int, e)) for e in schedule), key=lambda e: e[0]))
    for (_, last, _), (first, _, _) in zip(ranges, ranges[1:]):
        if first <= last:
            fail(name, schedule, allowed, f"ranges overlap at batch size {first}")
    if ranges[0][0] != 1:
        fail(name, schedule, allowed, "the first range must start at batch size 1")
    return ranges
