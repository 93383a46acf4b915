"""A stored calibration is reused only while fresh steps confirm it, and stored per machine and setup."""

from __future__ import annotations

import json
import time

import pytest

from batchlab.backends import CostModel, ModelBackend
from batchlab.experiments import calibration
from batchlab.experiments.calibration import (REUSE_ERROR, REUSE_MAX_AGE_S, calibrate_cost_model,
                                              checked_stored_fit, stored_fit_path, write_stored_fit)
from batchlab.plan import ScheduledChunk
from batchlab.trace import StepRecord

STORED = CostModel(0.03, 0.001, 0.0015, 2e-7, source="stored", fit_stats={"num_steps": 200, "median_rel_error": 0.03})


@pytest.fixture
def backend(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    return ModelBackend(lm, num_slots=4, max_seq_len=512)


def steps_off_by(factor):
    """Decode batches of 1-16 sequences and lone prompts of 32-384 tokens, each taking ``factor``
    times what STORED predicts for it."""
    shapes = [[ScheduledChunk(f"d{j}", 40 + i, 1, True) for j in range(n)] for i, n in enumerate((1, 2, 4, 8, 16))]
    shapes += [[ScheduledChunk("p", 0, n, False)] for n in (32, 64, 128, 256, 384)]
    return [StepRecord(i, 0.0, STORED.predict(chunks) * factor, chunks) for i, chunks in enumerate(shapes)]


@pytest.mark.parametrize("factor", [1.0, 1 + REUSE_ERROR / 2, 1 / (1 + REUSE_ERROR / 2)])
def test_a_stored_fit_that_predicts_fresh_steps_is_reused_and_says_so(backend, monkeypatch, factor):
    path = stored_fit_path(backend)
    write_stored_fit(path, STORED)
    monkeypatch.setattr(calibration, "check_steps", lambda *a, **k: steps_off_by(factor))
    cost = checked_stored_fit(backend, path)
    assert cost.coefficients == STORED.coefficients and cost.source == "stored"
    assert cost.fit_stats["checked_steps"] == 10
    assert cost.fit_stats["checked_error"] == pytest.approx(abs(1 / factor - 1))
    assert cost.fit_stats["median_rel_error"] == 0.03 and cost.fit_stats["stored_minutes_ago"] < 1
    assert "checked on" in repr(cost)


@pytest.mark.parametrize("factor", [1.25, 0.75, 3.0])
def test_a_stored_fit_that_misses_fresh_steps_is_not_reused(backend, monkeypatch, factor):
    path = stored_fit_path(backend)
    write_stored_fit(path, STORED)
    monkeypatch.setattr(calibration, "check_steps", lambda *a, **k: steps_off_by(factor))
    assert checked_stored_fit(backend, path) is None


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"cost_model": {"fixed_s": 1}}),
                                     "old"], ids=["missing", "damaged", "incomplete", "too old"])
def test_a_missing_damaged_or_old_fit_is_not_checked(backend, monkeypatch, content):
    path = stored_fit_path(backend)
    if content == "old":
        write_stored_fit(path, STORED)
        stored = json.loads(path.read_text())
        stored["stored_at"] = time.time() - REUSE_MAX_AGE_S - 60
        path.write_text(json.dumps(stored))
    elif content is not None:
        path.parent.mkdir(parents=True)
        path.write_text(content)

    def measure(*args, **kwargs):
        raise AssertionError("a fit that cannot be reused is not checked")
    monkeypatch.setattr(calibration, "check_steps", measure)
    assert checked_stored_fit(backend, path) is None


def test_each_machine_setup_has_its_own_stored_fit(lm, backend, monkeypatch):
    path = stored_fit_path(backend)
    assert path.parent.parent == calibration.cache_root()
    assert path == stored_fit_path(ModelBackend(lm, num_slots=4, max_seq_len=512))   # the same setup
    others = [stored_fit_path(ModelBackend(lm, num_slots=8, max_seq_len=512)),
              stored_fit_path(ModelBackend(lm, num_slots=4, max_seq_len=256)),
              stored_fit_path(ModelBackend(lm, num_slots=4, max_seq_len=512, paged=True)),
              stored_fit_path(backend, num_requests=12), stored_fit_path(backend, seed=1)]
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    others.append(stored_fit_path(backend))
    assert len({path, *others}) == len(others) + 1


def test_a_wrong_stored_fit_is_measured_anew_and_replaced(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    # Short slots keep it quick: the lone prompts stop at 62 tokens.
    backend = ModelBackend(lm, num_slots=4, max_seq_len=64)
    # A fit three times too fast: fresh steps miss it on any machine, quiet or busy (busy is slower).
    too_fast = CostModel(*(c / 3 for c in STORED.coefficients), source="too fast")
    path = stored_fit_path(backend, num_requests=4)
    write_stored_fit(path, too_fast)
    cost = calibrate_cost_model(backend, num_requests=4, reuse=True)
    assert cost.source != "too fast" and "checked_error" not in cost.fit_stats
    assert cost.fit_stats["num_steps"] > 20
    stored = json.loads(path.read_text())
    assert CostModel.from_dict(stored["cost_model"]) == cost          # the new fit is the stored one now
    assert stored["setup"]["max_seq_len"] == 64 and stored["setup"]["num_requests"] == 4
