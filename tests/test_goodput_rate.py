"""DistServe's goodput (the highest rate at which a share of requests meets the SLO), worked by hand."""

import math

import pandas as pd
import pytest

from batchlab.analysis.metrics import max_rate_meeting_slo, slo_attainment


def _sweep(rates, good, total=100):
    return pd.DataFrame({"request_rate": rates, "num_good": good, "num_requests": [total] * len(rates)})


def test_the_crossing_is_interpolated_between_the_rates_around_it():
    # attainment 1.0, 0.95, 0.85, 0.5: 0.9 is crossed half way from 2 to 3 req/s.
    sweep = _sweep([1.0, 2.0, 3.0, 4.0], [100, 95, 85, 50])
    assert slo_attainment(sweep).tolist() == [1.0, 0.95, 0.85, 0.5]
    assert max_rate_meeting_slo(sweep, 0.9) == pytest.approx(2.5)
    # A looser target is met further: the first miss of 0.8 is at 4 req/s (0.5), so the
    # crossing lies 0.05 / 0.35 of the way from 3 (0.85) to 4.
    assert max_rate_meeting_slo(sweep, 0.8) == pytest.approx(3 + 0.05 / 0.35)


def test_rows_are_sorted_and_the_first_miss_ends_the_search():
    # Out of order, and attainment comes back above 90% at 5 req/s (noise): the first miss counts.
    sweep = _sweep([5.0, 1.0, 3.0, 2.0], [95, 100, 80, 100])
    assert max_rate_meeting_slo(sweep, 0.9) == pytest.approx(2 + 0.1 / 0.2)


def test_rejected_requests_count_as_misses():
    sweep = pd.DataFrame({"request_rate": [1.0, 2.0], "num_good": [9, 9], "num_requests": [10, 12]})
    assert slo_attainment(sweep).tolist() == pytest.approx([0.9, 0.75])
    assert max_rate_meeting_slo(sweep, 0.9) == pytest.approx(1.0)


def test_edges_say_where_the_answer_lies():
    assert math.isnan(max_rate_meeting_slo(_sweep([1.0, 2.0], [50, 10]), 0.9))   # below the sweep
    with pytest.raises(ValueError, match="sweep higher rates"):
        max_rate_meeting_slo(_sweep([1.0, 2.0], [100, 99]), 0.9)
    with pytest.raises(ValueError, match="target=1.5"):
        max_rate_meeting_slo(_sweep([1.0], [1]), 1.5)
    with pytest.raises(ValueError, match="num_good"):
        slo_attainment(pd.DataFrame({"request_rate": [1.0], "num_requests": [3]}))
    with pytest.raises(ValueError, match="distinct"):
        max_rate_meeting_slo(_sweep([1.0, 1.0], [100, 50]), 0.9)
