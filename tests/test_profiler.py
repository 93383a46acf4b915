"""The step profiler and the machine measurements it rests on (no timing is compared)."""

import math

import pytest

from batchlab.model.profiler import measure_bandwidth, measure_matmul_flops, profile_steps


def test_machine_measurements_are_positive_and_check_their_sizes():
    bandwidth = measure_bandwidth(num_bytes=8 * 2**20, repeats=2)
    flops = measure_matmul_flops(size=256, repeats=2)
    assert math.isfinite(bandwidth) and bandwidth > 0
    assert math.isfinite(flops) and flops > 0
    with pytest.raises(ValueError, match="num_bytes=1000"):
        measure_bandwidth(num_bytes=1000)
    with pytest.raises(ValueError, match="size=8"):
        measure_matmul_flops(size=8)


def test_profile_steps_measures_every_shape_asked_for(weights):
    df = profile_steps(weights, batch_sizes=(1, 3), context_len=16, prefill_sizes=(8,),
                       context_lens=(32,), context_batch=2, repeats=1, bandwidth=20e9)
    assert list(df.kind) == ["decode", "decode", "prefill", "context"]
    assert list(df.batch_size) == [1, 3, 1, 2] and list(df.num_tokens) == [1, 3, 8, 2]
    assert list(df.context_len) == [16, 16, 0, 32]
    # The floor is the weight bytes over the given bandwidth, the same for every row.
    assert df.floor_ms.tolist() == pytest.approx([weights.num_bytes() / 20e9 * 1e3] * 4)
    assert (df.ms_per_step > 0).all()
    assert df.ms_per_token.tolist() == pytest.approx((df.ms_per_step / df.num_tokens).tolist())
    assert df.attrs["bandwidth_GBps"] == pytest.approx(20.0)


def test_profile_steps_rejects_bad_sizes(weights):
    with pytest.raises(ValueError, match=r"batch_sizes\[\d+\]=0; must be an int >= 1"):
        profile_steps(weights, batch_sizes=(1, 0), bandwidth=20e9)
    with pytest.raises(ValueError, match="repeats=0"):
        profile_steps(weights, batch_sizes=(1,), repeats=0, bandwidth=20e9)
