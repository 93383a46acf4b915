"""The sizes of a Llama-style decoder that decide its bytes and FLOPs per step.

``LayerShape`` is one decoder layer: its four matrix multiplies (the fused q, k, v projection,
the o projection, the MLP's fused gate and up projection, its down projection), each as the
(input, output) sizes one GPU holds when the layer is split over ``tensor_parallel`` GPUs
(Megatron's way: q/k/v/gate/up by output columns, o/down by input rows), and the bytes its small
element-wise operators move per token. ``ModelShape`` is the whole model: layers of one
``LayerShape``, the LM head, and the KV cache's bytes per token. ``MODEL_SHAPES`` holds
SmolLM2-135M, Llama-2-7B and Llama-3-8B, each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_bool, check_int


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's sizes (a gated MLP is Llama's: gate and up projections, then down)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            check_int(name, getattr(self, name))
        check_bool("gated_mlp", self.gated_mlp)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads}; must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")

    def __str__(self) -> str:
        return (f"hidden {self.hidden_size}, {self.num_heads} heads of {self.head_dim} ({self.num_kv_heads} KV), "
                f"MLP {self.intermediate_size}{' gated' if self.gated_mlp else ''}")

    def check_tensor_parallel(self, tensor_parallel: int) -> None:
        """``tensor_parallel`` GPUs can split this layer: it divides the heads and the MLP."""
        check_int("tensor_parallel", tensor_parallel)
        sizes = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                 "intermediate_size": self.intermediate_size}
        if any(size % tensor_parallel for size in sizes.values()):
            raise ValueError(f"tensor_parallel={tensor_parallel}; must divide "
                             + ", ".join(f"{k}={v}" for k, v in sizes.items()))

    def projections(self, tensor_parallel: int = 1) -> tuple[tuple[int, int], ...]:
        """(input, output) sizes of the four matrix multiplies one GPU runs: qkv, o, up, down."""
        self.check_tensor_parallel(tensor_parallel)
        h, tp = self.hidden_size, tensor_parallel
        q, kv = self.num_heads * self.head_dim // tp, self.num_kv_heads * self.head_dim // tp
        inter = self.intermediate_size // tp
        up = 2 * inter if self.gated_mlp else inter
        return (h, q + 2 * kv), (q, h), (h, up), (inter, h)

    @property
    def matmul_params(self) -> int:
        """Weights of the layer's four matrix multiplies."""
        return sum(k * n for k, n in self.projections())

    def small_op_elements(self, tensor_parallel: int = 1) -> int:
        """Elements read and written per token by the small operators on one GPU: two RMS norms
        (read and write the hidden state), rope (q and k in place), the activation (gate and up in,
        one out; plain MLP: one in, one out) and the residual add (two in, one out)."""
        self.check_tensor_parallel(tensor_parallel)
        h, tp = self.hidden_size, tensor_parallel
        q, kv = self.num_heads * self.head_dim // tp, self.num_kv_heads * self.head_dim // tp
        act = (3 if self.gated_mlp else 2) * self.intermediate_size // tp
        return 2 * (2 * h) + 2 * (q + kv) + act + 3 * h


SMALL_OPS_PER_LAYER = 5   # input norm, post-attention norm, rope, activation, residual add


@dataclass(frozen=True)
class ModelShape:
    """A whole decoder: ``num_layers`` layers, the LM head, the embedding, and a source."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    source: str

    def __post_init__(self) -> None:
        check_int("num_layers", self.num_layers, hint=f"model shape {self.name!r}")
        check_int("vocab_size", self.vocab_size, hint=f"model shape {self.name!r}")
        object.__setattr__(self, "_layer", LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads,
                                                      self.head_dim, self.intermediate_size))
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source={self.source!r}; must say where the sizes of {self.name!r} come from")

    @property
    def layer(self) -> LayerShape:
        return self._layer

    @property
    def matmul_params(self) -> int:
        """Weights of every matrix multiply: per layer q, k, v, o and the MLP's three; the LM head.

        The embedding lookup reads only a few rows, so it is left out (with tied embeddings the
        LM head *is* the embedding table, read once).
        """
        return self.num_layers * self.layer.matmul_params + self.hidden_size * self.vocab_size

    @property
    def num_params(self) -> int:
        """All parameters as usually counted (adds the embedding table when it is not tied; norms)."""
        norms = (2 * self.num_layers + 1) * self.hidden_size
        embed = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.matmul_params + embed + norms

    def weight_bytes(self, dtype_bytes: int) -> int:
        return self.matmul_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """A key and a value per KV head per layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        """q·k and p·v for one query-key pair: 2 multiply-adds of ``head_dim`` per query head per layer."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @classmethod
    def from_llama_config(cls, config, name: str, source: str) -> "ModelShape":
        """From ``batchlab.model.llama.LlamaConfig`` (e.g. ``weights.config`` of the loaded model)."""
        return cls(name, config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
                   config.head_dim, config.intermediate_size, config.vocab_size, True, source)


MODEL_SHAPES: dict[str, ModelShape] = {
    "SmolLM2-135M": ModelShape(
        "SmolLM2-135M", num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
        intermediate_size=1536, vocab_size=49152, tie_embeddings=True,
        source="HuggingFaceTB/SmolLM2-135M-Instruct config.json; the same as the course's loaded "
               "model's config (tests/test_roofline.py checks it)"),
    "Llama-2-7B": ModelShape(
        "Llama-2-7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
        intermediate_size=11008, vocab_size=32000, tie_embeddings=False,
        source="meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32, hidden_size 4096, "
               "num_attention_heads 32, num_key_value_heads 32 (no grouped-query attention), "
               "intermediate_size 11008, vocab_size 32000, tie_word_embeddings false; 6.74B parameters"),
    "Llama-3-8B": ModelShape(
        "Llama-3-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
        source="meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, hidden_size 4096, "
               "num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, "
               "vocab_size 128256, tie_word_embeddings false (an 8B-class shape)"),
}


def model_shape(name: str) -> ModelShape:
    if name not in MODEL_SHAPES:
        raise ValueError(f"shape={name!r}; must be one of {sorted(MODEL_SHAPES)}")
    return MODEL_SHAPES[name]
