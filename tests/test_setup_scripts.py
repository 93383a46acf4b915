"""The setup script checks the Python interpreter before it installs anything."""

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_copy(tmp_path: Path) -> Path:
    """A bare copy of the checkout's setup script (no .venv), so nothing here is touched."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "requirements.txt", tmp_path / "requirements.txt")
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
