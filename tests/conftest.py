"""Shared fixtures: the real embedded model is loaded once per test session."""

import os

import pytest


@pytest.fixture(scope="session")
def lm():
    from batchlab.model import load_model
    from batchlab.model.cpu_threads import usable_cpus
    # Two at a time (scripts/test.sh's first pass), each worker takes its share of the cores:
    # two workers of two threads each on two cores would wait on each other at every product.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return load_model(threads=max(1, len(usable_cpus()) // workers) if workers > 1 else None)


@pytest.fixture(scope="session")
def weights(lm):
    from batchlab.model.llama import LlamaWeights
    return LlamaWeights.from_hf(lm.model)


@pytest.fixture(scope="session")
def vllm_ready():
    """vLLM's venv is set up: skipped without it (with the command that sets it up); in CI,
    which sets it up, a missing vLLM is a failure."""
    import os

    from batchlab.launch import vllm_status
    ok, message = vllm_status()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI sets vLLM up with scripts/setup_vllm.sh, but: {message}")
        pytest.skip(message)


# Modules whose tests time nothing on the wall clock: answers, numerics, simulations on a virtual
# clock, files and refusals. scripts/test.sh runs them two at a time (pytest -n 2 -m parallel);
# everything else (a claim about measured time, a server on the wall clock, vLLM, the notebooks)
# runs alone afterwards, so no test's timing shares the CPU with another test. A new module runs
# alone until it is named here.
PARALLEL_MODULES = {
    # servers and vLLM, checked on answers, counts and files, not on speed
    "test_aiperf", "test_bench", "test_cli", "test_openai_sdk", "test_pd_loopback", "test_vllm_dashboards",
    "test_vllm_ref",
    # answers, numerics, simulations on a virtual clock, files and refusals
    "test_architecture", "test_batched_step", "test_batches", "test_bf16_step", "test_calibration", "test_capstone",
    "test_checks", "test_claims", "test_cluster", "test_colab_path", "test_cost_model", "test_cpu_dtype", "test_detok",
    "test_device_profiles", "test_diagnosis", "test_disaggregated", "test_divergence", "test_dtype_switch",
    "test_exercises", "test_generate", "test_goodput_rate", "test_gpu_check", "test_gpu_presets",
    "test_kv_blocks", "test_measured_kernels", "test_metrics", "test_model_loading", "test_model_shapes",
    "test_notebooks_policy", "test_packaging", "test_paged_kv_cache", "test_plots", "test_predict",
    "test_prefill_stall", "test_readme", "test_recommend", "test_request_life", "test_roofline",
    "test_sampling", "test_schedulers", "test_scripted_workloads", "test_setup_scripts", "test_site",
    "test_speculative", "test_stored_calibration", "test_sweeps", "test_trace_io", "test_vllm_sim", "test_workloads",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "parallel: times nothing on the wall clock; scripts/test.sh runs these "
                                       "two at a time (tests/conftest.py: PARALLEL_MODULES)")
    # The tests draw figures without a screen. (Notebook kernels keep the inline backend.)
    import matplotlib
    matplotlib.use("Agg")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name == "tests" and item.path.stem in PARALLEL_MODULES:
            item.add_marker(pytest.mark.parallel)
