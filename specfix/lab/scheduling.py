"""Chapter 1's scheduling experiments: one workload, synchronous and async, and how far a ``-1`` gets.

Read :data:`WORKLOADS` (a P/D decode node, and a budget that makes a third request wait) and :func:`run`
first; :func:`slot_kinds`, :func:`placeholder_counts` and :func:`wasted_steps` read its recording: what each
request's draft slots held when the embedding read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfix.fixes import Fixes
from specfix.lab.placeholder_lifecycle import check_recorded, draft_slots
from specfix.v1.engine import DEMO_PROMPTS, GenerateResult, LLMEngine, SamplingParams, generate
from specfix.v1.model_runner import StepTrace


@dataclass(frozen=True)
class Workload:
    """Prompts, which of them arrive prefilled (P/D), and the scheduler's token budget per step."""

    prompts: tuple[str, ...]
    remote_prefill: tuple[bool, ...]
    max_num_batched_tokens: int
    description: str  # the fields, in one line for the chapter


WORKLOADS = {
    "decode node": Workload(
        DEMO_PROMPTS,
        (True, False, True, False),
        256,
        "4 requests; requests 0 and 2 arrive with their prompts prefilled elsewhere (P/D); "
        "a token budget of 256 tokens per step",
    ),
    "tight budget": Workload(
        ("the fox saw the crow", "a lion was asleep", "the north wind"),
        (False,) * 3,
        8,
        "3 requests; no request arrives prefilled; a token budget of 8 tokens per step",
    ),
}

#: What a request's draft slots held in one engine step, as :func:`slot_kinds` reports it.
SLOT_KINDS = (
    "not scheduled",
    "no draft slots",
    "drafts from the scheduler",
    "-1 overwritten by the runner",
    "-1 reaches the embedding",
)
NOT_SCHEDULED, NO_SLOTS, SCHEDULER_DRAFTS, FILLED, REACHES_EMBEDDING = range(len(SLOT_KINDS))


def _workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {name!r}")
    return WORKLOADS[name]


def run(
    name: str,
    async_scheduling: bool,
    *,
    k: int = 3,
    max_tokens: int = 12,
    device: torch.device | str = "cpu",
) -> GenerateResult:
    """The workload ``name`` decoded greedily with the draft model, recorded step by step."""
    w = _workload(name)
    return generate(
        list(w.prompts),
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        num_speculative_tokens=k,
        remote_prefill=list(w.remote_prefill),
        max_num_batched_tokens=w.max_num_batched_tokens,
        async_scheduling=async_scheduling,
        device=device,
        record=True,
    )


def _kind(step: StepTrace, req_id: str, slots: dict[str, list[int]]) -> int:
    if req_id not in step.req_ids:
        return NOT_SCHEDULED
    if req_id not in slots:
        return NO_SLOTS
    if -1 in slots[req_id]:
        return REACHES_EMBEDDING
    return FILLED if step.num_filled_spec_tokens.get(req_id, 0) else SCHEDULER_DRAFTS


def slot_kinds(result: GenerateResult) -> dict[str, list[int]]:
    """Per request, per recorded step: an index into :data:`SLOT_KINDS`."""
    check_recorded(result)
    slots = [draft_slots(step, step.input_ids_before_clamp) for step in result.trace]  # as embedded
    return {
        out.request_id: [_kind(step, out.request_id, s) for step, s in zip(result.trace, slots, strict=True)]
        for out in result.outputs
    }


def placeholder_counts(result: GenerateResult) -> dict[str, int]:
    """Batches run, draft slots verified, and what became of the ``-1`` slots the scheduler wrote."""
    check_recorded(result)
    written = filled = reaching = slots = 0
    for step in result.trace:
        placeholders = step.scheduler_output.num_placeholder_spec_tokens
        for req_id, ids in draft_slots(step, step.input_ids_before_clamp).items():
            slots += len(ids)
            written += placeholders.get(req_id, 0)
            filled += step.num_filled_spec_tokens.get(req_id, 0)
            reaching += ids.count(-1)
    return {
        "batches": len(result.trace),
        "draft slots verified": slots,
        "-1 written by the scheduler": written,
        "-1 overwritten by the runner": filled,
        "-1 reaching the embedding": reaching,
    }


def wasted_steps(result: GenerateResult) -> int:
    """(request, step) pairs async scheduling planned after the request had all its tokens."""
    check_recorded(result)
    left = {out.request_id: len(out.token_ids) for out in result.outputs}
    wasted = 0
    for step in result.trace:
        for req_id, sampled in zip(step.req_ids, step.sampled_token_ids, strict=True):
            wasted += left[req_id] <= 0
            left[req_id] -= len(sampled)
    return wasted


def first_crash(name: str, async_scheduling: bool, *, k: int = 3, max_tokens: int = 12) -> int | None:
    """The engine step whose embedding raised without the clamp (None: none did); CPU only, as a GPU's
    device-side assert would poison the process."""
    w = _workload(name)
    engine = LLMEngine(
        num_speculative_tokens=k,
        fixes=Fixes(clamp_placeholders=False),
        device="cpu",
        max_num_batched_tokens=w.max_num_batched_tokens,
        async_scheduling=async_scheduling,
    )
    for prompt, remote in zip(w.prompts, w.remote_prefill, strict=True):
        engine.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens), remote_prefill=remote
        )
    while engine.has_unfinished_requests():
        try:
            engine.step()
        except IndexError:
            return engine.num_steps
    return None
