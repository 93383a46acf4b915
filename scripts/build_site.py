"""Build a static, executed copy of the course: one HTML page per notebook, with every figure and
printed result, one page per note in docs/, and an index page, readable in any browser without
running anything.

    python scripts/build_site.py [--executed executed] [--out site] [--docs docs] [--check]

It reads executed notebooks (`bash scripts/course.sh --headless` writes them to executed/, and so
does `bash scripts/test.sh`, from the run that checks the notebooks' claims) and converts them
with nbconvert, which the course already installs: each page is one self-contained file with its
figures embedded, so the folder can be opened locally, zipped or served as it is. (Jupyter Book
would add a Sphinx toolchain for a navigation bar this course does not need.) The notes in docs/*.md
(measurements and design notes README links to) become site/docs/NAME.html with mistune, the
Markdown renderer nbconvert already depends on; each is titled by its first '# ' heading, and its
links to other notes (and to ../README.md, which becomes the index) are pointed at the pages.

--check fails (exit 1) unless every notebook in notebooks/ has an executed copy without errors,
every cell that shows a figure (`plt.show()` at its top level, not inside a function it defines
or a branch it may skip) produced an image, every image reached the page, and every note has a
'# ' heading to be titled by. `bash scripts/course.sh --site` runs the notebooks and then this script.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

import mistune
import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
FIGURE_CALL = re.compile(r"^plt\.show\(\)", re.MULTILINE)   # at the cell's top level, not in a def
EMBEDDED_IMAGE = re.compile(r'<img[^>]+src="data:image/png;base64,')
# A relative link to a Markdown file, as mistune renders it: href="NAME.md" or "NAME.md#anchor".
MD_LINK = re.compile(r'href="(?![\w+.-]+:|/|#)([^"#]+)\.md(#[^"]*)?"')
DOC_STYLE = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;"
             "line-height:1.5}table{border-collapse:collapse;margin:1rem 0}th,td{border:1px solid #ccc;"
             "padding:.25rem .5rem;vertical-align:top}pre{background:#f6f8fa;padding:.75rem;overflow-x:auto}"
             "code{font-size:.9em}")


def title_of(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The notebook's first '# ' heading."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def doc_title(text: str) -> str | None:
    """A Markdown page's first '# ' heading outside code fences, as plain text (None if it has none)."""
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("# "):
            return line[2:].replace("`", "").strip()
    return None


def render_doc(text: str, title: str, stems: set[str]) -> str:
    """One note as a standalone page for site/docs/: links to other notes go to their pages, the
    link to ../README.md to the site's index."""
    def relink(m: re.Match) -> str:
        target, anchor = m.group(1), m.group(2) or ""
        if target in stems:
            return f'href="{target}.html{anchor}"'
        if target == "../README":
            return 'href="../index.html"'
        return m.group(0)
    body = MD_LINK.sub(relink, mistune.html(text))
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)} · batchlab</title>\n"
            f"<style>{DOC_STYLE}</style>\n"
            "<p><a href='../index.html'>batchlab: the course, executed</a></p>\n"
            f"{body}")


def build_docs(docs: Path, out: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Render every docs/*.md to out/docs/NAME.html: (href from the index, title) per page, and
    the pages that have no '# ' heading to be titled by."""
    pages = sorted(docs.glob("*.md")) if docs.is_dir() else []
    if pages:
        (out / "docs").mkdir(parents=True, exist_ok=True)
    stems = {p.stem for p in pages}
    rows, problems = [], []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        title = doc_title(text)
        if title is None:
            problems.append(f"docs/{page.name}: no '# ' heading to title its page by")
            title = page.stem
        (out / "docs" / f"{page.stem}.html").write_text(render_doc(text, title, stems), encoding="utf-8")
        rows.append((f"docs/{page.stem}.html", title))
    return rows, problems


def png_outputs(cell: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def problems_in(nb: nbformat.NotebookNode, page: str, name: str) -> list[str]:
    """What is missing from one executed notebook and its page."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"{name}: code cell {i} raised {errors[0].get('ename')}: {errors[0].get('evalue')}")
        if FIGURE_CALL.search(cell.source) and png_outputs(cell) == 0:
            problems.append(f"{name}: code cell {i} calls plt.show() but produced no image "
                            "(was it run with MPLBACKEND=Agg, which draws nothing?)")
    images = sum(png_outputs(c) for c in code)
    shown = len(EMBEDDED_IMAGE.findall(page))
    if shown < images:
        problems.append(f"{name}: {images} images in the executed notebook, {shown} on its page")
    return problems


def build(executed: Path, out: Path, check: bool, docs: Path = ROOT / "docs") -> list[str]:
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        raise SystemExit(f"no notebooks in {ROOT / 'notebooks'}")
    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab")
    rows, problems = [], []
    for source in sources:
        path = executed / source.name
        if not path.exists():
            problems.append(f"{source.name}: no executed copy in {executed} (run `bash scripts/course.sh "
                            "--headless` or `bash scripts/test.sh` first)")
            continue
        nb = nbformat.read(str(path), as_version=4)
        page, _ = exporter.from_notebook_node(nb)
        (out / f"{source.stem}.html").write_text(page, encoding="utf-8")
        rows.append((source.stem, title_of(nb, source.stem)))
        if check:
            problems += problems_in(nb, page, source.name)
    doc_rows, doc_problems = build_docs(docs, out)
    if check:
        problems += doc_problems
    links = "\n".join(f'<li><a href="{stem}.html">{html.escape(title)}</a></li>' for stem, title in rows)
    notes = "\n".join(f'<li><a href="{href}">{html.escape(title)}</a></li>' for href, title in doc_rows)
    (out / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>batchlab: the course, executed</title>\n"
        "<h1>batchlab: the course, executed</h1>\n"
        "<p>Every notebook as it ran, with its figures and printed results. To run them yourself, "
        "see the README.</p>\n"
        f"<ol start='0'>\n{links}\n</ol>\n"
        + (f"<h2>Notes and measurements</h2>\n<ul>\n{notes}\n</ul>\n" if doc_rows else ""),
        encoding="utf-8")
    print(f"{len(rows)} of {len(sources)} notebooks, {len(doc_rows)} notes -> {out}/ "
          f"(open {out / 'index.html'})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, default=ROOT / "executed", help="executed notebooks")
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="where the pages go")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="the notes (*.md) to render too")
    parser.add_argument("--check", action="store_true", help="fail unless every notebook and figure made it")
    args = parser.parse_args()
    problems = build(args.executed, args.out, args.check, args.docs)
    if problems:
        print("The static copy is incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
