"""A whole step's kernels from measured vLLM kernels (``measured_kernels.KernelTables``), on one GPU
or split over a tensor-parallel group.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchlab.steptime.kernels import KernelModel
from batchlab.steptime.attention_fit import guess_split
from batchlab.steptime.measured_kernels import KernelTables
from batchlab.checks import check_int, fail
from batchlab.shapes import SMALL_OPS_PER_LAYER, ModelShape

ALL_REDUCES_PER_LAYER = 2


@dataclass(frozen=True)
class MeasuredStep:
    """Seconds of a step's kernels for ``shape`` on ``tensor_parallel`` GPUs (module docstring)."""

    shape: ModelShape
    tables: KernelTables
    small_ops: KernelModel
    tensor_parallel: int = 1
    largest_graph: int = 0
    expert_parallel: bool = False
    _layers: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _edges: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("tensor_parallel", self.tensor_parallel)
        check_int("largest_graph", self.largest_graph, minimum=0)
        self.shape.layer.check_tensor_parallel(self.tensor_parallel)
        if self.expert_parallel and self.shape.moe is None:
            fail("enable_expert_parallel", True, "False for a dense model",
                 f"{self.shape.name} has no experts")
        tp, layer = self.tensor_parallel, self.shape.layer
        fit = self.tables.attention(layer.num_heads // tp, layer.kv_heads_per_gpu(tp),
                                    layer.head_dim)
        object.__setattr__(self, "_attention", fit)
        self.mlp_seconds(1)             # an MoE layer nobody measured is refused here, not mid-run

    @property
    def attention_fit(self):
        return self._attention

    def all_reduce_seconds(self, num_tokens: int) -> float:
        if self.tensor_parallel == 1:
            return 0.0
        graph = num_tokens <= self.largest_graph
        return self.tables.all_reduce_seconds(num_tokens * self.shape.hidden_size
                                              * self.small_ops.dtype_bytes,
                                              self.tensor_parallel, graph)

    def mlp_seconds(self, num_tokens: int) -> float:
        """The MLP of one layer: two GEMMs, or the fused MoE layer."""
        moe, tp, h = self.shape.moe, self.tensor_parallel, self.shape.hidden_size
        if moe is None:
            (_, _), (_, _), (k_up, n_up), (k_down, n_down) = self.shape.layer.projections(tp)
            return (self.tables.gemm_seconds(num_tokens, n_up, k_up)
                    + self.tables.gemm_seconds(num_tokens, n_down, k_down))
        ep = tp if self.expert_parallel else 1
        return self.tables.moe_seconds(num_tokens, h, moe.intermediate_size, moe.experts_per_token,
                                       moe.num_experts, tp // ep, ep)

    def layers_seconds(self, num_tokens: int) -> float:
        """Every layer without its attention (remembered per token count)."""
        seconds = self._layers.get(num_tokens)
        if seconds is None:
            (k_qkv, n_qkv), (k_o, n_o), _, _ = self.shape.layer.projections(self.tensor_parallel)
            t = (self.tables.gemm_seconds(num_tokens, n_qkv, k_qkv)
                 + self.tables.gemm_seconds(num_tokens, n_o, k_o))
            t += (self.mlp_seconds(num_tokens)
                  + ALL_REDUCES_PER_LAYER * self.all_reduce_seconds(num_tokens))
            elements = num_tokens * self.shape.layer.small_op_elements(self.tensor_parallel)
            t += float(self.small_ops.small_ops_seconds(SMALL_OPS_PER_LAYER, elements))
            seconds = self._layers[num_tokens] = self.shape.num_layers * t
        return seconds

    def step_attention_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int,
                               split: tuple[int, int] | None = None) -> float:
        """Every layer's attention (``AttentionFit.seconds``); ``split`` is ``(decode_seqs,
        decode_pairs)``, guessed from the totals when not given (``guess_split``)."""
        split = split or guess_split(num_seqs, num_tokens, attention_pairs)
        return self.shape.num_layers * self._attention.seconds(num_seqs, num_tokens,
                                                               attention_pairs, *split)

    def edges_seconds(self, num_rows: int, num_tokens: int) -> float:
        """The LM head for one row per sequence over 1/tp of the vocabulary, the embedding lookup
        and final norm, and the embedding's all-reduce (remembered)."""
        seconds = self._edges.get((num_rows, num_tokens))
        if seconds is None:
            h = self.shape.hidden_size
            head = self.tables.gemm_seconds(num_rows,
                                            -(-self.shape.vocab_size // self.tensor_parallel), h)
            seconds = self._edges[num_rows, num_tokens] = float(
                head + self.small_ops.small_ops_seconds(2, 4 * num_tokens * h)
                + self.all_reduce_seconds(num_tokens))
        return seconds


__all__ = ["MeasuredStep"]
