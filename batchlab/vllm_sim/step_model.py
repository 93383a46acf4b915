"""One vLLM V1 engine step on a tensor-parallel GPU group: the kernels, and the engine around them.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from batchlab.steptime.attention_fit import guess_split
from batchlab.steptime.cost_model import StepTimeModel
from batchlab.steptime.grounded_step import GroundedStep
from batchlab.steptime.measured_step import MeasuredStep
from batchlab.checks import check_int, fail
from batchlab.shapes import ModelShape, model_shape
from batchlab.speculative import SpeculativeConfig
from batchlab.engine_args import padded_tokens
from batchlab.vllm_sim.vllm_data import ENGINE_DATA

CPU = ENGINE_DATA["cpu_per_step"]


@dataclass(frozen=True)
class VllmStepModel(StepTimeModel):
    """Seconds per engine step (see the module docstring)."""

    gpu: GroundedStep | MeasuredStep
    cuda_graph_sizes: tuple[int, ...]
    async_scheduling: bool = True
    cpu_fixed_s: float = CPU["fixed_ms"] * 1e-3
    cpu_per_seq_s: float = CPU["per_seq_ms"] * 1e-3

    def gpu_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int,
                    split: tuple[int, int] | None = None) -> float:
        """The kernels' time, at the padded size; ``split`` is ``(decode_seqs, decode_pairs)``
        (None: guessed from the totals, ``guess_split``)."""
        tokens = padded_tokens(num_tokens, self.cuda_graph_sizes)
        rows = tokens if num_tokens == num_seqs else num_seqs      # a decode step pads its rows too
        g = self.gpu
        return (g.layers_seconds(tokens)
                + g.step_attention_seconds(num_seqs, num_tokens, attention_pairs, split)
                + g.edges_seconds(rows, tokens))

    def cpu_seconds(self, num_seqs: int) -> float:
        return self.cpu_fixed_s + self.cpu_per_seq_s * num_seqs

    def predict_split(self, num_seqs: int, num_tokens: int, attention_pairs: int, decode_seqs: int,
                      decode_pairs: int) -> float:
        if num_seqs <= 0:
            return 0.0
        gpu = self.gpu_seconds(num_seqs, num_tokens, attention_pairs, (decode_seqs, decode_pairs))
        cpu = self.cpu_seconds(num_seqs)
        return max(gpu, cpu) if self.async_scheduling else gpu + cpu

    def predict_features(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """Told only the totals: the split guessed as vLLM's scheduler builds a step."""
        return self.predict_split(num_seqs, num_tokens, attention_pairs,
                                  *guess_split(num_seqs, num_tokens, attention_pairs))

    def early_exit(self, exit_layer: int) -> "VllmStepModel":
        """A self-draft's pass (``method="early_exit"``): the model cut to its first ``exit_layer``
        layers, with its LM head, and no CPU work of its own (it runs inside a scheduled step)."""
        layers = self.gpu.shape.num_layers
        check_int("early_exit_layer", exit_layer,
                  hint=f"1..{layers - 1}, the layers a draft pass runs")
        if exit_layer >= layers:
            fail("early_exit_layer", exit_layer, f"in 1..{layers - 1}",
                 f"{self.gpu.shape.name} has {layers} layers")
        shape = replace(self.gpu.shape, name=f"{self.gpu.shape.name}, first {exit_layer} layers",
                        num_layers=exit_layer)
        return replace(self, gpu=replace(self.gpu, shape=shape), cpu_fixed_s=0.0, cpu_per_seq_s=0.0)

    def draft_model(self, model: str | ModelShape) -> "VllmStepModel":
        """A draft model's pass (``method="draft_model"``): the drafter's kernels on the same GPUs
        and CUDA graphs (vLLM's default: the target's tensor parallelism), no CPU work of its own.
        The drafter must share the target's vocabulary, as vLLM requires."""
        draft = model if isinstance(model, ModelShape) else model_shape(model)
        target = self.gpu.shape
        if draft.vocab_size != target.vocab_size:
            fail("model", draft.name,
                 f"a drafter with {target.name}'s vocabulary of {target.vocab_size} tokens",
                 f"{draft.name} has {draft.vocab_size}")
        draft.layer.check_tensor_parallel(self.gpu.tensor_parallel)
        return replace(self, gpu=replace(self.gpu, shape=draft), cpu_fixed_s=0.0, cpu_per_seq_s=0.0)

    def speculating(self, spec: SpeculativeConfig) -> "VllmStepModel":
        """The step as vLLM 0.32 runs it with ``spec``: prompt lookup drafts on the host, so vLLM
        turns async scheduling off for it (``config/vllm.py``); its model drafters keep it on."""
        return replace(self, async_scheduling=False) if spec.method == "ngram" else self

    def __repr__(self) -> str:
        g = self.gpu
        kernels = (g.tables.describe() if isinstance(g, MeasuredStep)
                   else "ROOFLINE-BASED ESTIMATE (no measured kernels)")
        graphs = (f"CUDA graphs up to {max(self.cuda_graph_sizes)} tokens" if self.cuda_graph_sizes
                  else "eager")
        return (f"VllmStepModel({g.shape.name} over {g.tensor_parallel} GPU(s); {kernels}; "
                f"{graphs}; {'async' if self.async_scheduling else 'synchronous'} scheduling)")


__all__ = ["VllmStepModel"]
