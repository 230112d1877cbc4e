"""Three ways to keep a ``-1`` placeholder out of the embedding, and what each one costs per step.

Mirrors the review of vLLM PR #47029 (vLLM 0.25's ``vllm/v1/worker/gpu_model_runner.py``): ``clamp``
(merged), ``host_mask`` (the first version; ``host_mask_async`` the reviewer's suggestion) and
``scheduler_zero`` (free on the GPU, and wrong). The comment above each fix says why it costs what it does.

Read :func:`make_step` first, then :func:`time_fix` and :func:`count_syncs`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specfix.lab.guard import PLACEHOLDER_TOKEN_ID
from specfix.timing import spin, summarize, wall_us
from specfix.tools.syncs import sync_warnings

#: The variants, in the order tables and plots show them.
FIXES = ("clamp", "host_mask", "host_mask_async", "scheduler_zero")
DESCRIPTIONS = {
    "clamp": "(a) clamp_ in place in _preprocess (merged)",
    "host_mask": "(b) host-built mask, torch.tensor(..., device=) each step (first version)",
    "host_mask_async": "(b') same mask, pinned + non_blocking copy (reviewer's suggestion)",
    "scheduler_zero": "(c) placeholders replaced by token 0 in the scheduler",
}
#: The one naming of the fixes in tables and legends (chapters 2 and 5): the bench's ``impl`` names, with the
#: letter the review discussion gives each (``"clamp (a)"``).
LABELS = {fix: f"{fix} {text.split()[0]}" for fix, text in DESCRIPTIONS.items()}


@dataclass
class Step:
    """What the scheduler sends (drafts as in vLLM's ``SchedulerOutput``) and the worker's device buffer;
    each request's drafts are the last of its tokens, which end at ``cu_num_scheduled_tokens[i]``."""

    req_ids: list[str]
    scheduled_spec_decode_tokens: dict[str, list[int]]
    cu_num_scheduled_tokens: list[int]
    input_ids: torch.Tensor
    pristine: torch.Tensor  # a copy of input_ids to restore before each timed step

    @property
    def num_input_tokens(self) -> int:
        return self.cu_num_scheduled_tokens[-1]


def make_step(
    num_tokens: int,
    num_spec_tokens: int = 3,
    padded_fraction: float = 0.25,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Step:
    """A decode step of ``num_tokens`` tokens: requests of ``1 + num_spec_tokens`` tokens each, a fraction of
    them padded with placeholder drafts (e.g. first decodes on a P/D decode node)."""
    if not isinstance(num_spec_tokens, int) or num_spec_tokens < 1:
        raise ValueError(f"num_spec_tokens must be an int >= 1, got {num_spec_tokens!r}")
    width = num_spec_tokens + 1
    if not isinstance(num_tokens, int) or num_tokens < width or num_tokens % width:
        raise ValueError(
            f"num_tokens must be a positive multiple of 1 + num_spec_tokens = {width}, got {num_tokens!r}"
        )
    if not 0.0 <= padded_fraction <= 1.0:
        raise ValueError(f"padded_fraction must lie in [0, 1], got {padded_fraction!r}")
    gen = torch.Generator().manual_seed(seed)
    num_reqs = num_tokens // width
    padded = torch.rand(num_reqs, generator=gen) < padded_fraction
    ids = torch.randint(0, 512, (num_reqs, width), generator=gen, dtype=torch.int32)  # a vocab of 512
    ids[padded, 1:] = PLACEHOLDER_TOKEN_ID
    req_ids = [f"req-{i}" for i in range(num_reqs)]
    spec = {r: ids[i, 1:].tolist() for i, r in enumerate(req_ids)}
    cu = [(i + 1) * width for i in range(num_reqs)]
    flat = ids.reshape(-1).to(device)
    return Step(req_ids, spec, cu, flat.clone(), flat)


# ``clamp``: the merged fix. ``_preprocess`` clamps ``input_ids.gpu[:num_input_tokens]`` in place to
# ``min=0``: one tiny kernel, no allocation, no host work, no synchronisation.
def clamp_placeholders(step: Step) -> None:
    step.input_ids[: step.num_input_tokens].clamp_(min=0)


def _placeholder_mask(step: Step) -> list[bool]:
    mask = [False] * step.num_input_tokens
    for req_id, end in zip(step.req_ids, step.cu_num_scheduled_tokens, strict=True):
        drafts = step.scheduled_spec_decode_tokens.get(req_id, ())
        start = end - len(drafts)
        for j, token in enumerate(drafts):
            if token < 0:
                mask[start + j] = True
    return mask


# ``host_mask``: the first version. A helper walks the scheduler's draft lists on the host, builds a
# mask of the placeholder positions and ships it with ``torch.tensor(..., device=...)`` every step: a
# synchronous copy from pageable memory (reconstructed from the review: same host work, same copy).
def mask_placeholder_draft_token_ids(step: Step) -> None:
    mask = torch.tensor(_placeholder_mask(step), dtype=torch.bool, device=step.input_ids.device)
    step.input_ids[: step.num_input_tokens].masked_fill_(mask, 0)


def mask_placeholder_draft_token_ids_async(step: Step) -> None:
    """(b') the reviewer's suggestion: the same mask, pinned and copied ``non_blocking``: no sync."""
    host = torch.tensor(_placeholder_mask(step), dtype=torch.bool)
    if step.input_ids.is_cuda:
        host = host.pin_memory()
    mask = host.to(step.input_ids.device, non_blocking=True)
    step.input_ids[: step.num_input_tokens].masked_fill_(mask, 0)


# ``scheduler_zero``: replace the placeholders by token ``0`` in the scheduler's lists, so no ``-1``
# ever reaches the GPU. Free on the GPU, but it is wrong: ``0`` is a real token, so the rejection
# sampler can accept it as a draft. vLLM 0.25's Model Runner V2 did this with its zeroed draft table;
# 0.33 marks those slots -1 again before verification (:mod:`specfix.mrv2.draft_slots`).
def zero_placeholders_in_scheduler(step: Step) -> dict[str, list[int]]:
    return {
        req_id: [0 if t < 0 else t for t in drafts]
        for req_id, drafts in step.scheduled_spec_decode_tokens.items()
    }


APPLY: dict[str, Callable[[Step], object]] = {
    "clamp": clamp_placeholders,
    "host_mask": mask_placeholder_draft_token_ids,
    "host_mask_async": mask_placeholder_draft_token_ids_async,
    "scheduler_zero": zero_placeholders_in_scheduler,
}


def _check_fix(fix: str) -> Callable[[Step], object]:
    if fix not in APPLY:
        raise ValueError(f"fix must be one of {list(APPLY)}, got {fix!r}")
    return APPLY[fix]


# -- measuring ------------------------------------------------------------------------------------------
def time_fix(fix: str, step: Step, repeats: int = 200, warmup: int = 20, busy_us: float = 0.0) -> dict:
    """Host microseconds of one application of ``fix`` (median, p20, p80), the step restored before each;
    ``busy_us`` of queued GPU work makes a synchronising fix stall the host, which the time then shows."""
    apply = _check_fix(fix)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    cuda = step.input_ids.is_cuda
    if busy_us and not cuda:
        raise ValueError("busy_us needs a CUDA step")

    def restore():
        step.input_ids.copy_(step.pristine)
        if cuda:
            torch.cuda.synchronize()
            if busy_us:  # GPU work still queued, as if the previous step's forward were running
                spin(busy_us)

    t = summarize(wall_us(functools.partial(apply, step), warmup + repeats, restore)[warmup:])
    return {
        "host_us": t["median_us"],
        "host_p20_us": t["p20_us"],
        "host_p80_us": t["p80_us"],
        "repeats": t["n"],
    }


def count_syncs(fix: str, step: Step) -> dict:
    """Host-device synchronisations of one application of ``fix``, counted two independent ways: torch's
    sync debug mode and blocking CUDA runtime calls in ``torch.profiler`` (None where unavailable)."""
    apply = _check_fix(fix)
    if not step.input_ids.is_cuda:
        raise ValueError("count_syncs needs a CUDA step")
    step.input_ids.copy_(step.pristine)
    apply(step)  # warm: first-call allocations are not per-step costs
    step.input_ids.copy_(step.pristine)
    messages = sync_warnings(lambda: apply(step))
    step.input_ids.copy_(step.pristine)
    torch.cuda.synchronize()
    return {"debug_mode": len(messages), "debug_messages": messages, **_profiled_syncs(apply, step)}


_BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def _profiled_syncs(apply: Callable[[Step], object], step: Step) -> dict:
    """Blocking CUDA runtime calls during ``apply(step)``, minus those of profiling an empty region (the
    profiler and our closing synchronize make some of their own)."""
    from torch.profiler import ProfilerActivity, profile

    def blocking_calls(fn) -> list[str]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.name in _BLOCKING_CALLS]

    try:
        baseline = blocking_calls(lambda: None)
        calls = blocking_calls(lambda: apply(step))
    except Exception as exc:  # noqa: BLE001  (profiler support varies by build; the count is then unknown)
        return {"profiler": None, "profiler_error": f"{type(exc).__name__}: {exc}"}
    for name in baseline:
        if name in calls:
            calls.remove(name)
    return {"profiler": len(calls), "profiler_calls": calls}


# -- correctness in the engine ---------------------------------------------------------------------------
# The fixes the engine can run (host_mask_async would ship the same mask), and None: no fix.
_ENGINE_FIXES = ("clamp", "host_mask", "scheduler_zero", None)


def _host_mask_runner(runner_cls):
    """A ``GPUModelRunner`` whose ``_preprocess`` applies fix (b) instead of the clamp."""

    class HostMaskRunner(runner_cls):
        def _preprocess(self, scheduler_output, num_input_tokens):
            req_ids = self._batch_order(scheduler_output)
            cu = list(itertools.accumulate(scheduler_output.num_scheduled_tokens[r] for r in req_ids))
            ids = self.input_ids.gpu
            mask_placeholder_draft_token_ids(
                Step(req_ids, scheduler_output.scheduled_spec_decode_tokens, cu, ids, ids)
            )
            return ids[:num_input_tokens], self.positions.gpu[:num_input_tokens]

    return HostMaskRunner


def run_engine_with_fix(
    fix: str | None, device: torch.device | str = "cpu", max_tokens: int = 24, temperature: float = 0.0
):
    """``(outputs, stats)`` of the engine's demo batch (two prefilled requests get placeholders) under one
    fix (None: no fix, which raises what the engine raises)."""
    from specfix.fixes import Fixes
    from specfix.v1.engine import DEMO_PROMPTS, LLMEngine
    from specfix.v1.scheduler import SamplingParams

    if fix not in _ENGINE_FIXES:
        raise ValueError(f"fix must be one of {_ENGINE_FIXES}, got {fix!r}")
    fixes = Fixes() if fix == "clamp" else Fixes(clamp_placeholders=False)
    engine = LLMEngine(
        num_speculative_tokens=3,
        proposer="ngram",
        fixes=fixes,
        device=device,
        placeholder_policy="zero" if fix == "scheduler_zero" else "minus_one",
    )
    if fix == "host_mask":
        engine.model_runner.__class__ = _host_mask_runner(type(engine.model_runner))
    params = SamplingParams(temperature=temperature, seed=0, max_tokens=max_tokens)
    req_ids = [engine.add_request(p, params, remote_prefill=i % 2 == 0) for i, p in enumerate(DEMO_PROMPTS)]
    finished: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        finished.update((out.request_id, list(out.token_ids)) for out in engine.step())
    return [finished[r] for r in req_ids], engine.scheduler.spec_decoding_stats


def engine_correctness(device: torch.device | str = "cpu", max_tokens: int = 24) -> list[dict]:
    """Each fix in the engine, greedy and sampled: does it crash, does it match the clamp, and what does an
    acceptance rate that counts placeholder slots as drafts report? The no-fix row runs on CPU only."""
    rows = []
    on_cuda = torch.device(device).type == "cuda"
    for temperature in (0.0, 0.7):
        reference = None
        for fix in _ENGINE_FIXES:
            row = {"fix": LABELS.get(fix, "no fix"), "temperature": temperature}
            if fix is None and on_cuda:
                rows.append({**row, "crashes": "device-side assert (run in a child: see the transcripts)"})
                continue
            try:
                outputs, stats = run_engine_with_fix(fix, device, max_tokens, temperature)
            except IndexError as exc:  # without a fix, on CPU: the embedding's own check (the result)
                if fix is not None:
                    raise
                rows.append({**row, "crashes": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
                continue
            reference = outputs if fix == "clamp" else reference
            slots = stats.num_draft_tokens + stats.num_placeholder_slots
            accepted_slots = stats.num_accepted_tokens + stats.num_placeholders_accepted
            rows.append(
                {
                    **row,
                    "crashes": "no",
                    "same tokens as the clamp": outputs == reference,
                    "verifications": stats.num_drafts,
                    "real drafts": stats.num_draft_tokens,
                    "accepted drafts": stats.num_accepted_tokens,
                    "acceptance rate, real drafts": stats.acceptance_rate,
                    "placeholder slots": stats.num_placeholder_slots,
                    "placeholders accepted": stats.num_placeholders_accepted,
                    "acceptance rate, all slots": accepted_slots / slots if slots else float("nan"),
                }
            )
    return rows
