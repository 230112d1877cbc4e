"""Chapter 1's experiments: who verified what, step by step, and requests that arrive prefilled.

:func:`verifications` reads a recorded run (``generate(..., record=True)``) into one
:class:`Verification` per request and step: where the request stood, which drafts were real, which
slots were padding, and how many slots the rejection sampler accepted. :func:`compare_runs` lines up two
runs of the same greedy workload by (request, position), which separates *how a draft is judged* (the
same in both runs wherever both verified the same position) from *where the drafter was consulted*
(which differs when one run advances faster). :func:`negative_draft_run` makes the rejection sampler meet
``-1`` drafts on its random path (vLLM PR #46533), where vLLM writes them: the first decode of requests that
arrive prefilled (P/D disaggregation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfix.fixes import Fixes
from specfix.models import NgramLM
from specfix.v1.engine import GenerateResult, LLMEngine, SamplingParams

#: Story openings from the fables; chapter 1 cycles through them to build a batch.
STORY_STARTS = ("the fox saw the crow", "a lion was asleep", "the north wind", "the mice",
                "an ant went to", "the boy cried", "the tortoise said", "once a hungry fox")


def story_prompts(num_prompts: int) -> list[str]:
    """``num_prompts`` prompts, cycling through :data:`STORY_STARTS`."""
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an int >= 1, got {num_prompts!r}")
    return [STORY_STARTS[i % len(STORY_STARTS)] for i in range(num_prompts)]


@dataclass(frozen=True)
class Verification:
    """One request verified in one step.

    ``position`` is the index of the request's last committed token (its ``num_computed_tokens`` when the
    step was scheduled); ``drafts`` are the drafter's real proposals, followed by the ids the scheduler
    wrote into the padding slots (``placeholders``: -1, or 0 under ``placeholder_policy="zero"``);
    ``accepted`` counts the slots the sampler accepted (a prefix, padding included).
    """

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


def verifications(result: GenerateResult) -> list[Verification]:
    """Every verification in a recorded run, step by step (requests without draft slots are skipped)."""
    if not isinstance(result, GenerateResult):
        raise TypeError(f"result must be a GenerateResult, got {type(result).__name__}")
    if result.num_steps and not result.trace:
        raise ValueError("result has no trace: run generate(..., record=True)")
    found = []
    for step in result.trace:
        out = step.scheduler_output
        start = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        start.update(zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens,
                         strict=True))
        for req_id, sampled in zip(step.req_ids, step.sampled_token_ids, strict=True):
            slots = out.scheduled_spec_decode_tokens.get(req_id, [])
            if not slots or not sampled:
                continue
            num_pad = out.num_placeholder_spec_tokens.get(req_id, 0)
            real = len(slots) - num_pad
            found.append(Verification(req_id, start[req_id], tuple(slots[:real]), tuple(slots[real:]),
                                      len(sampled) - 1))
    return found


def _tokens_by_request(result: GenerateResult) -> dict[str, list[int]]:
    return {out.request_id: out.prompt_token_ids + out.token_ids for out in result.outputs}


def compare_runs(a: GenerateResult, b: GenerateResult, token_id: int = 0) -> dict[str, dict[str, int]]:
    """Line up two recorded runs of one greedy workload by (request, position).

    Returns three groups, ``"both"``, ``"only a"`` and ``"only b"``, each with ``verifications`` (that have
    at least one real draft), ``drafts`` (real ones), ``accepted in a`` / ``accepted in b`` (real drafts
    accepted; 0 for a run that did not verify there) and ``after token_id`` (verifications whose last
    committed token is ``token_id``). Raises ValueError if the two runs' texts differ (then positions do not
    match) or if a shared verification carried different drafts.
    """
    tokens_a, tokens_b = _tokens_by_request(a), _tokens_by_request(b)
    if tokens_a != tokens_b:
        raise ValueError("the two runs produced different texts: their positions cannot be lined up")

    def real(run):
        return {(v.req_id, v.position): v for v in verifications(run) if v.drafts}

    in_a, in_b = real(a), real(b)
    differ = [key for key in in_a.keys() & in_b.keys() if in_a[key].drafts != in_b[key].drafts]
    if differ:
        raise ValueError(f"shared verifications with different drafts at (request, position) {differ[:3]}")
    groups = {"both": in_a.keys() & in_b.keys(), "only a": in_a.keys() - in_b.keys(),
              "only b": in_b.keys() - in_a.keys()}
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


def negative_draft_run(fixes: Fixes, prompts: Sequence[str], models: tuple[NgramLM, NgramLM], *, k: int = 3,
                       max_tokens: int = 32, device: torch.device | str = "cpu") -> dict[str, int]:
    """Sample (temperature 1, one seed per request) while requests keep arriving from a prefill node: the
    ``prompts`` decode for ``max_tokens`` tokens, and at every step one more prompt (cycling) joins with
    its KV already computed (P/D disaggregation), so its first decode is padded with ``[-1] * k`` right
    after the decoding requests' draft rows. Counts the sampler rows that hold a token *after* a ``-1``:
    rows that accepted a placeholder slot."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    engine = LLMEngine(num_speculative_tokens=k, fixes=fixes, device=device, models=models, record=True,
                       max_num_seqs=len(prompts) + 16)
    decoding = [engine.add_request(prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens))
                for seed, prompt in enumerate(prompts)]
    joined = 0
    while engine.has_unfinished_requests():
        if any(r in engine.scheduler.requests for r in decoding):
            engine.add_request(prompts[joined % len(prompts)], remote_prefill=True,
                               sampling_params=SamplingParams(temperature=1.0, seed=len(prompts) + joined,
                                                              max_tokens=1))
            joined += 1
        engine.step()
    rows = [row for step in engine.model_runner.trace for row in step.sampler_output.tolist()]
    accepted = sum(any(t != -1 for t in row[row.index(-1):]) for row in rows if -1 in row)
    return {"verifications": engine.scheduler.spec_decoding_stats.num_drafts,
            "rows with an accepted -1": accepted}
