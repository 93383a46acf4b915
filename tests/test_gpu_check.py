"""scripts/gpu_check.sh refuses, in one clear line, on a machine without CUDA."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
def test_gpu_check_fails_clearly_without_cuda():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env={"PYTHON": sys.executable,
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "torch.cuda.is_available() is False" in lines[0]


def test_gpu_check_names_a_python_without_torch():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env={"PYTHON": "/bin/false",
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot import torch" in done.stderr
