"""Sphinx configuration of the book: the chapters in notebooks/, executed at CI scale, as a static site.

Built by `make book` as `sphinx-build -c docs . build/book/html`: the source folder is the repository root, so
the notebooks are read where they live (nothing is copied, nothing is written into notebooks/), and every
top-level folder other than docs/ and notebooks/ is excluded. No file is fetched at build time or when a
page is read: the theme ships its assets, MathJax comes from the `sphinx-mathjax-offline` package, and the
ipywidgets loader is switched off (the book shows each widget's static figure instead; see _ext/).
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))

# The book is the CI-scale, CPU rendering of the suite; an explicit setting in the environment wins.
os.environ.setdefault("SPECFIX_SCALE", "ci")
os.environ.setdefault("SPECFIX_DEVICE", "cpu")
# A cell that leaves a figure undisplayed fails the build (specfix.figures.style.watch_figures).
os.environ["SPECFIX_CHECK_FIGURES"] = "1"

project = "specfix"
author = "the specfix authors"

root_doc = "docs/index"
include_patterns = ["docs/index.md", "notebooks/*.ipynb"]
# Sphinx walks the whole source folder before it filters; pruning the other top-level folders keeps the
# walk out of .venv/, build/ and the package.
exclude_patterns = sorted(
    entry.name for entry in ROOT.iterdir() if entry.is_dir() and entry.name not in ("docs", "notebooks")
) + ["**/.ipynb_checkpoints"]

extensions = [
    "myst_nb",
    "specfix_book",
]

# --- executing the chapters ------------------------------------------------------------------------
nb_execution_mode = "force"  # every build runs every chapter: the book shows what the code does today
# A failing cell fails the build: MyST-NB logs the cell and its traceback, runs the other chapters, and
# specfix_book then stops the build with the names of the chapters that failed.
nb_execution_raise_on_error = False
nb_execution_timeout = 300  # seconds per cell, as `make notebooks` (nbmake) allows
nb_execution_in_temp = True  # a chapter that writes a file writes it in a temporary folder
nb_execution_show_tb = True  # the traceback of a failing cell goes to the build log
nb_merge_streams = True
nb_ipywidgets_js = {}  # no widget loader from a CDN; widget outputs are dropped by specfix_book
nb_output_stderr = "show"

# --- what the reader sees --------------------------------------------------------------------------
mathjax_path = "mathjax/tex-chtml.js"  # MathJax 3, copied into _static/ by specfix_book (no CDN)
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
# Markdown that a cell displays goes through MyST as the notebook's own markdown does, so its links to
# other chapters (`01_placeholder_lifecycle.ipynb`) become links to their pages.
nb_render_markdown_format = "myst"

html_theme = "sphinx_book_theme"
html_title = "specfix: where speculative decoding meets padding"
html_static_path = ["_static"]
html_css_files = ["book.css"]
# Search excerpts without the theme's buttons (its colour-mode menu reads "Light Dark"); after searchtools.js.
html_js_files = [("search_excerpts.js", {"defer": "defer"})]
html_extra_path = ["_extra"]  # index.html at the top of the build folder, pointing at the front page
html_last_updated_fmt = None
html_copy_source = False  # the .ipynb sources stay in the repository, not in the book
html_show_sourcelink = False
html_show_copyright = False
# A first visit starts in light mode (the figures are drawn on white); the theme's switcher still offers dark.
html_context = {"default_mode": "light"}
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": False,
    "navbar_persistent": [],  # one search field, in the sidebar (the theme's header would repeat it)
}

# specfix_book: code cells longer than this many lines start collapsed (exercise cells never do). Code is
# wrapped at the column's 80 characters, so a cell runs longer than it would at 110.
specfix_book_collapse_lines = 25
