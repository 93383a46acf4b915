"""A compact Llama forward pass that runs one *mixed* batched step.

One step serves many sequences at once, each at its own position. Each sequence brings either a
chunk of its prompt (prefill: any number of tokens) or its one newest token (decode). All the
step's tokens are packed into one (T, D) matrix, so every weight matmul runs ONCE over all of
them and no padding token is ever computed. Only attention is per-sequence: each token attends
to its own sequence's cached keys and values.

Architecture (SmolLM2 is a Llama): token embedding → num_layers × [RMSNorm → grouped-query
attention with rotary position embeddings → residual → RMSNorm → SwiGLU MLP → residual] →
RMSNorm → LM head (tied to the embedding).

Shapes used below:  T tokens in the step, D hidden size, H query heads, KV key/value heads,
hd head size, S sequences that need a next token, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchlab.model.cpu_dtype import cpu_bf16_flags
from batchlab.model.kv_cache import KVCache
from batchlab.model.paged_kv_cache import PagedKVCache, PagedSeqChunk, PagedStepLayout, paged_attention


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position: int

    @classmethod
    def from_hf(cls, config) -> "LlamaConfig":
        rope = getattr(config, "rope_parameters", None) or {}
        scaling = getattr(config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type={rope_type!r} is not supported by this compact forward; "
                             "only 'default' rotary embeddings are implemented")
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.vocab_size, config.hidden_size, config.intermediate_size,
                   config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                   head_dim, float(theta), float(config.rms_norm_eps), config.max_position_embeddings)


@dataclass
class LayerWeights:
    """One layer's weights. Projections are stored as (in, out), so a step computes ``x @ w``.

    transformers keeps them as (out, in) and computes ``x @ w.T``. On the course's 2-core CPUs
    with MKL, the 30 layers' matmuls at 1-32 rows (a decode step) took 10-16% less time in the
    (in, out) layout, measured side by side; at 128-512 rows (prefill) the two were even.
    """

    attn_norm: torch.Tensor   # (D,)
    w_qkv: torch.Tensor       # (D, (H + 2·KV)·hd)  q, k and v projections fused: one matmul
    w_o: torch.Tensor         # (H·hd, D)
    mlp_norm: torch.Tensor    # (D,)
    w_gate_up: torch.Tensor   # (D, 2·I)            gate and up projections fused
    w_down: torch.Tensor      # (I, D)


# fp32 on a CPU: each projection also gets a copy pre-packed once into oneDNN's blocked layout
# (``LlamaWeights.project``). On the course's 2-core AVX2 VM, one thread, a (23, 576) @ (576, 3072)
# product took 1.1-1.2 ms packed against 1.4-2.4 ms for ``x @ w`` (which repacks the weight on every
# call), and the LM head at 6-23 rows 2-3x less; at one row ``x @ w`` was as fast or faster, so a
# single-row product keeps it. Set to False to compare (it costs a second copy of the weights).
PREPACK = True
PACK_ROWS = 32     # the row count oneDNN is told to expect (best of 1, 32, 512 measured there)


def _prepack_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _in_out(*weights: torch.Tensor) -> torch.Tensor:
    """Stack (out, in) weights along ``out`` and return one contiguous (in, sum of outs) copy."""
    return torch.cat([w.detach() for w in weights]).t().contiguous()


class LlamaWeights:
    """The model's weights, rearranged for the batched step: fused, (in, out) projections.

    The rearranged projections and LM head are copies (about the model's size again; 0.54 GB
    for SmolLM2-135M in fp32); the embedding table and norms are shared with the model.
    """

    def __init__(self, config: LlamaConfig, embed: torch.Tensor, layers: list[LayerWeights],
                 final_norm: torch.Tensor, lm_head: torch.Tensor) -> None:
        self.config, self.embed, self.layers = config, embed, layers
        self.final_norm, self.lm_head = final_norm, lm_head
        # Rotary tables for every position: (max_position, hd); column i and i + hd/2 share a frequency.
        hd = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        angles = torch.outer(torch.arange(config.max_position, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(embed.dtype).to(embed.device)
        self.sin = angles.sin().to(embed.dtype).to(embed.device)
        # bf16 weights on a CPU without bf16 matrix units: torch's bf16 matmul there is an emulated
        # fallback (about 1 GFLOP/s on the course's AVX2 VM, against 50-60 in fp32). Each product
        # then widens its weight to fp32 first (``project``): the weights stay bf16 in memory,
        # the arithmetic is fp32's, and the result is rounded back to bf16.
        self.widen_bf16 = (embed.dtype == torch.bfloat16 and embed.device.type == "cpu"
                           and not cpu_bf16_flags())
        # id(weight) -> its oneDNN pre-packed copy (see PREPACK), made from the (out, in) layout
        self.packed: dict[int, torch.Tensor] = {}
        if PREPACK and embed.dtype == torch.float32 and embed.device.type == "cpu" and _prepack_available():
            for w in [lm_head] + [w for lw in layers for w in (lw.w_qkv, lw.w_o, lw.w_gate_up, lw.w_down)]:
                self.packed[id(w)] = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_ROWS)

    def project(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w`` for a (rows, in) activation and one of these (in, out) weights, by the fastest
        route measured here: bf16 widened to fp32 (``widen_bf16``), fp32 through the pre-packed
        copy (``packed``) for more than one row, else a plain matmul."""
        if self.widen_bf16:
            return project(x, w, widen=True)
        packed = self.packed.get(id(w))
        if packed is not None and x.shape[0] > 1:
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return x @ w

    @classmethod
    def from_hf(cls, model) -> "LlamaWeights":
        """Take the weights of a transformers ``LlamaForCausalLM``, fused and transposed to (in, out)."""
        cfg = LlamaConfig.from_hf(model.config)
        m = model.model
        layers = []
        for layer in m.layers:
            a, p = layer.self_attn, layer.mlp
            if any(getattr(x, "bias", None) is not None for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)):
                raise ValueError("attention projections with bias are not supported by this compact forward")
            layers.append(LayerWeights(
                attn_norm=layer.input_layernorm.weight.detach(),
                w_qkv=_in_out(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                w_o=_in_out(a.o_proj.weight),
                mlp_norm=layer.post_attention_layernorm.weight.detach(),
                w_gate_up=_in_out(p.gate_proj.weight, p.up_proj.weight),
                w_down=_in_out(p.down_proj.weight)))
        return cls(cfg, m.embed_tokens.weight.detach(), layers, m.norm.weight.detach(),
                   _in_out(model.lm_head.weight))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def num_bytes(self) -> int:
        """Bytes a forward pass reads: every layer's weights, the final norm and the LM head.
        (The embedding table is only indexed, a few rows per step; here it is the LM head too.)"""
        tensors = [self.final_norm, self.lm_head]
        for lw in self.layers:
            tensors += [lw.attn_norm, lw.w_qkv, lw.w_o, lw.mlp_norm, lw.w_gate_up, lw.w_down]
        return sum(t.numel() * t.element_size() for t in tensors)

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        c = self.config
        if max_seq_len > c.max_position:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's context length {c.max_position}")
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, num_slots, max_seq_len,
                       self.dtype, str(self.device))


    def new_paged_kv_cache(self, num_blocks: int, block_size: int = 16, max_seq_len: int | None = None,
                           enable_prefix_caching: bool = False, reserve_blocks: int = 0) -> PagedKVCache:
        c = self.config
        max_seq_len = c.max_position if max_seq_len is None else max_seq_len
        if max_seq_len > c.max_position:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's context length {c.max_position}")
        return PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, num_blocks, block_size, max_seq_len,
                            self.dtype, str(self.device), enable_prefix_caching, reserve_blocks)


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a step: ``token_ids`` go to positions ``start, start+1, ...``
    in KV slot ``slot``; ``want_logits`` asks for the next-token logits after its last token."""

    slot: int
    start: int
    token_ids: list[int]
    want_logits: bool


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (one fused op)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def project(x: torch.Tensor, w: torch.Tensor, widen: bool = False) -> torch.Tensor:
    """``x @ w`` for a (rows, in) activation and an (in, out) weight. ``widen``: compute in fp32
    and round the result back to ``x``'s dtype (see ``LlamaWeights.widen_bf16``)."""
    if widen:
        return (x.float() @ w.float()).to(x.dtype)
    return x @ w


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + hd/2) pair of ``x`` (T, heads, hd) by its position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _StepLayout:
    """Index tensors for one step, computed once and shared by all layers."""

    def __init__(self, chunks: list[SeqChunk], cache: KVCache, config: LlamaConfig, device) -> None:
        if not chunks:
            raise ValueError("a step needs at least one sequence chunk; got none")
        ids, positions, slots = [], [], []
        self.single: list[tuple[int, SeqChunk]] = []   # (row, chunk): chunks of exactly 1 token
        self.multi: list[tuple[int, SeqChunk]] = []    # (first row, chunk): prompt chunks of > 1 token
        logit_rows, seen_slots = [], set()
        row = 0
        for c in chunks:
            n = len(c.token_ids)
            if n == 0:
                raise ValueError(f"chunk for slot {c.slot} has no tokens; each chunk needs at least 1")
            if c.slot in seen_slots:
                raise ValueError(f"slot {c.slot} appears twice in one step")
            if not 0 <= c.slot < cache.num_slots:
                raise ValueError(f"slot={c.slot} is outside the cache's slots 0..{cache.num_slots - 1}")
            seen_slots.add(c.slot)
            end = c.start + n
            if c.start < 0 or end > cache.max_seq_len or end > config.max_position:
                raise ValueError(
                    f"slot {c.slot}: positions {c.start}..{end - 1} go past the limit of "
                    f"{min(cache.max_seq_len, config.max_position)} tokens (KV slot length "
                    f"{cache.max_seq_len}, model context {config.max_position})")
            bad = [t for t in c.token_ids if not 0 <= t < config.vocab_size]
            if bad:
                raise ValueError(f"slot {c.slot}: token id {bad[0]} is outside the vocabulary "
                                 f"0..{config.vocab_size - 1}")
            ids += c.token_ids
            positions += range(c.start, end)
            slots += [c.slot] * n
            (self.single if n == 1 else self.multi).append((row, c))
            if c.want_logits:
                logit_rows.append(row + n - 1)
            row += n
        self.num_tokens = row
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)            # (T,)
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)  # (T,)
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)          # (T,)
        self.logit_rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        # Single-token chunks attend together in one call over slots [0, span): their queries are
        # scattered into slot order, and a mask keeps each one to its own past (positions ≤ start).
        if self.single:
            single_slots = [c.slot for _, c in self.single]
            self.span = max(single_slots) + 1
            self.max_ctx = max(c.start for _, c in self.single) + 1
            self.single_rows = torch.tensor([r for r, _ in self.single], dtype=torch.long, device=device)
            self.single_slots = torch.tensor(single_slots, dtype=torch.long, device=device)
            lengths = torch.ones(self.span, dtype=torch.long, device=device)  # unused slots see 1 key
            lengths[self.single_slots] = torch.tensor([c.start + 1 for _, c in self.single], device=device)
            ctx = torch.arange(self.max_ctx, device=device)
            self.single_mask = (ctx[None, :] < lengths[:, None])[:, None, None, :]  # (span, 1, 1, ctx)
            # Common case: single-token chunks come first, in slot order 0, 1, 2, ... → no scatter.
            n = len(self.single)
            self.single_dense = ([r for r, _ in self.single] == list(range(n))
                                 and single_slots == list(range(n)))


def _slot_attention(q: torch.Tensor, kv_new: torch.Tensor, kv_cache: torch.Tensor,
                    lay: _StepLayout) -> torch.Tensor:
    """One layer's attention on the slot cache: write the step's keys/values into each sequence's
    slot, then attend each token to its slot's past, read as a plain view.

    ``q``: (T, H, hd); ``kv_new``: (T, 2, KV, hd); ``kv_cache``: (slots, 2, KV, max_len, hd).
    Returns (T, H, hd).
    """
    T, H, hd = q.shape
    kv_cache[lay.slots, :, :, lay.positions] = kv_new          # write this step's keys/values
    k_cache, v_cache = kv_cache[:, 0], kv_cache[:, 1]          # (slots, KV, max_len, hd) views

    attn = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    if lay.single:
        # One query per slot: (span, H, 1, hd) against each slot's past (span, KV, ctx, hd).
        if lay.single_dense:
            qs = q[:lay.span].unsqueeze(2)
        else:
            qs = q.new_zeros(lay.span, H, 1, hd)
            qs[lay.single_slots] = q[lay.single_rows].unsqueeze(2)
        out = F.scaled_dot_product_attention(
            qs, k_cache[:lay.span, :, :lay.max_ctx], v_cache[:lay.span, :, :lay.max_ctx],
            attn_mask=lay.single_mask, enable_gqa=True)
        if lay.single_dense:
            attn[:lay.span] = out[:, :, 0]
        else:
            attn[lay.single_rows] = out[lay.single_slots, :, 0]
    for row, c in lay.multi:
        n, end = len(c.token_ids), c.start + len(c.token_ids)
        qc = q[row:row + n].transpose(0, 1).unsqueeze(0)       # (1, H, n, hd)
        kc = k_cache[c.slot:c.slot + 1, :, :end]               # (1, KV, end, hd): cached + new
        vc = v_cache[c.slot:c.slot + 1, :, :end]
        if c.start == 0:
            out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)
        else:  # a later prompt chunk: query i sees keys 0 .. start + i
            mask = (torch.arange(end, device=q.device)[None, :]
                    <= torch.arange(c.start, end, device=q.device)[:, None])
            out = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, enable_gqa=True)
        attn[row:row + n] = out[0].transpose(0, 1)
    return attn


@torch.inference_mode()
def forward_step(weights: LlamaWeights, cache: KVCache | PagedKVCache,
                 chunks: list[SeqChunk] | list[PagedSeqChunk]) -> torch.Tensor:
    """Run one mixed step; write every token's K/V into ``cache``; return logits (S, V) for the
    chunks with ``want_logits``, in the order they were given.

    On the slot cache (``KVCache``) the chunks are ``SeqChunk``s and each sequence's past is its
    slot; on a ``PagedKVCache`` they are ``PagedSeqChunk``s and each sequence's past is read
    through its block table (``paged_kv_cache.paged_attention``). Everything else is the same.
    """
    cfg = weights.config
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    paged = isinstance(cache, PagedKVCache)
    lay = (PagedStepLayout if paged else _StepLayout)(chunks, cache, cfg, weights.device)
    attention = paged_attention if paged else _slot_attention
    T = lay.num_tokens
    cos = weights.cos[lay.positions][:, None, :]                  # (T, 1, hd)
    sin = weights.sin[lay.positions][:, None, :]

    mm = weights.project                                           # x @ w, by the fastest route here
    x = weights.embed[lay.ids]                                     # (T, D)
    for li, lw in enumerate(weights.layers):
        h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
        qkv = mm(h, lw.w_qkv).view(T, H + 2 * KV, hd)              # (T, H + 2KV, hd)
        qk = apply_rope(qkv[:, :H + KV], cos, sin)                 # rotate q and k heads at once
        q = qk[:, :H]                                              # (T, H, hd)
        kv_new = torch.stack([qk[:, H:], qkv[:, H + KV:]], dim=1)  # (T, 2, KV, hd): keys, values
        attn = attention(q, kv_new, cache.kv[li], lay)             # (T, H, hd)
        x = x + mm(attn.view(T, H * hd), lw.w_o)

        h = rms_norm(x, lw.mlp_norm, cfg.rms_eps)
        gate, up = mm(h, lw.w_gate_up).chunk(2, dim=-1)           # (T, I) each
        x = x + mm(F.silu(gate) * up, lw.w_down)

    last = rms_norm(x[lay.logit_rows], weights.final_norm, cfg.rms_eps)   # (S, D)
    return mm(last, weights.lm_head)                                      # (S, V)
