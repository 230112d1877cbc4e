"""Chapter 1's figures, tables and paragraphs on the ``-1`` placeholder's life through one engine step.

A grid cell is a token id over its word, coloured by its kind (:data:`_KIND_LABELS`). Figures come back
closed in pyplot, so a notebook shows each once, as the cell's value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specfix.figures import style
from specfix.lab.placeholder_lifecycle import verifications
from specfix.v1.engine import GenerateResult
from specfix.v1.model_runner import StepTrace
from specfix.v1.scheduler import SpecDecodingStats

ORDINARY, PLACEHOLDER, WAS_PLACEHOLDER, UNUSED, PADDING, OVERWRITTEN = range(6)
_FILL, _KIND_LABELS = zip(
    ("#eeeeee", "token id"),
    (style.PLACEHOLDER, "-1 (PLACEHOLDER_TOKEN_ID)"),
    (style.light(style.FIXED), "was -1, clamped to 0"),
    ("#ffffff", "unused"),
    (style.light(style.PADDING, 0.65), "CUDA-graph padding"),
    (style.light(style.FIXED, 0.55), "real draft written over a -1"),
    strict=True,
)


def token_grids(panels, vocab: Sequence[str], height: float, caption: str, cols=None, rows=None) -> Figure:
    """Token grids, one per ``(ids, kinds, title)`` panel, with the kinds' key and a caption; closed."""
    with style.figure(caption, height, len(panels), 1, squeeze=False, close=True) as (fig, axes):
        shown = set()
        for ax, (ids, kinds, title) in zip(axes[:, 0], panels, strict=True):
            ids, kinds = np.atleast_2d(ids), np.atleast_2d(kinds)
            texts = [[f"{t}\n{vocab[t] if 0 <= t < len(vocab) else ''}" for t in row] for row in ids]
            style.cells(ax, kinds, _FILL, np.where(kinds == UNUSED, "", texts), cols, rows)
            ax.set_title(title, loc="left", fontsize=9)
            shown |= set(np.unique(kinds).tolist())
        key = style.patches([_FILL[k] for k in sorted(shown)], [_KIND_LABELS[k] for k in sorted(shown)])
        tight = dict(fontsize=style.SMALLEST_PT, columnspacing=1.2, handlelength=1.5)
        style.legend_below(fig, ncol=3, handles=key, **tight)
    return fig


def _filled_lengths(step: StepTrace) -> list[int]:
    """Cells of ``token_ids_cpu`` in use per request after this step's update: prompt, outputs and drafts."""
    out = step.scheduler_output
    start = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    start.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    prompt = {new.req_id: len(new.prompt_token_ids) for new in out.scheduled_new_reqs}
    scheduled = zip(step.req_ids, step.num_scheduled_tokens, strict=True)
    return [max(prompt.get(r, 0), start[r] + n) for r, n in scheduled]


def token_table(step: StepTrace, vocab: Sequence[str], rows: Sequence[int] | None = None, width: int = 10):
    """``InputBatch.token_ids_cpu`` after ``update_req_spec_token_ids``, ``rows`` its requests' rows."""
    rows = list(range(len(step.req_ids))) if rows is None else list(rows)
    if len(rows) != len(step.req_ids):
        raise ValueError(f"rows has {len(rows)} entries for {len(step.req_ids)} requests")
    table = step.token_ids_cpu[rows, :width]
    kinds = np.where(table == -1, PLACEHOLDER, ORDINARY)
    kinds[np.arange(width)[None, :] >= np.array(_filled_lengths(step))[:, None]] = UNUSED
    title = f"InputBatch.token_ids_cpu, first {width} positions, after update_req_spec_token_ids"
    caption = (
        "The scheduler's drafts, -1 included, are written right after each request's committed tokens: "
        "the -1 is still only a value in a CPU table."
    )
    fig = token_grids([(table, kinds, title)], vocab, 0.6 + 0.55 * len(rows), caption, rows=step.req_ids)
    fig.axes[0].set_xlabel("position in the request")
    return fig


def draft_positions(step: StepTrace) -> np.ndarray:
    """Where in ``input_ids`` each entry of ``draft_token_ids`` was gathered from."""
    md = step.spec_decode_metadata
    return md.logits_indices.cpu()[md.target_logits_indices.cpu().long() + 1].long().numpy()


def step_stages(step: StepTrace, vocab: Sequence[str]) -> Figure:
    """One step's ``input_ids``, ``draft_token_ids`` at their positions, and what the embedding reads."""
    if step.spec_decode_metadata is None:
        raise ValueError("step has no SpecDecodeMetadata: pick a step that verifies drafts")
    before = step.input_ids_before_clamp.numpy()
    labels = np.repeat(step.req_ids, step.num_scheduled_tokens).tolist()
    labels += ["pad"] * (len(before) - len(labels))
    padding = np.arange(len(before)) >= sum(step.num_scheduled_tokens)
    positions = draft_positions(step)
    drafts = np.zeros(len(before), dtype=np.int64)
    drafts[positions] = step.spec_decode_metadata.draft_token_ids.cpu().numpy()
    kinds_drafts = np.full(len(before), UNUSED)
    kinds_drafts[positions] = np.where(drafts[positions] == -1, PLACEHOLDER, ORDINARY)
    was = np.where(padding, PADDING, np.where(before == -1, WAS_PLACEHOLDER, ORDINARY))
    copy = "SpecDecodeMetadata.draft_token_ids (a copy made before the clamp), at its positions"
    panels = [
        (before, np.where(was == WAS_PLACEHOLDER, PLACEHOLDER, was), "input_ids after _prepare_inputs"),
        (drafts, kinds_drafts, copy),
        (step.embedding_input.numpy(), was, "input_ids after _preprocess: what nn.Embedding receives"),
    ]
    caption = (
        "Follow the orange -1 down: the metadata copy keeps it, the embedding's input has it clamped to 0 "
        "(green). Column labels name the request each token belongs to."
    )
    return token_grids(panels, vocab, 3.9, caption, cols=labels)


def sampler_output(step: StepTrace, vocab: Sequence[str]) -> Figure:
    """The rejection sampler's output matrix ``[B, max_spec_len + 1]`` of one step."""
    out = step.sampler_output.numpy()
    panel = (out, np.where(out == -1, PLACEHOLDER, ORDINARY), "RejectionSampler output [B, max_spec_len + 1]")
    caption = (
        "Each row holds the tokens its request produced, left to right, then -1. A request with k drafts has "
        "its bonus column at k: column 0 for one without drafts."
    )
    cols = [f"column {j}" for j in range(out.shape[1])]
    return token_grids([panel], vocab, 0.7 + 0.45 * out.shape[0], caption, cols=cols, rows=step.req_ids)


def acceptance(stats: Mapping[str, SpecDecodingStats]) -> Figure:
    """Acceptance rate per draft position and the distribution of acceptance lengths, one bar per run."""
    if not stats:
        raise ValueError("stats is empty: pass at least one run's SpecDecodingStats")
    k = max(s.num_spec_tokens for s in stats.values())
    lengths = [np.bincount(s.acceptance_lengths, minlength=k + 2)[1:] for s in stats.values()]
    caption = (
        "Left: each later draft is accepted less often, because it is only verified when every draft "
        "before it was accepted. Right: how many tokens one target pass yields."
    )
    with style.figure(caption, 3.4, 1, 2, close=True) as (fig, (ax1, ax2)):
        # plain series colours: green and magenta mean fixed and buggy everywhere in the book
        colours = style.SERIES[: len(stats)]
        style.grouped_bars(
            ax1,
            np.arange(k),
            [(n, s.acceptance_rate_per_pos, c) for (n, s), c in zip(stats.items(), colours, strict=True)],
        )
        style.grouped_bars(
            ax2,
            np.arange(1, k + 2),
            [(None, n / max(n.sum(), 1), c) for n, c in zip(lengths, colours, strict=True)],
        )
        ax1.set(xticks=range(k), xticklabels=[f"draft {j + 1}" for j in range(k)], ylim=(0, 1))
        ax1.set(ylabel="accepted / drafted", title="acceptance rate per position")
        ax2.set(xticks=range(1, k + 2), xlabel="tokens per target pass (1 + accepted)", ylabel="fraction")
        ax2.set_title("acceptance length")
        top = dict(loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=len(stats))
        fig.legend(*ax1.get_legend_handles_labels(), **top)
        fig.subplots_adjust(top=0.78, wspace=0.3)
    return fig


def _rate(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, 3) if denominator else math.nan


def design_table(designs: Mapping[str, GenerateResult | BaseException], plain: GenerateResult):
    """A row per placeholder design (an exception: its crash), slots and drafts counted apart."""
    rows = []
    for name, result in designs.items():
        if isinstance(result, BaseException):
            rows.append({"design": name, "outcome": f"crash: {type(result).__name__}"})
            continue
        found = verifications(result)
        drafts, pads = sum(len(v.drafts) for v in found), [t for v in found for t in v.placeholders]
        slots = drafts + len(pads)
        accepted_pads = sum(v.accepted_placeholders for v in found)
        accepted = sum(v.accepted_drafts for v in found)
        same = all(a.token_ids == b.token_ids for a, b in zip(result.outputs, plain.outputs, strict=True))
        rows.append(
            {
                "design": name,
                "outcome": "ran",
                "slots verified": slots,
                "placeholder slots": len(pads),
                "placeholders recognisable by id (< 0)": sum(t < 0 for t in pads),
                "real drafts": drafts,
                "placeholder slots accepted": accepted_pads,
                "real drafts accepted": accepted,
                "rate over all slots": _rate(accepted + accepted_pads, slots),
                "rate over real drafts": _rate(accepted, drafts),
                "text == plain greedy": same,
            }
        )
    return pd.DataFrame(rows).set_index("design")  # a crash makes the counts floats: tidy prints them whole


def comparison_table(summary: Mapping[str, Mapping[str, int]], name_a: str, name_b: str, word: str):
    """:func:`specfix.lab.placeholder_lifecycle.compare_runs`'s groups as a table, the runs named."""
    index = {
        "both": "verified by both runs",
        "only a": f"only by the {name_a} run",
        "only b": f"only by the {name_b} run",
    }
    rows = {
        index[group]: {
            "verifications": g["verifications"],
            "real drafts": g["drafts"],
            f"accepted ({name_a} run)": g["accepted in a"],
            f"accepted ({name_b} run)": g["accepted in b"],
            f"right after {word!r}": g["after token_id"],
        }
        for group, g in summary.items()
    }
    return pd.DataFrame(rows).T


def _words(ids: Sequence[int], vocab: Sequence[str]) -> str:
    return " ".join(f"{t} ({vocab[t]})" if 0 <= t < len(vocab) else str(t) for t in ids)


def runner_paths_table(rows: Mapping[str, Mapping[str, object]], vocab: Sequence[str]):
    """A row per runner and switch: the draft slots' ids at each stage, or the error in the embedding's column
    ("not reached" after it; "—": a step that raised leaves no trace, so its scheduler's ids are unknown)."""
    columns = (
        "scheduler sends",
        "embedding reads",
        "verification sees",
        "step emits",
        "placeholders accepted",
    )
    table = {}
    for name, row in rows.items():
        if row["error"]:  # the error stands where the embedding would have read the ids
            table[name] = {**dict.fromkeys(columns, "not reached"), "scheduler sends": "—"}
            table[name]["embedding reads"] = row["error"]
            continue
        ids = [_words(row[stage], vocab) for stage in ("embedding reads", "verification sees", "emitted")]
        values = [str(row["scheduler sends"]), *ids, row["placeholders accepted"]]
        table[name] = dict(zip(columns, values, strict=True))
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
        f"saw `{v1['verification sees']}`; without the clamp the step raised `{v1_off['error']}` at the "
        "embedding, so nothing after it ran and the failed step left no record (its row's — and "
        "*not reached*). "
        "Model Runner V2 never copies the scheduler's ids: its embedding read "
        f"`{v2['embedding reads']}` from the request's zeroed draft row, with no clamp anywhere, and "
        f"`gather_draft_sampled` turned them back into `{v2['verification sees']}` before verification, so "
        f"the step emitted {_words(v2['emitted'], vocab)} and accepted {v2['placeholders accepted']} "
        "placeholder slots"
        + (
            ", as the V1 runner did. "
            if same
            else f"; the V1 runner emitted {_words(v1['emitted'], vocab)}. "
        )
        + f"Without that marking, verification saw `{v2_off['verification sees']}`: "
        f"{v2_off['placeholders accepted']} of the {k} zero slots passed as a draft of {vocab[0]!r} and the "
        f"step emitted {_words(v2_off['emitted'], vocab)}."
    )


def sources_table(counts: Mapping[str, Mapping[str, int]]):
    """:func:`specfix.lab.placeholder_lifecycle.placeholder_sources` as a table, with the -1 slots' share."""
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


# --- the sentences that read chapter 1's steps and tables, built from their values (Markdown) ------------


def drafts_written_text(step: StepTrace, input_batch, req_id: str = "pd") -> str:
    """Where ``update_req_spec_token_ids`` wrote request `req_id`'s drafts in ``token_ids_cpu``."""
    where = np.flatnonzero(step.token_ids_cpu[input_batch.req_id_to_index[req_id]] == -1)
    if not len(where):
        raise ValueError(f"row {req_id!r} of token_ids_cpu holds no -1 in this step")
    return (
        f"`update_req_spec_token_ids` wrote the drafts **verbatim** right after the committed "
        f'tokens (positions {where[0]} to {where[-1]} of row `"{req_id}"`). `num_tokens_no_spec` did '
        "not move, because drafts are tentative: the next step overwrites whatever was not accepted."
    )


def padding_text(step: StepTrace, capture_sizes: Sequence[int]) -> str:
    """How many tokens the step schedules and how far ``_prepare_inputs`` pads them."""
    num_scheduled, num_input = sum(step.num_scheduled_tokens), len(step.input_ids_before_clamp)
    sizes = ", ".join(map(str, capture_sizes[:6]))
    if num_input == num_scheduled:
        padding = f"{num_scheduled} is already one of them, so this step runs without padding"
    else:
        padding = (
            f"so the step runs as {num_input} tokens: its {num_input - num_scheduled} padded slots "
            "hold stale ids from earlier steps and write nothing to the KV cache"
        )
    order = ", then ".join(f'`"{r}"`\'s' for r in step.req_ids)
    return (
        f"This step schedules {num_scheduled} tokens ({order}). `_prepare_inputs` pads "
        f"`num_input_tokens` up to the next CUDA-graph capture size ({sizes}, ...); {padding}."
    )


def rollback_text(step: StepTrace, request, req_id: str = "pd") -> str:
    """How ``update_from_output`` rolled `req_id`'s ``num_computed_tokens`` back after the step."""
    so = step.scheduler_output
    start = next(new.num_computed_tokens for new in so.scheduled_new_reqs if new.req_id == req_id)
    k = len(so.scheduled_spec_decode_tokens[req_id])
    accepted = len(step.sampled_token_ids[step.req_ids.index(req_id)]) - 1
    return (
        f'`"{req_id}"` was scheduled from position {start} with 1 + {k} tokens and accepted {accepted} '
        f"drafts, so `update_from_output` rolled `num_computed_tokens` back to "
        f"{request.num_computed_tokens} (its {request.num_tokens} tokens, minus the newest, whose KV is "
        "computed next step)."
    )


_ZERO, _CLAMP = "(b) zero in the scheduler", "(c) clamp in _preprocess"


def counting_text(table) -> str:
    """What :func:`design_table` counts, and the two acceptance rates of designs (b) and (c)."""
    b, c = table.loc[_ZERO], table.loc[_CLAMP]
    counts = ("placeholders recognisable by id (< 0)", "placeholder slots", "placeholder slots accepted")
    b, c = ({**row, **{k: int(row[k]) for k in counts}} for row in (b, c))  # 24, not 24.0, whatever the dtype
    neg, accepted = counts[0], b["placeholder slots accepted"]
    return f"""
**What is counted.** A *slot* is one entry of `scheduled_spec_decode_tokens`; a *real draft* is a token the
drafter proposed; the other slots are placeholders. Under (c) every placeholder is recognisable by its id
({c[neg]} of {c["placeholder slots"]} are negative), so any stage that sees the ids can leave them out. Under
(b) none is ({b[neg]} of {b["placeholder slots"]}): a zeroed slot is a draft of "the", and
{accepted} of them {"was" if accepted == 1 else "were"} accepted as such.

* **Rate over all slots** counts every slot as a draft, which is all a stage that sees only zeros can do:
  {b["rate over all slots"]} for (b), {c["rate over all slots"]} for (c). Padding drags it down.
* **Rate over real drafts** is what specfix's `SpecDecodingStats` reports: {b["rate over real drafts"]} for
  (b), {c["rate over real drafts"]} for (c). It knows which slots are padding from
  `num_placeholder_spec_tokens`, a field of specfix's `SchedulerOutput` that vLLM does not have (vLLM's
  nearest is `num_invalid_spec_tokens`, which keeps grammar-invalid slots out of its acceptance counts).
  Under (b) nothing in the ids could tell them apart.
"""


def placeholder_origin_text(result: GenerateResult, k: int) -> str:
    """Where a run's placeholder slots sit, and why short draft lists hold no ``-1``."""
    found = verifications(result)
    n_requests = len(result.outputs)
    first = {v.req_id: min(w.position for w in found if w.req_id == v.req_id) for v in found}
    pads = sum(v.num_placeholders for v in found)
    at_first = sum(v.num_placeholders for v in found if v.position == first[v.req_id])
    where = f"All {pads} sit" if at_first == pads else f"{at_first} sit ({pads - at_first} elsewhere)"
    each = f" ({k} each, padded as vLLM pads them)" if at_first == n_requests * k else ""
    short = sum(0 < len(v.drafts) < k for v in found)
    bare = sum(
        n == 1 and r not in s.scheduler_output.scheduled_spec_decode_tokens
        for s in result.trace
        for r, n in s.scheduler_output.num_scheduled_tokens.items()
    )
    return (
        f"Where do (c)'s {pads} placeholder slots come from? {where} in the first decodes of the "
        f"{n_requests} prefilled requests{each}. The n-gram drafter proposed fewer than {k} tokens in "
        f"{style.counted(short, 'later verification')}, and {style.counted(bare, 'decode step')} had no "
        "drafts at all; there the scheduler scheduled only the drafts it had, as vLLM's synchronous "
        "scheduler does, so the missing slots do not exist rather than hold a `-1`."
    )


def zeroing_text(compared: Mapping[str, Mapping[str, int]], table) -> str:
    """What :func:`comparison_table` shows: shared verifications judged alike, and where the runs part."""
    both, only_zero, only_clamp = compared["both"], compared["only a"], compared["only b"]
    b, c = table.loc[_ZERO], table.loc[_CLAMP]
    apart = only_zero["verifications"] + only_clamp["verifications"]
    where = (
        "Every verification with real drafts sat at the same request and position in both runs, so the "
        "two rates over real drafts agree"
        if apart == 0
        else f"The runs verified at different places {apart} times ({only_clamp['verifications']} only the "
        f"clamp run, {only_zero['verifications']} only the zero run): an accepted zero slot carries the "
        "zero run one token further within a step, so from there on the drafter is consulted at other "
        "positions, and only these verifications can make the two rates over real drafts differ"
    )
    return (
        f"Where both runs verified the same request at the same position ({both['verifications']} "
        f"verifications, {both['drafts']} real drafts), the drafter proposed the same tokens and both "
        f"runs accepted exactly as many: {both['accepted in a']} and {both['accepted in b']}. "
        f"**Zeroing does not change how a draft is judged.** {where} "
        f"({b['rate over real drafts']} for (b), {c['rate over real drafts']} for (c))."
    )


def negative_drafts_text(off: Mapping[str, int], on: Mapping[str, int]) -> str:
    """Sampler rows holding an accepted ``-1`` with ``reject_negative_drafts`` off and on."""
    return (
        f"With the check off, {off['rows with an accepted -1']} sampler rows hold a `-1` *inside* "
        "their accepted prefix: `parse_output` silently drops it, and the tokens after it were verified "
        f"against a context that never existed. With the check on, {on['rows with an accepted -1']} "
        "do. (The property tests in `tests/test_properties.py` check, over random schedules, that with "
        "every fix on no negative id reaches the embedding, no `-1` reaches an output, and greedy "
        "speculative decoding equals plain greedy decoding.)"
    )


def acceptance_text(stats: Mapping[str, SpecDecodingStats], expected: tuple[float, float]) -> str:
    """The runs' acceptance rates beside the range the chapter asserts."""
    rates = ", ".join(f"{s.acceptance_rate:.0%} ({name})" for name, s in stats.items())
    return (
        f"Our tiny pair accepts {rates}, inside the range {expected[0]:.0%} to {expected[1]:.0%} "
        "asserted above. Acceptance falls with the draft position, as it must: draft 2 is only verified "
        "if draft 1 was accepted."
    )
