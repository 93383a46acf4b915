"""What one step's index tensors and attention share, whatever the KV cache keeps its past in.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchlab.model.cpu_products import cpu_has_bf16_units


class StepLayout:
    """Index tensors for one step, computed once and shared by all layers.

    A subclass names a chunk in errors (``describe``), says how far its positions may go
    (``position_limit``) and checks anything else about it (``check``).
    """

    def __init__(self, chunks: list, config, device) -> None:
        if not chunks:
            raise ValueError("a step needs at least one sequence chunk; got none")
        ids, positions, logit_rows = [], [], []
        self.single: list[tuple[int, object]] = []   # (row, chunk): chunks of exactly 1 token
        # (first row, chunk): prompt chunks of > 1 token
        self.multi: list[tuple[int, object]] = []
        row = 0
        for c in chunks:
            n, end = len(c.token_ids), c.start + len(c.token_ids)
            if n == 0:
                raise ValueError(f"{self.describe(c)} has no tokens; each chunk needs at least 1")
            self.check(c)
            limit, why = self.position_limit(c)
            if c.start < 0 or end > min(limit, config.max_position):
                raise ValueError(f"{self.describe(c)}: positions {c.start}..{end - 1} go past the "
                                 f"limit of {min(limit, config.max_position)} tokens ({why}, model "
                                 f"context {config.max_position})")
            bad = [t for t in c.token_ids if not 0 <= t < config.vocab_size]
            if bad:
                raise ValueError(f"{self.describe(c)}: token id {bad[0]} is outside the vocabulary "
                                 f"0..{config.vocab_size - 1}")
            ids += c.token_ids
            positions += range(c.start, end)
            (self.single if n == 1 else self.multi).append((row, c))
            if c.want_logits:              # the last row, or the last num_logits (a draft's check)
                if not 1 <= c.num_logits <= n:
                    raise ValueError(f"{self.describe(c)}: num_logits={c.num_logits}; "
                                     f"must be in 1..{n}, the chunk's tokens")
                logit_rows += range(row + n - c.num_logits, row + n)
            row += n
        self.num_tokens = row
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)              # (T,)
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)  # (T,)
        self.logit_rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        rows = [r for r, _ in self.single]
        self.single_rows = torch.tensor(rows, dtype=torch.long, device=device)
        # decodes first, as schedulers plan them
        self.singles_first = rows == list(range(len(rows)))

    def describe(self, chunk) -> str:
        raise NotImplementedError

    def position_limit(self, chunk) -> tuple[int, str]:
        """The positions a chunk may reach in the cache, and why."""
        raise NotImplementedError

    def check(self, chunk) -> None:
        """Anything else a cache requires of a chunk."""


# One more attention call costs about as much as this many padded key positions saved (see
# ``context_groups``); measured in ``benchmarks/bench_paged.py``'s mixed-length decodes.
GROUP_CALL_KEYS = 512
MAX_CONTEXT_GROUPS = 4


def context_groups(lengths: list[int], call_keys: int | None = None) -> list[list[int]]:
    """Split single-token chunks, by their context ``lengths``, into groups that attend in separate
    calls, each padded only to its own longest context (not the step's): indices into ``lengths``
    (in order within a group), the longest group first. A group is split where that saves more
    than ``call_keys`` (default ``GROUP_CALL_KEYS``) padded key positions (sequences x positions),
    into at most ``MAX_CONTEXT_GROUPS`` groups. Padding is masked, so a group changes a sequence's
    attention only by rounding (the kernel's blocking follows the padded length), as any change
    of the batch's longest context does."""
    call_keys = GROUP_CALL_KEYS if call_keys is None else call_keys
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, rest = [], order
    while len(groups) < MAX_CONTEXT_GROUPS - 1 and len(rest) > 1:
        longest = lengths[rest[0]]
        saved, j = max(((len(rest) - j) * (longest - lengths[rest[j]]), j)
                       for j in range(1, len(rest)))
        if saved <= call_keys:
            break
        groups.append(rest[:j])
        rest = rest[j:]
    return [sorted(g) for g in groups + [rest] if g]


def decode_attention(qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Single-token chunks attend together: ``qs`` (S, H, 1, hd) against each one's past ``k``,
    ``v`` (S, KV, ctx, hd), ``mask`` (S, 1, 1, ctx) keeping each to its own length. (S, H, hd).

    torch's fused attention, except for bf16/fp16 on a CPU: there, with a mask, it took 2.8 ms
    for 32 sequences of 160 positions (SmolLM2's 9 query and 3 key/value heads), 4.8x its fp32
    time, and half of a bf16 decode step; ``grouped_attention`` took 0.37 ms (2026-12-02, the
    course's 2-core AMD EPYC with AVX-512 bf16, torch 2.13). On a CPU without bf16 units its bf16
    products are emulated, so they are computed in fp32 and rounded back, as the step's weight
    products are (``cpu_products``): 32 sequences of 400 positions took 1.75 ms a layer that way
    against 8.7 ms emulated (and 7.5 ms fused), on the course's AVX2 VM (2026-12-07)."""
    if qs.device.type == "cpu" and qs.dtype in (torch.bfloat16, torch.float16):
        widen = qs.dtype == torch.bfloat16 and not cpu_has_bf16_units()
        return grouped_attention(qs[:, :, 0], k, v, mask, widen=widen)
    return F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, enable_gqa=True)[:, :, 0]


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      widen: bool = False) -> torch.Tensor:
    """Attention written out for one query per sequence: ``q`` (S, H, hd), ``k``/``v`` (S, KV, ctx,
    hd), ``mask`` (S, 1, 1, ctx). Each key/value head serves a group of H/KV query heads (query
    head h reads key/value head h // (H/KV), as ``enable_gqa``), so the scores are one batched
    matmul per sequence without copying K and V per query head; softmax in fp32. ``widen``: both
    products in fp32, each result rounded back to ``q``'s dtype. (S, H, hd)."""
    S, H, hd = q.shape
    KV, dtype = k.shape[1], q.dtype
    if widen:
        q, k, v = q.float(), k.float(), v.float()
    qg = q.reshape(S, KV, H // KV, hd)                              # (S, KV, G, hd)
    # (k made contiguous first: bf16 matmul against a strided, transposed cache view took 340 us,
    # the copy plus the contiguous product 150 us; 32 sequences of 160 positions, 2026-12-02)
    # (S, KV, G, ctx)
    scores = (qg @ k.contiguous().transpose(-1, -2)).to(dtype).float() * hd ** -0.5
    scores.masked_fill_(~mask.view(S, 1, 1, -1), float("-inf"))
    # rounded to the dtype, widened again
    probs = torch.softmax(scores, dim=-1).to(dtype).to(v.dtype)
    return (probs @ v).to(dtype).reshape(S, H, hd)                  # (S, KV, G, hd) -> (S, H, hd)


def chunk_attention(qc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One chunk of ``n`` tokens attends causally to its sequence's past and itself: ``qc``
    (n, H, hd), ``k``/``v`` (1, KV, end, hd) with the chunk's own keys last. Returns (n, H, hd)."""
    n, end = qc.shape[0], k.shape[2]
    q = qc.transpose(0, 1).unsqueeze(0)                    # (1, H, n, hd)
    start = end - n
    if start == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:  # a later chunk (or one after a prefix hit): query i sees keys 0 .. start + i
        mask = (torch.arange(end, device=q.device)[None, :]
                <= torch.arange(start, end, device=q.device)[:, None])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def place_decodes(attn: torch.Tensor, out: torch.Tensor, lay: StepLayout) -> None:
    """Write the single-token chunks' attention ``out`` (S, H, hd) into their rows of ``attn``."""
    if lay.singles_first:
        attn[:out.shape[0]] = out
    else:
        attn[lay.single_rows] = out
