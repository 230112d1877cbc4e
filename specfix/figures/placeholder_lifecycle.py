"""Chapter 1's figures and tables: one engine step's tensors as coloured token grids, the acceptance plots,
the tables that compare placeholder designs, and one placeholder on both model runners, with the sentences
that read those tables.

Every grid cell is one token id with its word under it; colours (from :mod:`specfix.figures.style`) say what
the cell is: a ``-1`` placeholder, an id that was ``-1`` one stage earlier, an unused cell, or padding.
Each function returns its Figure already closed in pyplot, so a notebook shows it once, as the cell's value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import colors
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from specfix.figures import style
from specfix.lab.placeholder_lifecycle import verifications
from specfix.v1.engine import GenerateResult
from specfix.v1.model_runner import StepTrace
from specfix.v1.scheduler import SpecDecodingStats

ORDINARY, PLACEHOLDER, WAS_PLACEHOLDER, UNUSED, PADDING = range(5)
_FILL = [
    "#eeeeee",                                           # an ordinary token id
    style.PLACEHOLDER,                                   # a -1 placeholder
    colors.to_hex(0.3 * np.array(colors.to_rgb(style.FIXED)) + 0.7),  # was -1, clamped: light green
    "#ffffff",                                           # a cell nothing was written to
    colors.to_hex(0.35 * np.array(colors.to_rgb(style.PADDING)) + 0.65),  # CUDA-graph padding
]
_KIND_LABELS = ["token id", "-1 (PLACEHOLDER_TOKEN_ID)", "was -1, clamped to 0", "unused",
                "CUDA-graph padding"]


def _draw_ids(ax, ids, vocab: Sequence[str], kinds, col_labels=None, row_labels=None, title=""):
    """One grid: a cell per id, filled by its kind, the id and its word written in black on a light fill."""
    ids, kinds = np.atleast_2d(np.asarray(ids)), np.atleast_2d(np.asarray(kinds))
    ax.imshow(kinds, cmap=colors.ListedColormap(_FILL), vmin=0, vmax=len(_FILL) - 1, aspect="auto")
    for (r, c), t in np.ndenumerate(ids):
        if kinds[r, c] != UNUSED:
            word = vocab[t] if 0 <= t < len(vocab) else ""
            ax.text(c, r, f"{t}\n{word}", ha="center", va="center", fontsize=style.SMALLEST_PT, color="black")
    ax.set_xticks(range(ids.shape[1]), col_labels if col_labels is not None else range(ids.shape[1]),
                  fontsize=style.SMALLEST_PT)
    if row_labels is None:
        ax.set_yticks([])
    else:
        ax.set_yticks(range(ids.shape[0]), row_labels, fontsize=style.SMALLEST_PT)
    ax.grid(False)
    ax.set_title(title, loc="left", fontsize=9)


LEGEND_IN = 0.5  # the colour key's strip under the grids (two rows of three), in inches


def _kind_legend(fig: Figure, kinds_shown: set[int]) -> None:
    """Lay the grids out over the figure, then name the colours shown in a strip under them (the figure keeps
    the column's width; the figures give it LEGEND_IN of their height)."""
    fig.tight_layout(rect=(0, LEGEND_IN / fig.get_figheight(), 1, 1))
    handles = [Patch(facecolor=_FILL[k], edgecolor="#888888", label=_KIND_LABELS[k])
               for k in sorted(kinds_shown)]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 0.0), ncol=3,
               fontsize=style.SMALLEST_PT, columnspacing=1.2, handlelength=1.5)


def _filled_lengths(step: StepTrace) -> list[int]:
    """Cells of ``token_ids_cpu`` in use per request after this step's update: prompt, outputs and drafts."""
    out = step.scheduler_output
    start = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    start.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    prompt = {new.req_id: len(new.prompt_token_ids) for new in out.scheduled_new_reqs}
    return [max(prompt.get(r, 0), start[r] + n)
            for r, n in zip(step.req_ids, step.num_scheduled_tokens, strict=True)]


def token_table(step: StepTrace, vocab: Sequence[str], rows: Sequence[int] | None = None,
                width: int = 10) -> Figure:
    """``InputBatch.token_ids_cpu`` after ``update_req_spec_token_ids``: the drafts sit verbatim after each
    request's committed tokens. ``rows``: the requests' rows in the persistent batch (default 0, 1, ...)."""
    rows = list(range(len(step.req_ids))) if rows is None else list(rows)
    if len(rows) != len(step.req_ids):
        raise ValueError(f"rows has {len(rows)} entries for {len(step.req_ids)} requests")
    table = step.token_ids_cpu[rows, :width]
    kinds = np.where(table == -1, PLACEHOLDER, ORDINARY)
    kinds[np.arange(width)[None, :] >= np.array(_filled_lengths(step))[:, None]] = UNUSED
    with style.apply():
        fig = plt.figure(figsize=(style.WIDTH_IN, 0.6 + 0.55 * len(rows) + LEGEND_IN))
        ax = fig.subplots()
        _draw_ids(ax, table, vocab, kinds, row_labels=step.req_ids, title="InputBatch.token_ids_cpu, "
                  f"first {width} positions, after update_req_spec_token_ids")
        ax.set_xlabel("position in the request")
        _kind_legend(fig, set(np.unique(kinds)))
        style.caption(fig, "The scheduler's drafts, -1 included, are written right after each request's "
                      "committed tokens: the -1 is still only a value in a CPU table.")
    plt.close(fig)
    return fig


def _span_labels(step: StepTrace, num_input_tokens: int) -> list[str]:
    labels = np.repeat(step.req_ids, step.num_scheduled_tokens).tolist()
    return labels + ["pad"] * (num_input_tokens - len(labels))


def draft_positions(step: StepTrace) -> np.ndarray:
    """Where in ``input_ids`` each entry of ``draft_token_ids`` was gathered from."""
    md = step.spec_decode_metadata
    return md.logits_indices.cpu()[md.target_logits_indices.cpu().long() + 1].long().numpy()


def step_stages(step: StepTrace, vocab: Sequence[str]) -> Figure:
    """Three views of one step: ``input_ids`` after ``_prepare_inputs``, ``draft_token_ids`` under the
    positions it was gathered from, and what the embedding receives after ``_preprocess``."""
    if step.spec_decode_metadata is None:
        raise ValueError("step has no SpecDecodeMetadata: pick a step that verifies drafts")
    before = step.input_ids_before_clamp.numpy()
    n = len(before)
    labels = _span_labels(step, n)
    padding = np.arange(n) >= sum(step.num_scheduled_tokens)
    kinds_before = np.where(padding, PADDING, np.where(before == -1, PLACEHOLDER, ORDINARY))
    positions = draft_positions(step)
    drafts = np.zeros(n, dtype=np.int64)
    drafts[positions] = step.spec_decode_metadata.draft_token_ids.cpu().numpy()
    kinds_drafts = np.full(n, UNUSED)
    kinds_drafts[positions] = np.where(drafts[positions] == -1, PLACEHOLDER, ORDINARY)
    after = step.embedding_input.numpy()
    kinds_after = np.where(padding, PADDING, np.where(before == -1, WAS_PLACEHOLDER, ORDINARY))
    with style.apply():
        fig = plt.figure(figsize=(style.WIDTH_IN, 3.9 + LEGEND_IN))
        axes = fig.subplots(3, 1)
        _draw_ids(axes[0], before, vocab, kinds_before, labels, title="input_ids after _prepare_inputs")
        _draw_ids(axes[1], drafts, vocab, kinds_drafts, labels,
                  title="SpecDecodeMetadata.draft_token_ids (a copy made before the clamp), at its positions")
        _draw_ids(axes[2], after, vocab, kinds_after, labels,
                  title="input_ids after _preprocess: what nn.Embedding receives")
        _kind_legend(fig, set(np.unique(np.concatenate([kinds_before, kinds_drafts, kinds_after]))))
        style.caption(fig, "Follow the orange -1 down: the metadata copy keeps it, the embedding's input has "
                      "it clamped to 0 (green). Column labels name the request each token belongs to.")
    plt.close(fig)
    return fig


def sampler_output(step: StepTrace, vocab: Sequence[str]) -> Figure:
    """The rejection sampler's output matrix ``[B, max_spec_len + 1]`` of one step."""
    out = step.sampler_output.numpy()
    width = out.shape[1]
    kinds = np.where(out == -1, PLACEHOLDER, ORDINARY)
    with style.apply():
        fig = plt.figure(figsize=(style.WIDTH_IN, 0.7 + 0.45 * out.shape[0] + LEGEND_IN))
        ax = fig.subplots()
        _draw_ids(ax, out, vocab, kinds, col_labels=[f"column {j}" for j in range(width)],
                  row_labels=step.req_ids, title="RejectionSampler output [B, max_spec_len + 1]")
        _kind_legend(fig, set(np.unique(kinds)))
        style.caption(fig, "Each row holds the tokens its request produced, left to right, then -1. A "
                      "request with k drafts has its bonus column at k: column 0 for one without drafts.")
    plt.close(fig)
    return fig


def acceptance(stats: Mapping[str, SpecDecodingStats]) -> Figure:
    """Acceptance rate per draft position and the distribution of acceptance lengths, one bar per run."""
    if not stats:
        raise ValueError("stats is empty: pass at least one run's SpecDecodingStats")
    k = max(s.num_spec_tokens for s in stats.values())
    width = 0.8 / len(stats)
    with style.apply():
        fig = plt.figure(figsize=(style.WIDTH_IN, 3.4))
        ax1, ax2 = fig.subplots(1, 2)
        for i, (name, s) in enumerate(stats.items()):
            offset = (i - (len(stats) - 1) / 2) * width
            ax1.bar(np.arange(k) + offset, s.acceptance_rate_per_pos, width, label=name)
            lengths = np.bincount(s.acceptance_lengths, minlength=k + 2)[1:]
            ax2.bar(np.arange(1, k + 2) + offset, lengths / max(lengths.sum(), 1), width)
        ax1.set(xticks=range(k), xticklabels=[f"draft {j + 1}" for j in range(k)], ylim=(0, 1),
                ylabel="accepted / drafted", title="acceptance rate per position")
        ax2.set(xticks=range(1, k + 2), xlabel="tokens per target pass (1 + accepted)", ylabel="fraction",
                title="acceptance length")
        fig.legend(*ax1.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 1.0),
                   ncol=len(stats))
        fig.subplots_adjust(top=0.78, wspace=0.3)
        style.caption(fig, "Left: each later draft is accepted less often, because it is only verified when "
                      "every draft before it was accepted. Right: how many tokens one target pass yields.")
    plt.close(fig)
    return fig


# -- tables ----------------------------------------------------------------------------------------------


def _rate(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, 3) if denominator else math.nan


def design_table(designs: Mapping[str, GenerateResult | BaseException], plain: GenerateResult):
    """One row per placeholder design: what ran, slots and drafts counted apart, two acceptance rates, and
    whether the text equals plain greedy decoding. A design given as an exception is shown as its crash."""
    import pandas as pd

    rows = []
    for name, result in designs.items():
        if isinstance(result, BaseException):
            rows.append({"design": name, "outcome": f"crash: {type(result).__name__}"})
            continue
        found = verifications(result)
        slots = sum(len(v.drafts) + v.num_placeholders for v in found)
        drafts = sum(len(v.drafts) for v in found)
        pads = [t for v in found for t in v.placeholders]
        accepted_pads = sum(v.accepted_placeholders for v in found)
        accepted_drafts = sum(v.accepted_drafts for v in found)
        rows.append({
            "design": name, "outcome": "ran", "slots verified": slots, "placeholder slots": len(pads),
            "placeholders recognisable by id (< 0)": sum(t < 0 for t in pads), "real drafts": drafts,
            "placeholder slots accepted": accepted_pads, "real drafts accepted": accepted_drafts,
            "rate over all slots": _rate(accepted_drafts + accepted_pads, slots),
            "rate over real drafts": _rate(accepted_drafts, drafts),
            "text == plain greedy": all(a.token_ids == b.token_ids
                                        for a, b in zip(result.outputs, plain.outputs, strict=True)),
        })
    table = pd.DataFrame(rows).set_index("design")
    counts = [c for c in table.columns if c not in ("outcome", "text == plain greedy") and "rate" not in c]
    return table.astype({c: "Int64" for c in counts})


def comparison_table(summary: Mapping[str, Mapping[str, int]], name_a: str, name_b: str, word: str):
    """:func:`specfix.lab.placeholder_lifecycle.compare_runs`'s groups as a table, the runs named."""
    import pandas as pd

    index = {"both": "verified by both runs", "only a": f"only by the {name_a} run",
             "only b": f"only by the {name_b} run"}
    rows = {index[group]: {"verifications": g["verifications"], "real drafts": g["drafts"],
                           f"accepted ({name_a} run)": g["accepted in a"],
                           f"accepted ({name_b} run)": g["accepted in b"],
                           f"right after {word!r}": g["after token_id"]}
            for group, g in summary.items()}
    return pd.DataFrame(rows).T


def _words(ids: Sequence[int], vocab: Sequence[str]) -> str:
    return " ".join(f"{t} ({vocab[t]})" if 0 <= t < len(vocab) else str(t) for t in ids)


def runner_paths_table(rows: Mapping[str, Mapping[str, object]], vocab: Sequence[str]):
    """:func:`specfix.lab.placeholder_lifecycle.runner_paths` as a table: one row per runner and switch, the
    draft slots' ids at each stage (with their words), what the step emitted, or the error it raised."""
    import pandas as pd

    table = {}
    for name, row in rows.items():
        if row["error"]:
            table[name] = {"scheduler sends": "", "embedding reads": row["error"], "verification sees": "",
                           "step emits": "", "placeholders accepted": ""}
            continue
        table[name] = {"scheduler sends": str(row["scheduler sends"]),
                       "embedding reads": _words(row["embedding reads"], vocab),
                       "verification sees": _words(row["verification sees"], vocab),
                       "step emits": _words(row["emitted"], vocab),
                       "placeholders accepted": row["placeholders accepted"]}
    return pd.DataFrame(table).T


def runner_paths_text(rows: Mapping[str, Mapping[str, object]], vocab: Sequence[str]) -> str:
    """What the runner-paths table shows, in sentences built from its values (Markdown)."""
    v1, v1_off, v2, v2_off = rows.values()
    cached, k = v2["cached tokens"], len(v2["scheduler sends"])
    same = (v2["emitted"], v2["placeholders accepted"]) == (v1["emitted"], v1["placeholders accepted"])
    return (
        f"The repeat found {cached} of its {cached + 1} tokens in the prefix cache, so it started decoding "
        f"with one token left and the scheduler padded it with `{v2['scheduler sends']}`, on either runner. "
        f"The V1 runner's embedding read `{v1['embedding reads']}` (the clamp's zeros) while verification "
        f"saw `{v1['verification sees']}`; without the clamp the step raised `{v1_off['error']}`. "
        "Model Runner V2 never copies the scheduler's ids: its embedding read "
        f"`{v2['embedding reads']}` from the request's zeroed draft row, with no clamp anywhere, and "
        f"`gather_draft_sampled` turned them back into `{v2['verification sees']}` before verification, so "
        f"the step emitted {_words(v2['emitted'], vocab)} and accepted {v2['placeholders accepted']} "
        "placeholder slots"
        + (", as the V1 runner did. " if same
           else f"; the V1 runner emitted {_words(v1['emitted'], vocab)}. ")
        + f"Without that marking, verification saw `{v2_off['verification sees']}`: "
        f"{v2_off['placeholders accepted']} of the {k} zero slots passed as a draft of {vocab[0]!r} and the "
        f"step emitted {_words(v2_off['emitted'], vocab)}."
    )


def sources_table(counts: Mapping[str, Mapping[str, int]]):
    """:func:`specfix.lab.placeholder_lifecycle.placeholder_sources` as a table, with the -1 slots' share."""
    import pandas as pd

    table = pd.DataFrame(counts).T
    table["share of -1"] = [_rate(row["-1 slots"], row["draft slots"]) for _, row in table.iterrows()]
    return table


def sources_text(counts: Mapping[str, Mapping[str, int]]) -> str:
    """What the deployments table shows, one sentence per deployment, from its values (Markdown)."""
    parts = []
    for name, row in counts.items():
        pads, slots = row["-1 slots"], row["draft slots"]
        share = "none" if pads == 0 else "all" if pads == slots else f"{pads} of {slots}"
        parts.append(f"*{name}*: {share} of its draft slots left the scheduler as `-1`.")
    return " ".join(parts)
