"""A whole step's time from measured kernels (the grounded GPU presets).

For a step of ``num_seqs`` sequences, ``num_tokens`` tokens and ``attention_pairs`` query-key
pairs on one GPU::

    t = num_layers * (projections(T) + small_ops(T) + attention)   # every decoder layer
      + lm_head(num_seqs)                                          # logits at each sequence's last token
      + embedding(T) + final_norm(T)

Projections and small operators are ``KernelModel``'s, fitted to measured kernel times.
Attention is not in those measurements: each layer's attention is one kernel moving its share
of the KV cache the step reads (``keys_read`` keys and values, as the roofline counts them) and
doing its share of the q·k and p·v FLOPs, at the bandwidth and compute fractions (and the fixed
cost) the matrix multiplies were measured to reach. That is an assumption: a fused attention
kernel streaming the KV cache is taken to reach what a weight-streaming matrix multiply reaches.
The LM head runs for one row per sequence, as vLLM computes logits only where it samples. The
per-step overhead is added by ``RooflineCostModel``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchlab.backends.kernels import KernelModel
from batchlab.shapes import ModelShape


@dataclass(frozen=True)
class GroundedStep:
    """Seconds for one step of ``shape`` on one GPU whose kernels ``kernels`` describes."""

    shape: ModelShape
    kernels: KernelModel
    _layers_by_tokens: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def layers_seconds(self, num_tokens: int) -> float:
        """Every layer's projections and small operators (remembered per token count)."""
        seconds = self._layers_by_tokens.get(num_tokens)
        if seconds is None:
            seconds = self.shape.num_layers * float(self.kernels.layer_seconds(self.shape.layer, num_tokens))
            self._layers_by_tokens[num_tokens] = seconds
        return seconds

    def attention_seconds(self, keys_read: float, attention_pairs: int) -> float:
        """Every layer's attention: one kernel per layer over its share of the KV read and FLOPs."""
        layers = self.shape.num_layers
        kv_bytes = keys_read * self.shape.kv_bytes_per_token(self.kernels.dtype_bytes) / layers
        flops = attention_pairs * self.shape.attention_flops_per_pair / layers
        return layers * float(self.kernels.kernel_seconds(kv_bytes, flops))

    def edges_seconds(self, num_seqs: int, num_tokens: int) -> float:
        """The LM head for one row per sequence, the embedding lookup and the final norm."""
        h = self.shape.hidden_size
        head = self.kernels.matmul_seconds(h, self.shape.vocab_size, num_seqs)
        return float(head + self.kernels.small_ops_seconds(2, 4 * num_tokens * h))

    def seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int, keys_read: float) -> float:
        """The step without the per-step overhead."""
        return (self.layers_seconds(num_tokens) + self.attention_seconds(keys_read, attention_pairs)
                + self.edges_seconds(num_seqs, num_tokens))
