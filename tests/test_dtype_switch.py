"""The course-wide switch: BATCHLAB_DTYPE and BATCHLAB_DEVICE, honoured by load_model when left at "auto"."""

import pytest
import torch

from batchlab.model import loading
from batchlab.model.loading import ALLOWED_DEVICES, ALLOWED_DTYPES, DEVICE_ENV, DTYPE_ENV, from_environment


def test_auto_follows_the_variable_and_an_explicit_argument_wins(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    assert from_environment("auto", DTYPE_ENV, ALLOWED_DTYPES) == "bfloat16"
    assert from_environment("float32", DTYPE_ENV, ALLOWED_DTYPES) == "float32"
    monkeypatch.setenv(DEVICE_ENV, "cuda:1")
    assert from_environment("auto", DEVICE_ENV, ALLOWED_DEVICES) == "cuda:1"
    assert from_environment("cpu", DEVICE_ENV, ALLOWED_DEVICES) == "cpu"


@pytest.mark.parametrize("value", ["", "  "])
def test_unset_or_empty_leaves_auto(monkeypatch, value):
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    assert from_environment("auto", DTYPE_ENV, ALLOWED_DTYPES) == "auto"
    monkeypatch.setenv(DTYPE_ENV, value)
    assert from_environment("auto", DTYPE_ENV, ALLOWED_DTYPES) == "auto"


def test_bad_values_name_the_variable_the_value_and_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match=r"BATCHLAB_DTYPE='fp8'.*'float32', 'bfloat16', 'float16'"):
        loading.load_model()
    monkeypatch.delenv(DTYPE_ENV)
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match=r"BATCHLAB_DEVICE='tpu'.*'cpu', 'cuda'.*cuda:N"):
        loading.load_model()
    monkeypatch.setenv(DEVICE_ENV, "cuda:x")
    with pytest.raises(ValueError, match="BATCHLAB_DEVICE='cuda:x'"):
        loading.load_model()


def test_load_model_runs_in_the_dtype_the_variable_names(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    lm = loading.load_model()
    assert (lm.device, lm.dtype) == ("cpu", "bfloat16")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    lm = loading.load_model(dtype="float32")
    assert lm.dtype == "float32" and next(lm.model.parameters()).dtype == torch.float32
