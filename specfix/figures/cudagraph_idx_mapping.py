"""Chapter 3's figures, tables and paragraphs on the ``-1`` rows that CUDA-graph padding adds to
``idx_mapping``: why a graph pads, and what a padded row overwrites without the fix."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from specfix.figures import style
from specfix.lab.padding_bench import BufferState
from specfix.lab.stale_rows import ORIGIN_EARLIER, ORIGIN_FREE, ORIGIN_FRESH, ORIGIN_REUSED

#: bench_table's rows: a summary's counts, each with the words the table shows
BENCH_ROWS = {
    "num_requests": "requests",
    "differing": "responses that differ from the solo run",
    "steps_batched": "batched steps",
    "padded_steps": "steps with padded rows",
    "writes_landed": "padded writes that changed a live request's cached logits",
}
#: the origins of a padded write's stale entry (``writes_by_origin``), each a row of bench_table
ORIGINS = (ORIGIN_FRESH, ORIGIN_EARLIER, ORIGIN_REUSED, ORIGIN_FREE)
#: the chapter's name for each sampler ``resolve_sampler`` picks
SAMPLER_WORDS = {"kernel": "the Triton kernel", "reference": "the Triton kernel's torch twin"}


def launch_overhead(rows: Sequence[dict], source: str):
    """Wall us per drafter step (GPU work included), eager against one graph replay, per batch size."""
    df = pd.DataFrame(list(rows))
    missing = {"size", "eager_us", "graph_us"} - set(df.columns)
    if df.empty or missing:
        raise ValueError(f"rows must be dicts with size, eager_us and graph_us, missing {sorted(missing)}")
    speedup = df["eager_us"] / df["graph_us"]
    caption = (
        f"The replay costs about the same at every size, eager launches {speedup.min():.0f} to "
        f"{speedup.max():.0f} times more: at these batch sizes the host's launches, not the GPU's work, "
        "set the step time."
    )
    with style.figure(caption, 3.2) as (fig, ax):
        ax.plot(df["size"], df["eager_us"], "o-", color=style.BUGGY, label="eager launches")
        ax.plot(df["size"], df["graph_us"], "s-", color=style.FIXED, label="one graph replay")
        ax.set(xlabel="batch rows", ylabel="us per drafter step")
        title = f"Drafter step (k = 3 forwards and samplers)\n{style.wrap(source, 90)}"
        ax.set_title(title, fontsize=9)
        style.log_ticks(ax.xaxis, df["size"])
        style.log_ticks(ax.yaxis)
        style.legend_below(fig, ax)
    return fig


def _cell(ax, x: float, row: int, text: str, fill: str, dim: bool) -> None:
    alpha = 1 if fill == "white" else 0.3
    ax.add_patch(Rectangle((x, -row), 1.6, 0.85, facecolor=fill, alpha=alpha, edgecolor="#bbbbbb", lw=0.5))
    colour = "#888888" if dim else "black"
    ax.text(x + 0.8, -row + 0.42, text, ha="center", va="center", fontsize=style.SMALLEST_PT, color=colour)


def _draw_buffer(ax, state: BufferState, title: str) -> None:
    ax.text(0.8, 1.0, "idx_mapping", ha="center", fontsize=9, weight="bold")
    ax.text(4.2, 1.0, "draft_logits", ha="center", fontsize=9, weight="bold")
    for r, slot in enumerate(state.idx_mapping):
        live, padded = r < state.num_reqs, r < state.num_reqs_padded  # rows past the graph: white
        note = f"  ({state.batch[r]})" if live else "  padded" if padded else ""
        fill = style.NEUTRAL if live else style.PADDING if padded else "white"
        _cell(ax, 0, r, f"row {r}: {slot}{note}", fill, dim=not padded)
        owner = state.owners.get(r)  # the same index read as a request-state slot of draft_logits
        _cell(ax, 3.4, r, f"slot {r}: {owner or 'free'}", style.NEUTRAL if owner else "white", dim=not owner)
    for w in state.writes:
        hit = w.victim is not None
        arrow = dict(arrowstyle="->", color=style.BUGGY if hit else style.PADDING, lw=1.6 if hit else 1.0)
        ax.annotate("", xy=(3.4, -w.slot + 0.42), xytext=(1.6, -w.row + 0.42), arrowprops=arrow)
    ax.set(xlim=(-0.1, 5.1), ylim=(-len(state.idx_mapping) + 0.6, 1.4))
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def padded_buffers(states: Sequence[BufferState], titles: Sequence[str]):
    """Per state: ``idx_mapping`` rows, ``draft_logits`` slots, an arrow per padded row's write."""
    if len(states) != len(titles) or not states:
        raise ValueError(f"need one title per state, got {len(states)} states and {len(titles)} titles")
    rows = max(len(s.idx_mapping) for s in states)
    caption = (
        "Blue rows are live, grey rows are padding that the graph processes anyway, white rows lie "
        "beyond it. A magenta arrow is a padded row whose stale entry names a live request's slot: its "
        "sampler writes into that request's cached draft logits (last on the CPU; on a GPU the request's "
        "own row may store last). A grey arrow names a free slot, no request's logits."
    )
    with style.figure(caption, 0.3 * rows + 1.2, 1, len(states), squeeze=False) as (fig, axes):
        for ax, s, title in zip(axes[0], states, titles, strict=True):
            shape = f"{s.num_reqs} live rows, graph of {s.num_reqs_padded}"
            _draw_buffer(ax, s, f"{title}\n{shape}; overwritten: {', '.join(s.victims) or 'none'}")
        fig.tight_layout()
    return fig


def bench_table(benches: dict[str, dict]) -> pd.DataFrame:
    """The bench summaries (``PaddingBench.summary()`` or the recording's), a column per label (narrow enough
    for the book's column), a row per count in words: every padded write, those that changed a live
    request's cached logits (on a GPU the request's own store may land last), and the writes by where
    their stale entry came from, which add up to every padded write."""
    frame = pd.DataFrame(list(benches.values()), index=list(benches))
    missing = {*BENCH_ROWS, "writes_by_origin"} - set(frame.columns)
    if missing:
        raise ValueError(f"bench summaries lack {sorted(missing)}")
    counts = frame[list(BENCH_ROWS)].rename(columns=BENCH_ROWS)
    writes = {"padded writes, all": [sum(b["writes_by_origin"].values()) for b in benches.values()]}
    origins = {
        f"padded writes, stale entry from: {origin}": [
            b["writes_by_origin"].get(origin, 0) for b in benches.values()
        ]
        for origin in ORIGINS
    }
    table = counts.iloc[:, :4].assign(**writes).join(counts.iloc[:, 4:]).assign(**origins).T
    return table.rename_axis(None)


def _freq(counts) -> np.ndarray:
    counts = np.asarray(counts, dtype=float)
    return counts / max(counts.sum(), 1.0)


def chi_square_table(dists: dict[str, dict]) -> pd.DataFrame:
    """Per run and position: role, chi-square, and total variation to the target p and draft q."""
    rows = [{"fix": label} | r for label, dist in dists.items() for r in dist["positions"]]
    table = pd.DataFrame(rows).rename(columns={"tv_to_target": "TV to p", "tv_to_draft": "TV to q"})
    columns = ["role", "trials", "chi2", "threshold", "passed", "TV to p", "TV to q"]
    table = table.set_index(["fix", "position"])[columns]
    return table.round({"chi2": 1, "threshold": 1, "TV to p": 3, "TV to q": 3})


def diff_transcript(examples: Sequence[dict], differing: int | None = None) -> str:
    """The word diffs of recorded examples (``req_id``, ``solo``, ``batched``) as HTML, one block per
    request, under a bold line when ``differing`` (how many responses differ) is given; no line breaks
    inside a word, so a mark like ``[-lay-]`` stays whole."""
    words = lambda text: " ".join(
        f'<span style="white-space: nowrap">{html.escape(w)}</span>' for w in text.split()
    )
    blocks = [
        f'<p style="font-family: monospace; margin: 0.6em 0"><b>request {e["req_id"]}</b><br>'
        f"alone: {words(e['solo'])}<br>batched: {words(e['batched'])}</p>"
        for e in examples
    ]
    if differing is not None:
        blocks.insert(
            0,
            f"<p><b>{len(examples)} of the {differing} responses that differ without the fix</b> (marked as "
            "in section 3):</p>",
        )
    return "\n".join(blocks)


def recorded_heading(recording: dict, part: str) -> str:
    """The bold line over a table of the H200 recording (``part``: "bench" or "distribution")."""
    off, trials = recording["bench"]["fix_off"], recording["chi_square"]["False"]["positions"][0]["trials"]
    return {
        "bench": f"**{off['num_requests']} requests, batched against solo runs** (section 3's table):",
        "distribution": f"**The output per position, {trials:,} trials a run** (section 4's table):",
    }[part]


def output_distribution(dists: dict[str, dict]):
    """A panel per output position: each run's output frequencies against p and q."""
    if not dists:
        raise ValueError("dists is empty")
    first = next(iter(dists.values()))
    p, q, positions = first["target_probs"], first["draft_probs"], first["positions"]
    colour = {"fix on": style.FIXED, "fix off": style.BUGGY}
    cols = min(len(positions), 2)  # two panels a row: the figure keeps the column's width
    rows = -(-len(positions) // cols)
    caption = (
        "Without the fix the bars at the drafted positions follow the draft's crosses, not the target's "
        "black marks; the bonus position follows the target either way."
    )
    with style.figure(caption, 0.4 + 2.7 * rows, rows, cols, sharey=True, squeeze=False) as (fig, grid):
        axes = grid.ravel()
        for j, (ax, at) in enumerate(zip(axes, positions, strict=False)):
            runs = [
                (f"output, {k}", _freq(d["positions"][j]["counts"]), colour.get(k, style.PADDING))
                for k, d in dists.items()
            ]
            style.grouped_bars(ax, np.arange(len(p)), runs, alpha=0.85)
            ax.plot(p, "_", color="black", ms=9, mew=2, label="target p")
            ax.plot(q, "x", color=style.NEUTRAL, ms=5, label="draft q")
            ax.set(title=f"position {at['position']} ({at['role']})", xlabel="token id")
            style.integer_ticks(ax.xaxis)
        for ax in grid[:, 0]:
            ax.set_ylabel("frequency")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0 if len(axes) > len(positions) else 0.5 / fig.get_figheight(), 1, 1))
        if len(axes) > len(positions):  # the key takes the spare panel's place
            spare = axes[-1].get_position()
            fig.delaxes(axes[-1])
            fig.legend(handles, labels, loc="center", bbox_to_anchor=spare)
        else:
            fig.legend(handles, labels, loc="lower center", ncol=len(labels))
    return fig


# --- the sentences that read the chapter's runs and recordings, built from their values (Markdown) -------


def padded_writes_text(state: BufferState) -> str:
    """Which padded rows of an unfixed step write where: one bullet per stale write."""
    where = lambda name: f"live at row {state.batch.index(name)}" if name in state.batch else "live, waiting"
    lines = [
        f"- padded row {w.row} still holds **{w.slot}** (source: {w.origin}); "
        + (f"slot {w.slot} belongs to **{w.victim}**, {where(w.victim)}" if w.victim else "a free slot")
        for w in state.writes
    ]
    return (
        f"Without the fix, the step runs {state.num_reqs} live rows on the graph of "
        f"{state.num_reqs_padded}, so rows {state.num_reqs} to {state.num_reqs_padded - 1} are padding:\n\n"
        + "\n".join(lines)
        + "\n\nWith the fix every row past the batch is -1, which the sampler skips: no arrow."
    )


def bench_text(bench_on, bench_off, sampler: str, num_requests: int) -> str:
    """The padding bench's shapes, sampler and verdict."""
    shapes = sorted({(len(s.req_ids), s.num_reqs_padded) for s in bench_off.batched.steps})
    how = SAMPLER_WORDS[sampler]
    if sampler != "kernel":
        how += (
            " (the same tokens and stores, tied to the kernel by tests/test_speculator.py and "
            "tests/test_padding_bench.py; the kernel itself runs in section 6)"
        )
    return (
        f"{num_requests} requests; the batched steps had (live rows, graph rows) of {shapes} and ran as "
        f"{', '.join(bench_off.summary()['ran'])}, the drafter sampling with {how}. With the fix, "
        f"batched and solo runs differ in {len(bench_on.differing)} of {num_requests} responses; without "
        f"it, in **{len(bench_off.differing)} of {num_requests}**."
    )


def distribution_text(dists: dict[str, dict]) -> str:
    """Why the unfixed drafted positions follow q: the stale q′ and the acceptance it causes."""
    on, off = dists["fix on"], dists["fix off"]
    stale, first = off["stale_token"], off["positions"][0]
    return (
        f"**Without the fix, the drafted positions follow q instead of p.** At position 0 the output is "
        f"{first['tv_to_draft']:.3f} from q and {first['tv_to_target']:.3f} from p (with the fix: "
        f"{on['positions'][0]['tv_to_target']:.3f} from p). Why: the stale q′ puts "
        f"{off['stale_probs'][stale]:.6f} on token {stale} and {min(off['stale_probs']):.1e} on each "
        f"other token, so for a draft d ≠ {stale} the ratio p(d)/q′(d) is far above 1 and the draft is "
        f"accepted whatever u is: {off['acceptance_rate']:.0%} of drafts accepted, against "
        f"{on['acceptance_rate']:.0%} with the fix. A draft that is always accepted is simply a sample "
        "of q."
    )


def bonus_text(dists: dict[str, dict], trials: int) -> str:
    """Why the bonus position passes the test even without the fix."""
    on, off = dists["fix on"], dists["fix off"]
    k = len(off["positions"]) - 1
    bonus = off["positions"][k]
    return (
        f"**Position {k} passes the test even without the fix** (chi² {bonus['chi2']:.1f} < "
        f"{bonus['threshold']:.1f}) because it is the *bonus* token: emitted only when all k = {k} "
        "drafts were accepted, and `rejection_sample_mrv2` draws it from the target's own distribution p "
        "at that position, with noise of its own (keyed by seed and position, apart from the accept "
        "tests' uniforms). q never enters that draw, so a stale q changes how often the bonus is reached "
        f"({bonus['trials']} of {trials} trials without the fix, {on['positions'][k]['trials']} with "
        "it), not which token it is."
    )


def recorded_text(recording: dict) -> str:
    """The H200 recording's verdict: responses that differ, padded writes that landed (on a GPU the live
    row's own store to the slot may land last), the first position's chi²."""
    off, chi = recording["bench"]["fix_off"], recording["chi_square"]
    p0_off, p0_on = chi["False"]["positions"][0], chi["True"]["positions"][0]
    return (
        f"At full scale with real graph replays, **{off['differing']} of {off['num_requests']}** responses "
        f"differ from their solo runs without the fix and {recording['bench']['fix_on']['differing']} with "
        f"it. Without the fix only {off['writes_landed']} of its {sum(off['writes_by_origin'].values())} "
        "padded writes changed a live request's cached logits: in the same launch the request's own row "
        "stores into that slot too, and on a GPU either store may land last. Over "
        f"{p0_off['trials']:,} trials the first output position scores chi² {p0_off['chi2']:,.0f} against a "
        f"threshold of {p0_off['threshold']:.1f} without the fix, {p0_on['chi2']:.1f} with it."
    )
