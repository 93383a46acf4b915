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
