"""A compact Llama forward pass that runs one *mixed* batched step.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchlab.model.cpu_products import StepProducts
from batchlab.model.kv_cache import KVCache, SeqChunk
from batchlab.model.paged_kv_cache import PagedKVCache, PagedSeqChunk

__all__ = ["LlamaConfig", "LayerWeights", "LlamaWeights", "SeqChunk", "PagedSeqChunk",
           "forward_step", "rms_norm", "apply_rope", "project"]


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
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        return cls(config.vocab_size, config.hidden_size, config.intermediate_size,
                   config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                   head_dim, float(theta), float(config.rms_norm_eps),
                   config.max_position_embeddings)


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
        # Rotary tables for every position: (max_position, hd); column i and i + hd/2 share a
        # frequency.
        hd = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        angles = torch.outer(torch.arange(config.max_position, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(embed.dtype).to(embed.device)
        self.sin = angles.sin().to(embed.dtype).to(embed.device)
        # Every projection goes through ``products``, which picks each product's route on a CPU
        # (``batchlab.model.cpu_products``): bf16 weights on a CPU without bf16 matrix units are
        # multiplied through an fp32 copy of each, made once (torch's bf16 matmul there is an
        # emulated fallback, about 1 GFLOP/s on the course's AVX2 VM against 50-60 in fp32): the
        # values are the bf16 weights' and the arithmetic is fp32's; otherwise each weight's oneDNN
        # packed copy is used.
        self.products = StepProducts([lm_head] + [w for lw in layers
                                                  for w in (lw.w_qkv, lw.w_o, lw.w_gate_up,
                                                            lw.w_down)],
                                     embed.dtype, embed.device)

    @property
    def widen_bf16(self) -> bool:
        """Whether bf16 products are computed in fp32 (a CPU without bf16 units)."""
        return self.products.widen

    @widen_bf16.setter
    def widen_bf16(self, widen: bool) -> None:
        self.products.widen = widen

    def project(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w`` for a (rows, in) activation and one of these (in, out) weights
        (``products``)."""
        return self.products(x, w)

    @classmethod
    def from_hf(cls, model) -> "LlamaWeights":
        """Take the weights of a transformers ``LlamaForCausalLM``, fused and transposed to
        (in, out)."""
        cfg = LlamaConfig.from_hf(model.config)
        m = model.model
        layers = []
        for layer in m.layers:
            a, p = layer.self_attn, layer.mlp
            if any(getattr(x, "bias", None) is not None
                   for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)):
                raise ValueError("attention projections with bias are not supported by this "
                                 "compact forward")
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
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's context length "
                             f"{c.max_position}")
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, num_slots, max_seq_len,
                       self.dtype, str(self.device))


    def new_paged_kv_cache(self, num_blocks: int, block_size: int = 16,
                           max_seq_len: int | None = None, enable_prefix_caching: bool = False,
                           reserve_blocks: int = 0) -> PagedKVCache:
        c = self.config
        max_seq_len = c.max_position if max_seq_len is None else max_seq_len
        if max_seq_len > c.max_position:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's context length "
                             f"{c.max_position}")
        return PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, num_blocks, block_size,
                            max_seq_len,
                            self.dtype, str(self.device), enable_prefix_caching, reserve_blocks)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (one fused op)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + hd/2) pair of ``x`` (T, heads, hd) by its position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@torch.inference_mode()
def forward_step(weights: LlamaWeights, cache: KVCache | PagedKVCache,
                 chunks: list[SeqChunk] | list[PagedSeqChunk],
                 exit_layer: int | None = None) -> torch.Tensor:
    """Run one mixed step; write every token's K/V into ``cache``; return logits (S, V) for the
    chunks with ``want_logits``, in the order they were given (``num_logits`` rows for a chunk
    that asks for more than its last: a speculative draft's check).

    ``exit_layer``: run only the first ``exit_layer`` layers (writing only their K/V), then the
    final norm and LM head: an early exit, the self-draft of ``batchlab.model.early_exit``.

    On the slot cache (``KVCache``) the chunks are ``SeqChunk``s and each sequence's past is its
    slot; on a ``PagedKVCache`` they are ``PagedSeqChunk``s and each sequence's past is read
    through its block table. The cache builds the step's layout and reads its own past
    (``cache.step_layout``, ``cache.attention``); everything else is the same.
    """
    cfg = weights.config
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    lay = cache.step_layout(chunks, cfg, weights.device)
    T = lay.num_tokens
    cos = weights.cos[lay.positions][:, None, :]                  # (T, 1, hd)
    sin = weights.sin[lay.positions][:, None, :]

    # x @ w, by the fastest route here
    mm = weights.project
    x = weights.embed[lay.ids]                                     # (T, D)
    for li, lw in enumerate(weights.layers[:exit_layer]):
        h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
        qkv = mm(h, lw.w_qkv).view(T, H + 2 * KV, hd)              # (T, H + 2KV, hd)
        qk = apply_rope(qkv[:, :H + KV], cos, sin)                 # rotate q and k heads at once
        q = qk[:, :H]                                              # (T, H, hd)
        kv_new = torch.stack([qk[:, H:], qkv[:, H + KV:]], dim=1)  # (T, 2, KV, hd): keys, values
        attn = cache.attention(q, kv_new, li, lay)                 # (T, H, hd)
        x = x + mm(attn.view(T, H * hd), lw.w_o)

        h = rms_norm(x, lw.mlp_norm, cfg.rms_eps)
        gate, up = mm(h, lw.w_gate_up).chunk(2, dim=-1)           # (T, I) each
        x = x + mm(F.silu(gate) * up, lw.w_down)

    last = rms_norm(x[lay.logit_rows], weights.final_norm, cfg.rms_eps)   # (S, D)
    return mm(last, weights.lm_head)                                      # (S, V)
