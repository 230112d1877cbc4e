"""The one figure style of the suite: fixed colours, readable sizes, a caption under each figure.

Draw in ``with style.figure(caption, height) as (fig, ax):`` (nothing global changes for the reader's own
plots). Colours always mean the same thing: ``FIXED`` (fix on), ``BUGGY`` (fix off), ``PLACEHOLDER`` (a -1
slot), ``PADDING`` (a padded row), ``NEUTRAL`` (anything else).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import textwrap

import matplotlib as mpl
import numpy as np
from matplotlib import colors
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

FIXED = "#1b7837"  # green: the fixed code path
BUGGY = "#c51b7d"  # magenta: the buggy path (readable with black or white text)
PLACEHOLDER = "#f1a340"  # orange: a -1 placeholder slot
PADDING = "#9e9e9e"  # grey: a padded row or slot
NEUTRAL = "#2166ac"  # blue: anything else (target, reference, a measured value)
ACCENT = "#762a83"  # purple: a second series beside NEUTRAL
SERIES = (NEUTRAL, ACCENT, "#35978f")  # series colours, in order: a teal third beside NEUTRAL and ACCENT
CEILING = "#444444"  # dark grey: a hardware ceiling or a threshold line

COLUMN_PX = 688  # CSS px of the book's text column (sphinx-book-theme at 1280 px); wider figures shrink
WIDTH_IN = 7.0  # a column-wide figure: 7.17 in of SVG, less room for the tight bounding box
SMALLEST_PT = 8  # no text in a figure is smaller (ticks, legends, table cells, captions)
MIN_TEXT_PX = 9.0  # the smallest text once scaled into the column, CSS px (body text is 16 px)

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
    """The suite's rcParams inside the block, only these keys restored: ``mpl.rc_context`` would also roll
    back the ``interactive`` that IPython's first figure switches on, and later figures would vanish."""
    saved = {key: mpl.rcParams[key] for key in RC}
    mpl.rcParams.update(RC)
    try:
        yield
    finally:
        mpl.rcParams.update(saved)


def watch_figures() -> bool:
    """Fail each cell that leaves a figure undisplayed (SPECFIX_CHECK_FIGURES=1), and show every DataFrame's
    cells whole (a page cannot unfold a cell that pandas cut to "..."); False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    if not getattr(shell, "_specfix_watches_figures", False):
        shell.events.register("post_run_cell", _fail_on_undisplayed)
        import pandas as pd  # each cell whole, whatever display.max_colwidth a chapter set

        whole = lambda frame: pd.option_context("display.max_colwidth", None)(frame._repr_html_)()
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, whole)
        shell._specfix_watches_figures = True
    return True


def _fail_on_undisplayed(result) -> None:
    plt = sys.modules.get("matplotlib.pyplot")
    left = plt.get_fignums() if plt is not None and "inline" in mpl.get_backend() else []
    if not left:
        return
    titles = [plt.figure(num).get_suptitle() or f"figure {num}" for num in left]
    plt.close("all")
    if result.success:
        error = RuntimeError(
            f"this cell left {len(left)} figure(s) undisplayed ({'; '.join(titles)}): show each figure "
            "(plt.show()) or make it the cell's value"
        )
        result.error_in_exec = error
        from IPython import get_ipython

        get_ipython().showtraceback((type(error), error, None))


@contextlib.contextmanager
def figure(text: str, height: float, *shape, width: float = WIDTH_IN, close: bool = False, **kwargs):
    """``plt.subplots(*shape)`` drawn inside :func:`apply`, then ``text`` (what to look at, in one or two
    sentences) under it; ``close``: closed in pyplot, so a notebook shows it once, as the cell's value."""
    import matplotlib.pyplot as plt  # on first use: importing specfix (figure checks on) loads no pyplot

    with apply():
        fig, axes = plt.subplots(*shape, figsize=(width, height), **kwargs)
        yield fig, axes
        fig.text(0.01, -0.02, text, ha="left", va="top", wrap=True, fontsize=9, style="italic")
    if close:
        plt.close(fig)


def light(colour: str, amount: float = 0.7) -> str:
    """``colour`` mixed with ``amount`` of white (a fill on which black text reads); a negative ``amount``
    mixes in that much black instead (a darker shade of the same hue)."""
    return colors.to_hex((1 - abs(amount)) * np.array(colors.to_rgb(colour)) + max(amount, 0))


def patches(fills, labels) -> list[Patch]:
    """A colour key's handles: one swatch per fill, named by its label."""
    return [Patch(facecolor=f, edgecolor="#888888", label=k) for f, k in zip(fills, labels, strict=True)]


def legend_below(fig, ax=None, ncol=None, handles=None, **kwargs) -> None:
    """``handles`` or ``ax``'s (None: every panel's, merged) in a strip under the axes, so the figure keeps
    the column's width."""
    if handles is None:
        found = {}
        for each in [ax] if ax else fig.axes:
            for handle, label in zip(*each.get_legend_handles_labels(), strict=True):
                found.setdefault(label, handle)
        handles = list(found.values())
    labels = [h.get_label() for h in handles]
    ncol = ncol or (2 if max(map(len, labels), default=0) <= 45 else 1)
    strip = 0.15 + 0.2 * -(-len(labels) // ncol) if labels else 0.0
    fig.set_figheight(fig.get_figheight() + strip)
    fig.tight_layout(rect=(0, strip / fig.get_figheight(), 1, 1))
    where = dict(loc="lower center", bbox_to_anchor=(0.5, 0.0), bbox_transform=fig.transFigure, ncol=ncol)
    if labels:
        (fig if ax is None else ax).legend(handles, labels, **where, **kwargs)


def errorbars(ax, x, rows, **kwargs) -> None:
    """``rows``' medians against ``x``, with bars from their 20th to their 80th percentile."""
    y = rows["median_us"]
    ax.errorbar(x, y, yerr=[y - rows["p20_us"], rows["p80_us"] - y], capsize=3, **kwargs)


def cells(ax, kinds, fills, texts=None, xlabels=None, ylabels=None, text_colours=None) -> None:
    """A grid of cells filled by kind (an index into ``fills``), labelled by ``texts`` ("": blank)."""
    kinds = np.atleast_2d(kinds)
    ax.imshow(kinds, cmap=colors.ListedColormap(fills), vmin=0, vmax=len(fills) - 1, aspect="auto")
    for (r, c), text in np.ndenumerate(np.atleast_2d(np.asarray([] if texts is None else texts, object))):
        if text:
            colour = text_colours[kinds[r, c]] if text_colours else "black"
            ax.text(c, r, text, ha="center", va="center", fontsize=SMALLEST_PT, color=colour)
    rows, cols = kinds.shape
    ax.set_xticks(range(cols), xlabels if xlabels is not None else range(cols), fontsize=SMALLEST_PT)
    if ylabels is None:
        ax.set_yticks([])
    else:
        ax.set_yticks(range(rows), ylabels, fontsize=SMALLEST_PT)
    ax.grid(False)


def grouped_bars(ax, x, series, **kwargs) -> None:
    """Bars side by side at each ``x``, one per ``(label, heights, colour)`` or ``(label, heights, colour,
    yerr)`` of ``series`` (colour None: the style's cycle)."""
    width = 0.8 / len(series)
    for i, (label, heights, colour, *yerr) in enumerate(series):
        at = np.asarray(x) + (i - (len(series) - 1) / 2) * width
        ax.bar(at, heights, width, label=label, color=colour, yerr=yerr[0] if yerr else None, **kwargs)


def wrap(text: str, chars: int = 110) -> str:
    """``text`` in lines of ``chars`` (8 pt across WIDTH_IN), so a long line cannot widen the figure."""
    return "\n".join(textwrap.wrap(text, chars)) or text


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is 1: "1 verification", "3 verifications"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def integer_ticks(axis) -> None:
    """Whole-number ticks only (token ids, counts, positions)."""
    axis.set_major_locator(MaxNLocator(integer=True))


def log_ticks(axis, values=None) -> None:
    """A log scale whose labels cannot collide: at ``values`` only, or at 1, 2 and 5 times powers of 10."""
    getattr(axis.axes, f"set_{axis.axis_name}scale")("log")
    locator = FixedLocator(sorted({float(v) for v in values})) if values is not None else None
    axis.set_major_locator(locator or LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def text_px(natural_px: float, shown_px: float, pt: float = SMALLEST_PT) -> float:
    """CSS px height of ``pt``-point text in an SVG figure ``natural_px`` wide shown ``shown_px`` wide."""
    return pt * 96 / 72 * min(1.0, shown_px / natural_px)  # an SVG inch is 72 pt and 96 CSS px


def legibility(fig) -> dict:
    """``fig``'s natural width (CSS px), smallest text (pt), and that text's CSS px shown in the column."""
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
    """``frame`` as strings for the page: whole columns without decimals, a missing value as "-", headers
    spaced."""
    import pandas as pd

    missing = lambda value: pd.api.types.is_scalar(value) and pd.isna(value)  # None, NA, NaN
    out = frame.copy()
    for column in out.columns:
        values = out[column]
        if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
            out[column] = values.map(lambda v: "-" if missing(v) else v).astype(object)
            continue
        present = values.dropna().astype(float)
        spec = ",.0f" if len(present) and (present == present.round()).all() else f",.{digits}f"
        out[column] = values.map(lambda v, spec=spec: "-" if missing(v) else format(float(v), spec))
    out = out.rename(columns={name: name.replace("_", " ") for name in out.columns if isinstance(name, str)})
    out.index.names = [n.replace("_", " ") if isinstance(n, str) else n for n in out.index.names]
    return out
