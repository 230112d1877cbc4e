"""Sphinx extension for the book.

- Presents the chapters' cells (tags and prompts set by book_cells before a chapter runs).
- Drops widgets: every widget in the chapters has a static figure above it, and a static page cannot run
  the kernel a widget needs, so its output would be a blank box (or an `interactive(children=...)` repr).
  A post-transform removes each output that carries a widget view, and the widgets' saved state is left
  out of the pages.
- Presents the tables on each page as book_cells.present_tables says (where a name may break, numbers on the
  right, no meaningless row index).
- Fails the build when a cell raised, naming every chapter where one did.
- Serves MathJax from the book itself (no CDN).
"""

import importlib.util
import json
from pathlib import Path

from book_cells import prepare_notebook, present_tables
from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.transforms.post_transforms import SphinxPostTransform

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_SCRIPT = "ipywidgets_state"  # MyST-NB's key for the <script> holding the widgets' state


# The PyPI package `sphinx-mathjax-offline` ships MathJax 3 under static/mathjax/. Its own Sphinx hook is
# not declared safe for parallel reading, so the book takes only its files: they land in _static/mathjax/,
# where conf.py's `mathjax_path` points.
MATHJAX_PACKAGE = "sphinx-mathjax-offline"


def _add_mathjax(app, config):
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    static = Path(spec.submodule_search_locations[0], "static") if spec else None
    if static is None or not (static / "mathjax" / "tex-chtml.js").is_file():
        raise ExtensionError(
            f"the book serves MathJax from the {MATHJAX_PACKAGE!r} package, which is not "
            "installed: pip install -e '.[book]' (make book does it)"
        )
    config.html_static_path.append(str(static))


def _prepare_chapter(app, docname, source):
    if not docname.startswith("notebooks/"):
        return
    nb = prepare_notebook(json.loads(source[0]), app.config.specfix_book_collapse_lines)
    source[0] = json.dumps(nb)


def _present_tables(app, pagename, templatename, context, doctree):
    if "body" in context:
        context["body"] = present_tables(context["body"])


def _fail_on_failed_chapters(app, env):
    """Fail the build once every chapter has run, naming each chapter whose cell raised.

    MyST-NB's own `nb_execution_raise_on_error` stops at the first failure and leaves the cell's traceback
    in a temporary file (under `-j`, not even the chapter's name); with it off, MyST-NB logs each failing
    cell and its traceback as a warning, and this handler turns any failure into an error.
    """
    failed = sorted(
        docname
        for docname, data in getattr(env, "nb_metadata", {}).items()
        if (data.get("exec_data") or {}).get("succeeded") is False
    )
    if failed:
        raise ExtensionError(f"a cell raised in {', '.join(failed)} (the cell and its traceback are above)")


def _drop_widget_state(app, env):
    """Leave the widgets' saved state out of the pages: with their views gone, nothing would read it."""
    for data in getattr(env, "nb_metadata", {}).values():
        data.get("js_files", {}).pop(WIDGET_STATE_SCRIPT, None)


def _is_mime_bundle(node):
    return isinstance(node, nodes.container) and node.get("nb_element") == "mime_bundle"


class DropWidgetViews(SphinxPostTransform):
    """Remove every output whose mime bundle holds a widget view, and any output area left empty."""

    default_priority = 3  # MyST-NB's SelectMimeType runs at 4 and would keep the bundle's text/plain

    def run(self, **kwargs):
        for bundle in list(self.document.findall(_is_mime_bundle)):
            if not any(child.get("mime_type") == WIDGET_VIEW for child in bundle.children):
                continue
            area = bundle.parent
            area.remove(bundle)
            if not area.children and area.get("nb_element") == "cell_code_output":
                area.parent.remove(area)


def setup(app):
    app.add_config_value("specfix_book_collapse_lines", 15, "env", types=(int,))
    app.connect("config-inited", _add_mathjax)
    app.connect("source-read", _prepare_chapter)
    app.connect("env-updated", _fail_on_failed_chapters)
    app.connect("env-updated", _drop_widget_state)
    app.connect("html-page-context", _present_tables)
    app.add_post_transform(DropWidgetViews)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
