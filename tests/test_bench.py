"""``python -m benchmarks.peer`` keeps working: it runs end to end at its tiny size, writes the JSON
it promises, and batchlab's three engines produce the same greedy tokens. No timing is asserted.

vLLM runs as a contender here too wherever its venv is set up (CI sets it up: ``scripts/test.sh``
runs ``scripts/setup_vllm.sh``, so in CI a missing vLLM is a failure; elsewhere the test checks
instead that the benchmark says how to set it up and runs the others)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks import peer as bench
from benchmarks.peer.config import LABELS, VLLM_CONTENDERS
from benchmarks.peer.vllm_contender import NOT_INSTALLED, vllm_ready

ROOT = Path(__file__).resolve().parent.parent


def _bench_peer_script():
    spec = importlib.util.spec_from_file_location("bench_peer", ROOT / "benchmarks" / "bench_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_benchmark_runs_every_contender_and_writes_its_json(lm, tmp_path, capsys):
    # One torch thread: on a machine shared with other jobs, a thread pool waiting on preempted
    # peers can make a 2-thread run many times slower; the setting is restored afterwards.
    threads_before = torch.get_num_threads()
    out = tmp_path / "results.json"
    argv = ["--tiny", "--threads", "1", "--out", str(out)]
    vllm_ok, vllm_message = vllm_ready()
    if not vllm_ok and os.environ.get("CI"):
        pytest.fail(f"CI sets vLLM up with scripts/setup_vllm.sh, but: {vllm_message}")
    returned = bench.main(argv, lm=lm)
    printed = capsys.readouterr().out
    everything = json.loads(out.read_text())
    assert torch.get_num_threads() == threads_before
    assert everything["dtypes"] == ["float32"] and list(everything["runs"]) == ["float32"]
    data = everything["runs"]["float32"]
    assert data["dtype"] == "float32" and data["limits"]["bound_tok_s"] > 0

    assert data["errors"] == {}, data["errors"]
    expected = set(bench.CONTENDERS) if vllm_ok else set(bench.CONTENDERS) - set(VLLM_CONTENDERS)
    assert set(data["contenders"]) == expected
    if not vllm_ok:
        assert set(data["skipped"]) == set(VLLM_CONTENDERS) and NOT_INSTALLED in printed
    assert everything["command"] == "python -m benchmarks.peer " + " ".join(argv)
    assert data["machine"]["torch_threads"] == 1
    assert len(data["machine"]["loadavg_start"]) == 3 and data["machine"]["cpu_cores_usable"] >= 1
    assert "os.getloadavg()" in printed and everything["command"] in printed
    kernels = data["machine"]["kernels"]                   # which kernels the figures were made with
    assert kernels["fp32_kernel"] and f"packed products fp32 {kernels['fp32_kernel']}" in printed
    assert returned["table"] in printed

    workload = data["workload"]
    assert workload["num_requests"] == bench.TINY["num_requests"]
    wanted = {r["request_id"]: r["max_new_tokens"] for r in workload["requests"]}
    for name, s in data["contenders"].items():
        assert s["label"] in printed
        assert s["num_finished"] == len(wanted) and s["unfinished"] == {}, name
        assert s["output_tokens"] == workload["output_tokens"], name
        assert {r["request_id"]: len(r["output_ids"]) for r in s["requests"]} == wanted, name
        for r in s["requests"]:
            assert len(r["token_times"]) == wanted[r["request_id"]]
            assert r["token_times"] == sorted(r["token_times"])
        assert s["throughput_tok_s"] > 0 and s["wall_seconds"] > 0
        assert 0 <= s["ttft_p50_s"] <= s["ttft_p99_s"] and s["ttft_p50_s"] <= s["e2e_p99_s"]
        assert s["peak_memory_mib"] is None or s["peak_memory_mib"] >= 0
    # Non-streamed contenders hand back a whole batch at once: their first token is seen at the end.
    for name in ("hf_static", "batchlab_static", "batchlab_dynamic"):
        s = data["contenders"][name]
        assert not s["streamed"] and s["ttft_p50_s"] == pytest.approx(s["e2e_p50_s"])
    assert data["contenders"]["hf_continuous"]["throughput_vs_hf_continuous"] == pytest.approx(1.0)
    assert [t["max_batch_tokens"] for t in data["contenders"]["hf_continuous"]["extra"]["tries"]] \
        == list(bench.TINY["hf_batch_tokens"])

    # batchlab's engines compute the same greedy tokens, whatever the batching.
    assert data["greedy_reference"] == "batchlab_continuous"
    for name in bench.BATCHLAB_CONTENDERS:
        agreement = data["greedy_agreement"][name]
        assert agreement["matches"] == agreement["total"] == len(wanted), (name, agreement)
    tokens = {name: {r["request_id"]: r["output_ids"] for r in data["contenders"][name]["requests"]}
              for name in bench.BATCHLAB_CONTENDERS}
    assert tokens["batchlab_static"] == tokens["batchlab_dynamic"] == tokens["batchlab_continuous"]
    if vllm_ok:
        # vLLM, in its own venv, eager and compiled, on the same token ids: fp32 greedy tokens
        # equal batchlab's; the "x vLLM" ratios are to the faster of the two.
        for name, step in (("vllm", "eager"), ("vllm_compiled", "compiled")):
            v = data["contenders"][name]
            assert data["greedy_agreement"][name]["matches"] == len(wanted), data["greedy_agreement"][name]
            assert v["settings"]["dtype"] == "float32" and f"CPU build, {step}" in v["settings"]["engine"]
            assert v["extra"]["load_seconds"] > 0 and v["peak_memory_mib"] is None
        best = data["vllm_reference"]
        assert best == max(VLLM_CONTENDERS, key=lambda n: data["contenders"][n]["throughput_tok_s"])
        assert data["contenders"][best]["throughput_vs_vllm"] == pytest.approx(1.0)
        assert all(data["contenders"][n]["throughput_vs_vllm"] <= 1.0 for n in VLLM_CONTENDERS)
        assert data["contenders"]["batchlab_continuous"]["throughput_vs_vllm"] > 0
        assert f"x vLLM: against {LABELS[best]}" in printed
    # The project's goals are checked outside the library, on the same results.
    goals = _bench_peer_script().goal_report(everything)
    verdicts = [line for line in goals if line.startswith("[")]
    assert len(verdicts) == (6 if vllm_ok else 3), goals
    assert all(line.endswith((": PASS", ": MISS")) for line in verdicts), goals


def test_without_vllm_the_benchmark_says_how_to_set_it_up_and_runs_the_others(lm, tmp_path, capsys,
                                                                              monkeypatch):
    monkeypatch.setenv("BATCHLAB_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    out = tmp_path / "results.json"
    bench.main(["--tiny", "--threads", "1", "--no-warmup", "--only", "vllm,batchlab_continuous",
                "--out", str(out)], lm=lm)
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())["runs"]["float32"]
    assert NOT_INSTALLED in printed and NOT_INSTALLED in data["skipped"]["vllm"]
    assert "scripts/setup_vllm.sh" in printed
    assert data["errors"] == {} and set(data["contenders"]) == {"batchlab_continuous"}
    assert any(line.startswith("vLLM CPU") and "skipped" in line for line in data_table(out))


def data_table(out: Path) -> list[str]:
    return json.loads(out.read_text())["table"].splitlines()


def test_dtype_flag_names_the_bad_value(capsys):
    with pytest.raises(ValueError, match=r"dtype='fp16'; must be one of \['float32', 'bfloat16', 'both'\]"):
        bench.BenchConfig(dtype="fp16")
    assert bench.BenchConfig(dtype="both").dtypes == ("float32", "bfloat16")
    assert bench.BenchConfig(dtype="bfloat16").dtypes == ("bfloat16",)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--dtype", "half"])
    assert exit_info.value.code == 2
    assert "dtype='half'; must be one of ['float32', 'bfloat16', 'both']" in capsys.readouterr().err


def test_greedy_agreement_reports_the_first_differing_position():
    outputs = {"ref": {"a": [1, 2, 3], "b": [4, 5, 6], "c": [7, 8]},
               "other": {"a": [1, 2, 3], "b": [4, 9, 6], "c": [7]}}
    report = bench.greedy_agreement(outputs, "ref")
    assert report["ref"] == {"matches": 3, "total": 3, "mismatches_first_position": {}}
    assert report["other"] == {"matches": 1, "total": 3, "mismatches_first_position": {"b": 1, "c": 1}}


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "batch"}, "mode='batch'"),
    ({"only": ("sglang",)}, "only=('sglang',); must be one or more of ['hf_sequential'"),
    ({"rate": 0}, "rate=0"),
    ({"hf_batch_tokens": ()}, "hf_batch_tokens=()"),
    ({"threads": 0}, "threads=0"),
])
def test_bench_config_names_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        bench.BenchConfig(**kwargs)


def test_peak_memory_sees_a_new_allocation():
    with bench.PeakMemory() as mem:
        block = bytearray(64 * 2**20)   # 64 MiB, written so the pages are really resident
        block[::4096] = b"x" * len(block[::4096])
    if mem.method == "unavailable":
        pytest.skip("neither /proc/self/clear_refs nor psutil is available here")
    assert mem.peak_bytes >= 48 * 2**20, (mem.method, mem.peak_bytes)


def test_bfloat16_run_has_its_own_table_and_ceiling(lm, tmp_path, capsys):
    out = tmp_path / "results.json"
    bench.main(["--tiny", "--threads", "1", "--no-warmup", "--dtype", "bfloat16", "--only", "batchlab_continuous",
                "--out", str(out)], lm=lm)   # lm is fp32: the bf16 model is loaded for this run
    printed = capsys.readouterr().out
    everything = json.loads(out.read_text())
    assert everything["dtypes"] == ["bfloat16"]
    run = everything["runs"]["bfloat16"]
    assert run["dtype"] == run["model"]["dtype"] == "bfloat16" and run["errors"] == {}
    limits = run["limits"]
    assert limits["dtype"] == "torch.bfloat16" and limits["matmul_flops_s"] > 0
    assert limits["weight_bytes"] < 0.6 * 538e6                # bf16: half of the fp32 weights' bytes
    assert limits["fp32_matmul_flops_s"] > 0 and limits["bound_tok_s_at_fp32_peak"] >= limits["bound_tok_s"]
    assert "contender (bfloat16)" in printed and "for any bfloat16 engine" in printed
    s = run["contenders"]["batchlab_continuous"]
    assert s["output_tokens"] == run["workload"]["output_tokens"] and s["unfinished"] == {}
