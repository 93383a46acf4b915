"""Notebook storage policy: committed notebooks are built from notebooks/src and fully stripped.

Why stripped: outputs hold timings and figures that differ on every machine, would make every
review diff noisy, and could drift from the code. Readers get executed copies with all outputs
from `bash scripts/course.sh --headless` (written to executed/, which git ignores).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"
    sources = sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    assert sources == [p.stem for p in NOTEBOOKS], "every source needs its built notebook and vice versa"


def test_notebooks_match_their_sources():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_fully_stripped_and_complete(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), \
        f"{path.name} carries outputs; rebuild it with scripts/build_notebooks.py"
    text = ["".join(c["source"]) for c in nb["cells"]]
    assert "colab.research.google.com" in text[0], "first cell: the Open in Colab badge"
    assert "IN_COLAB" in text[1], "second cell: the Colab-only install cell"
    markdown = "\n".join(t for c, t in zip(nb["cells"], text) if c["cell_type"] == "markdown")
    for heading in ("## Summary", "## Exercises"):
        assert heading in markdown, f"{path.name} lacks a '{heading}' section"
    assert "what you will learn" in markdown.lower(), f"{path.name} lacks 'What you will learn'"


def test_course_map_gaps_names_a_notebook_missing_from_the_tables(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    sources = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    assert build.course_map_gaps(sources) == []
    extra = tmp_path / "99_not_listed.py"
    assert build.course_map_gaps(sources + [extra]) == [
        "notebook 00's course map lacks 99_not_listed", "README's table lacks 99_not_listed"]
