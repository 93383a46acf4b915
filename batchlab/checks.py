"""Argument checks shared by every module, so a bad value always gets the same kind of message.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any, NoReturn

_MAX_SHOWN = 120                 # longest repr of a value shown in a message
_INTERVALS = {"(0, 1]": (False, True), "[0, 1)": (True, False),
              "[0, 1]": (True, True), "(0, 1)": (False, False)}   # closed at 0?, closed at 1?


def is_int(value: object) -> bool:
    """True for Python and numpy integers, False for bools."""
    if type(value) is int:                  # the common case, without the ABC's slower check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """True for finite real numbers (ints or floats, numpy's too), False for bools."""
    if isinstance(value, float):             # (numpy's float64 too) the common case, checked fast
        return math.isfinite(value)
    if type(value) is int:
        return True
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def shown(value: object) -> str:
    """``repr(value)`` on one line and at most about 120 characters (a DataFrame stays readable)."""
    text = repr(value)
    if "\n" in text:
        text = " ".join(text.split())
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."


def fail(name: str, value: object, allowed: str, hint: str = "") -> NoReturn:
    """Raise the shared ``ValueError``: ``name=value; must be allowed (hint)``.

    For checks the helpers below do not cover, so their message has the same form.
    """
    raise ValueError(f"{name}={shown(value)}; must be {allowed}" + (f" ({hint})" if hint else ""))


def check_int(name: str, value: object, minimum: int | None = 1, *, allow_none: bool = False,
              hint: str = "") -> None:
    """``value`` is an int >= ``minimum`` (any int when ``minimum`` is None), or None when
    ``allow_none``."""
    if value is None and allow_none:
        return
    if not is_int(value) or (minimum is not None and value < minimum):
        allowed = "an int" + (f" >= {minimum}" if minimum is not None else "")
        fail(name, value, allowed + (" or None" if allow_none else ""), hint)


def check_number(name: str, value: object, minimum: float = 0.0, *, strict: bool = False,
                 maximum: float | None = None, allow_inf: bool = False, allow_none: bool = False,
                 hint: str = "") -> None:
    """``value`` is a finite number >= ``minimum`` (> with ``strict``) and <= ``maximum`` (when
    given), or None when ``allow_none``. ``allow_inf`` also accepts ``math.inf`` (with no
    ``maximum``)."""
    if value is None and allow_none:
        return
    real = (type(value) in (float, int)
            or (isinstance(value, numbers.Real) and not isinstance(value, bool)))
    ok = (real and (math.isfinite(value) or (allow_inf and maximum is None and value == math.inf))
          and (value > minimum if strict else value >= minimum)
          and (maximum is None or value <= maximum))
    if not ok:
        if maximum is None:
            allowed = (f"a {'' if allow_inf else 'finite '}number "
                       f"{'>' if strict else '>='} {minimum:g}")
            allowed += " or math.inf" if allow_inf else ""
        else:
            allowed = f"a finite number in {'(' if strict else '['}{minimum:g}, {maximum:g}]"
        fail(name, value, allowed + (" or None" if allow_none else ""), hint)


def check_fraction(name: str, value: object, interval: str = "(0, 1]", *, hint: str = "") -> None:
    """``value`` is a number in ``interval``: ``"(0, 1]"`` (a share that cannot be 0, the default),
    ``"[0, 1)"``, ``"[0, 1]"`` or ``"(0, 1)"``."""
    if interval not in _INTERVALS:
        fail("interval", interval, f"one of {list(_INTERVALS)}")
    closed_low, closed_high = _INTERVALS[interval]
    if not (is_number(value) and (value >= 0 if closed_low else value > 0)
            and (value <= 1 if closed_high else value < 1)):
        fail(name, value, f"a number in {interval}", hint)


def check_bool(name: str, value: object) -> None:
    """``value`` is True or False."""
    if not isinstance(value, bool):
        fail(name, value, "True or False")


def check_choice(name: str, value: object, allowed: Iterable[Any], *, hint: str = "") -> None:
    """``value`` is one of ``allowed`` (compared with ``==``; an unhashable value is not one)."""
    options = list(allowed)
    try:
        ok = value in options
    except (TypeError, ValueError):          # e.g. an array, whose == is elementwise
        ok = False
    if not ok:
        fail(name, value, f"one of {options!r}", hint)


def check_instance(name: str, value: object, cls: type | tuple[type, ...], what: str, *,
                   allow_none: bool = False, hint: str = "") -> None:
    """``value`` is an instance of ``cls`` (or None when ``allow_none``); ``what`` says so in
    words, e.g. ``"a batchlab Trace"``. The message also names the type that was given."""
    if (value is None and allow_none) or isinstance(value, cls):
        return
    got = f"got {type(value).__name__}"
    fail(name, value, what + (" or None" if allow_none else ""), f"{hint}; {got}" if hint else got)


def check_callable(name: str, value: object, what: str, *, hint: str = "") -> None:
    """``value`` can be called; ``what`` says what kind of function is wanted, e.g.
    ``"a function rate -> list of Request"``."""
    if not callable(value):
        fail(name, value, what, hint)


def check_list(name: str, value: object, what: str, *, hint: str = "") -> list:
    """``value`` is a non-empty collection (not a string); returns its items as a list.

    ``what`` says what the items are, e.g. ``"a non-empty list of request rates"``. Check the
    items themselves with the other helpers, naming them ``f"{name}[{i}]"``.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        fail(name, value, what, hint)
    items = list(value)
    if not items:
        fail(name, items, what, hint)
    return items
