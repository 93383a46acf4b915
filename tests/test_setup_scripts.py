"""The setup script checks the Python interpreter before it installs anything."""

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _setup_copy(tmp_path: Path) -> Path:
    """A bare copy of the checkout's setup script (no .venv), so nothing here is touched."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "requirements.txt", tmp_path / "requirements.txt")
    shutil.copy(ROOT / "requirements-site.txt", tmp_path / "requirements-site.txt")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "scripts" / "setup.sh"


def _fake_python(tmp_path: Path, version: str) -> Path:
    """An 'interpreter' that answers every call with a version string, and records that it ran."""
    fake = tmp_path / f"fake-python-{version}"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/calls.log"\necho {version}\n')
    fake.chmod(0o755)
    return fake


def test_setup_refuses_python_3_10_in_one_line_and_installs_nothing(tmp_path):
    setup = _setup_copy(tmp_path)
    fake = _fake_python(tmp_path, "3.10.13")
    env = {**os.environ, "PYTHON": str(fake)}
    out = subprocess.run(["bash", str(setup)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    msg = lines[0]
    assert "3.10.13" in msg and ">= 3.11" in msg and "PYTHON=python3.12 bash scripts/" in msg, msg
    # Only the version query ran: no venv was made and nothing was installed.
    assert (tmp_path / "calls.log").read_text().count("\n") == 1
    assert not (tmp_path / ".venv").exists()


def test_setup_names_an_interpreter_it_cannot_run(tmp_path):
    setup = _setup_copy(tmp_path)
    env = {**os.environ, "PYTHON": str(tmp_path / "no-such-python")}
    out = subprocess.run(["bash", str(setup)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "no-such-python" in out.stderr and "PYTHON=python3.12" in out.stderr
    assert not (tmp_path / ".venv").exists()


def test_the_floor_in_setup_matches_pyproject_and_readme():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    major, minor = re.search(r"NEED_MAJOR=(\d+) NEED_MINOR=(\d+)", text).groups()
    floor = f"{major}.{minor}"
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["requires-python"] == f">={floor}"
    assert f"Python {floor}+ only" in (ROOT / "README.md").read_text()


def test_lab_refuses_a_port_that_is_not_a_number():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "lab.sh"), "--port=eighty"], capture_output=True,
                         text=True, env={**os.environ, "BATCHLAB_LAB_PYTHON": "python3"})
    assert out.returncode == 2 and "--port=eighty; must be a port number" in out.stderr


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("port_given_as", ["BATCHLAB_PORT", "--port=N", "--port N"])
def test_course_command_starts_a_jupyterlab_that_answers(tmp_path, port_given_as):
    """scripts/lab.sh (what `bash scripts/course.sh` runs after setup) starts JupyterLab, as root
    too, prints the URL with its token in one line, and that URL answers over HTTP. A port the
    user names (as JupyterLab's own --port option, or the variable) is the one it listens on."""
    import signal
    import sys
    import time
    import urllib.request

    port = _free_port()
    env = {**os.environ, "BATCHLAB_LAB_PYTHON": sys.executable, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    options = {"BATCHLAB_PORT": [], "--port=N": [f"--port={port}"], "--port N": ["--port", str(port)]}
    if port_given_as == "BATCHLAB_PORT":
        env["BATCHLAB_PORT"] = str(port)
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "lab.sh"), "--no-browser", "--ip=127.0.0.1",
                             *options[port_given_as]],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline, url = time.monotonic() + 120, None
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()  # the script prints only its one line on stdout
            if not line:
                break
            match = re.search(r"(http://127\.0\.0\.1:\d+/lab\?token=\w+)", line)
            url = match.group(1) if match else None
        assert url is not None, "lab.sh printed no URL"
        assert f":{port}/" in url
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert resp.status == 200 and "JupyterLab" in resp.read().decode()
        # Without the token the API refuses: the token printed is the one that opens it.
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=30)
            raise AssertionError("the server answered without its token")
        except urllib.error.HTTPError as err:
            assert err.code == 403
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


SHAPES = ["bash", "scripts/check_machine_shapes.sh"]


@pytest.mark.parametrize("args, message", [(["--only", "nope"], "unknown variant 'nope'; allowed: default busy"),
                                           (["--bad"], "unknown argument '--bad'; allowed: --cheap")])
def test_machine_shapes_names_bad_input(args, message):
    result = subprocess.run(SHAPES + args, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def _cpu_hogs() -> set[str]:
    """PIDs of the CPU hogs check_machine_shapes starts (its own busy variant's may already run)."""
    found = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True)
    return set(found.stdout.split())


def test_machine_shapes_runs_a_variant_with_a_busy_core_and_ends_the_hog():
    hogs_before = _cpu_hogs()
    result = subprocess.run(SHAPES + ["--only", "busy,avx2", "--", "tests/test_claims.py"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "BATCHLAB_DTYPE=float32, a CPU hog" in result.stdout
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in result.stdout
    assert re.search(r"^busy +ok +\d+ s  \d+ passed", result.stdout, re.M), result.stdout[-1500:]
    # (on a CPU without AVX-512 the AVX2 cap changes nothing, and the variant says so instead)
    assert re.search(r"^avx2 +(ok +\d+ s  \d+ passed|same +0 s  the main pass's kernels)", result.stdout, re.M)
    assert _cpu_hogs() <= hogs_before, "the CPU hog outlived its run"


def test_machine_shapes_skips_a_cap_that_changes_no_kernel():
    # The main pass itself capped at AVX2: the avx2 variant would run the same kernels again.
    result = subprocess.run(SHAPES + ["--only", "avx2", "--", "tests/test_checks.py"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "avx2 skipped: BATCHLAB_DTYPE=float32 ONEDNN_MAX_CPU_ISA=AVX2 leaves oneDNN the kernels" in result.stdout
    assert re.search(r"^avx2 +same +0 s  the main pass's kernels: .*avx2", result.stdout, re.M), result.stdout[-1500:]
    assert "passed" not in result.stdout
