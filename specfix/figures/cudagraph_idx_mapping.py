"""Chapter 3's figures and tables: graph launch overhead, the padded ``idx_mapping`` rows and where they
point, the bench's counts, and the output distribution with and without the fix.

One function per figure; each returns the Figure (drawn in :mod:`specfix.figures.style`, captioned, legend
outside the data) and leaves showing it to the notebook. Tables are DataFrames.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from specfix.figures import style
from specfix.lab.padding_bench import BufferState, total_variation

#: Columns of :func:`bench_table`, in order.
BENCH_COLUMNS = ["num_requests", "differing", "steps_batched", "padded_steps", "writes_by_origin"]


def _log_axis(axis, values) -> None:
    """A log axis labelled at the measured values only (no colliding labels, no minor labels)."""
    axis.set_major_locator(FixedLocator(sorted({float(v) for v in values})))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    axis.set_minor_locator(NullLocator())


def launch_overhead(rows: Sequence[dict], source: str):
    """Host microseconds per drafter step, eager launches against one graph replay, per batch size.

    ``rows``: dicts with ``size``, ``eager_us`` and ``graph_us`` (the recording's ``launch_overhead``)."""
    df = pd.DataFrame(list(rows))
    missing = {"size", "eager_us", "graph_us"} - set(df.columns)
    if df.empty or missing:
        raise ValueError(f"rows must be dicts with size, eager_us and graph_us, missing {sorted(missing)}")
    with style.apply():
        fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 3.2))
        ax.plot(df["size"], df["eager_us"], "o-", color=style.BUGGY, label="eager launches")
        ax.plot(df["size"], df["graph_us"], "s-", color=style.FIXED, label="one graph replay")
        ax.set(xscale="log", yscale="log", xlabel="batch rows", ylabel="µs per drafter step",
               title=f"Drafter step (k = 3 forwards and samplers)\n{style.wrap(source, 90)}")
        ax.title.set_fontsize(9)
        _log_axis(ax.xaxis, df["size"])
        times = df[["eager_us", "graph_us"]].to_numpy()
        _log_axis(ax.yaxis, [v for v in (50, 100, 200, 500, 1000, 2000, 5000, 10000)
                             if times.min() / 1.5 <= v <= times.max() * 1.5])
        style.legend_below(fig, ax)
        speedup = df["eager_us"] / df["graph_us"]
        style.caption(fig, f"The replay costs about the same at every size, eager launches "
                           f"{speedup.min():.0f} to {speedup.max():.0f} times more: at these batch sizes the "
                           "host's launches, not the GPU's work, set the step time.")
    return fig


def _draw_buffer(ax, state: BufferState, title: str) -> None:
    rows = len(state.idx_mapping)
    live_slots = set(state.owners)
    ax.text(0.8, 1.0, "idx_mapping", ha="center", fontsize=9, weight="bold")
    ax.text(4.2, 1.0, "draft_logits", ha="center", fontsize=9, weight="bold")
    for r, slot in enumerate(state.idx_mapping):
        if r < state.num_reqs:
            fill, label = style.NEUTRAL, f"row {r}: {slot}  ({state.batch[r]})"
        elif r < state.num_reqs_padded:
            fill, label = style.PADDING, f"row {r}: {slot}  padded"
        else:
            fill, label = "white", f"row {r}: {slot}"
        ax.add_patch(Rectangle((0, -r), 1.6, 0.85, facecolor=fill, alpha=0.3 if fill != "white" else 1,
                               edgecolor="#bbbbbb", lw=0.5))
        ax.text(0.8, -r + 0.42, label, ha="center", va="center", fontsize=style.SMALLEST_PT,
                color="black" if r < state.num_reqs_padded else "#888888")
    for s in range(rows):
        owner = state.owners.get(s)
        ax.add_patch(Rectangle((3.4, -s), 1.6, 0.85, facecolor=style.NEUTRAL if s in live_slots else "white",
                               alpha=0.3 if s in live_slots else 1, edgecolor="#bbbbbb", lw=0.5))
        ax.text(4.2, -s + 0.42, f"slot {s}: {owner}" if owner else f"slot {s}: free", ha="center",
                va="center", fontsize=style.SMALLEST_PT, color="black" if owner else "#888888")
    for w in state.writes:
        hit = w.victim is not None
        ax.annotate("", xy=(3.4, -w.slot + 0.42), xytext=(1.6, -w.row + 0.42),
                    arrowprops=dict(arrowstyle="->", color=style.BUGGY if hit else style.PADDING,
                                    lw=1.6 if hit else 1.0))
    ax.set_xlim(-0.1, 5.1)
    ax.set_ylim(-rows + 0.6, 1.4)
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def padded_buffers(states: Sequence[BufferState], titles: Sequence[str]):
    """One panel per buffer state: ``idx_mapping`` rows (live, padded, beyond the graph) on the left, the
    request-state slots of ``draft_logits`` on the right, an arrow for every padded row that writes a slot
    (magenta: a live request's slot; grey: a free slot)."""
    if len(states) != len(titles) or not states:
        raise ValueError(f"need one title per state, got {len(states)} states and {len(titles)} titles")
    rows = max(len(s.idx_mapping) for s in states)
    with style.apply():
        fig, axes = plt.subplots(1, len(states), figsize=(style.WIDTH_IN, 0.3 * rows + 1.2), squeeze=False)
        for ax, state, title in zip(axes[0], states, titles, strict=True):
            victims = ", ".join(state.victims) or "none"
            _draw_buffer(ax, state, f"{title}\n{state.num_reqs} live rows, graph of {state.num_reqs_padded}; "
                                    f"overwritten: {victims}")
        fig.tight_layout()
        style.caption(fig, "Blue rows are live, grey rows are padding that the graph processes anyway, "
                           "white rows lie beyond it. A magenta arrow is a padded row whose stale entry "
                           "names a live request's slot: its sampler overwrites that request's cached draft "
                           "logits.")
    return fig


def bench_table(benches: dict[str, dict]) -> pd.DataFrame:
    """The bench summaries (``PaddingBench.summary()`` or the recording's), one row per label."""
    frame = pd.DataFrame(list(benches.values()), index=list(benches))
    missing = set(BENCH_COLUMNS) - set(frame.columns)
    if missing:
        raise ValueError(f"bench summaries lack {sorted(missing)}")
    return frame[BENCH_COLUMNS]


def chi_square_table(dists: dict[str, dict]) -> pd.DataFrame:
    """Per label (e.g. "fix on") and output position: its role (the last position is the bonus token),
    trials, chi-square against its threshold, and the total variation distance of the output to the
    target p and to the draft q, computed here from the counts (so live runs and recordings read alike)."""
    rows = []
    for label, dist in dists.items():
        p, q, last = dist["target_probs"], dist["draft_probs"], len(dist["positions"]) - 1
        for r in dist["positions"]:
            counts = np.asarray(r["counts"], dtype=float)
            freq = counts / max(counts.sum(), 1.0)
            rows.append({"fix": label, "position": r["position"],
                         "role": "bonus" if r["position"] == last else "draft", "trials": r["trials"],
                         "chi2": round(r["chi2"], 1), "threshold": round(r["threshold"], 1),
                         "passed": r["passed"], "TV to p": round(total_variation(freq, p), 3),
                         "TV to q": round(total_variation(freq, q), 3)})
    return pd.DataFrame(rows)


def output_distribution(dists: dict[str, dict], source: str = ""):
    """One panel per output position: the output frequencies of each run (bars) against the target p and
    the draft q (markers). ``dists``: label -> :func:`specfix.lab.padding_bench.one_step_distribution`."""
    if not dists:
        raise ValueError("dists is empty")
    first = next(iter(dists.values()))
    p, q = np.array(first["target_probs"]), np.array(first["draft_probs"])
    positions = first["positions"]
    colours = {"fix on": style.FIXED, "fix off": style.BUGGY}
    width = 0.8 / len(dists)
    x = np.arange(len(p))
    cols = min(len(positions), 2)  # two panels a row: the figure keeps the column's width
    rows = -(-len(positions) // cols)
    with style.apply():
        fig, grid = plt.subplots(rows, cols, figsize=(style.WIDTH_IN, 0.4 + 2.7 * rows), sharey=True,
                                 squeeze=False)
        axes = grid.ravel()
        for j, ax in enumerate(axes[:len(positions)]):
            for i, (label, dist) in enumerate(dists.items()):
                counts = np.array(dist["positions"][j]["counts"])
                ax.bar(x + (i - (len(dists) - 1) / 2) * width, counts / max(counts.sum(), 1), width=width,
                       color=colours.get(label, style.PADDING), alpha=0.85, label=f"output, {label}")
            ax.plot(x, p, "_", color="black", ms=9, mew=2, label="target p")
            ax.plot(x, q, "x", color=style.NEUTRAL, ms=5, label="draft q")
            role = positions[j].get("role", "")
            ax.set(title=f"position {positions[j]['position']}" + (f" ({role})" if role else ""),
                   xlabel="token id")
            style.integer_ticks(ax.xaxis)
        for ax in grid[:, 0]:
            ax.set_ylabel("frequency")
        if source:
            fig.suptitle(style.wrap(source), fontsize=style.SMALLEST_PT)
        handles, labels = axes[0].get_legend_handles_labels()
        if len(axes) > len(positions):  # the key takes the spare panel's place
            fig.tight_layout()
            spare = axes[-1].get_position()
            fig.delaxes(axes[-1])
            fig.legend(handles, labels, loc="center", bbox_to_anchor=(spare.x0 + spare.width / 2,
                                                                      spare.y0 + spare.height / 2))
        else:
            fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))
            fig.legend(handles, labels, loc="lower center", ncol=len(labels))
        style.caption(fig, "Without the fix the bars at the drafted positions follow the draft's crosses, "
                           "not the target's black marks; the bonus position follows the target either way.")
    return fig
