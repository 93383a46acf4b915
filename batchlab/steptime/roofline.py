"""A roofline cost model: a step is as slow as its bytes and FLOPs make it, on a GPU's kernels.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd

from batchlab.steptime.cost_model import FEATURES, CostModel, StepTimeModel, features_df
from batchlab.steptime.device_presets import (DEVICE_PRESETS_PATH, DevicePreset, device_preset,
                                              load_device_presets)
from batchlab.steptime.grounded_step import GroundedStep
from batchlab.steptime.kernels import KernelEfficiency, KernelModel
from batchlab.checks import check_bool, check_int, check_number
from batchlab.shapes import DTYPE_BYTES, MODEL_SHAPES, LayerShape, ModelShape, model_shape
from batchlab.trace import StepRecord, Trace

__all__ = ["DEVICE_PRESETS_PATH", "DTYPE_BYTES", "FORMULA", "GROUNDED_FORMULA", "MODEL_SHAPES",
           "DevicePreset", "KernelEfficiency", "LayerShape", "ModelShape", "RooflineCostModel",
           "compare_cost_models",
           "device_preset", "load_device_presets", "model_shape", "profile_features"]

FORMULA = ("t_step = max((weight_bytes + attention_pairs/min(query_tile, num_tokens/num_seqs)"
           "*kv_bytes_per_token) / bandwidth, "
           "(2*matmul_params*num_tokens + attention_pairs*attention_flops_per_pair) / peak_flops) "
           "+ overhead_s")
GROUNDED_FORMULA = ("t_step = num_layers*(projections(num_tokens) + small_ops(num_tokens) + "
                    "attention(keys_read, attention_pairs)) + lm_head(num_seqs) + "
                    "embedding_and_final_norm(num_tokens) + overhead_s; "
                    "each kernel latency + ((bytes/(bandwidth_fraction*bandwidth))^p + "
                    "(flops/(compute_fraction*peak_flops))^p)^(1/p)")


# --- the cost model ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RooflineCostModel(StepTimeModel):
    """Seconds per step from the roofline, or from measured kernels when ``kernels`` is given (see
    the module docstring); a drop-in for ``CostModel``."""

    shape: ModelShape
    bandwidth_Bps: float
    peak_flops: float
    dtype_bytes: int
    overhead_s: float = 0.0
    source: str = ""
    fit_stats: dict | None = field(default=None, compare=False)
    query_tile: int = 128
    kernels: KernelEfficiency | None = None
    # the device's SMs: a matrix multiply's tiles run in waves of them
    num_sms: int | None = None

    def __post_init__(self) -> None:
        check_int("query_tile", self.query_tile)
        check_int("num_sms", self.num_sms, allow_none=True)
        if not isinstance(self.shape, ModelShape):
            raise ValueError(f"shape={self.shape!r}; must be a ModelShape "
                             "(e.g. MODEL_SHAPES['SmolLM2-135M'])")
        if self.shape.moe is not None:
            raise ValueError(f"shape={self.shape.name!r}; must be a dense model: the roofline "
                             "reads every weight per step, which experts do not "
                             "(batchlab.predict prices experts from measured kernels)")
        check_number("bandwidth_Bps", self.bandwidth_Bps, strict=True)
        check_number("peak_flops", self.peak_flops, strict=True)
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"dtype_bytes={self.dtype_bytes!r}; must be 1, 2 or 4")
        check_number("overhead_s", self.overhead_s, hint="seconds per step")
        object.__setattr__(self, "overhead_s", float(self.overhead_s))
        if self.kernels is not None and not isinstance(self.kernels, KernelEfficiency):
            raise ValueError(f"kernels={self.kernels!r}; must be a KernelEfficiency or None "
                             "(the datasheet roofline)")
        kernels = KernelModel(self.bandwidth_Bps, self.peak_flops, self.dtype_bytes, self.kernels,
                              self.num_sms) \
            if self.kernels else None
        object.__setattr__(self, "_grounded",
                           GroundedStep(self.shape, kernels) if kernels else None)
        # The roofs the kernels reach (the datasheet's without kernels), and the per-step constants.
        object.__setattr__(self, "_bandwidth", self.bandwidth_Bps * (self.kernels.bandwidth_fraction
                                                                    if self.kernels else 1.0))
        object.__setattr__(self, "_peak", self.peak_flops * (self.kernels.compute_fraction
                                                             if self.kernels else 1.0))
        object.__setattr__(self, "_weight_bytes", self.shape.weight_bytes(self.dtype_bytes))
        object.__setattr__(self, "_kv_bytes", self.shape.kv_bytes_per_token(self.dtype_bytes))
        object.__setattr__(self, "_flops_per_token", 2 * self.shape.matmul_params)
        object.__setattr__(self, "_flops_per_pair", self.shape.attention_flops_per_pair)

    @classmethod
    def for_device(cls, shape: ModelShape | str, device: DevicePreset | str,
                   overhead_s: float | None = None, grounded: bool = True) -> "RooflineCostModel":
        """``shape`` on a preset device, in the preset's dtype. By default grounded: the device's
        kernels as measured and the preset's stated per-step overhead. ``grounded=False``: the
        datasheet's pure roofline, with no overhead. A given ``overhead_s`` replaces either."""
        check_bool("grounded", grounded)
        shape = model_shape(shape) if isinstance(shape, str) else shape
        device = device_preset(device) if isinstance(device, str) else device
        if grounded and device.kernels is None:
            raise ValueError(f"grounded=True; must be False for device {device.name!r}, "
                             "which has no kernels")
        if overhead_s is None:
            overhead_s = device.step_overhead_s if grounded else 0.0
            what = f"kernels: {device.kernels_source}; overhead: {device.step_overhead_source}" \
                if grounded else "datasheet roofline"
        else:
            what = f"kernels: {device.kernels_source}" if grounded else "datasheet roofline"
        return cls(shape, device.memory_bandwidth_Bps, device.peak_flops, device.dtype_bytes,
                   overhead_s,
                   source=f"{shape.name} on {device.name} "
                          f"({device.dtype}; {device.source}; {what})",
                   kernels=device.kernels if grounded else None,
                   num_sms=device.num_sms if grounded else None)

    # --- predicting --------------------------------------------------------------------------
    def keys_read(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """Cached keys (and values) the step's attention loads (see the module docstring)."""
        if num_seqs <= 0:
            return 0.0
        return attention_pairs / min(self.query_tile, max(1.0, num_tokens / num_seqs))

    def memory_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """The step's bytes at the bandwidth its kernels reach (the datasheet's without kernels)."""
        keys = self.keys_read(num_seqs, num_tokens, attention_pairs)
        return (self._weight_bytes + keys * self._kv_bytes) / self._bandwidth

    def compute_seconds(self, num_tokens: int, attention_pairs: int) -> float:
        """The step's FLOPs at the peak its kernels reach (the datasheet's without kernels)."""
        return ((self._flops_per_token * num_tokens + self._flops_per_pair * attention_pairs)
                / self._peak)

    def roofline_seconds(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """The step without its overhead: with kernels, the sum of its kernels' times; without,
        the slower of memory and compute."""
        if self._grounded is not None:
            keys = self.keys_read(num_seqs, num_tokens, attention_pairs)
            return self._grounded.seconds(num_seqs, num_tokens, attention_pairs, keys)
        return max(self.memory_seconds(num_seqs, num_tokens, attention_pairs),
                   self.compute_seconds(num_tokens, attention_pairs))

    def predict_features(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        return self.roofline_seconds(num_seqs, num_tokens, attention_pairs) + self.overhead_s

    def early_exit(self, exit_layer: int) -> "RooflineCostModel":
        """The cost of a self-draft's pass (``method="early_exit"``): this model cut to its first
        ``exit_layer`` layers, with its final norm and LM head, and no per-step overhead (the pass
        runs inside a step the engine has already scheduled)."""
        layers = self.shape.num_layers
        check_int("early_exit_layer", exit_layer,
                  hint=f"1..{layers - 1}, the layers a draft pass runs")
        if exit_layer >= layers:
            raise ValueError(f"early_exit_layer={exit_layer}; must be in 1..{layers - 1} "
                             f"({self.shape.name} has {layers} layers)")
        shape = replace(self.shape, name=f"{self.shape.name}, first {exit_layer} layers",
                        num_layers=exit_layer)
        return replace(self, shape=shape, overhead_s=0.0,
                       source=f"{self.source}; first {exit_layer} layers")

    def predict_df(self, features: pd.DataFrame) -> np.ndarray:
        return np.array([self.predict_features(*row) for row in _feature_rows(features)])

    def bound(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> str:
        """Which roof binds this step: ``"memory"`` or ``"compute"``."""
        return ("compute" if self.compute_seconds(num_tokens, attention_pairs)
                > self.memory_seconds(num_seqs, num_tokens, attention_pairs) else "memory")

    # --- fitting -----------------------------------------------------------------------------
    def fit(self, steps: Trace | Iterable[StepRecord] | pd.DataFrame,
            source: str = "") -> "RooflineCostModel":
        """This model with ``overhead_s`` fitted to measured steps (minimising relative error).

        With ``r_i`` the predicted time without overhead and ``y_i`` the measured one, minimising
        ``sum(((r_i + o - y_i) / y_i)**2)`` gives
        ``o = sum((y_i - r_i) / y_i**2) / sum(1 / y_i**2)``, clipped at 0 (an overhead cannot be
        negative).
        """
        table = _steps_table(steps)
        y = table["duration"].to_numpy(dtype=float)
        r = np.array([self.roofline_seconds(*row) for row in _feature_rows(table)])
        w = 1.0 / y**2
        overhead = max(0.0, float(np.sum((y - r) * w) / np.sum(w)))
        fitted = replace(self, overhead_s=overhead, source=source or self.source)
        object.__setattr__(fitted, "fit_stats", _fit_stats(y, r + overhead))
        return fitted

    # --- saving ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"formula": GROUNDED_FORMULA if self.kernels else FORMULA,
                "shape": asdict(self.shape),
                "bandwidth_Bps": self.bandwidth_Bps, "peak_flops": self.peak_flops,
                "dtype_bytes": self.dtype_bytes, "overhead_s": self.overhead_s,
                "query_tile": self.query_tile,
                "kernels": asdict(self.kernels) if self.kernels else None, "num_sms": self.num_sms,
                "source": self.source, "fit_stats": self.fit_stats}

    @classmethod
    def from_dict(cls, data: dict) -> "RooflineCostModel":
        formula, kernels = data.get("formula"), data.get("kernels")
        if formula != (GROUNDED_FORMULA if kernels else FORMULA):
            raise ValueError(f"formula={formula!r}; must be {FORMULA!r}, "
                             f"or {GROUNDED_FORMULA!r} with kernels")
        model = cls(ModelShape(**data["shape"]), data["bandwidth_Bps"], data["peak_flops"],
                    data["dtype_bytes"], data["overhead_s"], data.get("source", ""),
                    query_tile=data.get("query_tile", 128),
                    kernels=KernelEfficiency(**kernels) if kernels else None,
                    num_sms=data.get("num_sms"))
        object.__setattr__(model, "fit_stats", data.get("fit_stats"))
        return model

    def __repr__(self) -> str:
        text = (f"RooflineCostModel({self.shape.name}: {self._weight_bytes / 1e6:.0f} MB weights, "
                f"{self.bandwidth_Bps / 1e9:.0f} GB/s, {self.peak_flops / 1e12:.3g} TFLOP/s")
        if self.kernels:
            text += (f"; measured kernels reach {self.kernels.bandwidth_fraction:.0%} and "
                     f"{self.kernels.compute_fraction:.0%} of them")
        text += f", overhead {self.overhead_s * 1e3:.3g} ms"
        if self.fit_stats:
            text += (f"; fit on {self.fit_stats['num_steps']} steps, median error "
                     f"{self.fit_stats['median_rel_error']:.1%}")
        return text + ")"


# --- measured steps from either source ----------------------------------------------------------
def profile_features(profile: pd.DataFrame) -> pd.DataFrame:
    """``profiler.profile_steps`` rows as a steps table (the ``FEATURES`` columns and ``duration``).

    decode/context rows: ``batch_size`` sequences each decode at ``context_len``
    (``context_len + 1`` pairs each); prefill rows: one sequence computes ``num_tokens`` from
    position 0.
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
        raise ValueError(f"the steps table lacks columns {missing}; "
                         f"it needs {[*FEATURES, 'duration']}")
    y = table["duration"].to_numpy(dtype=float)
    if len(y) == 0 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("need at least one step, "
                         "and every measured duration must be finite and > 0")
    return table


def _feature_rows(table: pd.DataFrame):
    return table[list(FEATURES)].itertuples(index=False, name=None)


def _fit_stats(y: np.ndarray, pred: np.ndarray) -> dict:
    rel = np.abs(pred - y) / y
    r2 = 1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2) if len(y) > 1 else float("nan")
    return {"num_steps": int(len(y)), "r2": float(r2), "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.quantile(rel, 0.9))}


# --- which form describes this machine? ----------------------------------------------------------
def compare_cost_models(steps: Trace | Iterable[StepRecord] | pd.DataFrame,
                        roofline: RooflineCostModel,
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
        raise ValueError(f"holdout_fraction={holdout_fraction!r}; must be a number strictly "
                         "between 0 and 1")
    table = _steps_table(steps).reset_index(drop=True)
    n = len(table)
    num_test = int(round(n * holdout_fraction))
    if num_test < 1 or n - num_test < len(FEATURES) + 1:
        raise ValueError(f"{n} steps are too few to hold {holdout_fraction:.0%} out and still "
                         "fit four coefficients; measure more steps")
    order = np.random.default_rng(seed).permutation(n)
    test, train = table.iloc[order[:num_test]], table.iloc[order[num_test:]]
    additive = CostModel.fit(train, source=source)
    fitted_roof = roofline.fit(train, source=source or roofline.source)
    y = test["duration"].to_numpy(dtype=float)
    errors = {}
    for name, model in (("additive", additive), ("roofline", fitted_roof)):
        rel = np.abs(model.predict_df(test) - y) / y
        errors[name] = {"median_rel_error": float(np.median(rel)),
                        "p90_rel_error": float(np.quantile(rel, 0.9)),
                        "fit_median_rel_error": model.fit_stats["median_rel_error"]}
    df = pd.DataFrame(errors).T
    winner = str(df["median_rel_error"].idxmin())
    loser = "roofline" if winner == "additive" else "additive"
    ratio = float(df.loc[loser, "median_rel_error"] / max(df.loc[winner, "median_rel_error"],
                                                          1e-12))
    return {"additive": additive, "roofline": fitted_roof, "errors": df, "winner": winner,
            "ratio": ratio, "num_train": int(len(train)), "num_test": int(num_test)}
