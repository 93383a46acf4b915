"""One-line verdicts on a notebook's claims: a measured quantity against the bound its prose states.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from batchlab.checks import check_fraction, check_int, fail


def _values(value) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=float).ravel()
    except (TypeError, ValueError):
        arr = None
    if arr is None:
        fail("value", value, "a number or numbers", "expect: the measured value(s)")
    if arr.size == 0:
        fail("value", value, "one or more numbers", "expect: no values to check; an empty table?")
    return arr


def _shown(arr: np.ndarray) -> str:
    if arr.size == 1:
        return f"{arr[0]:.3g}"
    return f"{np.nanmin(arr):.3g} to {np.nanmax(arr):.3g} ({arr.size} values)"


def expect(claim: str, value, *, above: float | None = None, below: float | None = None) -> None:
    """Check that ``value`` (every one of them) is ``> above`` and/or ``< below``; print one line.

    Raises ``AssertionError`` naming the claim, the measured value(s) and the bound when it fails.
    """
    if not isinstance(claim, str) or not claim:
        fail("claim", claim, "a non-empty string", "expect: say in words what is being checked")
    if above is None and below is None:
        raise ValueError("expect: give a bound, above= and/or below=")
    arr = _values(value)
    ok = not np.isnan(arr).any()
    needs = []
    if above is not None:
        ok = ok and bool((arr > above).all())
        needs.append(f"> {above:.3g}")
    if below is not None:
        ok = ok and bool((arr < below).all())
        needs.append(f"< {below:.3g}")
    line = f"{claim}: {_shown(arr)} (needs {' and '.join(needs)})"
    if not ok:
        raise AssertionError(f"FAILED: {line}")
    print(f"ok: {line}")


def expect_close(claim: str, value, target: float, rel_tol: float) -> None:
    """Check that ``value`` (every one) is within ``rel_tol`` of ``target``; print one line."""
    check_fraction("rel_tol", rel_tol, "[0, 1)", hint="expect_close: a share of the target")
    arr = _values(value)
    # Within rel_tol of the target itself (not of the larger of the two, as math.isclose measures).
    ok = (bool(np.isfinite(arr).all())
          and bool((np.abs(arr - target) <= rel_tol * abs(target)).all()))
    line = f"{claim}: {_shown(arr)} (needs {target:.4g} ± {rel_tol:.0%})"
    if not ok:
        raise AssertionError(f"FAILED: {line}")
    print(f"ok: {line}")


def expect_true(claim: str, condition: bool | Iterable[bool], detail: object = "") -> None:
    """Check a yes/no claim (every one, if several); print one line, with ``detail`` if given."""
    conditions = [condition] if isinstance(condition, (bool, np.bool_)) else list(condition)
    if not conditions:
        fail("condition", condition, "a bool or a non-empty list of bools",
             "expect_true: no conditions to check")
    shown = f" ({detail})" if detail != "" else ""
    if not all(bool(c) for c in conditions):
        raise AssertionError(f"FAILED: {claim}{shown}")
    print(f"ok: {claim}{shown}")


def expect_same_answers(claim: str, parted: Mapping, total: int, exact: bool,
                        near_tie: float) -> None:
    """Check that greedy answers stayed the same, as strongly as the dtype allows; print one line.

    ``parted``: answer -> ``(first different token, margin)`` for the answers that parted from
    their lone run (``batchlab.model.divergence.parted_from_alone``), out of ``total`` compared.
    ``exact`` (fp32): none may part. Otherwise (bf16, fp16): each may part only at a near-tie,
    where the lone run's two best tokens were within ``near_tie`` logits.
    """
    check_int("total", total, max(len(parted), 1), hint="expect_same_answers: answers compared")
    same = f"{total - len(parted)} of {total} identical"
    if exact:
        detail = f"needs all; parted (token, margin): {dict(parted)}" if parted else "needs all"
        expect_true(f"{claim}: {same}", not parted, detail)
        return
    margins = [margin for _, margin in parted.values()]
    shown = (f"; {len(parted)} parted at a margin of {_shown(np.array(margins))} logits"
             if parted else "")
    expect_true(f"{claim}: {same}{shown}", [m < near_tie for m in margins] or [True],
                f"needs each parting at a margin < {near_tie:g}")
