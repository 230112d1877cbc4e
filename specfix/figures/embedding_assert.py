"""Chapter 2's figures, tables and paragraphs on the embedding's index assert and the fixes that keep a ``-1``
from it (their cost per step is the bench case ``placeholder_fixes``, which chapter 5 draws too)."""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Sequence
from pathlib import PurePath

import pandas as pd

from specfix.figures import style
from specfix.lab import embedding_assert as ea
from specfix.lab import placeholder_fixes as pf
from specfix.lab.guard import GuardTiming

_LIGHT = {"host": "#d6e4f0", "wait": "#fde2b8", "error": "#f6c6dd"}


def short_traceback(err: BaseException) -> str:
    """The last two frames of ``err``'s traceback, files named by package, never by a local path."""
    lines = ["Traceback (most recent call last):"]
    for frame in traceback.extract_tb(err.__traceback__)[-2:]:
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
    kernel = run.asserts[0].kernel if run.asserts else "the kernel"
    raises = (f"raises\n{raised.get('type', '?')}", "error")
    launch = ("launch\nF.embedding", "host")
    if late:  # (start, width, text, kind) of each host bar
        host = [(0, 1, *launch), (1, 1, "returns", "host"), (2, 1.2, "more Python", "host")]
        host += [(3.2, 1, "synchronize()\nwaits", "wait"), (4.2, 1.4, *raises)]
    else:
        host = [(0, 1, *launch), (1, 1.3, "launch waits\n(blocking)", "wait"), (2.3, 1.4, *raises)]
    end = 7.2 if late else 5.2
    gpu = [(0.7, 1.6, f"{kernel}:\na thread asserts", "error")]
    gpu.append((2.3, end - 2.3, "context poisoned: every later CUDA call fails", "error"))
    for lane, bars in ((1, host), (0, gpu)):
        for start, width, text, kind in bars:
            ax.barh(lane, width, left=start, color=_LIGHT[kind], edgecolor=style.CEILING, height=0.6)
            ax.text(start + width / 2, lane, text, ha="center", va="center", fontsize=8)
    ax.set(yticks=[0, 1], yticklabels=["GPU", "host\n(Python)"], xticks=[], xlim=(0, end))
    ax.set_xlabel("time (schematic)")
    blocking = int(bool((run.first("start") or {}).get("blocking")))
    where = raised.get("during", "?")
    ax.set_title(f"CUDA_LAUNCH_BLOCKING={blocking}: the error surfaces at {where}", loc="left")
    ax.grid(False)


def crash_timeline(async_run: ea.ChildRun, blocking_run: ea.ChildRun):
    """Host and GPU lanes of the two minimal children: where the kernel failed, where Python heard of it."""
    caption = (
        "Top: the launch returns at once and the failure reaches Python later, at the first call that "
        "waits for the GPU. Bottom: with CUDA_LAUNCH_BLOCKING=1 every launch waits, so the error is "
        "raised by F.embedding itself."
    )
    with style.figure(caption, 4.6, 2, 1, layout="constrained") as (fig, axes):
        _timeline(async_run, axes[0])
        _timeline(blocking_run, axes[1])
    return fig


def _cell(c: dict) -> str:
    outcome = c.get("outcome")
    if outcome == "device assert":
        return f"device assert in {c['kernel']} ({c['where']}): `{c['condition']}`"
    if outcome == "returned":
        return "no error: -1 wrapped around" if c.get("wrapped") else "no error (wrong values)"
    if outcome == "raised":
        return f"{c['type']}: {c['message']}"
    return "no result (timed out)" if c.get("timed_out") else "no result"


def ops_table(rows: list[dict], live_cpu: bool = False) -> pd.DataFrame:
    """A row per (op, bad index), a column per setting; ``live_cpu``: this machine's CPU answers."""
    table: dict = {}
    for row in rows:
        cpu = ea.cpu_outcome(row["op"], row["bad"], row["num_indices"]) if live_cpu else row["cpu"]
        entry = table.setdefault((row["op"], row["bad"]), {"CPU": _cell(cpu)})
        entry[f"CUDA, {row['num_indices']:,} indices"] = _cell(row["cuda"])
    return pd.DataFrame.from_dict(table, orient="index").rename_axis(["op", "bad index"])


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
    """For each kernel of an assert line, the ops (and bad index) that failed in it at each index count."""
    counts = sorted({row["num_indices"] for row in rows})
    asserted = [row["cuda"] for row in rows if row["cuda"].get("outcome") == "device assert"]
    conditions = {cuda["kernel"]: cuda["condition"] for cuda in asserted}
    table = {
        kernel: {
            "condition": conditions[kernel],
            **{f"{n:,} indices": _cases(by_n.get(n, [])) or "-" for n in counts},
        }
        for kernel, by_n in ops_by_kernel(rows).items()
    }
    return pd.DataFrame.from_dict(table, orient="index").rename_axis("kernel in the assert line")


def cpu_fix_costs(num_tokens: Sequence[int], repeats: int) -> pd.DataFrame:
    """The fixes timed live on this CPU (host time only), in the bench recording's columns."""
    rows = []
    for n in num_tokens:
        for fix in pf.FIXES:
            t = pf.time_fix(fix, pf.make_step(n), repeats=repeats, warmup=3)
            us = {"median_us": t["host_us"], "p20_us": t["host_p20_us"], "p80_us": t["host_p80_us"]}
            rows.append({"fix": fix, "label": pf.LABELS[fix], "num_tokens": n, **us})
    return pd.DataFrame(rows)


def _by_size(costs: pd.DataFrame, key: str = "median_us") -> pd.DataFrame:
    return costs.pivot(index="fix", columns="num_tokens", values=key)


#: Colour, marker and line of each fix, in both chapters that draw them (2 and 5).
_LOOK = {
    "clamp": (style.FIXED, "o", "-"),
    "host_mask": (style.BUGGY, "s", "-"),
    "host_mask_async": (style.PLACEHOLDER, "D", "--"),
    "scheduler_zero": (style.PADDING, "^", ":"),
}


def draw_fixes(ax, costs: pd.DataFrame, key: str, title: str, ylabel: str) -> None:
    """A panel of ``costs[key]`` per fix against the step's tokens, log-log (chapter 5 draws it too)."""
    fixes = [fix for fix in pf.FIXES if fix in set(costs["fix"])]
    for i, fix in enumerate(fixes):
        rows = costs[costs["fix"] == fix].sort_values("num_tokens")
        nudge = 1.09 ** (i - (len(fixes) - 1) / 2)  # side by side on the log axis, so no line hides another
        colour, marker, line = _LOOK[fix]
        face = "white" if line == "--" else colour
        label = pf.LABELS[fix]
        if "host_syncs_per_step" in rows:  # measured on a GPU only
            label += f", {rows['host_syncs_per_step'].max():g} host sync / step"
        look = dict(color=colour, marker=marker, linestyle=line, label=label, markerfacecolor=face)
        if key == "median_us":  # medians get their p20-p80 bars
            style.errorbars(ax, rows["num_tokens"] * nudge, rows, markersize=6, **look)
        else:
            ax.plot(rows["num_tokens"] * nudge, rows[key], markersize=6, **look)
    counts = sorted(int(n) for n in costs["num_tokens"].unique())
    ax.set(xlim=(min(counts) / 1.6, max(counts) * 1.6))
    style.log_ticks(ax.xaxis, counts)  # the measured token counts only
    style.log_ticks(ax.yaxis)
    ax.set(xlabel="tokens in the step", ylabel=ylabel, title=title)


def fix_costs_figure(costs: pd.DataFrame, where: str):
    """Each fix's cost per step against the step's tokens (log-log, p20-p80 bars), and behind a busy GPU."""
    busy = "host_us_behind_busy_gpu" in costs and costs["host_us_behind_busy_gpu"].notna().any()
    caption = (
        "Medians, bars from the 20th to the 80th percentile. Compare the green clamp with the magenta "
        "host mask and see how each line grows with the step; the points of one size sit side by side "
        "on purpose, so that no line hides another."
    )
    height, rows = (7.0, 2) if busy else (4.2, 1)
    with style.figure(caption, height, rows, 1, squeeze=False, layout="constrained") as (fig, axes):
        title = f"{where}: one step on an idle GPU" if busy else f"{where}: host time per step"
        draw_fixes(axes[0][0], costs, "median_us", title, "cost per step (us)")
        if busy:  # under the first panel: the figure keeps the column's width
            title = f"{where}: earlier GPU work still queued"
            draw_fixes(axes[1][0], costs, "host_us_behind_busy_gpu", title, "host time of the call (us)")
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside upper center", ncols=2)
    return fig


def guard_timing(timing: GuardTiming, what: str):
    """Every timed run, unguarded and guarded, with the medians: the spread the conclusion rests on."""
    caption = (
        f"One dot per run ({len(timing.plain_s)} of each, interleaved), the bar at the median. If the "
        "two clouds overlap, this machine cannot tell the guard's cost from the noise."
    )
    with style.figure(caption, 2.6, width=6.4, layout="constrained") as (fig, ax):
        runs = (("unguarded", timing.plain_s, style.NEUTRAL), ("guarded", timing.guarded_s, style.ACCENT))
        for lane, (label, samples, colour) in enumerate(runs):
            ms = [s * 1e3 for s in samples]
            ax.plot(ms, [lane] * len(ms), "o", color=colour, alpha=0.6, label=label)
            median = statistics.median(ms)
            ax.plot([median, median], [lane - 0.25, lane + 0.25], color=colour, linewidth=2.5)
        ax.set(yticks=[0, 1], yticklabels=["unguarded", "guarded"], ylim=(-0.6, 1.6))
        ax.set_xlabel(f"wall time of {what} (ms)")
        ax.grid(True, axis="x")
    return fig


def acceptance_view(rows: list[dict]) -> tuple[pd.DataFrame, list[str]]:
    """The finished runs as formatted columns (they fit the page), and a line per run that crashed."""
    table = pd.DataFrame(rows).set_index(["temperature", "fix"])
    ran = table["crashes"] == "no"
    crashed = [f"{fix} at temperature {t}: {why}" for (t, fix), why in table.loc[~ran, "crashes"].items()]
    table = table[ran].drop(columns="crashes")
    for rate in table.columns[table.columns.str.startswith("acceptance rate")]:  # 1.000, not a count's 1
        table[rate] = table[rate].map(lambda v: "-" if pd.isna(v) else f"{v:.3f}")
    return style.tidy(table, digits=3).T, crashed


# -- the sentences that read the chapter's recordings and tables, built from their values (Markdown) -------


def launch_text(run: ea.ChildRun) -> str:
    """How long the call with the ``-1`` took to return, and the warm-up before it (every child warms up)."""
    launch, warmup = run.first("returned")["launch_us"], run.first("warmup")["first_launch_us"]
    return (
        f"The call with the `-1` returned after **{launch:,.0f} us** of host time: the time to *launch* "
        "the kernel, which had not even started when Python moved on. It measures host work only "
        "(argument checks, allocating `out`, queuing the kernel), never the kernel itself. The warm-up "
        f"call before it took {warmup:,.0f} us: a kernel's first launch in a process pays one-time set-up "
        "(with lazy loading, CUDA's default, a kernel's code is loaded onto the GPU at its first launch), "
        "which the warm-up takes out of the timed call."
    )


def embedding_kernels(rows: list[dict]) -> dict[int, str]:
    """Index count -> the kernel in which ``F.embedding`` asserted on a ``-1`` at that count."""
    by_kernel = ops_by_kernel(rows).items()
    return {n: k for k, by_n in by_kernel for n, cases in by_n.items() if ("F.embedding", "-1") in cases}


def kernel_names_text(rows: list[dict], torch_version: str) -> str:
    """What an assert line's kernel name tells you, read from the op table."""
    by_kernel, emb = ops_by_kernel(rows), embedding_kernels(rows)
    few, many = min(emb), max(emb)
    ops_in = lambda n: sorted({op for op, _ in by_kernel[emb[n]][n]})
    bads = lambda n, op: " and ".join(b for o, b in by_kernel[emb[n]][n] if o == op)
    others = ", ".join(f"`{op}` ({bads(many, op)})" for op in ops_in(many) if op != "F.embedding")
    few_ops = " and ".join(f"`{op}`" for op in ops_in(few))
    many_at_few = " or ".join(f"`{op}`" for op in sorted({o for o, _ in by_kernel[emb[many]].get(few, [])}))
    return f"""What the kernel name tells you:

* **The embedding's kernel depends on how many ids it looks up.** With {few:,} ids `F.embedding` failed in
  `{emb[few]}`, with {many:,} ids in `{emb[many]}`. A serving step embeds hundreds or thousands of tokens at
  once, so the second is the line a production log shows; PR #46947 quotes it from a real deployment. (The
  recording tried only the index counts of the table. No case ran `indexSelectLargeIndex`, the many-indices
  sibling in PyTorch's `Indexing.cu`: with torch {torch_version} the large lookups went to `{emb[many]}`.)
* **With {many:,} ids the name does not tell the ops apart:** {others} failed in `{emb[many]}` too, with the
  same condition. The line says "an index was out of range in a gather-style kernel", not which op.
* **With {few:,} ids the name narrows it down:** `{emb[few]}` ran only for {few_ops}, the `index_select`
  family, of which the embedding is the usual member in a model; at that count `{emb[many]}` meant
  {many_at_few or "no op at all"}.
* Both conditions catch a `-1`: one holds the index as an unsigned number, where `-1` is huge, the other tests
  `>= 0` explicitly."""


def checklist_text(rows: list[dict]) -> str:
    """The chapter's five steps for a ``device-side assert triggered``, naming the op table's kernels."""
    emb = embedding_kernels(rows)
    few, many = emb[min(emb)], emb[max(emb)]
    return f"""1. **Read the assert line, not the traceback.** The condition says an index was out of range
   (below 0 or past the end); the kernel name says which *kind* of op, and how precisely depends on the batch
   (section 2): `{few}` means the `index_select` family (an embedding, usually) with few ids, while `{many}`
   can come from an embedding, `index_select`, `gather` or `w[idx]` alike. The Python traceback only shows
   where the host next waited for the GPU.
2. **Re-run with `CUDA_LAUNCH_BLOCKING=1`.** Every launch waits for its kernel, so the traceback points at the
   op that failed (section 1, and the check of your answer there). It is slow, but it is only for finding
   the bug.
3. **Wrap the suspect step in `specfix.lab.guard.check_indices()`** (or check the ids yourself before the
   lookup, e.g. `assert input_ids.min() >= 0`, which is a synchronisation too). You get the values, their
   positions and the calling line, with the process still alive.
4. **Ask where a `-1` can come from.** In a speculative-decoding engine the usual suspect is
   `PLACEHOLDER_TOKEN_ID` (chapter 1): scheduler padding for new decodes, async-scheduling placeholders,
   grammar-invalid draft tails.
5. **Restart the process.** After the assert the CUDA context is unusable (section 1). Nothing in it can be
   saved.

Other tools worth knowing: `compute-sanitizer` (reports the first out-of-bounds access with its kernel and
thread), and PyTorch builds with `TORCH_USE_CUDA_DSA` (device-side assertions that record the launch site)."""


def _sizes(sizes: Sequence[int]) -> str:
    return " and ".join(f"{n:,}" for n in sizes)


def _async_vs_sync(costs: pd.DataFrame) -> str:
    """host_mask_async against host_mask on an idle GPU: an order only where their p20-p80 ranges part."""
    p20, p80 = _by_size(costs, "p20_us"), _by_size(costs, "p80_us")
    a, s = "host_mask_async", "host_mask"
    slower = [n for n in p20.columns if p20.loc[a, n] > p80.loc[s, n]]
    faster = [n for n in p20.columns if p80.loc[a, n] < p20.loc[s, n]]
    more = "it does all that host_mask does, plus a copy into pinned (page-locked) host memory every step"
    said = []
    if slower:
        said.append(
            f"at {_sizes(slower)} tokens it is even slower than host_mask (its 20th percentile above "
            f"host_mask's 80th): {more}"
        )
    if faster:
        said.append(f"at {_sizes(faster)} tokens it is faster (its 80th percentile below host_mask's 20th)")
    if not said:
        return (
            " Their 20th-80th percentile ranges overlap at every size: on an idle GPU the asynchronous copy "
            f"saves nothing measurable, since {more}."
        )
    return " On an idle GPU, " + "; ".join(said) + "."


def fix_costs_text(costs: pd.DataFrame) -> str:
    """What the bench recording says about each fix's cost per step, one bullet per fix."""
    median, syncs = _by_size(costs), _by_size(costs, "host_syncs_per_step").max(axis=1)  # syncs: any size
    lo, hi = median.columns[0], median.columns[-1]
    c = lambda fix, n: median.loc[fix, n]
    p20, p80 = _by_size(costs, "p20_us").loc["clamp"], _by_size(costs, "p80_us").loc["clamp"]
    spread = "overlap" if p20[hi] <= p80[lo] and p20[lo] <= p80[hi] else "do not overlap"
    return f"""What the recording says, one fix at a time:

* **clamp** costs {c("clamp", lo):,.1f} us per step at {lo:,} tokens and {c("clamp", hi):,.1f} us at
  {hi:,}, {hi / lo:,.0f} times the tokens (their 20th-80th percentile ranges {spread}), and makes
  {syncs["clamp"]:g} host synchronisations per step. Since the events span the call's host work, its GPU
  time is smaller still.
* **host_mask** grows with the step, from {c("host_mask", lo):,.0f} us at {lo:,} tokens to
  {c("host_mask", hi):,.0f} us at {hi:,}: Python walks every draft list, then
  `torch.tensor(list, device=...)` copies from pageable host memory, which PyTorch does as a *blocking* copy,
  {syncs["host_mask"]:g} host synchronisation per step.
* **host_mask_async** makes {syncs["host_mask_async"]:g} synchronisations but keeps the host work:
  {c("host_mask_async", lo):,.0f} us at {lo:,} tokens and {c("host_mask_async", hi):,.0f} us at {hi:,},
  against host_mask's {c("host_mask", lo):,.0f} and {c("host_mask", hi):,.0f}.{_async_vs_sync(costs)}
* **scheduler_zero** does no GPU work at all, but its host work in the scheduler grows with the step, from
  {c("scheduler_zero", lo):,.0f} to {c("scheduler_zero", hi):,.0f} us; and it is wrong, as the next table
  shows."""


def busy_gpu_text(costs: pd.DataFrame) -> str:
    """What the fixes cost behind a busy GPU: host_mask waits for the queue while its own host work is
    shorter than the queue, the clamp never waits."""
    idle, busy = _by_size(costs), _by_size(costs, "host_us_behind_busy_gpu")
    lo = idle.columns[0]
    wait = busy.loc["host_mask"] - idle.loc["host_mask"]
    n_wait = wait.idxmax()
    waited = wait[n_wait] > 0
    late = [n for n in wait.index if wait[n] < wait[n_wait] / 2] if waited else list(wait.index)
    head = "**Behind a busy GPU (lower panel), host_mask's synchronisation makes it wait for the queue"
    text = []
    if waited:
        head += " only while its own host work is shorter than the queue.**" if late else ".**"
        text.append(
            f"At {n_wait:,} tokens host_mask's call took {busy.loc['host_mask', n_wait]:,.0f} us, "
            f"{wait[n_wait]:,.0f} us more than its whole step on an idle GPU: the blocking copy waited for "
            "the queued work, and so did the host, which could not prepare the next step meanwhile."
        )
    else:
        head = "**Behind a busy GPU (lower panel), host_mask's synchronisation never made it wait longer.**"
    if late:
        us = lambda fix, table: " and ".join(f"{table.loc[fix, n]:,.0f}" for n in late)
        no_less = (busy.loc["host_mask_async", late] >= busy.loc["host_mask", late]).all()
        text.append(
            f"At {_sizes(late)} tokens it took {us('host_mask', busy)} us against {us('host_mask', idle)} "
            "idle: its own host work outlasts the queued work, so by the time it copies there is nothing "
            "left to wait for, and the host work, which grows with the step, is its price. host_mask_async, "
            f"which never waits, took {us('host_mask_async', busy)} us{', no less' if no_less else ''}."
        )
    text.append(
        f"The clamp's call took {busy.loc['clamp', lo]:,.0f} to {busy.loc['clamp'].max():,.0f} us behind "
        "the same queue: it waits for nothing."
    )
    return " ".join([head, *text])


_REAL, _ACC, _VER = "real drafts", "accepted drafts", "verifications"


def _clamp_and_zero(rows: list[dict], temperature: float) -> tuple[dict, dict]:
    row = {(r["temperature"], r["fix"]): r for r in rows}
    return row[(temperature, pf.LABELS["clamp"])], row[(temperature, pf.LABELS["scheduler_zero"])]


def zeroing_greedy_text(rows: list[dict]) -> str:
    """At temperature 0: zeroing accepts placeholders; whether the real drafts changed, the counts say."""
    from specfix.tokenizer import get_tokenizer

    zero_word = get_tokenizer().vocab[0]
    a, z = _clamp_and_zero(rows, 0.0)
    placeholders = style.counted(z["placeholders accepted"], "placeholder slot")
    same_drafts = all(a[k] == z[k] for k in (_VER, _REAL, _ACC))
    if same_drafts:
        verified = (
            f"Zeroing accepted {placeholders} as the word *{zero_word}* (token 0), yet here both runs "
            f"verified {style.counted(a[_REAL], 'real draft')} in {style.counted(a[_VER], 'verification')} "
            f"and accepted {a[_ACC]} of them."
        )
    else:
        d_real, d_acc = a[_REAL] - z[_REAL], a[_ACC] - z[_ACC]
        same = f"the clamp's run verified {d_real:+} real drafts and accepted {d_acc:+}"
        if d_acc == 0:
            same = f"both runs verified {style.counted(a[_REAL], 'real draft')} and accepted {a[_ACC]}"
            if d_real:
                more = "clamp" if d_real > 0 else "zeroing"
                same = (
                    f"both runs accepted {style.counted(a[_ACC], 'real draft')}, and the {more} run verified "
                    f"{abs(d_real)} more, every one of them rejected"
                )
        verified = (
            f"The two runs did not verify the same drafts. Zeroing accepted {placeholders} as the word "
            f"*{zero_word}* (token 0); every accepted slot emits a token, so its requests went through their "
            f"text in {z[_VER]} verifications against {a[_VER]}, and its drafter proposed at other points "
            f"of the text: {same}."
        )
    rate, all_slots = "acceptance rate, real drafts", "acceptance rate, all slots"
    head = "left the real drafts as they were" if same_drafts else "changed which drafts were verified"
    return (
        f"**Zeroing {head}.** At temperature 0, scheduler_zero shows an acceptance rate "
        f"of {z[rate]:.3f} against the clamp's {a[rate]:.3f} ({z[_ACC]} of {z[_REAL]} against {a[_ACC]} of "
        f"{a[_REAL]}), and both count real drafts only. {verified} Counted over all "
        "slots, as a counter that cannot tell them apart would, the rates are "
        f"{z[all_slots]:.3f} for zeroing and {a[all_slots]:.3f} for the clamp, and zeroing's accepted "
        f"placeholders ({z['placeholders accepted']}) count as accepted drafts there. Zeroing's "
        f"greedy text is {'the same as' if z['same tokens as the clamp'] else 'different from'} the clamp's."
    )


def zeroing_sampled_text(rows: list[dict]) -> str:
    """The same comparison at the highest temperature run, or, where it verified no real draft, what the
    placeholder slots alone did to the counts."""
    t = max(r["temperature"] for r in rows)
    a, z = _clamp_and_zero(rows, t)
    both = a[_ACC] + z[_ACC]
    scarce = (
        f"; with {style.counted(both, 'accepted draft')} in both runs together, "
        "the rates say nothing either way. "
    )
    text = "the same as the clamp's."
    if not z["same tokens as the clamp"]:
        text = (
            "different from the clamp's: an accepted placeholder emits a token, so the sampled run draws its "
            "random numbers at other points."
        )
    if not a[_REAL] and not z[_REAL]:
        all_slots = "acceptance rate, all slots"
        return (
            f"At temperature {t} the n-gram drafter found no match in the sampled text: neither run verified "
            "a real draft, so those counts are zero and their rate is undefined (-). The only draft slots "
            f"verified were the {style.counted(z['placeholder slots'], 'placeholder slot')} the scheduler "
            f"padded. Zeroing accepted {z['placeholders accepted']} of them, so a counter over all slots "
            f"reports an acceptance rate of {z[all_slots]:.3f} for zeroing, with no draft proposed, against "
            f"{a[all_slots]:.3f} for the clamp; and zeroing's text is {text}"
        )
    return (
        f"At temperature {t}: {a[_ACC]} of {style.counted(a[_REAL], 'real draft')} accepted with the clamp, "
        f"{z[_ACC]} of {z[_REAL]} with zeroing{scarce if both < 10 else '. '}Zeroing still accepted "
        f"{style.counted(z['placeholders accepted'], 'placeholder slot')}, and its text is {text}"
    )


def guard_cost_text(timing: GuardTiming, steps: int, on_gpu: bool) -> str:
    """What the guard cost over `steps` engine steps, and whether that stands out of the noise."""
    ms = lambda s: f"median {statistics.median(s) * 1e3:,.0f} ms ({min(s) * 1e3:,.0f} to {max(s) * 1e3:,.0f})"
    verdict = (
        "the two spreads overlap: on this machine, at this size, the guard's cost is lost in the noise "
        "between runs"
    )
    if timing.separated:
        cost = f"{timing.ratio - 1:.0%}"
        verdict = f"every guarded run was slower than every unguarded one: the guard costs about {cost} here"
    elif max(timing.guarded_s) < min(timing.plain_s):
        verdict = (
            "every guarded run was faster, which says the machine's speed drifted, not that the guard helps"
        )
    sync = ", each one a synchronisation on this GPU."
    if not on_gpu:
        sync = (
            "; on a CPU each check reads memory the host already has, on a GPU each one is a synchronisation."
        )
    return (
        f"Over {len(timing.plain_s)} runs each: unguarded {ms(timing.plain_s)}, guarded "
        f"{ms(timing.guarded_s)}; {verdict}. The guard checked {timing.checked} index tensors per run, "
        f"{timing.checked / steps:,.0f} per step{sync} Either way the guard is for finding the bug, not for "
        "serving."
    )
