"""Chapter 5's figures of one ``specfix bench`` report, each in the frame of :func:`figure` (read it first),
each reading its numbers from :mod:`specfix.figures.performance`'s tables."""

from __future__ import annotations

import itertools
import re
import textwrap

import numpy as np

from specfix.figures import performance as perf
from specfix.figures import style
from specfix.figures.embedding_assert import draw_fixes
from specfix.tools import bench

_MARKERS = {"fp32": "o-", "bf16": "s--"}  # the line style says the dtype, the colour the vocabulary
#: A goal's line: the suite's threshold colour (no data series is drawn in it), a style per goal.
_GOAL_STYLES = ("-.", (0, (6, 2)), ":", (0, (1, 1)))


def vocab_colours(vocabs) -> dict:
    """One shade of NEUTRAL per vocabulary, darker for a larger one (an ordered quantity, one hue)."""
    vocabs = sorted({int(v) for v in vocabs})
    amounts = np.linspace(0.72, -0.6, len(vocabs)) if len(vocabs) > 1 else [0.0]
    return {v: style.light(style.NEUTRAL, a) for v, a in zip(vocabs, amounts, strict=True)}


def impl_colours(impls) -> dict:
    """Per sampler: specfix's in blue (the judged one darkest), vLLM's in purple (the newest darkest),
    anything else (torch) in the third series colour."""
    impls = list(dict.fromkeys(impls))
    ours = [i for i in bench.OURS if i in impls]
    ours = [bench.JUDGED] + [i for i in ours if i != bench.JUDGED] if bench.JUDGED in ours else ours
    vllm = sorted((i for i in impls if i.startswith("vllm_")), key=_version, reverse=True)
    colours = {i: style.light(style.NEUTRAL, 0.5 * n) for n, i in enumerate(ours)}
    colours |= {i: style.light(style.ACCENT, 0.5 * n / max(len(vllm) - 1, 1)) for n, i in enumerate(vllm)}
    return {i: colours.get(i, style.SERIES[2]) for i in impls}


def _version(impl: str) -> tuple:
    return tuple(int(p) for p in impl.removeprefix("vllm_").split("."))


def _key(fig, colours: dict, styles: dict) -> list:
    """Legend handles: a line per vocabulary (its colour), one per line style (what it means), then every
    labelled line of the panels (goals, ceilings): the legend stays short however many series."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, lw=2.5, label=f"vocab {v:,}") for v, c in colours.items()]
    handles += [
        Line2D([], [], color=style.CEILING, ls=ls, marker=m, label=k) for k, (m, ls) in styles.items()
    ]
    found = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(label, handle)
    return handles + list(found.values())


def missing(ax, report: dict, case: str, reason: str | None = None) -> None:
    """``ax`` as a note that ``case`` was not measured, and why (default: the report's reasons)."""
    if reason is None:
        reasons = [u["reason"] for u in report["unavailable"] if u["case"] == case]
        reasons += [e["error"] for e in report["errors"] if e["case"] == case]
        reason = "; ".join(reasons) or "not run in this report"
    kw = dict(ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=9)
    ax.text(0.5, 0.5, f"{case}: not measured\n{reason}", **kw)
    ax.set_axis_off()


def figure(report, case, empty, draw, shape, height, text, reason=None, **share):
    """``shape`` panels a column wide, drawn by ``draw(axes)`` (``empty``: each says why ``case`` is missing),
    ``text`` = (title, source, caption): title and source above, one legend strip below, then the caption."""
    title, source, caption = text
    with style.figure(caption, height, *shape, squeeze=False, **share) as (fig, axes):
        for ax in axes.flat if empty else ():
            missing(ax, report, case, reason)
        handles = None if empty else draw(axes)  # a figure that draws its own key returns its handles
        fig.suptitle(f"{title}\n{style.wrap(source)}", fontsize=style.SMALLEST_PT)
        wide = handles and max(len(line) for h in handles for line in h.get_label().splitlines()) > 30
        style.legend_below(fig, handles=handles, ncol=(2 if wide else 3) if handles else None)
    return fig


def _goal_line(ax, report, target, label, ls=_GOAL_STYLES[0]) -> None:
    if report["config"]["device"] == "cuda":  # a CPU smoke run judges nothing
        ax.axhline(target, color=style.CEILING, lw=1.4, ls=ls, label=style.wrap(label, 50))


# --------------------------------------------------------------------------------------------- figures


def bandwidth_figure(report: dict, source: str):
    """Read bandwidth of specfix's two samplers against the two ceilings, fp32 and bf16 side by side."""
    g, ceil = bench.frame(report, "gumbel"), perf.ceilings(report)

    def draw(axes):
        ours, colours = g[g["impl"].isin(list(bench.OURS))], vocab_colours(g["vocab"])
        for ax, dtype in zip(axes[:, 0], perf.DTYPE_BYTES, strict=True):
            for (impl, vocab), rows in ours[ours["dtype"] == dtype].groupby(["impl", "vocab"]):
                fmt = "o-" if impl == bench.JUDGED else "x:"
                ax.plot(rows["rows"], rows["TB_per_s_read"], fmt, color=colours[vocab])
            read = f"read ceiling (fp32 argmax): {ceil['read']:.2f} TB/s"
            ax.axhline(ceil["read"], color=style.CEILING, ls="--", lw=1, label=read)
            copy = f"copy (read + write): {ceil['copy']:.2f} TB/s"
            ax.axhline(ceil["copy"], color=style.PADDING, ls=":", lw=1, label=copy)
            ax.set(ylabel="logits read, TB/s", title=f"{dtype} logits")
            style.log_ticks(ax.xaxis, ours["rows"])
        axes[-1, 0].set_xlabel("rows (sequences sampled at once)")
        impls = {
            i: ("o", "-") if i == bench.JUDGED else ("x", ":") for i in bench.OURS if i in set(ours["impl"])
        }
        return _key(axes[0, 0].figure, colours, impls)

    caption = (
        "Read each line against the dashed read ceiling: at few rows fixed costs keep every kernel "
        "far below it; at many rows the gap left is the time spent making the noise."
    )
    text = ("Read bandwidth of gumbel_sample against the ceilings", source, caption)
    return figure(report, "gumbel", g.empty, draw, (2, 1), 5.4, text, sharex=True, sharey=True)


def throughput_figure(report: dict, source: str):
    """Logits per second of the judged (fast-noise) kernel per dtype and vocabulary, with its rate goals."""
    g = bench.frame(report, "gumbel")

    def draw(axes):
        ax, judged, colours = axes[0, 0], g[g["impl"] == bench.JUDGED], vocab_colours(g["vocab"])
        for (dtype, vocab), rows in judged.groupby(["dtype", "vocab"]):
            ax.plot(rows["rows"], rows["G_logits_per_s"], _MARKERS[dtype], color=colours[vocab])
        styles = {dtype: (fmt[0], fmt[1:]) for dtype, fmt in _MARKERS.items()}
        warm = g[g["impl"] == "fast_apply_temperature"]  # goal 3 also times the call that applies temperature
        if len(warm):
            styles["fast, apply_temperature=True"] = ("*", "none")
            for vocab, rows in warm.groupby("vocab"):
                ax.plot(
                    rows["rows"],
                    rows["G_logits_per_s"],
                    "*",
                    ms=9,
                    mec="black",
                    mew=0.5,
                    color=colours[vocab],
                )
        shapes = {}  # target -> the shapes it is judged at, in order (a dict as an ordered set)
        for r in (r for r in report["goals"] if r["case"] == "gumbel" and r["unit"] == "G logits/s"):
            where = re.sub(r", apply_temperature=\w+", "", r["goal"].rsplit(" at ", 1)[-1])
            shapes.setdefault(r["target"], {})[where] = None
        for (target, where), ls in zip(sorted(shapes.items()), _GOAL_STYLES, strict=False):
            _goal_line(ax, report, target, f"goal: {target:g} G/s at {'; '.join(where)}", ls)
        ax.set(xlabel="rows", ylabel="G logits / s")
        style.log_ticks(ax.xaxis, judged["rows"])
        style.log_ticks(ax.yaxis)
        return _key(ax.figure, colours, styles)

    caption = (
        "Each dark grey dash-dotted or dashed line is a goal, judged only at the shapes its label names; "
        "read those shapes' lines against it. The other lines show how the rate grows with the rows."
    )
    text = (f"Throughput of gumbel_sample ({bench.JUDGED})", source, caption)
    return figure(report, "gumbel", g.empty, draw, (1, 1), 3.4, text)


def speedup_figure(report: dict, source: str):
    """How many times faster the judged kernel is than each torch sampler, per dtype and vocabulary."""
    wide = perf.medians(report)

    def draw(axes):
        colours = vocab_colours(wide["vocab"])
        for ax, ref in zip(axes[:, 0], perf.TORCH_SAMPLERS, strict=True):
            for (dtype, vocab), rows in wide.groupby(["dtype", "vocab"]):
                speedup = rows[ref] / rows[bench.JUDGED]
                ax.plot(rows["rows"], speedup, _MARKERS[dtype], color=colours[vocab])
            ax.axhline(1, color=style.CEILING, lw=0.8)
            ax.set(ylabel="torch time / specfix time", title=f"speedup against {ref}")
            style.log_ticks(ax.xaxis, wide["rows"])
            style.log_ticks(ax.yaxis)
        target = next((r for r in report["goals"] if "softmax + multinomial" in r["goal"]), None)
        if target:
            _goal_line(axes[0, 0], report, target["target"], f"goal: {target['goal']}")
        axes[-1, 0].set_xlabel("rows")
        return _key(axes[0, 0].figure, colours, {dtype: (fmt[0], fmt[1:]) for dtype, fmt in _MARKERS.items()})

    title = "How much faster the fused Triton sampler is than the torch samplers"
    text = (title, source, perf.speedup_caption(report))
    return figure(report, "gumbel", wide.empty, draw, (2, 1), 5.4, text, sharex=True, sharey=True)


def graph_call_figure(report: dict, source: str):
    """GPU time of one call inside a CUDA graph, per implementation and shape (rows x vocabulary)."""
    gg = bench.frame(report, "gumbel_graph")

    def draw(axes):
        ax, series = axes[0, 0], []
        shapes = sorted(set(zip(gg["rows"], gg["vocab"], strict=True)), key=lambda s: (s[1], s[0]))
        for impl, colour in impl_colours(gg["impl"]).items():
            rows = gg[gg["impl"] == impl].set_index(["rows", "vocab"]).reindex(shapes)
            err = [rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]]
            series.append((impl, rows["median_us"], colour, err))
        style.grouped_bars(ax, np.arange(len(shapes)), series, capsize=2)
        ax.set_xticks(np.arange(len(shapes)), [f"{r:,} x\n{v:,}" for r, v in shapes])
        ax.set(xlabel="rows x vocabulary", ylabel="GPU time per call, us")
        style.log_ticks(ax.yaxis)
        target = perf.goal(report, "gumbel_graph", "us")
        if target:
            _goal_line(ax, report, target["target"], f"goal: {target['goal']}")

    caption = (
        "Compare specfix_fast (the serving kernel, dark blue) with the purple vLLM bars beside it and, at "
        "one row, with the dash-dotted goal: inside a graph no host launch cost is left, so this is GPU "
        "time alone."
    )
    text = ("Calls captured in one CUDA graph: GPU time per call", source, caption)
    return figure(report, "gumbel_graph", gg.empty, draw, (1, 1), 3.6, text)


def mask_figure(report: dict, source: str):
    """Overhead of the masked kernel over the unmasked one, against the one-sided goal (at most +target%)."""
    mo = perf.mask_overhead(report)

    def draw(axes):
        ax, values = axes[0, 0], mo["overhead"] * 100
        labels = ["with processed-logits store" if s else "sampling only" for s in mo.store_processed_logits]
        ax.bar(labels, values, width=0.5, color=[style.FIXED if v <= 0 else style.NEUTRAL for v in values])
        for x, v in enumerate(values):
            offset = dict(xytext=(0, 4 if v >= 0 else -12), textcoords="offset points")
            ax.annotate(f"{v:+.1f}%", (x, v), ha="center", fontsize=9, **offset)
        target = perf.goal(report, "gumbel_mask", "%")
        limit = target["target"] if target else 2.0
        top, bottom = max(limit * 2, float(values.max()) + 1), min(-limit, float(values.min()) - 1.5)
        miss = f"misses the goal (more than +{limit:g}%)"
        ax.axhspan(limit, top, color=style.BUGGY, alpha=0.12, label=miss)
        ax.axhline(limit, color=style.BUGGY, lw=1)
        ax.axhline(0, color=style.CEILING, lw=0.8)
        ax.set(ylim=(bottom, top), ylabel="masked / unmasked - 1, %")

    caption = (
        "The goal bounds the cost from above only: a bar below zero means the masked kernel ran "
        "faster than the unmasked one, which passes."
    )
    text = ("Cost of the is_valid_req mask (vLLM PR #47066)", source, caption)
    return figure(report, "gumbel_mask", mo.empty, draw, (1, 1), 3.2, text)


def fix_costs_figure(report: dict, source: str):
    """Each placeholder fix's cost per step idle and behind queued GPU work (chapter 2's panels)."""
    fc = perf.fix_costs(report)

    def draw(axes):
        idle, busy = axes[:, 0]
        draw_fixes(idle, fc, "median_us", "idle GPU", "one step, us")
        if "host_us_behind_busy_gpu" not in fc:
            why = "needs a GPU; this report ran on a CPU"
            return missing(busy, report, "host time behind a busy GPU", why)
        title = "earlier GPU work still queued"
        draw_fixes(busy, fc, "host_us_behind_busy_gpu", title, "host time of the call, us")
        idle.set(xlabel="")
        idle.tick_params(labelbottom=False)

    caption = (
        "Compare the green clamp with the magenta host mask, above on an idle GPU, below with "
        "earlier GPU work queued: a call that synchronises waits for all of that work."
    )
    text = ("Cost per step of each way to keep -1 out of the embedding", source, caption)
    return figure(report, "placeholder_fixes", fc.empty, draw, (2, 1), 5.6, text, sharex=True)


def drafter_figure(report: dict, source: str):
    """The drafter step per live batch and draft model, eager launches against one graph replay."""
    dg, colours = _compared(report)

    def draw(axes):
        ax = axes[0, 0]
        for (model, impl), rows in dg.groupby(["model", "impl"]):
            fmt, label = "o-" if impl == "graph" else "s--", f"{model}: {impl}"
            ax.plot(rows["live_batch"], rows["median_us"], fmt, ms=3, color=colours[model], label=label)
        ax.set(xlabel="live batch", ylabel="time per drafter step, us")
        style.log_ticks(ax.yaxis)

    wide = (
        dg.pivot_table(index=["model", "live_batch"], columns="impl", values="median_us") if len(dg) else dg
    )
    longer = (wide["eager"] / wide["graph"]).dropna() if {"eager", "graph"} <= set(wide) else []
    caption = "Compare each model's replay (solid) with its eager launches (dashed) at the same batch."
    if len(longer):
        caption = (
            f"At every live batch a model's eager launches (dashed) take {longer.min():.1f} to "
            f"{longer.max():.1f} times as long as its replay (solid): the host's launches, not the GPU, set "
            "the eager step's time."
        )
    once = sorted(set(bench.frame(report, "drafter_graph").get("model", [])) - set(colours))
    if once:
        caption += f" Not drawn: {', '.join(once)}, timed eager at one batch only (for a goal)."
    text = ("Drafter step: eager launches at the exact batch against one graph replay", source, caption)
    return figure(report, "drafter_graph", dg.empty, draw, (1, 1), 3.4, text)


def _compared(report: dict) -> tuple:
    """The drafter rows of the models timed both eager and replayed, and one colour per such model."""
    dg = bench.frame(report, "drafter_graph")
    both = dg.groupby("model")["impl"].agg(set) if len(dg) else {}
    models = sorted(m for m in both.index if {"eager", "graph"} <= both[m]) if len(dg) else []
    return (dg[dg["model"].isin(models)] if len(dg) else dg), dict(zip(models, itertools.cycle(style.SERIES)))


def padding_price_figure(report: dict, source: str):
    """Per live batch: the fraction of replayed rows that are padding, and the replay's speedup."""
    price, colours = perf.padding_price(report), _compared(report)[1]

    def draw(axes):
        top, bottom = axes[:, 0]
        one = price[price["model"] == price["model"].iloc[0]]
        top.bar(one["live_batch"], one["padded_fraction"] * 100, color=style.PADDING, label="padded rows")
        top.set(ylabel="padded rows, %")
        for model, rows in price.groupby("model"):
            colour = colours.get(model, style.CEILING)
            bottom.plot(
                rows["live_batch"], rows["speedup"], "o-", ms=3, color=colour, label=f"speedup, {model}"
            )
        bottom.axhline(1, color=style.CEILING, lw=0.8)
        bottom.set(xlabel="live batch", ylabel="replay speedup")
        style.integer_ticks(bottom.xaxis)

    caption = (
        "The grey bars peak just past each captured size, where most of a replayed graph is padding; "
        "compare the speedup below at those batches with its neighbours."
    )
    text = ("What the padding costs, and what the graph gives back", source, caption)
    reason = "needs the graph replay, which needs a GPU"
    return figure(report, "drafter_graph", price.empty, draw, (2, 1), 4.6, text, reason, sharex=True)


_REJECTION_LINES = {
    "specfix_triton": ("Triton, eager", style.NEUTRAL),
    "specfix_triton_graph": ("Triton, one CUDA-graph replay", style.ACCENT),
    "torch_reference": ("torch reference, eager", style.PADDING),
}


def rejection_figure(report: dict, source: str):
    """Verification time per step, Triton eager and replayed beside torch, at the smallest k and vocab."""
    rj, shape = perf.smallest_rejection_shape(report)
    rj = rj[rj["impl"].isin(list(_REJECTION_LINES))] if len(rj) else rj

    def draw(axes):
        ax = axes[0, 0]
        for (impl, mode), rows in rj.groupby(["impl", "mode"]):
            label, color = _REJECTION_LINES[impl]
            fmt = "o-" if mode == "greedy" else "s--"
            style.errorbars(ax, rows["batch"], rows, fmt=fmt, color=color, label=f"{label}, {mode}")
        ax.set(xlabel="requests in the batch", ylabel="time per verification step, us", title=shape)
        style.log_ticks(ax.xaxis, rj["batch"])
        style.log_ticks(ax.yaxis)

    caption = (
        "A replay (purple) is GPU time alone. An eager step (blue) is timed between CUDA events, so "
        "it also counts any wait for the host's Python that the GPU work queued ahead did not cover."
    )
    text = ("Rejection sampler (verification of k drafts per request), per step", source, caption)
    return figure(report, "rejection", rj.empty, draw, (1, 1), 3.6, text)


def peer_figure(report: dict, source: str):
    """The judged kernel's logits/s beside each vLLM's, per dtype and vocab, under the read ceiling."""
    table, versions, read = perf.peer_table(report), perf.peer_versions(report), perf.ceilings(report)["read"]
    vocabs = sorted(table["vocab"].unique()) if len(table) else [None]
    rate = lambda one, impl: one["rows"] * one["vocab"] / one[impl] / 1e3  # G logits/s
    colours = impl_colours([bench.JUDGED, *map(bench.peer_impl, versions)])
    marks = dict(
        zip(reversed(versions), itertools.cycle(("s--", "^-.", "v:", "D--")))
    )  # coinciding: both seen

    def draw(axes):
        for (row, dtype), (col, vocab) in itertools.product(enumerate(perf.DTYPE_BYTES), enumerate(vocabs)):
            ax, one = axes[row, col], table[(table["dtype"] == dtype) & (table["vocab"] == vocab)]
            ax.plot(
                one["rows"], rate(one, bench.JUDGED), "o-", color=colours[bench.JUDGED], label=bench.JUDGED
            )
            for v, size in zip(reversed(versions), itertools.count(7, -1.5)):  # hollow, shrinking: none hides
                impl, label = bench.peer_impl(v), f"vLLM {v} gumbel_sample"
                kw = dict(ms=size, mfc="none", color=colours[impl], label=label)
                ax.plot(one["rows"], rate(one, impl), marks[v], **kw)
            label = f"read ceiling: {read:.2f} TB/s (fp32 argmax), in logits/s of the dtype"
            ax.axhline(read * 1e3 / perf.DTYPE_BYTES[dtype], color=style.CEILING, ls=":", lw=1.2, label=label)
            ax.set_title(f"{vocab:,} x {dtype}", fontsize=9)
            style.log_ticks(ax.xaxis, sorted(table["rows"].unique())[::2])  # every other size: 4 panels a row
            style.log_ticks(ax.yaxis)
        for ax in axes[-1]:
            ax.set_xlabel("rows")
        for ax in axes[:, 0]:
            ax.set_ylabel("G logits / s")

    names = "vLLM " + ", ".join(reversed(versions)) if versions else "vLLM"
    names = " and ".join(names.rsplit(", ", 1))
    caption = (
        "Higher is faster. The gap between the blue line and a broken purple vLLM line is the speedup over "
        "that version (where two versions coincide, their markers tell them apart); the gap up to the "
        "dotted read ceiling is what any sampler could still gain."
    )
    text = (f"{bench.JUDGED} beside {names}: same inputs, same run", source, caption)
    shape, reason = (len(perf.DTYPE_BYTES), len(vocabs)), "no vLLM sampler in this report (bench --peer)"
    return figure(report, "gumbel", table.empty, draw, shape, 5.6, text, reason, sharex=True, sharey=True)


def small_batch_figure(report: dict, source: str):
    """Every shape judged under the small-batch goals, its margin (% of target) in its goal's column."""
    judged = {n: perf.judged_goals(report, n) for n in perf.SMALL_BATCH}

    def draw(axes):
        ax, rng = axes[0, 0], np.random.default_rng(0)  # a fixed jitter keeps the dots of a goal apart
        for n, goals in judged.items():
            margins = np.nan_to_num([perf.margin_pct(g) for g in goals])  # no percentage: at zero
            x = n + rng.uniform(-0.25, 0.25, len(margins))
            ok = np.array([g["status"] == "pass" for g in goals], dtype=bool)
            ax.scatter(x[ok], margins[ok], s=12, color=style.FIXED, label="shape meets its goal")
            ax.scatter(x[~ok], margins[~ok], s=12, color=style.BUGGY, label="shape misses its goal")
        ax.axhline(0, color=style.CEILING, lw=0.8)
        short = {n: "\n".join(textwrap.wrap(d.split(":")[0], 12)) for n, d in perf.SMALL_BATCH.items()}
        ax.set_xticks(list(short), [f"{n}. {d}" for n, d in short.items()])
        ax.set(ylabel="margin, % of the target")
        ax.grid(axis="x", visible=False)

    caption = (
        "A goal is met only if every one of its dots lies at or above zero (host syncs and identical "
        "replays have no percentage and sit at zero when met); its worst dot is its figure in the table."
    )
    text = ("The five small-batch goals, every shape judged", source, caption)
    empty = not any(judged.values())
    return figure(report, "goals", empty, draw, (1, 1), 3.6, text, "the report judged no small-batch goal")
