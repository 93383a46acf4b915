"""The static copy of the course (scripts/build_site.py): its check catches a missing figure,
an image lost on the way to the page, and a cell that raised; the docs/*.md notes become pages
linked from the index."""

import base64
import importlib.util
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_site.py"
spec = importlib.util.spec_from_file_location("build_site", SCRIPT)
build_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_site)

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


def notebook(figure_outputs, extra_outputs=()):
    figure = new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    figure.outputs = list(figure_outputs)
    printed = new_code_cell("print('hello')")
    printed.outputs = [new_output("stream", name="stdout", text="hello\n"), *extra_outputs]
    return new_notebook(cells=[new_markdown_cell("# 99 · A title\n\nText."), figure, printed])


def check(nb):
    page, _ = build_site.HTMLExporter(template_name="lab").from_notebook_node(nb)
    return build_site.problems_in(nb, page, "99_test.ipynb"), page


def test_a_notebook_with_its_figure_passes_and_embeds_it():
    nb = notebook([new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})])
    problems, page = check(nb)
    assert problems == []
    assert len(build_site.EMBEDDED_IMAGE.findall(page)) == 1
    assert build_site.title_of(nb, "fallback") == "99 · A title"


def test_a_figure_cell_without_an_image_is_reported():
    problems, _ = check(notebook([]))
    assert len(problems) == 1 and "plt.show() but produced no image" in problems[0]


def test_an_error_is_reported():
    error = new_output("error", ename="AssertionError", evalue="FAILED: a claim", traceback=[])
    image = new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})
    problems, _ = check(notebook([image], [error]))
    assert problems == ["99_test.ipynb: code cell 1 raised AssertionError: FAILED: a claim"]


def test_an_image_missing_from_the_page_is_reported():
    nb = notebook([new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})])
    assert build_site.problems_in(nb, "<html>no images</html>", "99_test.ipynb") == [
        "99_test.ipynb: 1 images in the executed notebook, 0 on its page"]


def test_a_function_that_shows_a_figure_is_not_a_figure_cell():
    nb = notebook([])
    nb.cells[1].source = "def draw():\n    plt.plot([1, 2])\n    plt.show()"
    assert check(nb)[0] == []


def test_the_docs_pages_are_rendered_titled_and_linked_from_the_index(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "alpha.md").write_text(
        "# Alpha `notes`\n\nSee [beta](beta.md#top), the [README](../README.md) and "
        "[a site](https://example.org/page.md).\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (docs / "beta.md").write_text(
        "Before the title.\n\n```bash\n# a comment, not a heading\n```\n\n# Beta & co\n\nText.\n")
    out = tmp_path / "site"
    # No executed notebooks here: build() reports them missing, and still renders the notes.
    problems = build_site.build(tmp_path / "no-executed", out, check=True, docs=docs)
    assert problems and all("no executed copy" in p for p in problems), problems
    alpha = (out / "docs" / "alpha.html").read_text()
    assert "<title>Alpha notes · batchlab</title>" in alpha
    assert "<table>" in alpha and 'href="beta.html#top"' in alpha and 'href="../index.html"' in alpha
    assert 'href="https://example.org/page.md"' in alpha
    beta = (out / "docs" / "beta.html").read_text()
    assert "<title>Beta &amp; co · batchlab</title>" in beta and "Before the title." in beta
    index = (out / "index.html").read_text()
    assert '<a href="docs/alpha.html">Alpha notes</a>' in index
    assert '<a href="docs/beta.html">Beta &amp; co</a>' in index


def test_a_docs_page_without_a_heading_is_reported(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "gamma.md").write_text("No heading here.\n\n## Only a second level\n")
    rows, problems = build_site.build_docs(docs, tmp_path / "site")
    assert rows == [("docs/gamma.html", "gamma")]
    assert problems == ["docs/gamma.md: no '# ' heading to title its page by"]
    assert (tmp_path / "site" / "docs" / "gamma.html").is_file()
