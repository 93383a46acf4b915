"""Argument checks shared by every module, so a bad value always gets the same kind of message.

Each check raises ``ValueError`` naming the argument, the value given and what is allowed, e.g.
``max_num_seqs=0; must be an int >= 1``; ``hint`` adds why, in the caller's words. Booleans are
never accepted as numbers (``True`` is an ``int`` in Python, but ``batch_size=True`` is a mistake).
"""

from __future__ import annotations

import math
import numbers


def is_int(value: object) -> bool:
    """True for Python and numpy integers, False for bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """True for finite real numbers (ints or floats, numpy's too), False for bools."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def _fail(name: str, value: object, allowed: str, hint: str) -> None:
    raise ValueError(f"{name}={value!r}; must be {allowed}" + (f" ({hint})" if hint else ""))


def check_int(name: str, value: object, minimum: int = 1, *, allow_none: bool = False,
              hint: str = "") -> None:
    """``value`` is an int >= ``minimum`` (or None, when ``allow_none``)."""
    if value is None and allow_none:
        return
    if not is_int(value) or value < minimum:
        _fail(name, value, f"an int >= {minimum}" + (" or None" if allow_none else ""), hint)


def check_number(name: str, value: object, minimum: float = 0.0, *, strict: bool = False,
                 allow_none: bool = False, hint: str = "") -> None:
    """``value`` is a finite number >= ``minimum`` (> with ``strict``), or None when ``allow_none``."""
    if value is None and allow_none:
        return
    if not is_number(value) or value < minimum or (strict and value == minimum):
        bound = f"{'>' if strict else '>='} {minimum:g}"
        _fail(name, value, f"a finite number {bound}" + (" or None" if allow_none else ""), hint)


def check_bool(name: str, value: object) -> None:
    """``value`` is True or False."""
    if not isinstance(value, bool):
        _fail(name, value, "True or False", "")
