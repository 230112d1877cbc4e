"""Chapter 1's experiments: who verified what, step by step, and where each ``-1`` placeholder goes.

Read :func:`verifications` first (a recorded run, one :class:`Verification` per request and step), then
:func:`compare_runs`, which separates *how a draft is judged* from *where the drafter was consulted*.
:func:`negative_draft_run` feeds the random path ``-1`` drafts (vLLM PR #46533); :func:`runner_paths`
follows a prefix-cache ``-1`` through both runners.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specfix.checks import check_count
from specfix.fixes import Fixes
from specfix.models import NgramLM
from specfix.v1.engine import GenerateResult, LLMEngine, SamplingParams, generate
from specfix.v1.model_runner import StepTrace

#: Story openings from the fables; chapter 1 cycles through them to build a batch.
STORY_STARTS = (
    "the fox saw the crow",
    "a lion was asleep",
    "the north wind",
    "the mice",
    "an ant went to",
    "the boy cried",
    "the tortoise said",
    "once a hungry fox",
)


def story_prompts(num_prompts: int) -> list[str]:
    check_count("num_prompts", num_prompts)
    return [STORY_STARTS[i % len(STORY_STARTS)] for i in range(num_prompts)]


@dataclass(frozen=True)
class Verification:
    """One request verified in one step: real ``drafts`` then padding ``placeholders``; ``accepted`` counts
    slots (a prefix, padding included), ``position`` is the last committed token's index."""

    req_id: str
    position: int
    drafts: tuple[int, ...]
    placeholders: tuple[int, ...]
    accepted: int

    @property
    def num_placeholders(self) -> int:
        return len(self.placeholders)

    @property
    def accepted_drafts(self) -> int:
        return min(self.accepted, len(self.drafts))

    @property
    def accepted_placeholders(self) -> int:
        return self.accepted - self.accepted_drafts


def check_recorded(result: object, name: str = "result") -> None:
    """A ``GenerateResult`` with its step trace (``record=True``), which chapter 1's readers need."""
    if not isinstance(result, GenerateResult):
        raise TypeError(f"{name} must be a GenerateResult, got {type(result).__name__}")
    if result.num_steps and not result.trace:
        raise ValueError(f"{name} has no trace: run it with record=True")


def verifications(result: GenerateResult) -> list[Verification]:
    """Every verification in a recorded run, step by step (requests without draft slots are skipped)."""
    check_recorded(result)
    found = []
    for step in result.trace:
        out = step.scheduler_output
        start = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        start.update(
            zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens, strict=True)
        )
        for req_id, sampled in zip(step.req_ids, step.sampled_token_ids, strict=True):
            slots = out.scheduled_spec_decode_tokens.get(req_id, [])
            if not slots or not sampled:
                continue
            num_pad = out.num_placeholder_spec_tokens.get(req_id, 0)
            real = len(slots) - num_pad
            found.append(
                Verification(
                    req_id, start[req_id], tuple(slots[:real]), tuple(slots[real:]), len(sampled) - 1
                )
            )
    return found


def compare_runs(a: GenerateResult, b: GenerateResult, token_id: int = 0) -> dict[str, dict[str, int]]:
    """Two recorded runs of one text, verifications lined up by (request, position): both, only a, only b."""
    tokens_a, tokens_b = ({o.request_id: o.prompt_token_ids + o.token_ids for o in r.outputs} for r in (a, b))
    if tokens_a != tokens_b:
        raise ValueError("the two runs produced different texts: their positions cannot be lined up")

    def real(run):
        return {(v.req_id, v.position): v for v in verifications(run) if v.drafts}

    in_a, in_b = real(a), real(b)
    differ = [key for key in in_a.keys() & in_b.keys() if in_a[key].drafts != in_b[key].drafts]
    if differ:
        raise ValueError(f"shared verifications with different drafts at (request, position) {differ[:3]}")
    groups = {
        "both": in_a.keys() & in_b.keys(),
        "only a": in_a.keys() - in_b.keys(),
        "only b": in_b.keys() - in_a.keys(),
    }
    summary = {}
    for name, keys in groups.items():
        either = [in_a.get(key) or in_b[key] for key in keys]
        summary[name] = {
            "verifications": len(keys),
            "drafts": sum(len(v.drafts) for v in either),
            "accepted in a": sum(in_a[key].accepted_drafts for key in keys if key in in_a),
            "accepted in b": sum(in_b[key].accepted_drafts for key in keys if key in in_b),
            "after token_id": sum(tokens_a[req][pos] == token_id for req, pos in keys),
        }
    return summary


def negative_draft_run(
    fixes: Fixes,
    prompts: Sequence[str],
    models: tuple[NgramLM, NgramLM],
    *,
    k: int = 3,
    max_tokens: int = 32,
    device: torch.device | str = "cpu",
) -> dict[str, int]:
    """Sampler rows that accept a ``-1`` while a P/D request with ``[-1] * k`` drafts joins every step."""
    check_count("k", k)
    engine = LLMEngine(
        num_speculative_tokens=k,
        fixes=fixes,
        device=device,
        models=models,
        record=True,
        max_num_seqs=len(prompts) + 16,
    )
    decoding = [
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens))
        for seed, prompt in enumerate(prompts)
    ]
    joined = 0
    while engine.has_unfinished_requests():
        if any(r in engine.scheduler.requests for r in decoding):
            engine.add_request(
                prompts[joined % len(prompts)],
                remote_prefill=True,
                sampling_params=SamplingParams(temperature=1.0, seed=len(prompts) + joined, max_tokens=1),
            )
            joined += 1
        engine.step()
    rows = [row for step in engine.model_runner.trace for row in step.sampler_output.tolist()]
    accepted = sum(any(t != -1 for t in row[row.index(-1) :]) for row in rows if -1 in row)
    return {
        "verifications": engine.scheduler.spec_decoding_stats.num_drafts,
        "rows with an accepted -1": accepted,
    }


#: One token more than a block (``specfix.v1.scheduler.BLOCK_SIZE``), so a repeat is cached up to its last
#: token; the next word is "the", token 0, where a zero in a placeholder slot passes for a draft.
REPEATED_PROMPT = "the fox saw the crow sitting on a tree with a piece of cheese and said to"
_DEFAULT_FIXES = Fixes()
#: vLLM's two model runners, each with its fix and without it.
RUNNER_PATHS = {
    "V1 runner with the clamp (0.25; 0.33's fallback)": ("v1", Fixes()),
    "V1 runner without the clamp (before PR #47029)": ("v1", Fixes(clamp_placeholders=False)),
    "Model Runner V2 (0.33's default)": ("v2", Fixes()),
    "Model Runner V2 without the marking (as in 0.25)": ("v2", Fixes(mark_placeholder_drafts=False)),
}


def repeated_prompt_engine(
    *,
    k: int = 3,
    model_runner: str = "v1",
    fixes: Fixes = _DEFAULT_FIXES,
    models: tuple[NgramLM, NgramLM] | None = None,
    device: torch.device | str = "cpu",
) -> LLMEngine:
    """Prefix caching on: :data:`REPEATED_PROMPT` run as ``"first"``, then one step of it as ``"repeat"``."""
    engine = LLMEngine(
        num_speculative_tokens=k,
        enable_prefix_caching=True,
        record=True,
        models=models,
        device=device,
        model_runner=model_runner,
        fixes=fixes,
        sampler_backend="torch",
    )
    params = SamplingParams(temperature=0.0, max_tokens=8)
    engine.add_request(REPEATED_PROMPT, params, request_id="first")
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request(REPEATED_PROMPT, params, request_id="repeat")
    engine.step()
    return engine


def draft_slots(step: StepTrace, ids: torch.Tensor) -> dict[str, list[int]]:
    """Per request with draft slots: ``ids`` (one per scheduled token) at its slots, the last of its span."""
    spec = step.scheduler_output.scheduled_spec_decode_tokens
    ends = np.cumsum(step.num_scheduled_tokens)
    return {
        r: ids[end - len(spec[r]) : end].tolist()
        for r, end in zip(step.req_ids, ends.tolist(), strict=True)
        if r in spec
    }


def runner_paths(
    *, k: int = 3, models: tuple[NgramLM, NgramLM] | None = None
) -> dict[str, dict[str, object]]:
    """The repeat's draft slots on each of :data:`RUNNER_PATHS`, as sent, embedded and verified. CPU only:
    without the clamp a GPU's device-side assert would leave the process unusable."""
    rows = {}
    for name, (runner, fixes) in RUNNER_PATHS.items():
        try:
            engine = repeated_prompt_engine(k=k, model_runner=runner, fixes=fixes, models=models)
        except IndexError as err:
            rows[name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        step = engine.model_runner.trace[-1]
        metadata, start = step.spec_decode_metadata, step.req_ids.index("repeat")
        first = sum(metadata.num_draft_tokens[:start])
        rows[name] = {
            "cached tokens": step.scheduler_output.scheduled_new_reqs[0].num_computed_tokens,
            "scheduler sends": step.scheduler_output.scheduled_spec_decode_tokens["repeat"],
            "embedding reads": draft_slots(step, step.embedding_input)["repeat"],
            "verification sees": metadata.draft_token_ids[first : first + k].tolist(),
            "emitted": step.sampled_token_ids[start],
            "placeholders accepted": engine.scheduler.spec_decoding_stats.num_placeholders_accepted,
            "error": None,
        }
    return rows


def placeholder_sources(
    *,
    k: int = 3,
    num_prompts: int = 4,
    max_tokens: int = 12,
    models: tuple[NgramLM, NgramLM] | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, dict[str, int]]:
    """Four everyday deployments, run live: draft slots verified, and how many were ``-1`` placeholders."""
    prompts = story_prompts(num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    common = dict(
        num_speculative_tokens=k, models=models, device=device, record=True, sampler_backend="torch"
    )
    runs = {
        "one node, new prompts": generate(prompts, params, enable_prefix_caching=True, **common).trace,
        "one node, a prompt sent again (prefix cache)": repeated_prompt_engine(
            k=k, models=models, device=device
        ).model_runner.trace,
        "P/D decode node": generate(prompts, params, remote_prefill=True, **common).trace,
        "one node, async scheduling": generate(prompts, params, async_scheduling=True, **common).trace,
    }
    return {
        name: {
            "draft slots": sum(
                len(d) for step in trace for d in step.scheduler_output.scheduled_spec_decode_tokens.values()
            ),
            "-1 slots": sum(
                sum(step.scheduler_output.num_placeholder_spec_tokens.values()) for step in trace
            ),
        }
        for name, trace in runs.items()
    }
