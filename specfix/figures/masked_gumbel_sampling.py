"""Chapter 4's figures, tables and paragraphs on Gumbel-max sampling, its ``is_valid_req`` mask and their
H200 recordings."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from specfix.figures import style
from specfix.figures.performance import goal, mask_overhead
from specfix.tools import bench

#: The draft-logits picture's cells (sentinel, written by a live row, a stray write) and their text colours.
_CELL_FILLS = ("#f0f0f0", style.NEUTRAL, style.BUGGY)
_CELL_TEXT = ("black", "white", "white")
_CELL_WORDS = ("sentinel", "written", "stray write")


def _bars_figure(probs, series, title: str, caption: str, height: float = 3.0, whiskers: bool = False):
    """softmax(logits / T) beside each ``(label, token ids drawn, colour)`` series' frequencies, per token;
    ``whiskers``: at each series' bar, softmax +- 2 standard deviations of a frequency over its draws."""
    vocab, probs = len(probs), np.asarray(probs, dtype=float)
    bars = [("softmax(logits / T)", probs, style.CEILING)]
    bars += [(label, np.bincount(s, minlength=vocab) / len(s), colour) for label, s, colour in series]
    with style.figure(caption, height) as (fig, ax):
        style.grouped_bars(ax, np.arange(vocab), bars)
        if whiskers:
            width = 0.8 / len(bars)  # where grouped_bars puts series i's bars
            for i, (_, s, _) in enumerate(series, start=1):
                at = np.arange(vocab) + (i - (len(bars) - 1) / 2) * width
                sigma = np.sqrt(probs * (1 - probs) / len(s))
                label = "softmax ± 2σ over the sampler's draws" if i == 1 else "_whisker"
                ax.errorbar(
                    at, probs, 2 * sigma, fmt="none", ecolor="black", elinewidth=0.9, capsize=2, label=label
                )
        style.integer_ticks(ax.xaxis)
        ax.set(xlabel="token id", ylabel="frequency", title=title)
        style.legend_below(fig, ax)
    return fig


def outside_whiskers(probs, draws: dict[str, np.ndarray]) -> int:
    """How many (sampler, token) frequencies lie more than 2 standard deviations from softmax."""
    p = np.asarray(probs, dtype=float)
    outside = 0
    for s in draws.values():
        freq = np.bincount(s, minlength=len(p)) / len(s)
        outside += int((np.abs(freq - p) > 2 * np.sqrt(p * (1 - p) / len(s))).sum())
    return outside


def draws_vs_softmax(probs, draws: dict[str, np.ndarray], temperature: float, tests: pd.DataFrame):
    """Grouped bars: softmax(logits / T) and each sampler's token frequencies (``draws``: label -> ids),
    with their sampling noise; ``tests``: the chi-square test of each sampler (``passed``), by label."""
    colours = style.SERIES  # not green: green means "fix on" in this book
    series = [
        (f"{name} ({len(s):,} draws)", s, colours[i % len(colours)])
        for i, (name, s) in enumerate(draws.items())
    ]
    fewest = min(draws, key=lambda name: len(draws[name]))
    caption = (
        "Whiskers: the softmax bar ± 2 standard deviations of a frequency over that sampler's draws, the "
        f"band a correct sampler's bar falls in about 19 times in 20. {outside_whiskers(probs, draws)} of "
        f"{len(draws) * len(probs)} bars fall outside theirs; {int(tests.passed.sum())} of {len(tests)} "
        f"samplers pass the chi-square test below. The {fewest}'s {len(draws[fewest]):,} draws leave the "
        "widest band: its bars may stray furthest from softmax by chance alone."
    )
    title = f"Gumbel-max draws against softmax, T = {temperature}"
    return _bars_figure(probs, series, title, caption, height=3.4, whiskers=True)


def draws_at_temperature(probs, samples, temperature: float, chi2: float, threshold: float):
    """The widget's figure: softmax(logits / T) and the frequency of each token among ``samples``."""
    return _bars_figure(
        probs,
        [(f"{len(samples):,} Gumbel-max draws", samples, style.NEUTRAL)],
        f"T = {temperature:g}, vocabulary {len(probs)}",
        f"Chi-square {chi2:.1f} against a threshold of {threshold:.1f}: the draws "
        f"{'pass' if chi2 < threshold else 'fail'} the test. Lower T piles the draws onto the top tokens; "
        "higher T flattens them.",
    )


def gumbel_tail(u, exact, careful, naive):
    """The noise g(u) at small u in three forms; the naive form's +inf marked, not clipped away."""
    u, exact, careful, naive = (np.asarray(a, dtype=np.float64) for a in (u, exact, careful, naive))
    overflow = ~np.isfinite(naive)
    top = np.nanmax(exact) * 1.12
    caption = (
        "In the shaded band the naive form is +inf (triangles): 1 - u is exactly 1 in float32. Just "
        "right of it, it is a staircase. The careful form follows the exact curve everywhere."
    )
    with style.figure(caption, 3.2) as (fig, ax):
        ax.semilogx(u, exact, color=style.CEILING, lw=4, alpha=0.35, label="exact (float64)")
        ax.semilogx(u, careful, "--", color=style.FIXED, label="careful -log(-log1p(-u)), float32")
        finite = np.where(overflow, np.nan, naive)
        ax.semilogx(u, finite, ":", color=style.BUGGY, lw=2, label="naive -log(-log(1 - u)), float32")
        if overflow.any():
            ax.axvspan(u[overflow].min(), u[overflow].max(), color=style.BUGGY, alpha=0.08)
            marks = u[overflow][::8]
            label = "naive = +inf (1 - u rounds to 1)"
            ax.plot(marks, np.full(len(marks), top), "^", color=style.BUGGY, ms=5, label=label)
        ax.set_ylim(top=top * 1.06)
        ax.set(xlabel="u", ylabel="Gumbel noise g", title="The winners' noise lives at small u")
        style.legend_below(fig, ax)
    return fig


def tile_winners(noisy, block: int):
    """One row's logits + noise by tiles of ``block``: each tile's maximum, then the best of them."""
    noisy = np.asarray(noisy, dtype=np.float64)
    starts = range(0, len(noisy), block)
    maxima = [noisy[s : s + block].max() for s in starts]
    winners = [s + int(noisy[s : s + block].argmax()) for s in starts]
    best = int(np.argmax(maxima))
    caption = (
        f"Each tile keeps only its maximum and its token id; the row's token is the best tile's winner, "
        f"token {winners[best]}, whatever the tile size."
    )
    with style.figure(caption, 3.0) as (fig, ax):
        ax.plot(noisy, lw=0.4, color=style.PADDING)
        for s in starts[1::2]:
            ax.axvspan(s, min(s + block, len(noisy)), color=style.PADDING, alpha=0.12, lw=0)
        ax.plot(winners, maxima, "o", color=style.NEUTRAL, label="each tile's max (stage 1)")
        best_look = dict(ms=11, mfc="none", mec=style.FIXED, mew=2, label="best of the tiles (stage 2)")
        ax.plot([winners[best]], [maxima[best]], "o", **best_look)
        ax.set_ylim(top=maxima[best] + 0.15 * (maxima[best] - noisy.min()))
        style.integer_ticks(ax.xaxis)
        title = f"{len(maxima)} tiles of {block} (the last one partial)"
        ax.set(xlabel="token id", ylabel="logit + noise", title=title)
        style.legend_below(fig, ax)
    return fig


def draft_logits_cells(buf, sentinel: float, live_slots) -> np.ndarray:
    """Each (row, column) of ``buf``: 0 all sentinel, 1 written in a live slot, 2 written elsewhere."""
    written = (np.asarray(buf) != sentinel).any(axis=-1)
    live = np.zeros(written.shape, dtype=bool)
    for row, col in live_slots:
        live[row, col] = True
    return np.where(written & ~live, 2, written.astype(int))


def padded_rows_buffers(buffers: dict[str, np.ndarray], sentinel: float, live_slots, row_labels):
    """A map of the guarded draft-logits buffer per kernel variant (``buffers``: title -> buffer)."""
    caption = (
        "Grey: still the sentinel. Blue: written by a live row into its own slot. Magenta: written where "
        "no live row belongs, here the guard row just before the table."
    )
    with style.figure(caption, 3.2, 1, len(buffers), sharey=True, squeeze=False) as (fig, axes):
        for ax, (title, buf) in zip(axes[0], buffers.items(), strict=True):
            cells = draft_logits_cells(buf, sentinel, live_slots)
            columns = [f"col {c}" for c in range(cells.shape[1])]
            words = np.array(_CELL_WORDS)[cells]
            style.cells(ax, cells, _CELL_FILLS, words, columns, row_labels, text_colours=_CELL_TEXT)
            ax.set_title(title)
    return fig


def _gumbel_at(report: dict, rows: int, vocab: int) -> pd.Series:
    """us per call of every sampler at ``rows`` x ``vocab`` fp32, by impl."""
    g = bench.frame(report, "gumbel")
    return g[(g.rows == rows) & (g.vocab == vocab) & (g.dtype == "fp32")].set_index("impl").median_us


def throughput_table(report: dict, min_rows: int = 256) -> pd.DataFrame:
    """G logits/s of specfix's two noise modes, by vocabulary and rows (from ``min_rows`` on), per dtype: the
    unit in each dtype's header."""
    g = bench.frame(report, "gumbel")
    ours = g[g.impl.str.startswith("specfix") & (g.rows >= min_rows)]
    table = ours.pivot_table(index=["vocab", "rows"], columns=["dtype", "impl"], values="G_logits_per_s")
    names = {d: f"{d}, G logits/s" for d in table.columns.levels[0]}
    names |= {i: f"{i.removeprefix('specfix_')} noise" for i in table.columns.levels[1]}
    return table.round().rename(columns=names).rename_axis(columns=[None, None])


#: A rate goal's shape, as the bench writes it: "... at 1,024 x 151,936 bf16, ...".
_GOAL_SHAPE = re.compile(r"at ([\d,]+) x ([\d,]+) (\w+)")


def _rate_goal(report: dict, vocab: int) -> tuple[dict, int, str] | None:
    """The first G logits/s goal of the gumbel case at ``vocab``, with its rows and dtype."""
    for g in report["goals"]:
        shape = _GOAL_SHAPE.search(g["goal"])
        if g["case"] == "gumbel" and g["unit"] == "G logits/s" and shape:
            if int(shape[2].replace(",", "")) == vocab:
                return g, int(shape[1].replace(",", "")), shape[3]
    return None


def bench_speed(report: dict, vocab: int = 151_936, rows_at: int = 256):
    """G logits/s against rows at one vocabulary, with the rate goal at its own shape, and every sampler's
    us per call at one shape."""
    gumbel = bench.frame(report, "gumbel").query("vocab == @vocab")
    names = ["torch_softmax_multinomial", "torch_gumbel_max", "specfix_exact", "specfix_fast"]
    at = _gumbel_at(report, rows_at, vocab)
    big = gumbel[(gumbel.impl == "specfix_fast") & (gumbel.rows >= 256)].G_logits_per_s
    rate = _rate_goal(report, vocab)
    goal_words = ""
    if rate:
        g, goal_rows, goal_dtype = rate
        path = re.search(r"apply_temperature=(True|False)", g["goal"])  # the bench times both paths
        goal_words = (
            f"The star is the goal, >= {g['target']:.0f} G logits/s at {goal_rows:,} rows {goal_dtype}"
            f"{', ' + path[0] if path else ''}: "
            f"{g['status']} ({g['measured']:.0f} measured; chapter 5 shows why). "
        )
    caption = (
        f"Above: from 256 rows on the fast noise runs at {big.min():.0f} to {big.max():.0f} G logits/s; "
        f"fewer rows do not fill the GPU. {goal_words}Below: both noise modes against the textbook "
        "samplers at one shape (shorter is faster)."
    )
    with style.figure(caption, 6.2, 2, 1, height_ratios=[1.4, 1]) as (fig, (top, bottom)):
        for impl, colour in (("specfix_exact", style.ACCENT), ("specfix_fast", style.FIXED)):
            for dtype, line in (("fp32", "-"), ("bf16", "--")):
                sel = gumbel[(gumbel.impl == impl) & (gumbel.dtype == dtype)].sort_values("rows")
                label = f"{impl.removeprefix('specfix_')} noise, {dtype}"
                top.plot(sel.rows, sel.G_logits_per_s, line, marker="o", color=colour, label=label)
        if rate:
            label = f"goal: {g['target']:.0f} G/s at {goal_rows:,} rows, {goal_dtype} ({g['status']})"
            top.plot([goal_rows], [g["target"]], "*", ms=10, color=style.CEILING, label=label)
        top.set_xscale("log", base=2)
        top.set(xlabel="rows", ylabel="G logits / s", title=f"vocabulary {vocab:,}")
        top.legend(loc="upper left", fontsize=8)
        colours = [style.PADDING, style.PADDING, style.ACCENT, style.FIXED]
        bottom.barh([n.replace("_", " ") for n in names], [at[n] for n in names], color=colours)
        bottom.set(xlabel="us per call (median)", title=f"{rows_at} x {vocab:,}, fp32")
        fig.tight_layout()
    return fig


def graph_table(report: dict) -> pd.DataFrame:
    """Median us per call of each sampler inside a CUDA graph (a row per sampler, the unit in the row
    header), a column per (vocabulary, rows, calls per graph)."""
    graph = bench.frame(report, "gumbel_graph")
    table = graph.pivot_table(index="impl", columns=["vocab", "rows", "calls_per_graph"], values="median_us")
    return table.round(2).rename_axis(
        index="median us per call", columns=["vocab", "rows", "calls per graph"]
    )


def mask_table(report: dict) -> pd.DataFrame:
    """The mask's recorded overhead (masked / unmasked - 1, in %), with and without the logits store."""
    mo = mask_overhead(report).set_index("store_processed_logits")
    us = {"masked us": mo.masked_us.round(1), "unmasked us": mo.unmasked_us.round(1)}
    table = pd.DataFrame({**us, "overhead %": (100 * mo.overhead).round(2)})
    table.index = table.index.map({False: "without", True: "with"})
    return table.rename_axis("processed-logits store")


def drafter_store_table(perf: dict) -> pd.DataFrame:
    """us per call of one row in a CUDA graph, with and without storing the draft logits, and the cost."""
    frame = pd.DataFrame(perf["graph_one_row"])
    table = frame.pivot_table(index=["vocab", "noise"], columns="drafter_store", values="us_per_call")
    table.columns = ["without store (us)" if not c else "with store (us)" for c in table.columns]
    table["store adds (us)"] = table["with store (us)"] - table["without store (us)"]
    return table.round(2)


# --- the sentences that read the chapter's draws, tables and recordings, built from their values (Markdown)


def samplers_text(tests: pd.DataFrame, draws: dict[str, np.ndarray]) -> str:
    """How many samplers pass the chi-square test (`tests`: one row per sampler of `draws`)."""
    return (
        f"{int(tests.passed.sum())} of {len(draws)} samplers pass the chi-square test (statistic under "
        "the threshold: degrees of freedom + 10 standard deviations, after merging sparse bins). The "
        f"kernel drew {len(draws['Triton kernel']):,} samples (on a CPU it runs in Triton's interpreter, "
        "one program at a time, so CI scale keeps it small); the torch reference drew "
        f"{len(draws['torch reference']):,}, and it picks **the kernel's tokens bit for bit** (checked "
        "in `tests/test_gumbel.py`, on the CPU and on the H200). Temperature 0 means plain argmax: no "
        "noise at all."
    )


def tail_text(u, exact, careful, naive) -> str:
    """Where the naive noise overflows; the careful form's worst relative error (:func:`gumbel_tail`'s)."""
    overflow = ~np.isfinite(np.asarray(naive))
    worst = np.max(np.abs(np.asarray(careful, dtype=np.float64) - exact) / np.abs(exact))
    u = np.asarray(u)
    return (
        f"The naive form is `+inf` at {int(overflow.sum())} of these {len(u)} points, every u up to "
        f"{u[overflow].max():.2e} (at u = 1e-8, where the exact noise is "
        f"{-np.log(-np.log1p(-1e-8)):.2f}). The careful form's largest relative error over the whole "
        f"range is {worst:.1e}."
    )


def invariance_table(alone: dict, t_alone, t_crowd, t_moved) -> pd.DataFrame:
    """Each request's token alone, in another batch, and one position on (`alone`: the requests' batch)."""
    tokens = {"alone": t_alone, "in another batch": t_crowd, "position + 1": t_moved}
    index = [f"request {i}" for i in range(len(t_alone))]
    return pd.DataFrame({"seed": alone["seed"], "pos": alone["pos"], **tokens}, index=index)


def invariance_text(table: pd.DataFrame) -> str:
    """What :func:`invariance_table` shows: the same (seed, position) gives the same token anywhere."""
    same = int((table["alone"] == table["in another batch"]).sum())
    changed = [name for name in table.index if table.loc[name, "position + 1"] != table.loc[name, "alone"]]
    kept = [name for name in table.index if name not in changed]
    return (
        f"Same (seed, position), same token: {same} of {len(table)} requests pick the same token in "
        "another batch, at other slots, with another tile size. A new position is a new draw: fresh, "
        f"independent noise, so the token may change or stay: here it changed for "
        f"{', '.join(changed) or 'no request'} and stayed for {', '.join(kept) or 'no request'} (a "
        "likely token is often drawn again)."
    )


def agreement_text(match: pd.DataFrame, source: str) -> str:
    """What the vllm-mode agreement table shows (`source`: what the mode was compared with)."""
    same, exact_same = match["same token as vLLM's noise"].sum(), match["same token as specfix exact"].sum()
    cached = "in both runs" if match["same cached logits"].all() else "NOT in every run"
    greedy = int(match["greedy row agrees"].sum())
    return (
        f"The `vllm` mode picks the same token as {source} on {same} of {match.rows.sum()} rows, with "
        "and without the drafting salt, and its draft-logits cache holds the same values "
        f"({cached}). Against specfix's `exact` mode, a different generator, it agrees on {exact_same} "
        f"rows; the greedy row (temperature 0, no noise) agrees in {greedy} of {len(match)} runs. Both "
        "modes are correct samplers: their tokens are different draws from the same distribution."
    )


def _first_report(san: dict, variant: str):
    kind, info = next(iter(san["variants"][variant]["kinds"].items()))
    line = next(line for line in info["first"] if "before the nearest allocation" in line)
    return kind, info["count"], line.split("=========")[-1].strip()


def _beyond_reports(variant: dict) -> str:
    """What a sanitizer summary counts beyond its reports: the CUDA calls that failed after the kernel."""
    extra = variant["errors"] - sum(info["count"] for info in variant["kinds"].values())
    calls = [re.search(r"API call to (\w+)", line)[1] for line in variant["program_hit"]]
    after = f"the {len(calls)} CUDA calls after the kernel ({', '.join(f'`{c}`' for c in calls)})"
    if extra == len(calls):
        return f"{extra} errors more than its reports: {after}, each failing with the stopped kernel's error"
    return f"{extra} errors more than its reports; {after} failed"


def sanitizer_text(san: dict) -> str:
    """What compute-sanitizer reported for the masked kernel and the two unmasked variants."""
    read_kind, read_count, read_where = _first_report(san, "unmasked")
    write_kind, write_count, write_where = _first_report(san, "unmasked_guarded_tables")
    beyond = {
        name: _beyond_reports(san["variants"][name]) for name in ("unmasked", "unmasked_guarded_tables")
    }
    if len(set(beyond.values())) == 1:
        summaries = f"Each of the two summaries counts {beyond['unmasked']}."
    else:
        summaries = " ".join(f"The {name} summary counts {words}." for name, words in beyond.items())
    return (
        f"{san['variants']['masked']['errors']} errors with the mask. Without it: {read_count:,} reports "
        f"of *{read_kind.lower()}*, the padded rows' threads reading `temperature[-1]` "
        f'("{read_where}"); memcheck then stops the kernel. With the tables inside larger allocations: '
        f'{write_count:,} reports of *{write_kind.lower()}* ("{write_where}"): `draft_logits[-1, 1, '
        f":]`. {summaries}"
    )


def noise_speed_text(report: dict, rows: int = 256, vocab: int = 151_936) -> str:
    """The two noise modes against softmax + multinomial at one fp32 shape of the bench recording."""
    at = _gumbel_at(report, rows, vocab)
    fast, exact, slow = at["specfix_fast"], at["specfix_exact"], at["torch_softmax_multinomial"]
    return (
        f"At {rows} x {vocab:,} fp32 the fast noise takes {fast:.0f} us and the exact noise {exact:.0f} "
        "us: exact pays for bit-for-bit reproducibility with its own polynomial logarithm, compiled "
        f"without FMA contraction. Softmax + `torch.multinomial` takes {slow:.0f} us, {slow / fast:.1f}x "
        f"the fast kernel's time and {slow / exact:.1f}x the exact kernel's."
    )


def graph_text(report: dict, store: pd.DataFrame) -> str:
    """One row in a CUDA graph against its goal, and what storing the draft logits adds."""
    one_row = graph_table(report).xs(1, level="rows", axis=1).droplevel("calls per graph", axis=1)
    target, vocab = goal(report, "gumbel_graph", "us"), one_row.columns.max()
    adds = store["store adds (us)"]
    return (
        f"One row of {vocab:,} logits with the fast noise: {one_row.loc['specfix_fast', vocab]:.2f} us per "
        f"call (goal: at most {target['target']:.0f} us, {target['status']}). Storing the draft logits on "
        f"the way adds {adds.min():.2f} to {adds.max():.2f} us per call."
    )


def mask_text(mask: pd.DataFrame) -> str:
    """What :func:`mask_table` shows: the mask's overhead, within the noise of two timed kernels."""
    return (
        f"The mask's overhead is {mask.loc['without', 'overhead %']:+.2f}% without the store and "
        f"{mask.loc['with', 'overhead %']:+.2f}% with it. A negative overhead means the masked kernel "
        "was the faster of the two in this run. The mask adds one compare per tile, so a difference of a "
        "few percent either way is not the mask's cost but the difference between two separately "
        "compiled, separately timed kernels: what the run shows is that the mask costs nothing "
        "measurable."
    )


def noise_comparison_table(rec: dict) -> pd.DataFrame:
    """The `vllm` noise mode against vLLM's own kernel, one line per fact."""
    cases = rec["cases"]
    facts = {
        "compared with": f"vLLM {rec['vllm_version']}'s gumbel_sample, same inputs",
        "cases run": f"{len(cases)} of {rec['cases_planned']}",
        "vocabularies": ", ".join(f"{v:,}" for v in sorted({c["vocab"] for c in cases})),
        "dtypes": ", ".join(sorted({c["dtype"] for c in cases})),
        "temperatures": ", ".join(f"{t:g}" for t in rec["temperatures"]),
        "rows compared": f"{rec['rows']:,}",
        "tokens that differ": f"{rec['mismatches']:,}",
        "cached logits that differ": f"{rec['cache_mismatches']:,}",
        "rows whose token is not the argmax": f"{rec['not_argmax']:,}",
    }
    return pd.DataFrame({"recorded": facts})
