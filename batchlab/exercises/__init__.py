"""Checking helpers for the notebooks' exercises.

Each notebook's exercises have checkers in ``batchlab/exercises/nbNN.py``; a checker computes
the expected answer itself from the same inputs and compares. Worked solutions live apart, in
``solutions/NN_slug.py`` at the repository root, so a reader sees them only by choice.

In a notebook::

    from batchlab.exercises import check
    my_answer = ...            # your code
    check("02.1", my_answer)   # prints: correct / close / wrong / not attempted yet
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_CHECKERS: dict[str, Callable[[object], "Verdict"]] = {}


@dataclass(frozen=True)
class Verdict:
    status: str          # "correct", "close", "wrong" or "not attempted"
    message: str

    @property
    def ok(self) -> bool:
        return self.status in ("correct", "close")

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def exercise(name: str):
    """Register a checker ``fn(answer) -> Verdict`` under ``name`` (e.g. "02.1")."""
    def register(fn):
        if name in _CHECKERS:
            raise ValueError(f"exercise {name!r} is registered twice")
        _CHECKERS[name] = fn
        return fn
    return register


def compare(answer, expected, rtol: float = 1e-6, atol: float = 0.0,
            what: str = "answer") -> Verdict:
    """Numbers, sequences or arrays: exact match → correct; within tolerance → close."""
    if answer is None or answer is ...:
        return Verdict("not attempted", f"set your {what} and run the cell again")
    try:
        a = np.asarray(answer, dtype=float)
        e = np.asarray(expected, dtype=float)
    except (TypeError, ValueError):
        ok = answer == expected
        return Verdict("correct" if ok else "wrong", f"expected {expected!r}, got {answer!r}")
    if a.shape != e.shape:
        return Verdict("wrong", f"expected shape {e.shape}, got {a.shape}")
    if np.array_equal(a, e):
        return Verdict("correct", f"{what} matches exactly")
    if np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        return Verdict("close", f"{what} matches within rtol={rtol}, atol={atol}")
    worst = float(np.nanmax(np.abs(a - e))) if a.size else math.nan
    return Verdict("wrong",
                   f"{what} differs from the expected value (largest difference {worst:.4g})")


def call_reader(fn, *args):
    """Call the reader's function: ``(result, None)``, or ``(None, message)`` if it raised."""
    try:
        return fn(*args), None
    except Exception as err:  # the reader's code may fail in any way; report it
        return None, f"your function raised {type(err).__name__}: {err}"


def not_a_function(answer, example: str) -> Verdict | None:
    """A verdict when ``answer`` is not the reader's function (unset, or a result), else None."""
    if answer is None or answer is ...:
        return Verdict("not attempted", "define your function and pass it (not its result)")
    if not callable(answer):
        return Verdict("wrong", f"pass the function itself, e.g. {example}")
    return None


def _load_all() -> None:
    import pkgutil
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("nb"):
            importlib.import_module(f"{__name__}.{mod.name}")


def checker(name: str) -> Callable[[object], Verdict]:
    _load_all()
    if name not in _CHECKERS:
        raise KeyError(f"no exercise named {name!r}; known: {sorted(_CHECKERS)}")
    return _CHECKERS[name]


def verdict(name: str, answer) -> Verdict:
    """The verdict on ``answer`` for exercise ``name``, without printing."""
    return checker(name)(answer)


def check(name: str, answer) -> None:
    """Check ``answer`` for exercise ``name`` and print the verdict (for notebook cells)."""
    print(f"[{name}] {verdict(name, answer)}")


def all_exercises() -> list[str]:
    _load_all()
    return sorted(_CHECKERS)
