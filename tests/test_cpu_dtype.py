"""dtype="auto" on a CPU: fp32 without bf16 matrix units; with them, bf16 only if measured faster."""

import json

from batchlab.model import cpu_dtype
from batchlab.model.cpu_dtype import PROBE_ROWS, cpu_bf16_flags, pick_cpu_dtype, probe_cpu_dtypes


def fake_cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx2 {flags}\n")
    return path


def test_flags_are_read_from_cpuinfo(tmp_path):
    assert cpu_bf16_flags(fake_cpuinfo(tmp_path, "")) == []
    assert cpu_bf16_flags(fake_cpuinfo(tmp_path, "amx_tile amx_bf16 avx512_bf16")) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16_flags(tmp_path / "missing") == []


def test_no_bf16_units_means_fp32_and_nothing_is_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_dtype, "probe_cpu_dtypes", lambda: (_ for _ in ()).throw(AssertionError))
    cache = tmp_path / "probe.json"
    assert pick_cpu_dtype(cache, fake_cpuinfo(tmp_path, "")) == "float32"
    assert not cache.exists()


def test_the_probe_measures_both_dtypes_at_both_sizes():
    result = probe_cpu_dtypes(repeats=1)
    for name in ("float32", "bfloat16"):
        assert set(result["seconds"][name]) == {str(r) for r in PROBE_ROWS}
        assert all(s > 0 for s in result["seconds"][name].values())
    times = result["seconds"]
    assert result["bf16_faster"] == all(times["bfloat16"][str(r)] < times["float32"][str(r)]
                                        for r in PROBE_ROWS)


def test_with_bf16_units_the_saved_verdict_decides_and_is_measured_once(tmp_path, monkeypatch):
    calls = []
    verdicts = iter([True, False])
    monkeypatch.setattr(cpu_dtype, "probe_cpu_dtypes",
                        lambda: calls.append(1) or {"seconds": {}, "bf16_faster": next(verdicts)})
    info, cache = fake_cpuinfo(tmp_path, "avx512_bf16"), tmp_path / "probe.json"
    assert pick_cpu_dtype(cache, info) == "bfloat16"
    assert pick_cpu_dtype(cache, info) == "bfloat16"          # read back, not measured again
    assert len(calls) == 1 and len(json.loads(cache.read_text())) == 1
    cache.write_text("{not json")                              # a damaged file is measured again
    assert pick_cpu_dtype(cache, info) == "float32" and len(calls) == 2
