"""How long one step takes: a four-term linear cost model, fitted to measured steps.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.checks import check_choice, check_instance, check_number
from batchlab.plan import ScheduledChunk, StepPlan, step_features
from batchlab.trace import StepRecord, Trace

FEATURES = ("num_seqs", "num_tokens", "attention_pairs")
COEFFICIENTS = ("fixed_s", "per_seq_s", "per_token_s", "per_attention_pair_s")
FORMULA = ("t_step = fixed_s + per_seq_s*num_seqs + per_token_s*num_tokens "
           "+ per_attention_pair_s*attention_pairs")


def features_df(steps: Trace | Iterable[StepRecord]) -> pd.DataFrame:
    """One row per step: its features and its duration (the table ``CostModel.fit`` reads).

    Columns: ``step``, ``num_seqs``, ``num_tokens``, ``attention_pairs``, ``duration``. Joins
    naturally with ``Trace.steps_df()`` on ``step``.
    """
    records = steps.steps if isinstance(steps, Trace) else list(steps)
    rows = []
    for i, s in enumerate(records):
        check_instance(f"steps[{i}]", s, StepRecord, "a StepRecord", hint="a step of a Trace")
        rows.append((s.index, *step_features(s.chunks), s.duration))
    return pd.DataFrame(rows, columns=["step", *FEATURES, "duration"])


# --- non-negative least squares ------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Solve ``min ||a @ x - b||`` subject to ``x >= 0`` (Lawson and Hanson's active-set method).

    The idea: keep a set of coefficients allowed to be positive (``passive``), all others pinned
    at zero. Repeatedly free the pinned coefficient whose increase would reduce the error most
    (largest gradient ``w``), solve ordinary least squares on the free ones, and if that pushes
    some free coefficient below zero, move only part of the way and pin the one that hit zero.
    Stop when no pinned coefficient would help. ``a`` is (m, n), ``b`` is (m,).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    max_iter = 3 * n if max_iter is None else max_iter
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.abs(a).sum(axis=0).max() * max(m, n)
    w = a.T @ (b - a @ x)                       # (n,) minus the gradient of the squared error / 2
    for _ in range(max_iter):
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            s = np.zeros(n)
            if not passive.any():
                break
            s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if s[passive].min() > 0:
                break
            # Move from x towards s only until the first free coefficient reaches zero.
            hits = passive & (s <= 0)
            gap = x[hits] - s[hits]                 # >= 0, since x >= 0 >= s there
            alpha = np.min(np.divide(x[hits], gap, out=np.zeros_like(gap), where=gap > 0))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
        w = a.T @ (b - a @ x)
    return x


# --- the model -----------------------------------------------------------------------------------
class StepTimeModel:
    """What the simulator asks of a step-time formula: ``predict_features(num_seqs, num_tokens,
    attention_pairs)`` in seconds. ``predict`` works out a step's features and asks it. Two forms
    exist: the additive ``CostModel`` below and the roofline (``batchlab.steptime.roofline``)."""

    def predict_features(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        raise NotImplementedError

    def predict_split(self, num_seqs: int, num_tokens: int, attention_pairs: int, decode_seqs: int,
                      decode_pairs: int) -> float:
        """The same, told which sequences decode and their pairs (``plan.decode_split``); a model
        that prices decodes and prompt chunks apart overrides it."""
        return self.predict_features(num_seqs, num_tokens, attention_pairs)

    def predict(self, step: StepPlan | StepRecord | Iterable[ScheduledChunk]) -> float:
        """Seconds for one step, given its plan, its record or its chunks. No chunks: 0 (no step
        runs)."""
        chunks = step.chunks if isinstance(step, (StepPlan, StepRecord)) else step
        num_seqs, num_tokens, pairs = step_features(chunks)
        if num_seqs == 0:
            return 0.0
        return self.predict_features(num_seqs, num_tokens, pairs)


@dataclass(frozen=True)
class CostModel(StepTimeModel):
    """Seconds per step from four non-negative coefficients (see the module docstring).

    ``source`` says what was measured (model, device, dtype, date); ``fit_stats`` holds how well
    the fit matched its measurements (``num_steps``, ``r2``, ``median_rel_error``,
    ``p90_rel_error``; a stored fit reused after a check adds ``checked_steps``, ``checked_error``
    and ``stored_minutes_ago``), or None for a model written by hand.
    """

    fixed_s: float
    per_seq_s: float
    per_token_s: float
    per_attention_pair_s: float
    source: str = ""
    fit_stats: dict | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            value = getattr(self, name)
            check_number(name, value, hint="a cost, in seconds")
            object.__setattr__(self, name, float(value))
        check_instance("source", self.source, str, "a string", hint="what was measured")

    # --- predicting ------------------------------------------------------------------------------
    def predict_features(self, num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
        """Seconds for a step with these features (the formula, evaluated in a fixed order)."""
        return (self.fixed_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens
                + self.per_attention_pair_s * attention_pairs)

    def predict_df(self, features: pd.DataFrame) -> np.ndarray:
        """Seconds for every row of a table with the ``FEATURES`` columns (e.g. ``features_df``)."""
        x = _design_matrix(features)
        return x @ np.array(self.coefficients)

    @property
    def coefficients(self) -> tuple[float, float, float, float]:
        return (self.fixed_s, self.per_seq_s, self.per_token_s, self.per_attention_pair_s)

    # --- fitting ---------------------------------------------------------------------------------
    @classmethod
    def fit(cls, steps: Trace | Iterable[StepRecord] | pd.DataFrame, weight: str = "relative",
            source: str = "") -> "CostModel":
        """Fit the four coefficients to measured steps by non-negative least squares.

        ``steps``: a ``Trace`` or ``StepRecord`` list with measured durations (features are
        computed from their chunks), or a table with the ``FEATURES`` columns and ``duration``
        (``features_df`` makes one). ``weight="relative"`` (default) minimises relative errors,
        ``"absolute"`` minimises errors in seconds (long steps then dominate).
        """
        check_choice("weight", weight, ("relative", "absolute"))
        table = steps if isinstance(steps, pd.DataFrame) else features_df(steps)
        if "duration" not in table.columns:
            raise ValueError(f"the steps table needs a 'duration' column; "
                             f"it has {list(table.columns)}")
        x = _design_matrix(table)                         # (num_steps, 4)
        y = table["duration"].to_numpy(dtype=float)       # (num_steps,)
        if len(y) < len(COEFFICIENTS):
            raise ValueError(f"{len(y)} steps cannot determine {len(COEFFICIENTS)} coefficients; "
                             "measure more steps")
        if not np.all(np.isfinite(y)) or np.any(y <= 0):
            raise ValueError("every measured duration must be a finite number of seconds > 0")
        # Row weights turn "relative error" into ordinary least squares; column scales make the
        # columns comparable (attention pairs run into the millions, num_seqs is a handful).
        row_w = 1.0 / y if weight == "relative" else np.ones_like(y)
        xw = x * row_w[:, None]
        col_scale = np.linalg.norm(xw, axis=0)
        if np.any(col_scale == 0):
            raise ValueError("a feature is zero in every step; cannot fit its coefficient")
        if np.linalg.matrix_rank(xw / col_scale) < len(COEFFICIENTS):
            warnings.warn("the measured steps do not vary enough to tell all four costs apart "
                          "(e.g. only decode steps: num_seqs == num_tokens); measure a mix of "
                          "prompt and decode steps of several sizes", stacklevel=2)
        coef = nnls(xw / col_scale, y * row_w) / col_scale
        pred = x @ coef
        rel = np.abs(pred - y) / y
        stats = {"num_steps": int(len(y)), "weight": weight,
                 "r2": float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)),
                 "median_rel_error": float(np.median(rel)),
                 "p90_rel_error": float(np.quantile(rel, 0.9))}
        return cls(*map(float, coef), source=source, fit_stats=stats)

    # --- saving and loading ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"formula": FORMULA, **{name: getattr(self, name) for name in COEFFICIENTS},
                "source": self.source, "fit_stats": self.fit_stats}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        missing = [name for name in COEFFICIENTS if name not in data]
        if missing:
            raise ValueError(f"cost model data lacks {missing}; it needs {list(COEFFICIENTS)}")
        if "formula" in data and data["formula"] != FORMULA:
            raise ValueError(f"cost model data is for formula {data['formula']!r}, not {FORMULA!r}")
        return cls(*(data[name] for name in COEFFICIENTS), source=data.get("source", ""),
                   fit_stats=data.get("fit_stats"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        """Read a model saved by ``save`` (e.g. the fit of the real model shipped with the
        course)."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        terms = (f"{self.fixed_s * 1e3:.3g} ms/step + {self.per_seq_s * 1e3:.3g} ms/seq + "
                 f"{self.per_token_s * 1e3:.3g} ms/token + "
                 f"{self.per_attention_pair_s * 1e6:.3g} µs/attention pair")
        if self.fit_stats:
            terms += (f"; fit on {self.fit_stats['num_steps']} steps, median error "
                      f"{self.fit_stats['median_rel_error']:.1%}")
        # a stored fit, checked (calibration)
        if self.fit_stats and "checked_error" in self.fit_stats:
            terms += (f"; stored {self.fit_stats['stored_minutes_ago']:.0f} min ago, checked on "
                      f"{self.fit_stats['checked_steps']} fresh steps: "
                      f"median error {self.fit_stats['checked_error']:.1%}")
        return f"CostModel({terms})"


def _design_matrix(table: pd.DataFrame) -> np.ndarray:
    """(num_steps, 4) matrix: a column of ones (the fixed cost) and the three features."""
    missing = [name for name in FEATURES if name not in table.columns]
    if missing:
        raise ValueError(f"the steps table lacks columns {missing}; it needs {list(FEATURES)} "
                         "(features_df(trace) computes them)")
    feats = table[list(FEATURES)].to_numpy(dtype=float)
    return np.column_stack([np.ones(len(table)), feats])
