"""The prompts of ``vllm bench serve``'s datasets, built as vLLM 0.32 builds them
(``--dataset-name``).

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from batchlab.checks import check_int, fail, is_number
from batchlab.loadgen.client import LoadRequest
from batchlab.workloads.lengths import range_around

DATASETS = ("random", "sharegpt", "prefix_repetition")
# vLLM's is_valid_sequence
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def parse_range_ratio(value: str | float | dict) -> tuple[float, float]:
    """``--random-range-ratio``: one number for both, or ``{"input": r1, "output": r2}``; each in
    [0, 1)."""
    text = value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            fail("random-range-ratio", text,
                 'a number in [0, 1) or a JSON {"input": r1, "output": r2}')
    if isinstance(value, dict):
        if set(value) != {"input", "output"}:
            fail("random-range-ratio", text,
                 'a JSON object with exactly the keys "input" and "output"')
        pair = (value["input"], value["output"])
    else:
        pair = (value, value)
    if not all(is_number(r) and 0 <= r < 1 for r in pair):
        fail("random-range-ratio", text, "in [0, 1) (each ratio)")
    return float(pair[0]), float(pair[1])


@dataclass(frozen=True)
class DatasetConfig:
    """vLLM's dataset options (``--dataset-name`` and the flags of each dataset)."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    random_input_len: int = 64
    random_output_len: int = 16
    random_range_ratio: str = "0.0"
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    disable_shuffle: bool = False
    no_oversample: bool = False

    def __post_init__(self) -> None:
        if self.dataset_name not in DATASETS:
            fail("dataset-name", self.dataset_name, f"one of {list(DATASETS)}",
                 "or --prompts FILE for a JSONL of prompts, --workload FILE to replay a workload")
        if self.dataset_name == "sharegpt":
            if self.dataset_path is None:
                fail("dataset-path", None,
                     "a ShareGPT-style JSON file with --dataset-name sharegpt")
            if not Path(self.dataset_path).is_file():
                fail("dataset-path", self.dataset_path, "a ShareGPT-style JSON file (no such file)")
        elif self.dataset_path is not None:
            fail("dataset-path", self.dataset_path,
                 f"unset with --dataset-name {self.dataset_name}",
                 "a file is read by --dataset-name sharegpt")
        check_int("random-input-len", self.random_input_len)
        check_int("random-output-len", self.random_output_len)
        check_int("random-prefix-len", self.random_prefix_len, 0)
        parse_range_ratio(self.random_range_ratio)
        check_int("sharegpt-output-len", self.sharegpt_output_len, allow_none=True)
        check_int("prefix-repetition-prefix-len", self.prefix_repetition_prefix_len, 0)
        check_int("prefix-repetition-suffix-len", self.prefix_repetition_suffix_len)
        check_int("prefix-repetition-num-prefixes", self.prefix_repetition_num_prefixes)
        check_int("prefix-repetition-output-len", self.prefix_repetition_output_len)

    def sample(self, n: int, tokenizer, seed: int = 0) -> list[LoadRequest]:
        """``n`` requests of this dataset (arrival times 0: see ``schedule``)."""
        check_int("num-prompts", n)
        if self.dataset_name == "random":
            return random_requests(n, self, tokenizer, seed)
        if self.dataset_name == "sharegpt":
            return sharegpt_requests(n, self, tokenizer, seed)
        return prefix_repetition_requests(n, self, tokenizer, seed)


def _allowed_tokens(tokenizer) -> np.ndarray:
    return np.setdiff1d(np.arange(len(tokenizer)), np.asarray(tokenizer.all_special_ids, dtype=int))


def random_requests(n: int, cfg: DatasetConfig, tokenizer, seed: int = 0) -> list[LoadRequest]:
    """vLLM's ``random`` dataset (see the module docstring)."""
    rng = np.random.default_rng(seed)
    in_ratio, out_ratio = parse_range_ratio(cfg.random_range_ratio)
    real_len = max(0, cfg.random_input_len - int(tokenizer.num_special_tokens_to_add()))
    in_low, in_high = range_around(real_len, in_ratio)
    out_low, out_high = (max(x, 1) for x in range_around(cfg.random_output_len, out_ratio))
    if cfg.random_prefix_len + in_low < 1:
        fail("random-input-len", cfg.random_input_len,
             "long enough for a prompt of at least 1 token",
             f"the tokenizer adds {tokenizer.num_special_tokens_to_add()} special tokens; "
             f"range ratio {in_ratio}")
    input_lens = rng.integers(in_low, in_high + 1, size=n)
    output_lens = rng.integers(out_low, out_high + 1, size=n)
    allowed = _allowed_tokens(tokenizer)
    offsets = rng.integers(0, len(allowed), size=n)
    prefix = allowed[rng.integers(0, len(allowed), size=cfg.random_prefix_len)].tolist()
    out = []
    for i in range(n):
        body = allowed[(offsets[i] + i + np.arange(input_lens[i])) % len(allowed)].tolist()
        ids = [int(t) for t in prefix + body]
        out.append(LoadRequest(f"r{i:04d}", ids, int(output_lens[i]), prompt_len=len(ids)))
    return out


def _conversations(path: str) -> list[list[dict]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        fail("dataset-path", path, "a ShareGPT-style JSON file", f"not JSON: {e}")
    if not isinstance(data, list):
        fail("dataset-path", path, 'a JSON list of {"conversations": [{"from", "value"}, ...]}',
             f"the file holds a JSON {type(data).__name__}")
    out = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(turns, list) and len(turns) >= 2 and all(
                isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns[:2]):
            out.append(turns)
    if not out:
        fail("dataset-path", path,
             "a ShareGPT-style JSON file with at least one conversation of two turns",
             'each entry {"conversations": [{"from": "human", "value": ...}, '
             '{"from": "gpt", "value": ...}]}')
    return out


def sharegpt_requests(n: int, cfg: DatasetConfig, tokenizer, seed: int = 0) -> list[LoadRequest]:
    """vLLM's ``sharegpt`` dataset (see the module docstring): text prompts."""
    conversations = _conversations(cfg.dataset_path)
    shuffler = random.Random(seed)
    if not cfg.disable_shuffle:
        shuffler.shuffle(conversations)
    picked: list[LoadRequest] = []
    for turns in conversations:
        if len(picked) >= n:
            break
        prompt, completion = turns[0]["value"], turns[1]["value"]
        prompt_len = len(tokenizer(prompt)["input_ids"])
        output_len = (len(tokenizer(completion)["input_ids"]) if cfg.sharegpt_output_len is None
                      else cfg.sharegpt_output_len)
        too_short = prompt_len < SHAREGPT_MIN_LEN or (cfg.sharegpt_output_len is None
                                                       and output_len < SHAREGPT_MIN_LEN)
        if (too_short or prompt_len > SHAREGPT_MAX_PROMPT
                or prompt_len + output_len > SHAREGPT_MAX_TOTAL):
            continue
        picked.append(LoadRequest(f"r{len(picked):04d}", prompt, output_len, prompt_len=prompt_len))
    if not picked:
        fail("dataset-path", cfg.dataset_path, "a ShareGPT-style file with a usable conversation",
             f"every pair had a prompt or output under {SHAREGPT_MIN_LEN} tokens or a prompt over "
             f"{SHAREGPT_MAX_PROMPT}")
    if not cfg.no_oversample and len(picked) < n:
        redraw, base = random.Random(seed), list(picked)
        picked += [replace(redraw.choice(base), request_id=f"r{i:04d}")
                   for i in range(len(base), n)]
    return picked


def prefix_repetition_requests(n: int, cfg: DatasetConfig, tokenizer,
                               seed: int = 0) -> list[LoadRequest]:
    """vLLM's ``prefix_repetition`` dataset (see the module docstring)."""
    per_prefix = n // cfg.prefix_repetition_num_prefixes
    if per_prefix == 0:
        fail("num-prompts", n,
             f">= prefix-repetition-num-prefixes={cfg.prefix_repetition_num_prefixes}",
             "each prefix needs at least one prompt")
    rng = np.random.default_rng(seed)
    allowed = _allowed_tokens(tokenizer)
    prompts = []
    for _ in range(cfg.prefix_repetition_num_prefixes):
        prefix = allowed[rng.integers(0, len(allowed),
                                      size=cfg.prefix_repetition_prefix_len)].tolist()
        for _ in range(per_prefix):
            suffix = allowed[rng.integers(0, len(allowed),
                                          size=cfg.prefix_repetition_suffix_len)].tolist()
            prompts.append([int(t) for t in prefix + suffix])
    if not cfg.disable_shuffle:
        random.Random(seed).shuffle(prompts)
    return [LoadRequest(f"r{i:04d}", ids, cfg.prefix_repetition_output_len, prompt_len=len(ids))
            for i, ids in enumerate(prompts)]
