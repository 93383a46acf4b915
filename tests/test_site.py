"""The course site (scripts/build_site.py, scripts/check_site.py): the build's check catches a
missing figure, an image lost on the way to the page and a cell that raised; a small course built
with Sphinx has its pages, sidebar, Colab button and search; and the browser check, run on it in
Chromium, passes, then names a broken image, a link to a missing page and a link to a missing
anchor once they are put in."""

import base64
import importlib.util
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_site, check_site = _script("build_site"), _script("check_site")

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()
IMAGE = {"image/png": PNG, "text/plain": "<Figure>"}


def notebook(figure_outputs, extra_outputs=(), title="# 99 · A title\n\nText."):
    badge = new_markdown_cell("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](x)")
    install = new_code_cell('import sys\nIN_COLAB = "google.colab" in sys.modules')
    figure = new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    figure.outputs = list(figure_outputs)
    printed = new_code_cell("print('hello')")
    printed.outputs = [new_output("stream", name="stdout", text="hello\n"), *extra_outputs]
    return new_notebook(cells=[badge, install, new_markdown_cell(title), figure, printed],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                  "language_info": {"name": "python"}})


def test_a_notebook_with_its_figure_passes():
    assert build_site.problems_in(notebook([new_output("display_data", data=IMAGE)]), "99_test.ipynb") == []


def test_a_figure_cell_without_an_image_is_reported():
    problems = build_site.problems_in(notebook([]), "99_test.ipynb")
    assert len(problems) == 1 and "code cell 1 calls plt.show() but produced no image" in problems[0]


def test_an_error_is_reported():
    error = new_output("error", ename="AssertionError", evalue="FAILED: a claim", traceback=[])
    problems = build_site.problems_in(notebook([new_output("display_data", data=IMAGE)], [error]), "99_test.ipynb")
    assert problems == ["99_test.ipynb: code cell 2 raised AssertionError: FAILED: a claim"]


def test_an_image_missing_from_the_page_is_reported():
    nb = notebook([new_output("display_data", data=IMAGE)])
    assert build_site.images_missing(nb, "<html>no images</html>", "99_test.ipynb") == [
        "99_test.ipynb: 1 images in the executed notebook, 0 on its page"]
    assert build_site.images_missing(nb, '<img alt="" src="../_images/abc.png" />', "99_test.ipynb") == []


def test_a_function_that_shows_a_figure_is_not_a_figure_cell():
    nb = notebook([])
    nb.cells[3].source = "def draw():\n    plt.plot([1, 2])\n    plt.show()"
    assert build_site.problems_in(nb, "99_test.ipynb") == []


def test_a_page_drops_the_colab_cells_and_says_how_to_run_it_under_its_title():
    nb = notebook([], title='# 99 · A title\n\n<a id="words"></a>\n## Words')
    bar = {"application/vnd.jupyter.widget-view+json": {"model_id": "1"}, "text/plain": "runs:   0%|  | 0/9"}
    nb.cells[4].outputs.append(new_output("display_data", data=bar))
    page = build_site.page_notebook(nb, "99_test.ipynb")
    assert [o.output_type for o in page.cells[3].outputs] == ["stream"]         # the progress bar left out
    assert [c.cell_type for c in page.cells] == ["markdown", "markdown", "code", "code"]
    assert page.cells[0].source == "# 99 · A title\n\n(words)=\n## Words"        # a target Sphinx links to
    assert "Run it yourself" in page.cells[1].source and "`notebooks/99_test.ipynb`" in page.cells[1].source
    assert len(nb.cells) == 5 and '<a id="words">' in nb.cells[2].source     # the executed copy is untouched
    assert len(nb.cells[4].outputs) == 2


# --- a small course, built and opened in a browser ---------------------------------------------------------
def _small_course(root: Path) -> Path:
    """Two executed notebooks with a figure each, linking to each other (one to an anchor), a note
    linking to README, and a README with the table of notebooks."""
    (root / "notebooks").mkdir(parents=True)
    executed, docs = root / "executed", root / "docs"
    executed.mkdir()
    docs.mkdir()
    pages = {"00_first_steps": "# 00 · First steps\n\nSee [the second](01_second_steps.ipynb#the-zebra-section).",
             "01_second_steps": "# 01 · Second steps\n\nBack to [the first](00_first_steps.ipynb).\n\n"
                                "## The zebra section\n\nA quagga is a zebra."}
    for stem, title in pages.items():
        nb = notebook([new_output("display_data", data=IMAGE)], title=title)
        nbformat.write(nb, str(root / "notebooks" / f"{stem}.ipynb"))
        nbformat.write(nb, str(executed / f"{stem}.ipynb"))
    (docs / "a-note.md").write_text("# A note\n\nBack to the [README](../README.md).\n")
    (root / "README.md").write_text("# small\n\nA small course.\n\n## The course\n\n| notebook | what it teaches |\n"
                                    "|---|---|\n| `00_first_steps` | the first steps |\n"
                                    "| `01_second_steps` | quaggas |\n")
    return executed


def _browser():
    browser = check_site.find_browser(None)
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs Chromium with scripts/setup_browser.sh, but none was found")
        pytest.skip("no Chromium (Debian: apt-get install chromium)")
    return browser


def test_a_small_course_builds_into_a_site_a_browser_finds_whole(tmp_path):
    browser = _browser()
    executed = _small_course(tmp_path / "course")
    site = tmp_path / "site"
    problems = build_site.build(executed, site, check=True, docs=tmp_path / "course" / "docs",
                                source=tmp_path / "source", course=tmp_path / "course")
    assert problems == []
    index = (site / "index.html").read_text()
    assert "notebooks/01_second_steps.html" in index and "quaggas" in index and "docs/a-note.html" in index
    first = (site / "notebooks" / "00_first_steps.html").read_text()
    assert "colab.research.google.com/github/batchlab-course/batchlab/blob/main/notebooks/00_first_steps.ipynb" in first
    assert "Run it yourself" in first and "colab-badge.svg" not in first and "IN_COLAB" not in first
    assert 'href="01_second_steps.html#the-zebra-section"' in first          # a link to a heading, resolved
    assert "bd-sidebar" in first and "search" in first                        # the theme's sidebar and search box

    found, pages = check_site.check(site, browser, search="quagga", finds="notebooks/01_second_steps.html")
    assert found == [] and pages == 6, found                 # index, 2 notebooks, the note, search, genindex

    # Now break it three ways; the check names each.
    shutil.rmtree(site / "_images")
    note = site / "docs" / "a-note.html"
    note.write_text(note.read_text().replace(
        "</article>", '<a href="../notebooks/02_missing.html">gone</a>'
                      '<a href="../notebooks/00_first_steps.html#no-such-part">nowhere</a></article>'))
    found, _ = check_site.check(site, browser, search="quagga", finds="notebooks/01_second_steps.html")
    assert sum("an image that does not decode" in p for p in found) == 2, found     # one per notebook
    assert "docs/a-note.html: a link to notebooks/02_missing.html, which is not in the site" in found
    assert "docs/a-note.html: a link to notebooks/00_first_steps.html#no-such-part, whose page has no #no-such-part" \
        in found


def test_a_broken_build_is_reported_with_sphinxs_warning(tmp_path):
    executed = _small_course(tmp_path / "course")
    (tmp_path / "course" / "docs" / "a-note.md").write_text("# A note\n\nSee [a page](no-such-page.md).\n")
    problems = build_site.build(executed, tmp_path / "site", check=True, docs=tmp_path / "course" / "docs",
                                source=tmp_path / "source", course=tmp_path / "course")
    assert len(problems) == 1 and problems[0].startswith("Sphinx warned:") and "no-such-page" in problems[0], problems


def test_a_folder_that_holds_no_site_is_never_emptied(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    with pytest.raises(SystemExit, match="not empty and holds no site"):
        build_site.build(tmp_path / "executed", tmp_path / "mine", check=True, source=tmp_path / "source")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"
