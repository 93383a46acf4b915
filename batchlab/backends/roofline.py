"""A roofline cost model: a step is as slow as the slower of reading its bytes and doing its FLOPs.

The additive ``CostModel`` (fixed + per sequence + per token + per attention pair) describes a
CPU well, where a step's work adds up. On a GPU a step costs about::

    t_step = max(bytes_read / bandwidth, flops / peak_flops) + overhead_s

    bytes_read = weight_bytes                                   # every weight matrix, once per step
               + keys_read * kv_bytes_per_token                 # a key and a value, all layers
    keys_read  = attention_pairs / min(query_tile, num_tokens / num_seqs)
    flops      = 2 * matmul_params * num_tokens                 # a multiply-add per weight per token
               + attention_pairs * attention_flops_per_pair     # q·k and p·v, every head of every layer

A decode step at small batch is memory-bound (the weights dominate ``bytes_read``), so adding
sequences is nearly free until ``flops / peak`` catches up: that is notebook 01's roofline. The
``overhead_s`` (kernel launches, Python, sampling) is the one fitted number.

Keys read: the simulator knows a step's ``(num_seqs, num_tokens, attention_pairs)`` only. In a
decode step each pair is one cached key read (``num_tokens / num_seqs == 1``), so the KV bytes
are exact. A prompt chunk's queries share their keys: a fused attention kernel (FlashAttention's
way) loads a block of keys once for a tile of up to ``query_tile`` queries, so the pairs are
divided by the queries per sequence, at most a tile. Counting every pair as a read would make a
512-token prompt chunk of an 8B model read more KV bytes than weights and look memory-bound; it
is compute-bound. For a step that mixes decodes with a prompt chunk, ``num_tokens / num_seqs`` is
an average, so the keys read are approximate there.

The pieces: ``ModelShape`` (the model's sizes; ``MODEL_SHAPES`` holds SmolLM2-135M and
Llama-3-8B, each with its source), ``DevicePreset`` (bandwidth and peak; ``load_device_presets``
reads ``batchlab/backends/device_presets.json``: T4, L4, A100, H100, H200 from their datasheets),
``RooflineCostModel`` (the formula, with ``predict``/``predict_features`` like ``CostModel``,
so ``SimBackend`` takes either), and ``compare_cost_models`` (fit both forms on the same measured
steps and score them on held-out ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.backends.cost_model import FEATURES, CostModel, StepTimeModel, features_df
from batchlab.trace import StepRecord, Trace

DEVICE_PRESETS_PATH = Path(__file__).resolve().parent / "device_presets.json"   # package data
FORMULA = ("t_step = max((weight_bytes + attention_pairs/min(query_tile, num_tokens/num_seqs)"
           "*kv_bytes_per_token) / bandwidth, "
           "(2*matmul_params*num_tokens + attention_pairs*attention_flops_per_pair) / peak_flops) "
           "+ overhead_s")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _positive_number(owner: str, name: str, value, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        what = "an int" if integer else "a finite number"
        raise ValueError(f"{owner}: {name}={value!r}; must be {what} > 0")


# --- the model's shape ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder that decide its bytes and FLOPs per step."""

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
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            _positive_number(f"ModelShape {self.name!r}", name, getattr(self, name), integer=True)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShape {self.name!r}: num_heads={self.num_heads} must be a multiple "
                             f"of num_kv_heads={self.num_kv_heads} (grouped-query attention)")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"ModelShape {self.name!r}: source={self.source!r}; say where the sizes come from")

    @property
    def matmul_params(self) -> int:
        """Weights of every matrix multiply: per layer q, k, v, o and the MLP's three; the LM head.

        The embedding lookup reads only a few rows, so it is left out (with tied embeddings the
        LM head *is* the embedding table, read once).
        """
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size
        return self.num_layers * per_layer + h * self.vocab_size

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
    "Llama-3-8B": ModelShape(
        "Llama-3-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
        source="meta-llama/Meta-Llama-3-8B config.json (an 8B-class shape)"),
}


def model_shape(name: str) -> ModelShape:
    if name not in MODEL_SHAPES:
        raise ValueError(f"model shape {name!r} is unknown; known: {sorted(MODEL_SHAPES)}")
    return MODEL_SHAPES[name]


# --- the device ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DevicePreset:
    """A device's roofline: memory bandwidth (bytes/s) and dense peak (FLOP/s) in ``dtype``."""

    name: str
    memory_bandwidth_Bps: float
    peak_flops: float
    dtype: str
    memory_bytes: float
    source: str

    def __post_init__(self) -> None:
        owner = f"device preset {self.name!r}"
        for name in ("memory_bandwidth_Bps", "peak_flops", "memory_bytes"):
            _positive_number(owner, name, getattr(self, name))
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"{owner}: dtype={self.dtype!r}; must be one of {sorted(DTYPE_BYTES)}")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"{owner}: source={self.source!r}; name the datasheet the numbers come from")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


_PRESET_KEYS = {"memory_bandwidth_GBps", "peak_tflops", "dtype", "memory_GB", "source"}


def load_device_presets(path: str | Path = DEVICE_PRESETS_PATH) -> dict[str, DevicePreset]:
    """Read the presets file (GB/s, dense TFLOPS, GB, as datasheets state them) into ``DevicePreset``s."""
    data = json.loads(Path(path).read_text())
    devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(devices, dict) or not devices:
        raise ValueError(f"{path}: expected an object with a non-empty 'devices' object")
    presets = {}
    for name, entry in devices.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: device {name!r} must be an object with keys {sorted(_PRESET_KEYS)}")
        missing, extra = _PRESET_KEYS - entry.keys(), entry.keys() - _PRESET_KEYS
        if missing or extra:
            raise ValueError(f"{path}: device {name!r} lacks {sorted(missing)} / has unknown {sorted(extra)}; "
                             f"the keys are {sorted(_PRESET_KEYS)}")
        for key in ("memory_bandwidth_GBps", "peak_tflops", "memory_GB"):
            _positive_number(f"{path}: device {name!r}", key, entry[key])
        presets[name] = DevicePreset(name, entry["memory_bandwidth_GBps"] * 1e9, entry["peak_tflops"] * 1e12,
                                     entry["dtype"], entry["memory_GB"] * 1e9, entry["source"])
    return presets


def device_preset(name: str, path: str | Path = DEVICE_PRESETS_PATH) -> DevicePreset:
    presets = load_device_presets(path)
    if name not in presets:
        raise ValueError(f"device preset {name!r} is unknown; known: {sorted(presets)}")
    return presets[name]


# --- the cost model ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RooflineCostModel(StepTimeModel):
    """Seconds per step from the roofline (see the module docstring); a drop-in for ``CostModel``."""

    shape: ModelShape
    bandwidth_Bps: float
    peak_flops: float
    dtype_bytes: int
    overhead_s: float = 0.0
    source: str = ""
    fit_stats: dict | None = field(default=None, compare=False)
    query_tile: int = 128

    def __post_init__(self) -> None:
        _positive_number("RooflineCostModel", "query_tile", self.query_tile, integer=True)
        if not isinstance(self.shape, ModelShape):
            raise ValueError(f"shape={self.shape!r}; must be a ModelShape (e.g. MODEL_SHAPES['SmolLM2-135M'])")
        _positive_number("RooflineCostModel", "bandwidth_Bps", self.bandwidth_Bps)
        _positive_number("RooflineCostModel", "peak_flops", self.peak_flops)
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"dtype_bytes={self.dtype_bytes!r}; must be 1, 2 or 4")
        o = self.overhead_s
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) or o < 0:
            raise ValueError(f"overhead_s={o!r}: must be a finite number of seconds >= 0")
        object.__setattr__(self, "overhead_s", float(o))
        # The per-step constants, computed once (predict_features runs once per simulated step).
        object.__setattr__(self, "_weight_bytes", self.shape.weight_bytes(self.dtype_bytes))
        object.__setattr__(self, "_kv_bytes", self.shape.kv_bytes_per_token(self.dtype_bytes))
        object.__setattr__(self, "_flops_per_token", 2 * self.shape.matmul_params)
        object.__setattr__(self, "_flops_per_pair", self.shape.attention_flops_per_pair)

    @classmethod
    def for_device(cls, shape: ModelShape | str, device: DevicePreset | str,
                   overhead_s: float = 0.0) -> "RooflineCostModel":
        """The roofline of ``shape`` on a preset device, in the preset's dtype."""
        shape = model_shape(shape) if isinstance(shape, str) else shape
        device = device_preset(device) if isinstance(device, str) else device
        return cls(shape, device.memory_bandwidth_Bps, device.peak_flops, device.dtype_bytes, overhead_s,
                   source=f"{shape.name} on {device.name} ({device.dtype}; {device.source})")

    # --- predicting --------------------------------------------------------------------------
    def keys_read(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """Cached keys (and values) the step's attention loads (see the module docstring)."""
        if num_seqs <= 0:
            return 0.0
        return attention_pairs / min(self.query_tile, max(1.0, num_tokens / num_seqs))

    def memory_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        keys = self.keys_read(num_seqs, num_tokens, attention_pairs)
        return (self._weight_bytes + keys * self._kv_bytes) / self.bandwidth_Bps

    def compute_seconds(self, num_tokens: int, attention_pairs: int) -> float:
        return (self._flops_per_token * num_tokens + self._flops_per_pair * attention_pairs) / self.peak_flops

    def roofline_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """The step without its overhead: the slower of memory and compute."""
        return max(self.memory_seconds(num_seqs, num_tokens, attention_pairs),
                   self.compute_seconds(num_tokens, attention_pairs))

    def predict_features(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        return self.roofline_seconds(num_seqs, num_tokens, attention_pairs) + self.overhead_s

    def predict_df(self, features: pd.DataFrame) -> np.ndarray:
        return np.array([self.predict_features(*row) for row in _feature_rows(features)])

    def bound(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> str:
        """Which roof binds this step: ``"memory"`` or ``"compute"``."""
        return ("compute" if self.compute_seconds(num_tokens, attention_pairs)
                > self.memory_seconds(num_seqs, num_tokens, attention_pairs) else "memory")

    # --- fitting -----------------------------------------------------------------------------
    def fit(self, steps: Trace | Iterable[StepRecord] | pd.DataFrame, source: str = "") -> "RooflineCostModel":
        """This roofline with ``overhead_s`` fitted to measured steps (minimising relative error).

        With ``r_i`` the roofline time and ``y_i`` the measured one, minimising
        ``sum(((r_i + o - y_i) / y_i)**2)`` gives ``o = sum((y_i - r_i) / y_i**2) / sum(1 / y_i**2)``,
        clipped at 0 (an overhead cannot be negative).
        """
        table = _steps_table(steps)
        y = table["duration"].to_numpy(dtype=float)
        r = np.array([self.roofline_seconds(*row) for row in _feature_rows(table)])
        w = 1.0 / y**2
        overhead = max(0.0, float(np.sum((y - r) * w) / np.sum(w)))
        pred = r + overhead
        fitted = RooflineCostModel(self.shape, self.bandwidth_Bps, self.peak_flops, self.dtype_bytes,
                                   overhead, source or self.source, query_tile=self.query_tile)
        object.__setattr__(fitted, "fit_stats", _fit_stats(y, pred))
        return fitted

    # --- saving ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"formula": FORMULA, "shape": asdict(self.shape), "bandwidth_Bps": self.bandwidth_Bps,
                "peak_flops": self.peak_flops, "dtype_bytes": self.dtype_bytes, "overhead_s": self.overhead_s,
                "query_tile": self.query_tile, "source": self.source, "fit_stats": self.fit_stats}

    @classmethod
    def from_dict(cls, data: dict) -> "RooflineCostModel":
        if data.get("formula") != FORMULA:
            raise ValueError(f"roofline data is for formula {data.get('formula')!r}, not {FORMULA!r}")
        model = cls(ModelShape(**data["shape"]), data["bandwidth_Bps"], data["peak_flops"],
                    data["dtype_bytes"], data["overhead_s"], data.get("source", ""),
                    query_tile=data.get("query_tile", 128))
        object.__setattr__(model, "fit_stats", data.get("fit_stats"))
        return model

    def __repr__(self) -> str:
        text = (f"RooflineCostModel({self.shape.name}: {self._weight_bytes / 1e6:.0f} MB weights, "
                f"{self.bandwidth_Bps / 1e9:.0f} GB/s, {self.peak_flops / 1e12:.3g} TFLOP/s, "
                f"overhead {self.overhead_s * 1e3:.3g} ms")
        if self.fit_stats:
            text += (f"; fit on {self.fit_stats['num_steps']} steps, median error "
                     f"{self.fit_stats['median_rel_error']:.1%}")
        return text + ")"


# --- measured steps from either source ----------------------------------------------------------
def profile_features(profile: pd.DataFrame) -> pd.DataFrame:
    """``profiler.profile_steps`` rows as a steps table (the ``FEATURES`` columns and ``duration``).

    decode/context rows: ``batch_size`` sequences each decode at ``context_len`` (``context_len + 1``
    pairs each); prefill rows: one sequence computes ``num_tokens`` from position 0.
    """
    rows = []
    for r in profile.itertuples():
        if r.kind == "prefill":
            seqs, tokens, pairs = 1, r.num_tokens, r.num_tokens * (r.num_tokens + 1) // 2
        else:
            seqs, tokens, pairs = r.batch_size, r.batch_size, r.batch_size * (r.context_len + 1)
        rows.append((int(seqs), int(tokens), int(pairs), r.ms_per_step / 1e3))
    return pd.DataFrame(rows, columns=[*FEATURES, "duration"])


def _steps_table(steps) -> pd.DataFrame:
    table = steps if isinstance(steps, pd.DataFrame) else features_df(steps)
    missing = [c for c in (*FEATURES, "duration") if c not in table.columns]
    if missing:
        raise ValueError(f"the steps table lacks columns {missing}; it needs {[*FEATURES, 'duration']}")
    y = table["duration"].to_numpy(dtype=float)
    if len(y) == 0 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("need at least one step, and every measured duration must be finite and > 0")
    return table


def _feature_rows(table: pd.DataFrame):
    return table[list(FEATURES)].itertuples(index=False, name=None)


def _fit_stats(y: np.ndarray, pred: np.ndarray) -> dict:
    rel = np.abs(pred - y) / y
    r2 = 1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2) if len(y) > 1 else float("nan")
    return {"num_steps": int(len(y)), "r2": float(r2), "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.quantile(rel, 0.9))}


# --- which form describes this machine? ----------------------------------------------------------
def compare_cost_models(steps: Trace | Iterable[StepRecord] | pd.DataFrame, roofline: RooflineCostModel,
                        holdout_fraction: float = 0.3, seed: int = 0, source: str = "") -> dict:
    """Fit the additive ``CostModel`` and ``roofline``'s overhead on the same measured steps; score
    both on held-out steps (a seeded random ``holdout_fraction`` of them).

    ``roofline`` carries the machine's bandwidth and peak (measured with ``profiler``'s
    ``measure_bandwidth`` and ``measure_matmul_flops`` on a CPU, or a preset). Returns a dict:
    ``additive`` and ``roofline`` (the fitted models), ``errors`` (a DataFrame: median and p90
    relative error of each on the held-out steps), ``winner`` and ``ratio`` (the loser's median
    held-out error over the winner's).
    """
    if isinstance(holdout_fraction, bool) or not isinstance(holdout_fraction, (int, float)) \
            or not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction={holdout_fraction!r}; must be a number strictly between 0 and 1")
    table = _steps_table(steps).reset_index(drop=True)
    n = len(table)
    num_test = int(round(n * holdout_fraction))
    if num_test < 1 or n - num_test < len(FEATURES) + 1:
        raise ValueError(f"{n} steps are too few to hold {holdout_fraction:.0%} out and still fit four "
                         "coefficients; measure more steps")
    order = np.random.default_rng(seed).permutation(n)
    test, train = table.iloc[order[:num_test]], table.iloc[order[num_test:]]
    additive = CostModel.fit(train, source=source)
    fitted_roof = roofline.fit(train, source=source or roofline.source)
    y = test["duration"].to_numpy(dtype=float)
    errors = {}
    for name, model in (("additive", additive), ("roofline", fitted_roof)):
        rel = np.abs(model.predict_df(test) - y) / y
        errors[name] = {"median_rel_error": float(np.median(rel)), "p90_rel_error": float(np.quantile(rel, 0.9)),
                        "fit_median_rel_error": model.fit_stats["median_rel_error"]}
    df = pd.DataFrame(errors).T
    winner = str(df["median_rel_error"].idxmin())
    loser = "roofline" if winner == "additive" else "additive"
    ratio = float(df.loc[loser, "median_rel_error"] / max(df.loc[winner, "median_rel_error"], 1e-12))
    return {"additive": additive, "roofline": fitted_roof, "errors": df, "winner": winner, "ratio": ratio,
            "num_train": int(len(train)), "num_test": int(num_test)}
