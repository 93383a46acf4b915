"""One request's life read back from a trace: the glossary's numbers, and its picture."""

import math

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from batchlab.analysis import metrics  # noqa: E402
from batchlab.analysis.request_life import plot_request_life, request_life  # noqa: E402
from batchlab.requests import RequestStatus  # noqa: E402
from batchlab.trace import RequestRecord, Trace  # noqa: E402


def _trace() -> Trace:
    done = RequestRecord("a", arrival_time=1.0, prompt_len=8, max_new_tokens=4,
                         status=RequestStatus.FINISHED, finish_reason="length",
                         first_scheduled_time=1.5, token_times=[1.75, 1.85, 2.25, 2.35],
                         release_time=2.35, streamed=True)
    rejected = RequestRecord("b", 1.2, 8, 4, RequestStatus.REJECTED, "too_long", None, [], None, True)
    return Trace(requests=[done, rejected])


def test_request_life_splits_ttft_into_queue_and_prefill_and_matches_metrics():
    life = request_life(_trace(), "a")
    assert life["queue"] == pytest.approx(0.5) and life["prefill"] == pytest.approx(0.25)
    assert life["ttft"] == pytest.approx(life["queue"] + life["prefill"])
    assert life["gaps"] == pytest.approx([0.1, 0.4, 0.1])
    assert life["tpot"] == pytest.approx(0.2) and life["e2e"] == pytest.approx(1.35)
    row = metrics.per_request_metrics(_trace()).set_index("request_id").loc["a"]
    assert row.ttft == pytest.approx(life["ttft"]) and row.tpot == pytest.approx(life["tpot"])
    assert row.e2e == pytest.approx(life["e2e"]) and row.itl_max == pytest.approx(life["gaps"].max())


def test_a_one_token_request_has_no_tpot_and_bad_ids_are_named():
    one = RequestRecord("c", 0.0, 8, 1, RequestStatus.FINISHED, "length", 0.0, [0.3], 0.3, True)
    assert math.isnan(request_life(Trace(requests=[one]), "c")["tpot"])
    with pytest.raises(ValueError, match="'zz'"):
        request_life(_trace(), "zz")
    with pytest.raises(ValueError, match="'b' did not finish"):
        request_life(_trace(), "b")


def test_plot_request_life_draws_ttft_and_e2e():
    ax = plot_request_life(_trace(), "a")
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "TTFT 750 ms" in texts and "E2E 1350 ms" in texts and "longest gap (ITL) 400 ms" in texts


@pytest.mark.parametrize("max_new, min_tokens, already, stop", [
    (5, 0, 0, False), (5, 0, 0, True), (5, 3, 0, True), (5, 5, 0, True), (5, 0, 2, True), (7, 4, 5, True),
    (1, 0, 0, True), (6, 2, 3, False)])
def test_the_end_rule_run_ahead_agrees_with_the_rule_token_by_token(max_new, min_tokens, already, stop):
    """``tokens_to_end`` (the fast path's run length) ends a request where ``ends_on`` (each step's
    check) does, with and without the token among its stop tokens, before and after ``min_tokens``."""
    from batchlab.requests import FinishReason, Request, SamplingParams
    token = 7
    req = Request("r", [1, 2], max_new, sampling=SamplingParams(min_tokens=min_tokens),
                  stop_token_ids=(token,) if stop else ())
    req.output_ids += [3] * already
    ahead = req.tokens_to_end(token)
    for n in range(1, ahead + 1):
        req.output_ids.append(token)
        reason = req.ends_on(token)
        assert (reason is None) == (n < ahead), (n, ahead, reason)
    assert reason is (FinishReason.STOP if stop and len(req.output_ids) >= min_tokens else FinishReason.LENGTH)
