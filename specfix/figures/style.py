"""The one figure style of the suite: fixed colours, readable sizes, a caption under each.

Use ``with style.apply(): fig, ax = plt.subplots(...)`` (a context, so nothing global changes for the
reader's own plots) and :func:`caption` under the figure. Colours always mean the same thing:
``FIXED`` (fix on), ``BUGGY`` (fix off), ``PLACEHOLDER`` (a -1 slot), ``PADDING`` (a padded row),
``NEUTRAL``. No backend is chosen here: figures render inline in Jupyter and off-screen in tests.
"""

from __future__ import annotations

import contextlib

import matplotlib as mpl

FIXED = "#1b7837"        # green: the fixed code path
BUGGY = "#c51b7d"        # magenta: the buggy path (readable with black or white text)
PLACEHOLDER = "#f1a340"  # orange: a -1 placeholder slot
PADDING = "#9e9e9e"      # grey: a padded row or slot
NEUTRAL = "#2166ac"      # blue: anything else (target, reference, a measured value)
ACCENT = "#762a83"       # purple: a second series beside NEUTRAL
CEILING = "#444444"      # dark grey: a hardware ceiling or a threshold line

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
    """The suite's rcParams for the figures drawn inside the block."""
    with mpl.rc_context(RC):
        yield


def caption(fig, text: str) -> None:
    """Write ``text`` under the figure: what to look at, in one or two sentences."""
    fig.text(0.01, -0.02, text, ha="left", va="top", wrap=True, fontsize=9, style="italic",
             transform=fig.transFigure)


def integer_ticks(axis) -> None:
    """Whole-number ticks only (token ids, counts, positions)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))
