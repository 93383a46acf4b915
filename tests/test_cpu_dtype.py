"""dtype="auto" on a CPU: fp32 without bf16 matrix units; with them, bf16 only if measured faster."""

import json

import pytest

from batchlab.model import cpu_dtype
from batchlab.model.cpu_dtype import PROBE_ROWS, cpu_bf16_flags, pick_cpu_dtype, probe_cpu_dtypes


@pytest.fixture
def no_isa_cap(monkeypatch):
    """For tests of fake CPUs' flags: a cap set for the whole run (check_machine_shapes) would hide
    them. (oneDNN itself keeps the cap it read at start-up.)"""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


def fake_cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx2 {flags}\n")
    return path


def test_flags_are_read_from_cpuinfo(tmp_path, no_isa_cap):
    assert cpu_bf16_flags(fake_cpuinfo(tmp_path, "")) == []
    assert cpu_bf16_flags(fake_cpuinfo(tmp_path, "amx_tile amx_bf16 avx512_bf16")) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16_flags(tmp_path / "missing") == []


def test_no_bf16_units_means_fp32_and_nothing_is_measured(tmp_path, monkeypatch, no_isa_cap):
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


def test_with_bf16_units_the_saved_verdict_decides_and_is_measured_once(tmp_path, monkeypatch, no_isa_cap):
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


@pytest.mark.parametrize("cap, expected", [("AVX2", []), ("avx512_core", []),
                                           ("AVX512_CORE_BF16", ["avx512_bf16"]),
                                           ("AVX512_CORE_AMX", ["amx_bf16", "avx512_bf16"]),
                                           ("ALL", ["amx_bf16", "avx512_bf16"]), ("", ["amx_bf16", "avx512_bf16"])])
def test_onednn_isa_cap_hides_the_units_it_excludes(tmp_path, monkeypatch, cap, expected):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_bf16_flags(fake_cpuinfo(tmp_path, "amx_tile amx_bf16 avx512_bf16")) == expected


def test_products_are_timed_warm_by_the_steps_route():
    import torch
    w = torch.randn(576, 1536).to(torch.float32)
    timer = cpu_dtype.product_timer(w, rows=4)          # already warmed up: a steady-state call
    assert cpu_dtype.best_seconds(timer, 3) > 0
    assert torch.allclose(timer(), torch.randn(4, 576, generator=torch.Generator().manual_seed(1)) @ w,
                          atol=1e-4)
