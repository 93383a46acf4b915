"""Build the course site: every notebook as it ran, with its figures and printed results, the notes
in docs/, and a home page saying what each notebook teaches; a sidebar of chapters, search,
previous/next links and a Colab button on every notebook page.

    python scripts/build_site.py [--executed executed] [--out site] [--check]

It reads executed notebooks (`bash scripts/course.sh --headless` writes them to executed/, and so
does `bash scripts/test.sh`, from the run that checks the notebooks' claims), gathers them with
the notes into build/site-source/ (the home page from README's table of notebooks), and runs
Sphinx on them with myst-nb and sphinx-book-theme (site_config/conf.py): the notebooks are
rendered, never run again. Open site/index.html, or serve the folder as it is.

--check fails (exit 1) unless every notebook in notebooks/ has an executed copy without errors,
every cell that shows a figure (`plt.show()` at its top level, not inside a function it defines
or a branch it may skip) produced an image, every image reached its page, every note has a '# '
heading to be titled by, and Sphinx warned of nothing (a broken link between pages, say).
scripts/check_site.py then opens the built site in a real browser. `bash scripts/course.sh --site`
runs the notebooks, then both.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "site_config"
FIGURE_CALL = re.compile(r"^plt\.show\(\)", re.MULTILINE)   # at the cell's top level, not in a def
PAGE_IMAGE = re.compile(r'<img[^>]+src="[^"]*_images/[^"]+\.png"')
TABLE_ROW = re.compile(r"^\| `(\d\d_[a-z0-9_]+)` \| (.+) \|$", re.MULTILINE)   # README's table of notebooks
README_LINK = re.compile(r"\]\(\.\./README\.md(#[^)]*)?\)")
WIDGET = "application/vnd.jupyter.widget-view+json"
HTML_ANCHOR = re.compile(r'^<a id="([\w-]+)"></a>[ \t]*$', re.MULTILINE)   # a link target in a notebook


def doc_title(text: str) -> str | None:
    """A Markdown page's first '# ' heading outside code fences, as plain text (None if it has none)."""
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("# "):
            return line[2:].replace("`", "").strip()
    return None


def png_outputs(cell: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def problems_in(nb: nbformat.NotebookNode, name: str) -> list[str]:
    """What is wrong with one executed notebook: a cell that raised, a figure cell without an image."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"{name}: code cell {i} raised {errors[0].get('ename')}: {errors[0].get('evalue')}")
        if FIGURE_CALL.search(cell.source) and png_outputs(cell) == 0:
            problems.append(f"{name}: code cell {i} calls plt.show() but produced no image "
                            "(was it run with MPLBACKEND=Agg, which draws nothing?)")
    return problems


def images_missing(nb: nbformat.NotebookNode, page: str, name: str) -> list[str]:
    """A figure of the executed notebook that did not reach its built page."""
    images = sum(png_outputs(c) for c in nb.cells if c.cell_type == "code")
    shown = len(PAGE_IMAGE.findall(page))
    return [f"{name}: {images} images in the executed notebook, {shown} on its page"] if shown < images else []


def page_notebook(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The notebook as its page shows it: the Colab badge and the Colab-only install cell give way
    to the theme's Colab button and a note on running it, placed under the title; link targets
    written as HTML anchors become Sphinx's; progress bars are left out."""
    nb = copy.deepcopy(nb)                   # (the executed copy stays as it ran)
    cells = [c for c in nb.cells if not (c.cell_type == "markdown" and "colab-badge.svg" in c.source)
             and not (c.cell_type == "code" and "IN_COLAB" in c.source)]
    for cell in cells:
        if cell.cell_type == "markdown":     # an HTML anchor becomes a MyST target Sphinx can link to
            cell.source = HTML_ANCHOR.sub(r"(\1)=", cell.source)
        else:                                # a progress bar (a widget) only moves while the notebook runs
            cell.outputs = [o for o in cell.get("outputs", []) if WIDGET not in o.get("data", {})]
    title = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("# ")), 0)
    note = nbformat.v4.new_markdown_cell(
        '<div class="run-it">\n\n'
        "**Run it yourself.** In Colab: the rocket button at the top of this page, *Colab*; its first "
        f"cell installs the course. On your machine: `bash scripts/course.sh` opens JupyterLab; open "
        f"`notebooks/{name}` there.\n\n</div>")
    nb = nbformat.from_dict({**nb, "cells": cells[:title + 1] + [note] + cells[title + 1:]})
    return nb


def home_page(readme: str, notebooks: list[str], notes: list[tuple[str, str]]) -> str:
    """index.md: what the course is, a table of what each notebook teaches (README's), the notes,
    and the sidebar's two chapters."""
    intro = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()          # README's first paragraph(s)
    taught = dict(TABLE_ROW.findall(readme))
    rows = "\n".join(f"| [{stem[:2]} · {stem[3:].replace('_', ' ')}](notebooks/{stem}.ipynb) | "
                     f"{taught.get(stem, '')} |" for stem in notebooks)
    note_rows = "\n".join(f"- [{title}](docs/{stem}.md)" for stem, title in notes)
    return (f"# batchlab: how LLM servers batch requests\n\n{intro}\n\n"
            "Every page below is a notebook as it ran on the course's 2-core CPU, with every figure, "
            "printed result and checked claim. Run any of them yourself in Colab (the rocket button on "
            "its page) or on your machine (`bash scripts/course.sh`).\n\n"
            f"## The notebooks\n\n| notebook | what it teaches |\n|---|---|\n{rows}\n\n"
            f"## Notes and measurements\n\n{note_rows}\n\n"
            "```{toctree}\n:caption: The course\n:maxdepth: 1\n:hidden:\n\n"
            + "\n".join(f"notebooks/{stem}" for stem in notebooks)
            + "\n```\n\n```{toctree}\n:caption: Notes and measurements\n:maxdepth: 1\n:hidden:\n\n"
            + "\n".join(f"docs/{stem}" for stem, _ in notes) + "\n```\n")


def assemble(executed: Path, source: Path, docs: Path, check: bool, course: Path = ROOT) -> tuple[list[str], list[str], dict]:
    """Write the site's sources to ``source`` from ``course``'s notebooks (their executed copies in
    ``executed``), ``docs`` and README: (notebook stems, problems, executed notebooks by stem)."""
    notebooks = sorted((course / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no notebooks in {course / 'notebooks'}")
    shutil.rmtree(source, ignore_errors=True)
    (source / "notebooks").mkdir(parents=True)
    (source / "docs").mkdir()
    stems, problems, runs = [], [], {}
    for path in notebooks:
        ran = executed / path.name
        if not ran.exists():
            problems.append(f"{path.name}: no executed copy in {executed} (run `bash scripts/course.sh "
                            "--headless` or `bash scripts/test.sh` first)")
            continue
        nb = nbformat.read(str(ran), as_version=4)
        if check:
            problems += problems_in(nb, path.name)
        nbformat.write(page_notebook(nb, path.name), str(source / "notebooks" / path.name))
        stems.append(path.stem)
        runs[path.stem] = nb
    notes = []
    for page in sorted(docs.glob("*.md")) if docs.is_dir() else []:
        text = page.read_text(encoding="utf-8")
        title = doc_title(text)
        if title is None:
            problems.append(f"docs/{page.name}: no '# ' heading to title its page by")
            text = f"# {page.stem}\n\n{text}"
        (source / "docs" / page.name).write_text(README_LINK.sub(r"](../index.md\1)", text), encoding="utf-8")
        notes.append((page.stem, title or page.stem))
    (source / "index.md").write_text(home_page((course / "README.md").read_text(encoding="utf-8"), stems, notes),
                                     encoding="utf-8")
    return stems, problems, runs


def build(executed: Path, out: Path, check: bool, docs: Path = ROOT / "docs",
          source: Path = ROOT / "build" / "site-source", course: Path = ROOT) -> list[str]:
    """Assemble the sources (``assemble``), run Sphinx, and with ``check`` return every problem."""
    if out.exists() and any(out.iterdir()) and not (out / "index.html").exists():
        raise SystemExit(f"--out {out}: not empty and holds no site (no index.html); name an empty folder")
    stems, problems, runs = assemble(executed, source, docs, check, course)
    shutil.rmtree(out, ignore_errors=True)     # the last build's pages, gone: a page removed since stays removed
    warnings = source.parent / f"{source.name}-warnings.txt"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(CONFIG), "-w", str(warnings),
                           "-d", str(source.parent / f"{source.name}-doctrees"), str(source), str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        problems.append(f"Sphinx failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    elif check:
        said = [ln for ln in warnings.read_text().splitlines() if ln.strip()] if warnings.exists() else []
        problems += [f"Sphinx warned: {ln}" for ln in said]
        for stem in stems:
            page = out / "notebooks" / f"{stem}.html"
            problems += images_missing(runs[stem], page.read_text(encoding="utf-8") if page.exists() else "",
                                       f"{stem}.ipynb")
    print(f"{len(stems)} of {len(sorted((course / 'notebooks').glob('[0-9][0-9]_*.ipynb')))} notebooks, "
          f"{len(list(docs.glob('*.md'))) if docs.is_dir() else 0} notes -> {out}/ (open {out / 'index.html'})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, default=ROOT / "executed", help="executed notebooks")
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="where the pages go")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="the notes (*.md) to render too")
    parser.add_argument("--check", action="store_true", help="fail unless every notebook, figure and link made it")
    args = parser.parse_args()
    problems = build(args.executed, args.out, args.check, args.docs)
    if problems:
        print("The course site is incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
