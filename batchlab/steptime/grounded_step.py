"""A whole step's time from measured kernels (the grounded GPU presets), on one GPU or split over
several.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from batchlab.steptime.kernels import KernelModel
from batchlab.checks import check_int
from batchlab.shapes import ModelShape

ALL_REDUCES_PER_LAYER = 2     # attention's output projection and the MLP's down projection
QUERY_TILE = 128              # query tokens that share one read of a sequence's keys


@dataclass(frozen=True)
class GroundedStep:
    """Seconds for one step of ``shape`` on each of ``tensor_parallel`` GPUs whose kernels
    ``kernels`` describes; ``all_reduce(num_bytes)`` prices one all-reduce among them."""

    shape: ModelShape
    kernels: KernelModel
    tensor_parallel: int = 1
    all_reduce: Callable[[float], float] | None = None
    _layers_by_tokens: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _edges: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("tensor_parallel", self.tensor_parallel)
        self.shape.layer.check_tensor_parallel(self.tensor_parallel)
        if self.tensor_parallel > 1 and self.all_reduce is None:
            raise ValueError(f"tensor_parallel={self.tensor_parallel} needs all_reduce (seconds "
                             "for an all-reduce of N bytes, e.g. collectives.AllReduceModel)")

    def all_reduce_seconds(self, num_tokens: int) -> float:
        """One all-reduce of the hidden states of ``num_tokens`` tokens (0 on one GPU)."""
        if self.tensor_parallel == 1:
            return 0.0
        return float(self.all_reduce(num_tokens * self.shape.hidden_size
                                     * self.kernels.dtype_bytes))

    def layers_seconds(self, num_tokens: int) -> float:
        """Every layer's projections, small operators and all-reduces (remembered per token
        count)."""
        seconds = self._layers_by_tokens.get(num_tokens)
        if seconds is None:
            layer = float(self.kernels.layer_seconds(self.shape.layer, num_tokens,
                                                     self.tensor_parallel))
            layer += ALL_REDUCES_PER_LAYER * self.all_reduce_seconds(num_tokens)
            seconds = self._layers_by_tokens[num_tokens] = self.shape.num_layers * layer
        return seconds

    def attention_seconds(self, keys_read: float, attention_pairs: int) -> float:
        """Every layer's attention: one kernel per layer over its share of the KV read and FLOPs."""
        split = self.shape.num_layers * self.tensor_parallel
        kv_bytes = keys_read * self.shape.kv_bytes_per_token(self.kernels.dtype_bytes) / split
        flops = attention_pairs * self.shape.attention_flops_per_pair / split
        return self.shape.num_layers * float(self.kernels.kernel_seconds(kv_bytes, flops))

    def step_attention_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int,
                               split: tuple[int, int] | None = None) -> float:
        """Every layer's attention for a step's totals: each sequence's keys read once per tile of
        ``QUERY_TILE`` query tokens (``split``, which sequences decode, is not used)."""
        keys = attention_pairs / min(QUERY_TILE, max(1.0, num_tokens / num_seqs))
        return self.attention_seconds(keys, attention_pairs)

    def edges_seconds(self, num_seqs: int, num_tokens: int) -> float:
        """The LM head for one row per sequence, the embedding lookup and the final norm
        (remembered per sequence and token count)."""
        seconds = self._edges.get((num_seqs, num_tokens))
        if seconds is None:
            h = self.shape.hidden_size
            head = self.kernels.matmul_seconds(h, -(-self.shape.vocab_size // self.tensor_parallel),
                                               num_seqs)
            seconds = self._edges[num_seqs, num_tokens] = float(
                head + self.kernels.small_ops_seconds(2, 4 * num_tokens * h)
                + self.all_reduce_seconds(num_tokens))
        return seconds

    def seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int,
                keys_read: float) -> float:
        """The step without the per-step overhead."""
        return (self.layers_seconds(num_tokens) + self.attention_seconds(keys_read, attention_pairs)
                + self.edges_seconds(num_seqs, num_tokens))
