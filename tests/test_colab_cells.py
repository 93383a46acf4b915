"""Every notebook's Colab badge and install cell come from pyproject.toml's [project.urls]."""

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _build_module():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _repository() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"]


def test_badge_and_install_cell_use_the_pyproject_address():
    url = _repository()
    owner_name = url.removeprefix("https://github.com/")
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        badge, install = "".join(cells[0]["source"]), "".join(cells[1]["source"])
        assert (f"https://colab.research.google.com/github/{owner_name}/blob/main/notebooks/{path.name}"
                in badge), path.name
        assert f'COURSE_REPO = "{url}"' in install, path.name
        # No other repository address hides in either cell.
        assert badge.count("github/") == 1 and install.count("https://github.com/") == 1, path.name


def test_a_repository_that_is_not_on_github_is_refused_with_its_value(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[project.urls]\nRepository = "https://example.org/a/b"\n')
    try:
        _build_module().course_repository(pyproject)
        raise AssertionError("accepted a non-GitHub address")
    except SystemExit as err:
        assert "https://example.org/a/b" in str(err) and "[project.urls] Repository" in str(err)


def test_install_cell_says_in_one_sentence_when_the_course_cannot_be_cloned(tmp_path):
    """Run the install cell as Colab would, against an address git cannot clone (a local path
    that does not exist, so no network is used): it stops with the sentence, not a traceback."""
    missing = tmp_path / "no-such-course"
    cell = _build_module().install_cell(str(missing))
    code = "import sys, types\nsys.modules['google.colab'] = types.ModuleType('google.colab')\n" + cell
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"Could not fetch the course from {missing}")
    assert "[project.urls] Repository" in lines[0]
