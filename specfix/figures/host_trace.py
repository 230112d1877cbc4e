"""Chapter 5's host side of a small step, from ``scripts/record_host_trace.py``'s recording: one step under
the profiler, ``gumbel_sample`` by rows, eager against one CUDA-graph replay, specfix beside vLLM.

Read :func:`host_rows` and :func:`step_table` first: the figures and :func:`host_trace_text` read them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from specfix.figures import style
from specfix.figures.performance import source_line
from specfix.figures.performance_figures import figure, missing
from specfix.tools import recorded

#: The timeline's lanes, top to bottom: label and colour.
_LANES = {
    "call": ("call", style.PADDING),
    "op": ("torch ops", style.NEUTRAL),
    "launch": ("launch calls", style.CEILING),
    "gpu": ("GPU kernels", style.ACCENT),
}
#: The step figure's bars: what each times, its label, its colour.
_STEP_BARS = (
    ("eager", "back_to_back", "eager, back to back", style.NEUTRAL),
    ("graph", "back_to_back", "one graph replay, back to back", style.ACCENT),
    ("eager", "gpu", "GPU time alone", style.PADDING),
)


def load_host_trace() -> tuple[dict, str]:
    """The recording and the line that says where it comes from (the profiler run needs a GPU)."""
    trace = recorded.load("host_trace_h200")
    return trace, source_line(trace["meta"])


def _impl_name(trace: dict, impl: str) -> str:
    return "specfix" if impl == "specfix" else f"vLLM {trace['peer']['version']}"


def _median(timing: dict | None, key: str) -> float:
    part = (timing or {}).get(key)
    return part["median_us"] if part else math.nan


def host_rows(trace: dict) -> pd.DataFrame:
    """``gumbel_sample``'s median host, GPU and back-to-back us per (impl, rows), and ``host_bound``."""
    keys = ("host", "gpu", "back_to_back")
    rows = [
        {"impl": r["impl"], "rows": r["rows"]} | {f"{k}_us": _median(r, k) for k in keys}
        for r in trace["rows"]
    ]
    df = pd.DataFrame(rows, columns=["impl", "rows", *(f"{k}_us" for k in keys)])
    df["host_bound"] = df["host_us"] > df["gpu_us"]
    return df.sort_values(["impl", "rows"]).reset_index(drop=True)


def step_table(trace: dict) -> pd.DataFrame:
    """The step's median host, GPU and back-to-back us per (impl, batch), eager and replayed."""
    parts = [(mode, key) for mode in ("eager", "graph") for key in ("host", "gpu", "back_to_back")]
    out = [
        {"impl": r["impl"], "batch": r["batch"]} | {f"{m}_{k}_us": _median(r.get(m), k) for m, k in parts}
        for r in trace["graph"]
    ]
    df = pd.DataFrame(out, columns=["impl", "batch", *(f"{m}_{k}_us" for m, k in parts)])
    df["order"] = df["impl"].map(trace["impls"].index)
    return df.sort_values(["order", "batch"]).drop(columns="order").reset_index(drop=True)


def _timeline(trace: dict, impl: str, batch: int) -> dict | None:
    return next((t for t in trace["timelines"] if t["impl"] == impl and t["batch"] == batch), None)


def _lanes(ax, t: dict, end: float) -> None:
    """One step's spans in their lanes, the longer calls named."""
    for y, (lane, (label, colour)) in enumerate(_LANES.items()):
        spans = [
            (s["start_us"], max(s["end_us"] - s["start_us"], end / 1500))
            for s in t["spans"]
            if s["lane"] == lane
        ]
        ax.broken_barh(spans, (len(_LANES) - y - 1.4, 0.8), color=colour, label=label)
    for s in (s for s in t["spans"] if s["lane"] == "call" and s["end_us"] - s["start_us"] > end / 8):
        x, look = (s["start_us"] + s["end_us"]) / 2, dict(ha="center", va="center", clip_on=True)
        ax.text(x, len(_LANES) - 1, s["name"], fontsize=style.SMALLEST_PT, **look)
    ax.set_yticks(range(len(_LANES)), [label for label, _ in reversed(_LANES.values())])
    ax.set_ylim(-0.6, len(_LANES) - 0.4)
    ax.grid(axis="y", visible=False)


def host_timeline_figure(trace: dict, source: str):
    """The largest traced step, a panel per implementation: its calls, torch ops, launches and GPU kernels."""
    batch = max(t["batch"] for t in trace["timelines"])
    traced = {i: t for i in trace["impls"] if (t := _timeline(trace, i, batch))}
    end = max((s["end_us"] for t in traced.values() for s in t["spans"]), default=1.0)

    def draw(axes):
        for ax, (impl, t) in zip(axes[:, 0], traced.items(), strict=True):
            _lanes(ax, t, end)
            ax.set_title(
                f"{_impl_name(trace, impl)}: host {t['step_host_us']:,.0f} us, GPU busy "
                f"{t['gpu_busy_us']:,.0f} us, {t['kernels']} kernels, {t['launches']} launch calls",
                fontsize=9,
            )
        axes[-1, 0].set(xlim=(0, end * 1.02), xlabel="microseconds from the start of the step")

    k, vocab = list(traced.values())[-1]["k"], list(traced.values())[-1]["vocab"]
    title = f"One speculative step at {batch} requests (k = {k}, vocabulary {vocab:,}), host against GPU"
    caption = (
        "Read down a column: wherever the top three lanes are busy and the GPU lane is empty, the "
        "GPU waits for the host. The profiler adds its own time to every host span."
    )
    text, height = (title, source, caption), 1.0 + 1.5 * len(traced)
    return figure(trace, "timeline", False, draw, (len(traced), 1), height, text, sharex=True)


def host_regime_figure(trace: dict, source: str):
    """Above: host and GPU time per ``gumbel_sample`` call by rows. Below: the step eager and replayed."""
    df, steps = host_rows(trace), step_table(trace)
    colours = dict(zip(trace["impls"], itertools.cycle(style.SERIES)))

    def draw(axes):
        top, bottom = axes[:, 0]
        for impl, one in df.groupby("impl", sort=False):
            name = _impl_name(trace, impl)
            top.plot(one["rows"], one["host_us"], "o-", ms=3, color=colours[impl], label=f"{name}: host")
            if one["gpu_us"].notna().any():
                top.plot(one["rows"], one["gpu_us"], "s--", ms=3, color=colours[impl], label=f"{name}: GPU")
        top.set(xlabel="rows sampled by one gumbel_sample call", ylabel="time per call, us")
        style.log_ticks(top.xaxis, df["rows"])
        style.log_ticks(top.yaxis)
        if steps.empty:
            return missing(bottom, trace, "graph", "the recording has no step timings")
        series = [(label, steps[f"{mode}_{key}_us"], colour) for mode, key, label, colour in _STEP_BARS]
        style.grouped_bars(bottom, np.arange(len(steps)), series)
        for xi in np.flatnonzero(steps["graph_back_to_back_us"].isna().to_numpy()):
            bottom.text(xi, 0, "not\ncaptured", ha="center", va="bottom", fontsize=style.SMALLEST_PT)
        names = [f"{_impl_name(trace, r.impl)}\n{r.batch} req." for r in steps.itertuples()]
        bottom.set_xticks(np.arange(len(steps)), names)
        bottom.set(ylabel="time per step, us")
        bottom.grid(axis="x", visible=False)

    caption = (
        "Above, where a solid line (host) lies over the dashed one of its colour (GPU), the host "
        "sets the pace. Below, the replay's bar drops to its GPU time: the graph removes the host's "
        "work, not the GPU's."
    )
    text = ("Where the host sets the pace, and what a CUDA graph takes away", source, caption)
    return figure(trace, "regime", False, draw, (2, 1), 6.0, text)


def _regime_lines(trace: dict, df: pd.DataFrame) -> list[str]:
    """Up to how many rows each implementation is host-bound; specfix's host cost per call over the peer's."""
    lines = []
    for impl in trace["impls"] if df["gpu_us"].notna().any() else ():
        one = df.query("impl == @impl")
        bound = one["host_bound"].cummin()  # host-bound at every size up to here
        where = "not host-bound even at the fewest rows measured"
        if bound.any():
            where = f"host-bound up to {one['rows'][bound].max():,} rows"
        if bound.any() and not bound.all():
            where += f"; from {one['rows'][~bound].min():,} rows the GPU sets the pace"
        lines.append(f"- **{_impl_name(trace, impl)} `gumbel_sample` by rows**: {where}.")
    peer, wide = trace["peer"]["impl"], df.pivot_table(index="rows", columns="impl", values="host_us")
    if peer in wide and "specfix" in wide:
        ours, theirs = wide["specfix"], wide[peer]
        at = [
            f"{ours[r] / theirs[r]:.2f}x at {r:,} row{'s' * (r > 1)} ({ours[r]:.1f} against "
            f"{theirs[r]:.1f} us)"
            for r in (1, 8, 64)
            if r in wide.index
        ]
        lines.append(f"- **Host cost per call**, specfix over {_impl_name(trace, peer)}: {'; '.join(at)}.")
    return lines


def host_trace_text(trace: dict) -> str:
    """The recording's timeline, host-bound regime, host cost beside vLLM's and what a replay removes."""
    name, lines, df = lambda impl: _impl_name(trace, impl), [], host_rows(trace)
    batch = max((t["batch"] for t in trace["timelines"]), default=None)
    for impl, t in ((i, _timeline(trace, i, batch)) for i in trace["impls"]):
        if t:
            share = t["gpu_busy_us"] / t["step_host_us"] if t["step_host_us"] else math.nan
            lines.append(
                f"- **{name(impl)}, one step at {batch} requests** (profiled): the host worked "
                f"{t['step_host_us']:,.0f} us, the GPU was busy {t['gpu_busy_us']:,.0f} us of it "
                f"({share:.0%}) in {t['kernels']} kernels from {t['launches']} launch calls."
            )
    lines += _regime_lines(trace, df)
    for r in step_table(trace).itertuples():
        if not math.isnan(r.graph_back_to_back_us):
            lines.append(
                f"- **{name(r.impl)}, the step at {r.batch} request{'s' * (r.batch > 1)}**: "
                f"{r.eager_back_to_back_us:,.0f} us back to back eager, "
                f"{r.graph_back_to_back_us:,.0f} us replayed from one CUDA graph; the host's work "
                f"per step {r.eager_host_us:,.0f} us eager, {r.graph_host_us:,.0f} us for a replay; "
                f"the GPU's {r.eager_gpu_us:,.0f} and {r.graph_gpu_us:,.0f} us."
            )
    idle = [
        f"{r['impl']} at {r['rows']:,} rows"
        for r in trace["rows"]
        if r.get("gpu_busy_throughout_host_timing") is False
    ]
    if idle:
        lines.append(
            "- The GPU ran out of queued work before the host's timing loop ended "
            f"({', '.join(idle)}): there the host's times include waiting for the GPU."
        )
    if not df["gpu_us"].notna().any():
        lines.append("- This recording ran without a GPU: every time in it is the host's.")
    return "\n".join(lines)
