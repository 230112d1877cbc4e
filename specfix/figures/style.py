"""The one figure style of the suite: fixed colours, readable sizes, a caption under each.

Use ``with style.apply(): fig, ax = plt.subplots(...)`` (a context, so nothing global changes for the
reader's own plots) and :func:`caption` under the figure. Colours always mean the same thing:
``FIXED`` (fix on), ``BUGGY`` (fix off), ``PLACEHOLDER`` (a -1 slot), ``PADDING`` (a padded row),
``NEUTRAL``. No backend is chosen here: figures render inline in Jupyter and off-screen in tests.
"""

from __future__ import annotations

import contextlib

import matplotlib as mpl

FIXED = "#1b7837"  # green: the fixed code path
BUGGY = "#c51b7d"  # magenta: the buggy path (readable with black or white text)
PLACEHOLDER = "#f1a340"  # orange: a -1 placeholder slot
PADDING = "#9e9e9e"  # grey: a padded row or slot
NEUTRAL = "#2166ac"  # blue: anything else (target, reference, a measured value)
ACCENT = "#762a83"  # purple: a second series beside NEUTRAL
THIRD = "#35978f"  # teal: a third series beside NEUTRAL and ACCENT
SERIES = (NEUTRAL, ACCENT, THIRD)  # series colours, in order
CEILING = "#444444"  # dark grey: a hardware ceiling or a threshold line

#: The width, in CSS px, of the book's text column (sphinx-book-theme at 1280 px); JupyterLab's output area
#: is a little wider. A figure drawn wider is scaled down to it, and its text with it.
COLUMN_PX = 688
#: A figure as wide as the column: 688 px is 7.17 in of SVG; the rest is room for the tight bounding box.
WIDTH_IN = 7.0
#: No text in a figure is set smaller than this (ticks, legends, table cells, captions).
SMALLEST_PT = 8
#: The smallest text of a figure, once scaled into the column, is at least this tall (CSS px, em size;
#: the body text is 16 px, code 14 px). Checked by the book check and the figures' tests.
MIN_TEXT_PX = 9.0

RC = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.prop_cycle": mpl.cycler(color=[NEUTRAL, FIXED, BUGGY, PLACEHOLDER, ACCENT, PADDING]),
}


@contextlib.contextmanager
def apply():
    """The suite's rcParams for the figures drawn inside the block; on leaving, only these keys go back.

    Not ``mpl.rc_context``: it restores every rcParam, ``interactive`` among them, and the first pyplot
    figure of a Jupyter kernel is where IPython's inline backend switches interactive mode on. Rolled back,
    every later figure that is neither shown nor a cell's value would silently never be displayed.
    """
    saved = {key: mpl.rcParams[key] for key in RC}
    mpl.rcParams.update(RC)
    try:
        yield
    finally:
        mpl.rcParams.update(saved)


def watch_figures(shell=None) -> bool:
    """Fail each cell that leaves a pyplot figure undisplayed (neither shown nor the cell's value).

    With IPython's inline backend a figure still open once the cell has ended was never drawn: the cell's
    reply turns to an error naming the figures, which are then closed. ``make notebooks``, the book and
    ``make lab-check`` switch this on through ``SPECFIX_CHECK_FIGURES=1`` (read when specfix is imported).
    Returns whether a shell was found to watch.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    if not getattr(shell, "_specfix_watches_figures", False):
        shell.events.register("post_run_cell", _fail_on_undisplayed)
        shell._specfix_watches_figures = True
    return True


class UndisplayedFigureError(RuntimeError):
    """A cell created a figure that was never displayed."""


def _fail_on_undisplayed(result) -> None:
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or "inline" not in mpl.get_backend():
        return
    left = plt.get_fignums()
    if not left:
        return
    titles = [plt.figure(num).get_suptitle() or f"figure {num}" for num in left]
    plt.close("all")
    if result.success:
        error = UndisplayedFigureError(
            f"this cell left {len(left)} figure(s) undisplayed ({'; '.join(titles)}): show each figure "
            "(plt.show()) or make it the cell's value"
        )
        result.error_in_exec = error
        from IPython import get_ipython

        get_ipython().showtraceback((type(error), error, None))


def caption(fig, text: str) -> None:
    """Write ``text`` under the figure: what to look at, in one or two sentences."""
    fig.text(
        0.01,
        -0.02,
        text,
        ha="left",
        va="top",
        wrap=True,
        fontsize=9,
        style="italic",
        transform=fig.transFigure,
    )


def legend_below(fig, ax, ncol: int = 2, handles=None) -> None:
    """``ax``'s legend (its artists', or ``handles``) in a strip under the axes, not beside them, so that the
    figure keeps its width (the column's): the figure grows by the strip and its axes are laid out above."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    else:
        labels = [h.get_label() for h in handles]
    strip = 0.15 + 0.2 * -(-len(labels) // ncol)
    fig.set_figheight(fig.get_figheight() + strip)
    fig.tight_layout(rect=(0, strip / fig.get_figheight(), 1, 1))
    ax.legend(
        handles,
        labels,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=fig.transFigure,
        ncol=ncol,
    )


def key_below(fig, handles, ncol: int = 2) -> None:
    """A colour key (legend ``handles``) for the whole figure in a strip under its axes, as legend_below."""
    strip = 0.15 + 0.2 * -(-len(handles) // ncol)
    fig.set_figheight(fig.get_figheight() + strip)
    fig.tight_layout(rect=(0, strip / fig.get_figheight(), 1, 1))
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 0.0), ncol=ncol)


def wrap(text: str, chars: int = 110) -> str:
    """``text`` broken into lines of at most ``chars`` characters (8 pt across a WIDTH_IN figure): a long
    line, such as a recording's source, would otherwise widen the figure past the column."""
    import textwrap

    return "\n".join(textwrap.wrap(text, chars)) or text


def integer_ticks(axis) -> None:
    """Whole-number ticks only (token ids, counts, positions)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def text_px(natural_px: float, shown_px: float, pt: float = SMALLEST_PT) -> float:
    """CSS px height of ``pt``-point text once an SVG figure ``natural_px`` wide is shown ``shown_px`` wide.

    An SVG figure is ``inches * 72`` pt wide, which a browser shows as ``inches * 96`` px at natural size.
    """
    return pt * 96 / 72 * min(1.0, shown_px / natural_px)


def legibility(fig) -> dict:
    """What a reader gets from ``fig`` in the column: its natural width (CSS px, as the inline backend saves
    it, bbox_inches="tight"), its smallest text (pt), and that text's size once scaled into the column."""
    import io
    import re

    from matplotlib.text import Text

    svg = io.BytesIO()
    fig.savefig(svg, format="svg", bbox_inches="tight")  # as the inline backend draws it
    natural = float(re.search(rb'<svg[^>]* width="([0-9.]+)pt"', svg.getvalue()).group(1)) * 96 / 72
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    smallest = min(sizes, default=SMALLEST_PT)
    return {
        "natural_px": round(natural),
        "smallest_pt": smallest,
        "text_px": round(text_px(natural, min(natural, COLUMN_PX), smallest), 1),
    }


def tidy(frame, digits: int = 1):
    """A table as the chapters show it: a column of whole numbers without decimals (a count reads 95, not
    95.0), other numbers to ``digits`` places, thousands separated, a missing value as "-" (never NaN or
    <NA>), and column names with spaces for underscores (a header can then wrap onto a second line).
    Returns a copy of ``frame`` holding strings; the numbers stay in ``frame``."""
    import pandas as pd

    def missing(value) -> bool:
        return value is None or value is pd.NA or (isinstance(value, float) and value != value)

    out = frame.copy()
    for column in out.columns:
        values = out[column]
        if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
            out[column] = values.map(lambda v: "-" if missing(v) else v).astype(object)
            continue
        present = values.dropna().astype(float)
        spec = ",.0f" if len(present) and (present == present.round()).all() else f",.{digits}f"
        out[column] = values.map(lambda v, spec=spec: "-" if missing(v) else format(float(v), spec))
    spaced = {name: name.replace("_", " ") for name in out.columns if isinstance(name, str)}
    out = out.rename(columns=spaced)
    out.index.names = [n.replace("_", " ") if isinstance(n, str) else n for n in out.index.names]
    return out
