"""Which kernels this CPU runs the step's products with (``batchlab.model.cpu_kernels``)."""

from __future__ import annotations

import torch

from batchlab.model.cpu_kernels import cpu_kernel_flags, describe_kernels, kernel_report, parse_onednn_log

AMX_LOG = """onednn_verbose,v1,info,oneDNN v3.12.0 (commit x)
onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and 8-bit integer support
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0 dst:f32::blocked:AB16b64a::f0,,,1536x576,3.0
onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx512_core,forward_inference,src:f32::blocked:ab::f0,,,mb8ic576oc1536,0.1
onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx512_core_amx,forward_inference,src:bf16::blocked:ab::f0,,,mb8ic576oc1536,0.05
"""


def test_the_onednn_log_names_the_isa_and_each_products_kernel():
    found = parse_onednn_log(AMX_LOG)
    assert found["isa"].startswith("Intel AVX-512") and "AMX" in found["isa"]
    assert found == {"isa": found["isa"], "fp32_kernel": "brg_matmul:avx512_core",
                     "bf16_kernel": "brg_matmul:avx512_core_amx"}
    assert parse_onednn_log("no log at all") == {"isa": None, "fp32_kernel": None, "bf16_kernel": None}


def test_cpu_flags_are_read_in_order_and_a_missing_file_gives_none(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu amx_bf16 avx2 sse avx512f amx_tile\n")
    assert cpu_kernel_flags(info) == ["avx2", "avx512f", "amx_tile", "amx_bf16"]
    assert cpu_kernel_flags(tmp_path / "missing") == []


def test_this_machine_reports_the_kernel_it_ran(monkeypatch):
    report = kernel_report()
    assert report["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    if torch.backends.mkldnn.is_available():
        assert report["isa"] and report["fp32_kernel"], report
    line = describe_kernels(report)
    assert f"packed products fp32 {report['fp32_kernel']}" in line
    # Capped at AVX2, oneDNN dispatches to AVX2 kernels whatever the CPU has.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = kernel_report()
    assert capped["onednn_isa_cap"] == "AVX2" and capped["bf16_units"] == []
    if torch.backends.mkldnn.is_available() and "avx2" in report["flags"]:       # an x86 CPU
        assert "AVX2" in capped["isa"] and "avx512" not in capped["fp32_kernel"], capped
