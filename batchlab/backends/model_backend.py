"""The real-model backend: runs each step plan on SmolLM2 with the batched Llama step.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping


from batchlab.backends.base import Backend, StepResult
from batchlab.checks import check_bool, check_instance, check_int
from batchlab.kv_blocks import check_block_size
from batchlab.model import LoadedModel, load_model
from batchlab.model.early_exit import draft_early_exit
from batchlab.model.environment import synchronize
from batchlab.model.kv_cache import KVCache
from batchlab.model.llama import LlamaWeights, forward_step
from batchlab.model.paged_kv_cache import PagedKVCache
from batchlab.model.sampling import RequestSampler
from batchlab.model.verify import verify_draft
from batchlab.plan import StepPlan
from batchlab.requests import KVCopy, Request
from batchlab.speculative import SpeculativeConfig, check_runs_on_the_model, propose_ngram


class ModelBackend(Backend):
    """Run plans on the real model.

    num_slots: KV slots, i.e. how many sequences the slot cache can hold at once. (That is the
    cache's size; how many requests a scheduler runs at once is its ``max_num_seqs``, vLLM's
    meaning. A server usually gives both the same number.)
    max_seq_len: tokens per slot (prompt + output of one request must fit).
    kv_memory_bytes: alternatively, a memory budget; the slot count is what it holds.
    paged: a paged KV cache of ``block_size``-token blocks instead of slots (off by default). Its
    size: ``kv_memory_bytes`` if given, else ``num_kv_blocks``, else the slot cache's memory
    (``num_slots`` sequences of ``max_seq_len``). ``enable_prefix_caching`` and
    ``reserve_blocks``: see ``kv_blocks.BlockManager``. ``speculative_config``: draft tokens for
    each request's next step and check them in it (``batchlab.speculative``: a
    ``SpeculativeConfig``); the scheduler must check drafts (``ContinuousBatcher``).
    """

    def __init__(self, lm: LoadedModel | None = None, num_slots: int = 32,
                 max_seq_len: int = 1024, kv_memory_bytes: int | None = None, paged: bool = False,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 enable_prefix_caching: bool = False, reserve_blocks: int = 0,
                 speculative_config: SpeculativeConfig | None = None) -> None:
        self.lm = lm if lm is not None else load_model()
        self.weights = LlamaWeights.from_hf(self.lm.model)
        cfg = self.weights.config
        check_int("max_seq_len", max_seq_len,
                  hint=f"at most {cfg.max_position}, the model's context length")
        if max_seq_len > cfg.max_position:
            raise ValueError(f"max_seq_len={max_seq_len!r}; must be an int in "
                             f"1..{cfg.max_position} (the model's context length)")
        check_bool("paged", paged)
        if not paged and (enable_prefix_caching or reserve_blocks or num_kv_blocks is not None):
            raise ValueError("enable_prefix_caching, reserve_blocks and num_kv_blocks "
                             "need paged=True")
        self.kv: KVCache | PagedKVCache
        if paged:
            self.kv = self._paged_cache(num_slots, max_seq_len, kv_memory_bytes, block_size,
                                        num_kv_blocks, enable_prefix_caching, reserve_blocks)
        elif kv_memory_bytes is not None:
            self.kv = KVCache.from_budget(kv_memory_bytes, max_seq_len, cfg.num_layers,
                                          cfg.num_kv_heads, cfg.head_dim, self.weights.dtype,
                                          str(self.weights.device), max_slots=num_slots)
        else:
            check_int("num_slots", num_slots)
            self.kv = self.weights.new_kv_cache(num_slots, max_seq_len)
        self.sampler = RequestSampler()
        check_instance("speculative_config", speculative_config, SpeculativeConfig,
                       "a SpeculativeConfig", allow_none=True,
                       hint="SpeculativeConfig.parse(text) reads vLLM's JSON")
        self.speculative = speculative_config
        if speculative_config is not None:
            _check_speculation(speculative_config, max_seq_len, cfg.num_layers)

    def _paged_cache(self, num_slots: int, max_seq_len: int, kv_memory_bytes: int | None,
                     block_size: int, num_kv_blocks: int | None, enable_prefix_caching: bool,
                     reserve_blocks: int) -> PagedKVCache:
        cfg, w = self.weights.config, self.weights
        if kv_memory_bytes is not None:
            return PagedKVCache.from_budget(kv_memory_bytes, cfg.num_layers, cfg.num_kv_heads,
                                            cfg.head_dim, block_size, max_seq_len, w.dtype,
                                            str(w.device), enable_prefix_caching, reserve_blocks)
        if num_kv_blocks is None:
            check_int("num_slots", num_slots)
            check_block_size(block_size)
            num_kv_blocks = num_slots * -(-max_seq_len // block_size)   # the slot cache's memory
        return w.new_paged_kv_cache(num_kv_blocks, block_size, max_seq_len, enable_prefix_caching,
                                    reserve_blocks)

    def describe(self) -> str:
        return f"ModelBackend({self.lm.name}, {self.lm.device}/{self.lm.dtype}, {self.kv})"

    def release(self, request_id: str) -> None:
        self.sampler.forget(request_id)     # its generator, if it sampled with one

    def read_kv(self, request_id: str, num_tokens: int) -> KVCopy:
        return KVCopy(self.kv.read_tokens(request_id, num_tokens),
                      list(self.kv.block_table(request_id)))

    def run(self, plan: StepPlan, requests: Mapping[str, Request]) -> StepResult:
        if plan.is_empty:
            raise ValueError("ModelBackend.run got an empty plan; the engine runs only plans "
                             "with work")
        chunks, sampling = [], []
        for c in plan.chunks:
            req = requests[c.request_id]
            ids = req.token_ids(c.start, c.num_tokens - len(c.draft)) + list(c.draft)
            chunks.append(self.kv.seq_chunk(c.request_id, c.start, ids, c.samples,
                                            1 + len(c.draft)))
            if c.samples:
                sampling.append((req, c.draft))
        synchronize(self.weights.device)
        t0 = time.perf_counter()
        logits = forward_step(self.weights, self.kv, chunks)
        result = self._choose(logits, sampling)
        if self.speculative is not None:
            result.drafts = self._draft(result, sampling, len(chunks))
        synchronize(self.weights.device)
        result.duration = time.perf_counter() - t0
        return result

    def _choose(self, logits, sampling: list[tuple[Request, tuple[int, ...]]]) -> StepResult:
        """Each sampling request's next token from its logit row, or its draft checked against its
        ``k + 1`` rows (``model.verify``)."""
        plain, plain_rows, checks, row = [], [], [], 0
        for req, draft in sampling:
            if draft:
                checks.append((req, draft, row))
            else:
                plain.append(req)
                plain_rows.append(row)
            row += 1 + len(draft)
        rows = logits if not checks else logits[plain_rows]
        tokens, logprobs = self.sampler.sample(rows, plain) if plain else ([], {})
        result = StepResult({r.request_id: t for r, t in zip(plain, tokens)}, 0.0, logprobs)
        for req, draft, row in checks:
            emitted, token_logprobs = verify_draft(logits[row:row + len(draft) + 1], req, draft,
                                                   self.sampler)
            result.verified[req.request_id] = emitted
            if token_logprobs is not None:
                logprobs[req.request_id] = token_logprobs
        return result

    def _draft(self, result: StepResult, sampling: list[tuple[Request, tuple[int, ...]]],
               batch_size: int) -> dict[str, list[int]]:
        """Draft each sampling request's next tokens from its text after this step, ``k`` as the
        config's batch-size schedule says, no more than its remaining tokens allow: by prompt
        lookup, or by the model's first layers (``_draft_early_exit``)."""
        spec, wanted = self.speculative, []
        k = spec.tokens_for_batch(batch_size)
        for req, draft in sampling:
            emitted = result.verified.get(req.request_id) or [result.new_tokens[req.request_id]]
            room = min(k, req.max_new_tokens - len(req.output_ids) - len(emitted) - 1)
            if room > 0 and not any(req.stops_on(t) for t in emitted):
                wanted.append((req, draft, emitted, room))
        if spec.method == "early_exit":
            return self._draft_early_exit(wanted)
        return {req.request_id: propose_ngram(req.prompt_ids + req.output_ids + emitted, room,
                                              spec.prompt_lookup_min, spec.prompt_lookup_max)
                for req, _, emitted, room in wanted}

    def _draft_early_exit(self, wanted: list) -> dict[str, list[int]]:
        """Early-exit drafts. A pass writes its layers' keys and values at the positions the next
        step checks, up to ``room - 1`` past the newest token: the step's chunk had room up to its
        own end, so each sequence borrows what more it needs (fewer drafts where the paged cache
        has no free block) and gives it back before the step ends, as vLLM's scheduler sets
        lookahead slots aside for a model drafter."""
        seqs, borrowed = [], []
        for req, draft, emitted, room in wanted:
            # the newest token's position
            newest = req.prompt_len + len(req.output_ids) + len(emitted) - 1
            # past the chunk's end
            extra = len(emitted) + room - 1 - len(draft)
            while extra > 0 and not self.kv.grow(req.request_id, extra):
                room, extra = room - 1, extra - 1
            if room > 0:
                seqs.append((req.request_id, emitted[-1], newest, room))
            borrowed.append((req.request_id, max(extra, 0)))
        drafts = (draft_early_exit(self.weights, self.kv, self.speculative.early_exit_layer, seqs)
                  if seqs else [])
        for rid, extra in borrowed:
            self.kv.rollback(rid, extra)
        return {rid: d for (rid, *_), d in zip(seqs, drafts)}


def _check_speculation(spec: SpeculativeConfig, max_seq_len: int, num_layers: int) -> None:
    """A speculative config this backend can run: its checks fit a sequence, its drafter runs
    on the model itself, an early exit leaves layers out."""
    if spec.num_speculative_tokens >= max_seq_len:
        raise ValueError(f"num_speculative_tokens={spec.num_speculative_tokens}; "
                         f"must be below max_seq_len={max_seq_len} (a check computes k + 1 "
                         "positions of one sequence)")
    check_runs_on_the_model(spec)
    exit_layer = spec.early_exit_layer
    if exit_layer is not None and not exit_layer < num_layers:
        raise ValueError(f"early_exit_layer={exit_layer}; must be in 1..{num_layers - 1} "
                         f"(the draft runs fewer layers than the model's {num_layers})")
