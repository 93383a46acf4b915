"""Shared fixtures: the real embedded model is loaded once per test session."""

import pytest


@pytest.fixture(scope="session")
def lm():
    from batchlab.model import load_model
    return load_model()


@pytest.fixture(scope="session")
def weights(lm):
    from batchlab.model.llama import LlamaWeights
    return LlamaWeights.from_hf(lm.model)


@pytest.fixture(scope="session")
def vllm_ready():
    """vLLM's venv is set up: skipped without it (with the command that sets it up); in CI,
    which sets it up, a missing vLLM is a failure."""
    import os

    from batchlab.vllm_ref import vllm_status
    ok, message = vllm_status()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI sets vLLM up with scripts/setup_vllm.sh, but: {message}")
        pytest.skip(message)


def pytest_configure(config):
    # The tests draw figures without a screen. (Notebook kernels keep the inline backend.)
    import matplotlib
    matplotlib.use("Agg")
