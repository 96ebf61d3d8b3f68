"""Sphinx configuration of hvd_magic's documentation: ``make docs`` builds docs/_build/html."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))  # hvd_options (the options table), hvd_figures (bench figures)
sys.path.insert(0, str(HERE.parent))  # hvd_magic itself, for a build from a checkout

project = "hvd_magic"
author = "hvd_magic's authors"
copyright = "hvd_magic's authors"

extensions = ["myst_parser", "hvd_options", "hvd_figures"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `%%horovod` cells: IPython's lexer reads magics, which Python's would flag as errors.
highlight_language = "ipython3"
myst_heading_anchors = 3

try:
    import pydata_sphinx_theme  # noqa: F401

    html_theme = "pydata_sphinx_theme"
    html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
except ImportError:  # Sphinx's own theme: the pages read the same
    html_theme = "alabaster"
html_title = "hvd_magic"

html_static_path = ["_static"]
html_css_files = ["hvd.css"]
