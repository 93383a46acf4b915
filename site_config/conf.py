"""Sphinx's configuration for the course site (scripts/build_site.py assembles the pages and runs
Sphinx on them with this file): myst-nb renders the executed notebooks as they ran (no second
execution), sphinx-book-theme gives the sidebar, search, previous/next links and a Colab button."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
with open(ROOT / "pyproject.toml", "rb") as f:
    REPOSITORY = tomllib.load(f)["project"]["urls"]["Repository"]   # one place for the address

project = "batchlab"
author = "the batchlab authors"
html_title = "batchlab: how LLM servers batch requests"
extensions = ["myst_nb"]
nb_execution_mode = "off"                    # the pages show the run that checked every claim
nb_merge_streams = True                      # one block per cell for its printed lines
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3                     # "#a-heading" links within and between pages
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_theme_options = {
    "repository_url": REPOSITORY,
    "repository_branch": "main",
    "path_to_docs": "",                      # the pages sit where they sit in the repository
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
html_last_updated_fmt = None
