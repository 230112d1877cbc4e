"""Chapter 1's figures and paragraphs for the two scheduling modes, synchronous and asynchronous, read from
:mod:`specfix.lab.scheduling`'s runs. Orange is a ``-1`` that reaches the embedding (only the clamp keeps it
from crashing there), green a ``-1`` the runner overwrote with a real draft. Figures come back closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specfix.figures import placeholder_lifecycle as lifecycle
from specfix.figures import style
from specfix.lab import scheduling as lab
from specfix.lab.placeholder_lifecycle import check_recorded
from specfix.v1.engine import GenerateResult
from specfix.v1.model_runner import StepTrace

#: One fill per entry of :data:`specfix.lab.scheduling.SLOT_KINDS`.
KIND_FILLS = (
    "#ffffff",
    "#e6e6e6",
    style.light(style.NEUTRAL, 0.55),
    style.light(style.FIXED, 0.55),
    style.PLACEHOLDER,
)


def _require_traces(runs: Mapping[str, GenerateResult]) -> None:
    if not runs:
        raise ValueError("runs is empty: pass at least one recorded run")
    for name, result in runs.items():
        check_recorded(result, name=f"runs[{name!r}]")


def slot_timeline(runs: Mapping[str, GenerateResult]) -> Figure:
    """A panel per run: what each request's draft slots held at each step (:data:`SLOT_KINDS`)."""
    _require_traces(runs)
    width = max(len(r.trace) for r in runs.values())
    height = 1.0 + 0.42 * sum(len(r.outputs) for r in runs.values()) + 0.5 * len(runs)
    caption = (
        "Each number is a request's draft slots in that step. Orange: a -1 the embedding reads, which "
        "only the clamp makes safe; green: a -1 the runner overwrote with the drafter's previous "
        "proposals before the forward."
    )
    inches = min(1.6 + 0.55 * width, style.WIDTH_IN)
    with style.figure(caption, height, len(runs), 1, width=inches, squeeze=False, close=True) as (fig, axes):
        for ax, (name, result) in zip(axes[:, 0], runs.items(), strict=True):
            kinds = lab.slot_kinds(result)
            grid = np.zeros((len(kinds), width), dtype=int)  # a step past the run's end: kind 0
            texts = np.full((len(kinds), width), "", dtype=object)
            for row, (req_id, values) in enumerate(kinds.items()):
                grid[row, : len(values)] = values
                for step, trace in enumerate(result.trace):
                    spec = trace.scheduler_output.scheduled_spec_decode_tokens
                    texts[row, step] = str(len(spec[req_id])) if req_id in spec else ""
            style.cells(ax, grid, KIND_FILLS, texts, ylabels=[f"request {r}" for r in kinds])
            ax.set(xlabel="engine step")
            ax.set_title(name, loc="left")
        style.legend_below(fig, handles=style.patches(KIND_FILLS, lab.SLOT_KINDS))
    return fig


def placeholder_table(runs: Mapping[str, GenerateResult]):
    """A row per run of :func:`specfix.lab.scheduling.placeholder_counts`."""
    _require_traces(runs)
    return pd.DataFrame({name: lab.placeholder_counts(result) for name, result in runs.items()}).T


_STAGES = (
    "SchedulerOutput.scheduled_spec_decode_tokens\n(= token_ids_cpu, verbatim)",
    "input_ids on the device,\nafter _prepare_input_ids",
    "input_ids after _preprocess:\nwhat nn.Embedding reads",
)


def follow_placeholder(
    step: StepTrace, req_id: str, vocab: Sequence[str], step_index: int | None = None
) -> Figure:
    """One request's draft slots in one step (``step_index`` in its run, if given), from the scheduler to the
    embedding; the title says what became of its ``-1``, so that two steps' figures tell themselves apart."""
    spec = step.scheduler_output.scheduled_spec_decode_tokens
    if req_id not in spec:  # the scheduler gives draft slots to scheduled requests only
        raise ValueError(f"request {req_id!r} has no draft slots in this step")
    sent = np.array(spec[req_id])
    end = int(np.cumsum(step.num_scheduled_tokens)[step.req_ids.index(req_id)])
    device = step.input_ids_before_clamp[end - len(sent) : end].numpy()
    embedded = step.embedding_input[end - len(sent) : end].numpy()
    ids = np.stack([sent, device, embedded])
    filled = (sent == -1) & (device != -1)  # the runner wrote a draft over the -1
    kinds = np.where(ids == -1, lifecycle.PLACEHOLDER, lifecycle.ORDINARY)
    kinds[1:, filled] = lifecycle.OVERWRITTEN
    kinds[2, (device == -1) & (embedded != -1)] = lifecycle.WAS_PLACEHOLDER
    caption = (
        "The scheduler's -1 reaches the device as it is; it becomes a real draft only where the runner "
        "has proposals for the request from the step before, and is otherwise clamped to 0 for the embedding."
    )
    counts = {"filled with real drafts": filled.sum(), "left for the embedding": (device == -1).sum()}
    fates = [f"{style.counted(int(n), '-1 slot')} {fate}" for fate, n in counts.items() if n]
    at = "one step" if step_index is None else f"engine step {step_index}"
    panel = (ids, kinds, f"request {req_id} in {at}: " + (", ".join(fates) or "no -1"))
    slots = [f"draft slot {j + 1}" for j in range(len(sent))]
    return lifecycle.token_grids([panel], vocab, 2.6, caption, slots, _STAGES)


# --- the sentences that read the figures and tables above, built from the runs (Markdown) ---------------
# `runs` maps (workload name, "sync" or "async") to a recorded run of specfix.lab.scheduling.run.


def workloads_text(runs: Mapping[tuple[str, str], GenerateResult]) -> str:
    """The two workloads, one bullet each, and whether both modes wrote the same text on them."""
    tokens = {key: [out.token_ids for out in result.outputs] for key, result in runs.items()}
    same = all(tokens[name, "sync"] == tokens[name, "async"] for name in lab.WORKLOADS)
    return (
        "\n".join(f"* **{name}**: {w.description}." for name, w in lab.WORKLOADS.items())
        + f"\n\nBoth modes write {'the same' if same else 'different'} text on both workloads."
    )


def decode_node_text(runs: Mapping[tuple[str, str], GenerateResult]) -> str:
    """Where the decode node's ``-1`` slots went, in each mode."""
    s, a = (lab.placeholder_counts(runs["decode node", mode]) for mode in ("sync", "async"))
    every = ""
    if a["-1 written by the scheduler"] == a["draft slots verified"]:
        every = " (one for every draft slot of the run)"
    return (
        f"Synchronous: the scheduler wrote {s['-1 written by the scheduler']} `-1` slots, in the first "
        f"decode of the prefilled requests, and {s['-1 reaching the embedding']} reached the embedding; "
        "every other draft slot held a real draft that the scheduler had from `update_draft_token_ids`. "
        f"Async: the scheduler wrote {a['-1 written by the scheduler']} `-1` slots{every}; the runner "
        f"overwrote {a['-1 overwritten by the runner']} of them with real drafts before the forward, and "
        f"{a['-1 reaching the embedding']} reached the embedding: the prefilled requests' first decode "
        "again, because the runner had no proposals for requests it had never run."
    )


def waiting_request(result: GenerateResult) -> tuple[str, int]:
    """The first request whose ``-1`` reaches the embedding, and the (0-based) step where it does."""
    kinds = lab.slot_kinds(result)
    waiting = next((req for req, row in kinds.items() if lab.REACHES_EMBEDDING in row), None)
    if waiting is None:
        raise ValueError("no request's -1 reaches the embedding in this run")
    return waiting, kinds[waiting].index(lab.REACHES_EMBEDDING)


def waiting_text(result: GenerateResult) -> str:
    """The request the async run leaves out while the budget is tight, and what it gets when it returns."""
    waiting, back = waiting_request(result)
    row = lab.slot_kinds(result)[waiting]
    last = max(i for i, kind in enumerate(row[:back]) if kind != lab.NOT_SCHEDULED)
    step = result.trace[back]
    k = len(step.scheduler_output.scheduled_spec_decode_tokens[waiting])
    accepted = len(step.sampled_token_ids[step.req_ids.index(waiting)]) - 1
    return (
        f"In the async run, request {waiting} sits out steps {last + 1} to {back - 1}. Synchronous "
        "scheduling keeps a waiting request's drafts on the request (`update_draft_token_ids` stored them "
        "there) and sends them when it returns. Async scheduling sends the placeholders it gave the request "
        f"when it last ran, and at step {back} the runner has no proposals for it: the drafter's last step "
        f"did not include it. Its {k} `-1` reach the embedding, clamped to token 0 there, and the rejection "
        f"sampler accepts {accepted} of them. Its draft slots in that step and in the next, stage by stage:"
    )


def budget_text(runs: Mapping[tuple[str, str], GenerateResult]) -> str:
    """What the tight budget costs async scheduling: batches, slots, and steps run for finished requests."""
    s, a = (lab.placeholder_counts(runs["tight budget", mode]) for mode in ("sync", "async"))
    return (
        f"With the tight budget, async scheduling ran {a['batches']} batches where synchronous scheduling "
        f"ran {s['batches']}, and verified {a['draft slots verified']} draft slots against "
        f"{s['draft slots verified']}. It ran a request that had already produced all its tokens "
        f"{lab.wasted_steps(runs['tight budget', 'async'])} times: it plans a step before it knows whether "
        "the step in flight finishes the request, and skips the request only when even a step that rejects "
        "every draft would reach `max_tokens` (vLLM's check in `Scheduler.schedule`). The output of such a "
        "step is dropped. The waiting request's placeholder step also emits fewer tokens than a step with "
        "real drafts may."
    )


def crashes_text(crashes, runs: Mapping[tuple[str, str], GenerateResult]) -> str:
    """Where each workload crashes without the clamp, and why only there."""

    def said(name, mode):
        at = crashes.loc[name, mode]
        return "finishes" if pd.isna(at) else f"crashes at step {int(at)}"

    counts = [lab.placeholder_counts(result) for (_, mode), result in runs.items() if mode == "async"]
    rest = ""
    if all(
        c["-1 written by the scheduler"] == c["-1 overwritten by the runner"] + c["-1 reaching the embedding"]
        for c in counts
    ):
        rest = (
            "Every other `-1` of these async runs was overwritten before the forward (in the table above, "
            "written = overwritten + reaching the embedding), so without the clamp async scheduling crashes "
            "only where a request meets the runner without proposals from the step before."
        )
    node = f"synchronous scheduling {said('decode node', 'sync')} and async scheduling "
    node += said("decode node", "async")
    if crashes.loc["decode node", "sync"] == crashes.loc["decode node", "async"]:
        node = f"both modes crash at step {int(crashes.loc['decode node', 'sync'])}"
    return (
        f"On the decode node {node}: the prefilled requests' first decode, the path a P/D decode node "
        f"takes. With the tight budget, synchronous scheduling {said('tight budget', 'sync')}, having "
        f"written no `-1`; async scheduling {said('tight budget', 'async')}, where the waiting request "
        f"returns with placeholders the runner cannot fill. {rest}"
    )
