"""Chapter 2's figures and tables: the crash timeline, which kernel asserts for which op, what each
placeholder fix costs per step, the guard's overhead, and what the engine counts under each fix.

Every figure function returns a ``matplotlib.figure.Figure`` drawn in the suite's style
(:mod:`specfix.figures.style`) with a caption; every table function returns a ``pandas.DataFrame``.
The fix costs come from the one bench recording that chapter 5 shows too (``bench_h200.json``, case
``placeholder_fixes``), under the bench's names for the fixes.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Sequence
from pathlib import PurePath

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from specfix.figures import style
from specfix.lab import embedding_assert as ea
from specfix.lab import placeholder_fixes as pf
from specfix.lab.guard import GuardTiming

# -- 1. the crash, on a timeline ---------------------------------------------------------------------------

_LIGHT = {"host": "#d6e4f0", "wait": "#fde2b8", "error": "#f6c6dd"}


def short_traceback(err: BaseException, frames: int = 2) -> str:
    """The last ``frames`` frames of ``err``'s traceback as Python prints them, each file named from its
    package (``torch/nn/functional.py``) or as ``<cell>``: no path of the machine that ran it."""
    lines = ["Traceback (most recent call last):"]
    for frame in traceback.extract_tb(err.__traceback__)[-frames:]:
        name = frame.filename
        if "site-packages/" in name:
            name = name.split("site-packages/")[-1]
        elif "ipykernel_" in name or name.startswith("<"):
            name = "<cell>"
        else:
            name = PurePath(name).name
        lines.append(f'  File "{name}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line}")
    return "\n".join(lines + ["".join(traceback.format_exception_only(err)).rstrip()])


def _timeline(run: ea.ChildRun, ax) -> None:
    raised = run.first("raised") or {}
    late = run.first("returned") is not None  # the launch returned before the error surfaced
    blocking = bool((run.first("start") or {}).get("blocking"))
    kernel = run.asserts[0].kernel if run.asserts else "the kernel"
    raises = f"raises\n{raised.get('type', '?')}"
    if late:
        host = [(0, 1, "launch\nF.embedding", "host"), (1, 1, "returns", "host"),
                (2, 1.2, "more Python", "host"), (3.2, 1, "synchronize()\nwaits", "wait"),
                (4.2, 1.4, raises, "error")]
    else:
        host = [(0, 1, "launch\nF.embedding", "host"), (1, 1.3, "launch waits\n(blocking)", "wait"),
                (2.3, 1.4, raises, "error")]
    end = 7.2 if late else 5.2
    gpu = [(0.7, 1.6, f"{kernel}:\na thread asserts", "error"),
           (2.3, end - 2.3, "context poisoned: every later CUDA call fails", "error")]
    for lane, bars in ((1, host), (0, gpu)):
        for start, width, text, kind in bars:
            ax.barh(lane, width, left=start, color=_LIGHT[kind], edgecolor=style.CEILING, height=0.6)
            ax.text(start + width / 2, lane, text, ha="center", va="center", fontsize=8)
    ax.set(yticks=[0, 1], yticklabels=["GPU", "host (Python)"], xticks=[], xlim=(0, end),
           xlabel="time (schematic)")
    ax.set_title(f"CUDA_LAUNCH_BLOCKING={int(blocking)}: the error reaches Python at "
                 f"{raised.get('during', '?')}", loc="left")
    ax.grid(False)


def crash_timeline(async_run: ea.ChildRun, blocking_run: ea.ChildRun):
    """Host and GPU lanes of the two minimal children: where the kernel failed, where Python heard of it."""
    with style.apply():
        fig, axes = plt.subplots(2, 1, figsize=(8, 4.6), layout="constrained")
        _timeline(async_run, axes[0])
        _timeline(blocking_run, axes[1])
        style.caption(fig, "Top: the launch returns at once and the failure reaches Python later, at the "
                           "first call that waits for the GPU. Bottom: with CUDA_LAUNCH_BLOCKING=1 every "
                           "launch waits, so the error is raised by F.embedding itself.")
    return fig


# -- 2. which operations assert, and how ----------------------------------------------------------------

def _cuda_cell(c: dict) -> str:
    if c.get("outcome") == "device assert":
        return f"device assert in {c['kernel']} ({c['where']}): `{c['condition']}`"
    if c.get("outcome") == "returned":
        return "no error: -1 wrapped around" if c.get("wrapped") else "no error (wrong values)"
    if c.get("outcome") == "raised":
        return f"{c['type']}: {c['message']}"
    if c.get("outcome") == "not run":
        return "not recorded yet"
    return "no result (timed out)" if c.get("timed_out") else "no result"


def _cpu_cell(c: dict) -> str:
    if c["outcome"] == "returned":
        return "no error: -1 wrapped around" if c["wrapped"] else "no error (wrong values)"
    return f"{c['type']}: {c['message']}"


def ops_table(rows: list[dict], live_cpu: bool = False) -> pd.DataFrame:
    """The table "which operations assert, and how": one row per (op, bad index), a column per setting.

    ``rows`` are the recorder's rows (:func:`specfix.lab.embedding_assert.op_table_rows`); ``live_cpu``
    replaces the recorded CPU column by this machine's answer.
    """
    table: dict = {}
    for row in rows:
        key = (row["op"], row["bad"])
        cpu = ea.cpu_outcome(row["op"], row["bad"], row["num_indices"]) if live_cpu else row["cpu"]
        entry = table.setdefault(key, {"CPU": _cpu_cell(cpu)})
        entry[f"CUDA, {row['num_indices']:,} indices"] = _cuda_cell(row["cuda"])
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.names = ["op", "bad index"]
    return frame


def ops_by_kernel(rows: list[dict]) -> dict[str, dict[int, list[tuple[str, str]]]]:
    """Kernel name -> index count -> the (op, bad index) cases whose CUDA run asserted in that kernel."""
    found: dict[str, dict[int, list[tuple[str, str]]]] = {}
    for row in rows:
        cuda = row["cuda"]
        if cuda.get("outcome") == "device assert":
            cases = found.setdefault(cuda["kernel"], {}).setdefault(row["num_indices"], [])
            cases.append((row["op"], row["bad"]))
    return found


def _cases(cases: list[tuple[str, str]]) -> str:
    by_op: dict[str, list[str]] = {}
    for op, bad in cases:
        by_op.setdefault(op, []).append(bad)
    return ", ".join(f"{op} ({' and '.join(bads)})" for op, bads in by_op.items())


def kernel_table(rows: list[dict]) -> pd.DataFrame:
    """What an assert line's kernel name tells you: for each kernel, the ops (and bad index) that failed in
    it, at each recorded index count ("-" where none did)."""
    counts = sorted({row["num_indices"] for row in rows})
    conditions = {row["cuda"]["kernel"]: row["cuda"]["condition"] for row in rows
                  if row["cuda"].get("outcome") == "device assert"}
    table = {kernel: {"condition": conditions[kernel],
                      **{f"{n:,} indices": _cases(by_count.get(n, [])) or "-" for n in counts}}
             for kernel, by_count in ops_by_kernel(rows).items()}
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "kernel in the assert line"
    return frame


# -- 3. what each fix costs -----------------------------------------------------------------------------

def cpu_fix_costs(num_tokens: Sequence[int], repeats: int) -> pd.DataFrame:
    """The fixes timed live on this CPU (host time only: no kernel launch, copy or sync here), in the columns
    of :func:`specfix.figures.performance.fix_costs`, the bench recording's table."""
    rows = []
    for n in num_tokens:
        for fix in pf.FIXES:
            t = pf.time_fix(fix, pf.make_step(n), repeats=repeats, warmup=3)
            rows.append({"fix": fix, "label": pf.LABELS[fix], "num_tokens": n, "median_us": t["host_us"],
                         "p20_us": t["host_p20_us"], "p80_us": t["host_p80_us"]})
    return pd.DataFrame(rows)


def fix_cost_facts(costs: pd.DataFrame) -> dict:
    """The numbers the chapter's prose quotes: ``{fix: {num_tokens: row}}``, and ``sizes`` measured."""
    facts = {fix: {int(r["num_tokens"]): r for r in rows.to_dict("records")}
             for fix, rows in costs.groupby("fix")}
    return {"sizes": sorted(int(n) for n in costs["num_tokens"].unique()), **facts}


#: Colour, marker and line of each fix: the colours of chapter 5's figure of the same recording.
_LOOK = {"clamp": (style.FIXED, "o", "-"), "host_mask": (style.BUGGY, "s", "-"),
         "host_mask_async": (style.PLACEHOLDER, "D", "--"), "scheduler_zero": (style.PADDING, "^", ":")}


def _log_axes(ax, token_counts: list[int]) -> None:
    """Log-log axes whose labels cannot collide: the measured token counts only on x; 1, 2 and 5 times each
    power of ten on y; no labels on minor ticks."""
    ax.set(xscale="log", yscale="log")
    ax.set_xticks(token_counts)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(token_counts) / 1.6, max(token_counts) * 1.6)


def _draw_fixes(ax, costs: pd.DataFrame, key: str, spread: bool) -> None:
    fixes = [fix for fix in pf.FIXES if fix in set(costs["fix"])]
    for i, fix in enumerate(fixes):
        rows = costs[costs["fix"] == fix].sort_values("num_tokens")
        nudge = 1.09 ** (i - (len(fixes) - 1) / 2)  # side by side on the log axis, so no line hides another
        colour, marker, line = _LOOK[fix]
        kwargs = {"color": colour, "marker": marker, "linestyle": line, "label": pf.LABELS[fix],
                  "markersize": 6, "markerfacecolor": "white" if line == "--" else colour}
        x, y = rows["num_tokens"] * nudge, rows[key]
        if spread:
            ax.errorbar(x, y, yerr=[y - rows["p20_us"], rows["p80_us"] - y], capsize=3, **kwargs)
        else:
            ax.plot(x, y, **kwargs)


def fix_costs_figure(costs: pd.DataFrame, where: str):
    """Cost per step of each fix against the tokens in the step (log-log, medians with p20-p80 bars) and,
    where ``costs`` has it, the call's host time with earlier GPU work still queued. ``costs`` has the
    columns of :func:`specfix.figures.performance.fix_costs`; ``where`` names the machine."""
    busy = "host_us_behind_busy_gpu" in costs and costs["host_us_behind_busy_gpu"].notna().any()
    counts = sorted(int(n) for n in costs["num_tokens"].unique())
    with style.apply():
        fig, axes = plt.subplots(2 if busy else 1, 1, figsize=(style.WIDTH_IN, 7.0 if busy else 4.2),
                                 squeeze=False, layout="constrained")
        left = axes[0][0]
        _draw_fixes(left, costs, "median_us", spread=True)
        _log_axes(left, counts)
        left.set(xlabel="tokens in the step", ylabel="cost per step (us)",
                 title=f"{where}: one step on an idle GPU" if busy else f"{where}: host time per step")
        if busy:
            right = axes[1][0]  # under the first panel: the figure keeps the column's width
            _draw_fixes(right, costs, "host_us_behind_busy_gpu", spread=False)
            _log_axes(right, counts)
            right.set(xlabel="tokens in the step", ylabel="host time of the call (us)",
                      title=f"{where}: earlier GPU work still queued")
        fig.legend(*left.get_legend_handles_labels(), loc="outside upper center", ncols=2)
        style.caption(fig, "Medians, bars from the 20th to the 80th percentile. Compare the green clamp with "
                           "the magenta host mask and see how each line grows with the step; the points of "
                           "one size sit side by side on purpose, so that no line hides another.")
    return fig


# -- 4. the guard's cost --------------------------------------------------------------------------------

def guard_timing(timing: GuardTiming, what: str):
    """Every timed run, unguarded and guarded, with the medians: the spread the conclusion rests on."""
    with style.apply():
        fig, ax = plt.subplots(figsize=(6.4, 2.6), layout="constrained")
        for lane, (label, samples, colour) in enumerate((("unguarded", timing.plain_s, style.NEUTRAL),
                                                         ("guarded", timing.guarded_s, style.ACCENT))):
            ms = [s * 1e3 for s in samples]
            ax.plot(ms, [lane] * len(ms), "o", color=colour, alpha=0.6, label=label)
            median = statistics.median(ms)
            ax.plot([median, median], [lane - 0.25, lane + 0.25], color=colour, linewidth=2.5)
        ax.set(yticks=[0, 1], yticklabels=["unguarded", "guarded"], ylim=(-0.6, 1.6),
               xlabel=f"wall time of {what} (ms)")
        ax.grid(True, axis="x")
        style.caption(fig, f"One dot per run ({len(timing.plain_s)} of each, interleaved), the bar at the "
                           "median. If the two clouds overlap, this machine cannot tell the guard's cost "
                           "from the noise.")
    return fig


# -- 5. what the engine counts under each fix -----------------------------------------------------------

def acceptance_table(rows: list[dict]) -> pd.DataFrame:
    """The engine runs of :func:`specfix.lab.placeholder_fixes.engine_correctness`, one row per (fix,
    temperature): crashes, drafts and placeholder slots counted apart, and both acceptance rates."""
    frame = pd.DataFrame(rows).set_index(["temperature", "fix"])
    counts = ["verifications", "real drafts", "accepted drafts", "placeholder slots", "placeholders accepted"]
    for column in counts:
        if column in frame:  # whole numbers, blank where the run crashed
            frame[column] = frame[column].astype("Int64")
    return frame.round({"acceptance rate, real drafts": 3, "acceptance rate, all slots": 3})
