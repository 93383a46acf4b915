"""batchlab.analysis.claims: a claim passes with one printed line, fails with the same line."""

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.claims import expect, expect_close, expect_same_answers, expect_true


def test_expect_prints_one_line_with_the_value_and_the_bound(capsys):
    expect("TTFT grows", 8.31, above=3)
    assert capsys.readouterr().out == "ok: TTFT grows: 8.31 (needs > 3)\n"


def test_expect_checks_every_value_and_shows_the_range(capsys):
    expect("ratios", pd.Series([1.2, 1.5, 2.0]), above=1.0, below=2.5)
    assert capsys.readouterr().out == "ok: ratios: 1.2 to 2 (3 values) (needs > 1 and < 2.5)\n"
    with pytest.raises(AssertionError, match=r"FAILED: ratios: 0.9 to 2 \(3 values\) \(needs > 1\)"):
        expect("ratios", np.array([0.9, 1.5, 2.0]), above=1.0)


def test_expect_fails_on_nan_and_on_the_upper_bound():
    with pytest.raises(AssertionError):
        expect("x", float("nan"), above=0)
    with pytest.raises(AssertionError, match="needs < 0.5"):
        expect("x", 0.5, below=0.5)          # strict: equal to the bound is not below it


def test_expect_rejects_bad_calls():
    with pytest.raises(ValueError, match="give a bound"):
        expect("x", 1.0)
    with pytest.raises(ValueError, match="claim=''; must be a non-empty string"):
        expect("", 1.0, above=0)
    with pytest.raises(ValueError, match=r"value=\[\]; must be one or more numbers \(expect: no values"):
        expect("x", [], above=0)
    with pytest.raises(ValueError, match="value='fast'; must be a number or numbers"):
        expect("x", "fast", above=0)


def test_expect_close_and_expect_true(capsys):
    expect_close("sim / real", [0.9, 1.1], 1.0, rel_tol=0.35)
    assert capsys.readouterr().out == "ok: sim / real: 0.9 to 1.1 (2 values) (needs 1 ± 35%)\n"
    with pytest.raises(AssertionError, match="FAILED: sim / real: 0.6"):
        expect_close("sim / real", 0.6, 1.0, rel_tol=0.35)
    with pytest.raises(AssertionError, match="FAILED: sim / real: 1.38"):   # 35% of the target, not of 1.38
        expect_close("sim / real", 1.377, 1.0, rel_tol=0.35)
    with pytest.raises(ValueError, match=r"rel_tol=1.5; must be a number in \[0, 1\)"):
        expect_close("x", 1.0, 1.0, rel_tol=1.5)
    expect_true("same requests", [True, True], "2 runs")
    assert capsys.readouterr().out == "ok: same requests (2 runs)\n"
    with pytest.raises(AssertionError, match="FAILED: same requests"):
        expect_true("same requests", False)


def test_expect_same_answers_is_exact_in_fp32_and_allows_only_near_ties_otherwise(capsys):
    expect_same_answers("fp32", {}, 4, exact=True, near_tie=0.5)
    assert "4 of 4 identical" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="3 of 4 identical"):
        expect_same_answers("fp32", {"r1": (7, 0.0)}, 4, exact=True, near_tie=0.5)
    expect_same_answers("bf16", {"r1": (7, 0.125), "r2": (3, 0.0)}, 4, exact=False, near_tie=0.5)
    assert "2 parted at a margin of 0 to 0.125" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="margin of 0.75"):
        expect_same_answers("bf16", {"r1": (7, 0.75)}, 4, exact=False, near_tie=0.5)
    with pytest.raises(ValueError, match="total"):
        expect_same_answers("bf16", {"r1": (7, 0.0), "r2": (1, 0.0)}, 1, exact=False, near_tie=0.5)
