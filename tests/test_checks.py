"""The shared argument checks: one message form, ``name=value; must be ...``, always ValueError."""

import math

import numpy as np
import pandas as pd
import pytest

from batchlab.checks import (
    check_bool, check_callable, check_choice, check_fraction, check_instance, check_int, check_list,
    check_number, fail, is_int, is_number, shown,
)
from batchlab.requests import SamplingParams


def test_is_int_and_is_number_refuse_bools():
    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(3.0)
    assert is_number(2.5) and is_number(np.float32(1)) and not is_number(False)
    assert not is_number(math.nan) and not is_number(math.inf) and not is_number("1")


def test_fail_has_the_shared_form():
    with pytest.raises(ValueError, match=r"^x=3; must be small \(why\)$"):
        fail("x", 3, "small", "why")
    with pytest.raises(ValueError, match=r"^x='a'; must be small$"):
        fail("x", "a", "small")


def test_long_values_are_shown_on_one_short_line():
    text = shown(pd.DataFrame({"a": range(100)}))
    assert "\n" not in text and text.endswith("[100 rows x 1 columns]")
    text = shown(list(range(1000)))
    assert len(text) == 120 and text.startswith("[0, 1, 2") and text.endswith("...")
    assert shown([1, 2]) == "[1, 2]"


@pytest.mark.parametrize("call, message", [
    (lambda: check_int("n", 0), r"^n=0; must be an int >= 1$"),
    (lambda: check_int("n", True), r"^n=True; must be an int >= 1$"),
    (lambda: check_int("n", -1, minimum=0, allow_none=True), r"^n=-1; must be an int >= 0 or None$"),
    (lambda: check_int("seed", 1.5, minimum=None), r"^seed=1.5; must be an int$"),
    (lambda: check_number("t", -1, hint="seconds"), r"^t=-1; must be a finite number >= 0 \(seconds\)$"),
    (lambda: check_number("t", 0, strict=True), r"^t=0; must be a finite number > 0$"),
    (lambda: check_number("t", math.inf), r"^t=inf; must be a finite number >= 0$"),
    (lambda: check_number("rate", math.nan, strict=True, allow_inf=True),
     r"^rate=nan; must be a number > 0 or math.inf$"),
    (lambda: check_number("p", 101, maximum=100), r"^p=101; must be a finite number in \[0, 100\]$"),
    (lambda: check_fraction("top_p", 0), r"^top_p=0; must be a number in \(0, 1\]$"),
    (lambda: check_fraction("tol", 1, "[0, 1)"), r"^tol=1; must be a number in \[0, 1\)$"),
    (lambda: check_fraction("tol", 0.5, "0..1"), r"^interval='0..1'; must be one of"),
    (lambda: check_bool("flag", 1), r"^flag=1; must be True or False$"),
    (lambda: check_choice("unit", "us", ("ms", "s")), r"^unit='us'; must be one of \['ms', 's'\]$"),
    (lambda: check_choice("unit", np.array([1, 2]), ("ms",)), r"^unit=array\(\[1, 2\]\); must be one of"),
    (lambda: check_instance("trace", [1], pd.DataFrame, "a DataFrame"),
     r"^trace=\[1\]; must be a DataFrame \(got list\)$"),
    (lambda: check_instance("x", 3, str, "a string", allow_none=True, hint="an id"),
     r"^x=3; must be a string or None \(an id; got int\)$"),
    (lambda: check_callable("fn", 3, "a function"), r"^fn=3; must be a function$"),
    (lambda: check_list("rates", "12", "a non-empty list"), r"^rates='12'; must be a non-empty list$"),
    (lambda: check_list("rates", iter([]), "a non-empty list"), r"^rates=\[\]; must be a non-empty list$"),
])
def test_each_check_names_the_value_and_what_is_allowed(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_good_values_pass():
    check_int("n", np.int64(4))
    check_int("n", None, allow_none=True)
    check_int("seed", -7, minimum=None)
    check_number("rate", math.inf, strict=True, allow_inf=True)
    check_number("p", 100, maximum=100)
    check_fraction("top_p", 1)
    check_fraction("tol", 0, "[0, 1)")
    check_choice("unit", "ms", {"ms": 1e3, "s": 1.0})
    check_instance("x", None, str, "a string", allow_none=True)
    check_callable("fn", len, "a function")
    assert check_list("rates", (r for r in (1, 2)), "a list") == [1, 2]


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), r"temperature=-1; must be a finite number >= 0 \(0 = greedy\)"),
    (dict(temperature=True), r"temperature=True; must be a finite number >= 0"),
    (dict(top_p=1.5), r"top_p=1.5; must be a number in \(0, 1\]"),
    (dict(seed=1.5), r"seed=1.5; must be an int or None"),
])
def test_sampling_params_use_the_shared_checks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    assert SamplingParams(0.7, 0.9, seed=-3).seed == -3
