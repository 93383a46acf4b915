"""The server's simulated-device mode: real serving code, predicted step times, placeholder text.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel, StepTimeModel
from batchlab.steptime.device_presets import load_device_presets
from batchlab.steptime.roofline import RooflineCostModel
from batchlab.shapes import MODEL_SHAPES, ModelShape, model_shape
from batchlab.vllm_sim import VllmReplica

DEFAULT_SHAPE = "Llama-3-8B"
PLACEHOLDER_TEXT = " x"
ADDITIVE_FIT_SHAPE = "SmolLM2-135M"     # the additive CPU fit is of the course's model
NOTE = ("simulated device: step times are a cost model's predictions; generated tokens are "
        "placeholders")


def allowed_specs() -> str:
    devices = ", ".join(sorted(load_device_presets()))
    return (f"a GPU preset ({devices}), MODEL@DEVICE with MODEL one of {sorted(MODEL_SHAPES)}, "
            "or the path of a saved cost model (.json)")


@dataclass(frozen=True)
class SimulatedDevice:
    """A parsed ``--simulate`` spec: the cost model, and the shape its KV cache is sized by."""

    spec: str
    cost_model: StepTimeModel
    shape: ModelShape
    dtype_bytes: int

    @classmethod
    def parse(cls, spec: object) -> "SimulatedDevice":
        """``spec`` as described in the module docstring; a ValueError naming it otherwise."""
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"simulate={spec!r}; must be {allowed_specs()}")
        if spec.endswith(".json"):
            return cls._from_file(spec)
        model, _, device = spec.rpartition("@")
        devices = load_device_presets()
        if device not in devices or (model and model not in MODEL_SHAPES):
            raise ValueError(f"simulate={spec!r}; must be {allowed_specs()}")
        shape = model_shape(model or DEFAULT_SHAPE)
        try:
            replica = VllmReplica(shape, device)
        except ValueError as err:
            raise ValueError(f"simulate={spec!r}: vLLM would not serve it: {err}") from None
        return cls(spec, replica.step_model, shape, replica.resolved_args.dtype_bytes)

    @classmethod
    def _from_file(cls, spec: str) -> "SimulatedDevice":
        path = Path(spec)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"simulate={spec!r}: cannot read a cost model from it "
                             f"({type(e).__name__}: {e}); must be {allowed_specs()}") from None
        if isinstance(data, dict) and "shape" in data:
            model = RooflineCostModel.from_dict(data)
            return cls(spec, model, model.shape, model.dtype_bytes)
        return cls(spec, CostModel.from_dict(data), model_shape(ADDITIVE_FIT_SHAPE), 4)

    def kv_capacity_tokens(self, kv_cache_memory_bytes: int | None, max_num_seqs: int,
                           max_model_len: int) -> int:
        if kv_cache_memory_bytes is None:
            return max_num_seqs * max_model_len
        tokens = kv_cache_memory_bytes // self.shape.kv_bytes_per_token(self.dtype_bytes)
        if tokens < max_model_len:
            raise ValueError(f"kv_cache_memory_bytes={kv_cache_memory_bytes}: holds {tokens} "
                             f"tokens of {self.shape.name}, fewer than "
                             f"max_model_len={max_model_len}; must hold at least one whole "
                             "sequence")
        return tokens

    def backend(self, config, placeholder_token: int) -> SimBackend:
        """The engine's backend for a ``ServerConfig`` (its KV cache knobs)."""
        e = config.engine
        tokens = self.kv_capacity_tokens(config.kv_cache_memory_bytes, e.max_num_seqs,
                                         e.max_model_len)
        return SimBackend.for_args(self.cost_model, tokens, e, paged=config.paged,
                                   placeholder_token=placeholder_token)

    def card(self) -> dict:
        """What ``/v1/models`` says about the simulation."""
        return {"spec": self.spec, "shape": self.shape.name, "cost_model": repr(self.cost_model),
                "placeholder_text": PLACEHOLDER_TEXT, "note": NOTE}


def placeholder_token_id(tokenizer) -> int:
    """The one token every simulated step samples (``PLACEHOLDER_TEXT``)."""
    ids = tokenizer.encode(PLACEHOLDER_TEXT, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"PLACEHOLDER_TEXT={PLACEHOLDER_TEXT!r} is {len(ids)} tokens for this "
                         "tokenizer; must be one")
    return ids[0]


__all__ = ["SimulatedDevice", "placeholder_token_id", "allowed_specs", "DEFAULT_SHAPE",
           "PLACEHOLDER_TEXT", "NOTE"]
