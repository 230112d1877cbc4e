"""The engine loop: schedule, run the model, verify drafts, update, repeat; and ``generate``.

Mirrors vLLM 0.33.0's ``vllm/v1/engine/llm_engine.py`` and ``vllm/entrypoints/llm.py`` (``LLM.generate``),
with the engine core's loop (``vllm/v1/engine/core.py``) in the same process.

    result = generate(["the fox said"], SamplingParams(temperature=0.8, seed=1), num_speculative_tokens=3)
    result.outputs[0].text, result.stats.acceptance_rate

Read :meth:`LLMEngine.step` first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfix.fixes import Fixes
from specfix.models import NgramLM, load_models
from specfix.tokenizer import Tokenizer, get_tokenizer
from specfix.v1.model_runner import GPUModelRunner, ModelRunnerOutput, StepTrace
from specfix.v1.proposer import DraftModelProposer, NgramProposer
from specfix.v1.scheduler import (
    AsyncScheduler,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerOutput,
    SpecDecodingStats,
    check_num_spec_tokens,
)
from specfix.v1.snapshot import Snapshot

PROPOSERS = ("draft_model", "ngram")
#: "v1": vLLM's V1 runner; "v2": Model Runner V2's draft slots (:mod:`specfix.mrv2.draft_slots`).
MODEL_RUNNERS = ("v1", "v2")
_DEFAULT_FIXES = Fixes()
_DEFAULT_PARAMS = SamplingParams()


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool


@dataclass
class GenerateResult:
    outputs: list[RequestOutput]
    stats: SpecDecodingStats
    num_steps: int
    trace: list[StepTrace]


class _StepUndo:
    """What a failed ``LLMEngine.step`` puts back, the global generators too (unseeded requests use them)."""

    def __init__(self, engine: LLMEngine):
        runner = engine.model_runner
        self.parts = [
            Snapshot(engine.scheduler),
            Snapshot(runner, skip=runner.NOT_STEP_STATE),
            Snapshot(engine, skip=("scheduler", "model_runner", "tokenizer")),
        ]
        self.trace, self.trace_len = runner.trace, len(runner.trace)
        self.cpu_rng = torch.get_rng_state()
        self.device = runner.device
        self.cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    def restore(self) -> None:
        for part in self.parts:
            part.restore()
        del self.trace[self.trace_len :]
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)


def _check_engine_args(
    num_speculative_tokens: int | None, proposer: str, async_scheduling: bool, model_runner: str
) -> None:
    check_num_spec_tokens(num_speculative_tokens)
    if model_runner not in MODEL_RUNNERS:
        raise ValueError(f"model_runner must be one of {MODEL_RUNNERS}, got {model_runner!r}")
    if proposer not in PROPOSERS:
        raise ValueError(f"proposer must be one of {PROPOSERS}, got {proposer!r}")
    if not isinstance(async_scheduling, bool):
        raise TypeError(f"async_scheduling must be a bool, got {async_scheduling!r}")
    if async_scheduling and num_speculative_tokens is not None and proposer == "ngram":
        raise ValueError(
            "async_scheduling=True does not work with proposer='ngram': the n-gram drafter "
            "may propose fewer than k tokens, and vLLM's V1 runner refuses async "
            "scheduling with it too"
        )


def _make_drafter(
    proposer: str, num_speculative_tokens: int | None, draft: NgramLM, max_model_len: int
) -> DraftModelProposer | NgramProposer | None:
    """None without speculative decoding."""
    if num_speculative_tokens is None:
        return None
    if proposer == "draft_model":
        return DraftModelProposer(draft, num_speculative_tokens)
    return NgramProposer(num_speculative_tokens, max_model_len=max_model_len)


class LLMEngine:
    """One scheduler, one model runner, one tokenizer; a ``step()`` is all-or-nothing, so a failed one
    leaves the engine as it was and usable.

    ``async_scheduling`` keeps two batches in flight (vLLM's ``step_with_batch_queue``); vLLM 0.33 refuses
    it with the n-gram drafter (``vllm/config/vllm.py``), as specfix does. vLLM 0.33 runs Model Runner V2
    by default (``model_runner="v2"``); prefix caching is off here so that runs do not depend on each other.
    """

    def __init__(
        self,
        *,
        num_speculative_tokens: int | None = 3,
        proposer: str = "draft_model",
        fixes: Fixes = _DEFAULT_FIXES,
        device: torch.device | str = "cpu",
        placeholder_policy: str = "minus_one",
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 256,
        max_model_len: int = 256,
        cudagraph_capture_sizes: tuple[int, ...] | None = None,
        sampler_backend: str = "auto",
        models: tuple[NgramLM, NgramLM] | None = None,
        record: bool = False,
        async_scheduling: bool = False,
        model_runner: str = "v1",
        enable_prefix_caching: bool = False,
    ):
        _check_engine_args(num_speculative_tokens, proposer, async_scheduling, model_runner)
        self.tokenizer: Tokenizer = get_tokenizer()
        target, draft = models if models is not None else load_models(device)
        if target.embed_tokens.weight.device.type != torch.device(device).type:
            raise ValueError(f"models live on {target.embed_tokens.weight.device}, but device={device!r}")
        drafter = _make_drafter(proposer, num_speculative_tokens, draft, max_model_len)
        scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = scheduler_cls(
            vocab_size=target.vocab_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            num_spec_tokens=num_speculative_tokens,
            placeholder_policy=placeholder_policy,
            enable_prefix_caching=enable_prefix_caching,
        )
        runner_cls = GPUModelRunner
        if model_runner == "v2":
            from specfix.mrv2.draft_slots import GPUModelRunnerV2 as runner_cls
        self.model_runner = runner_cls(
            target,
            drafter=drafter,
            fixes=fixes,
            device=device,
            max_num_reqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            cudagraph_capture_sizes=cudagraph_capture_sizes,
            sampler_backend=sampler_backend,
            record=record,
            async_scheduling=async_scheduling,
        )
        self.async_scheduling = async_scheduling
        # Async scheduling: batches run but not yet handed to the scheduler, newest first (vLLM's batch_queue)
        self._batch_queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
        self._prompts: dict[str, str] = {}
        self._next_id = 0
        self.num_steps = 0

    def add_request(
        self,
        prompt: str | Sequence[int],
        sampling_params: SamplingParams,
        *,
        request_id: str | None = None,
        remote_prefill: bool = False,
    ) -> str:
        """Queue a prompt; ``remote_prefill`` (P/D disaggregation) leaves only its last token to compute. The
        scheduler checks the request (ids, prompt, sampling_params) before anything changes."""
        if not isinstance(remote_prefill, bool):
            raise TypeError(f"remote_prefill must be a bool, got {remote_prefill!r}")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        req_id, next_id = request_id, self._next_id
        if request_id is None:  # an automatic id: the next number not in use
            while self.scheduler.is_request_id_in_use(str(next_id)):
                next_id += 1
            req_id, next_id = str(next_id), next_id + 1
        request = Request(
            req_id,
            token_ids,
            sampling_params,
            num_computed_tokens=max(len(token_ids) - 1, 0) if remote_prefill else 0,
        )
        self.scheduler.add_request(request)
        self._next_id = next_id
        self._prompts[req_id] = (
            prompt if isinstance(prompt, str) else self.tokenizer.decode(request.prompt_token_ids)
        )
        return req_id

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._batch_queue)

    def step(self) -> list[RequestOutput]:
        """One iteration; returns the outputs of the requests that finished in it (now freed)."""
        undo = _StepUndo(self)
        try:
            finished = self._step_async() if self.async_scheduling else self._step_sync()
            outputs = [self._output(r) for r in finished]
            for request in finished:
                del self._prompts[request.request_id]
            self.num_steps += 1
        except BaseException as error:
            try:
                undo.restore()
            except Exception as failed:  # e.g. after a device-side assert no CUDA call works in this process
                if hasattr(error, "add_note"):  # Python >= 3.11
                    error.add_note(
                        f"the engine could not be put back as it was ({type(failed).__name__}: "
                        f"{failed}); start anew (after a device-side assert: a new process)"
                    )
            raise
        return outputs

    def _step_sync(self) -> list[Request]:
        """vLLM's ``EngineCore.step`` then ``post_step``: schedule, run, update, hand over the drafts."""
        scheduler_output = self.scheduler.schedule()
        runner_output = self.model_runner.execute_model(scheduler_output)
        finished = self.scheduler.update_from_output(scheduler_output, runner_output)
        drafts = self.model_runner.take_draft_token_ids()
        if drafts is not None:
            self.scheduler.update_draft_token_ids(drafts)
        return finished

    def _step_async(self) -> list[Request]:
        """vLLM's ``EngineCore.step_with_batch_queue``: it plans one step ahead of what it knows."""
        ran = False
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            runner_output = self.model_runner.execute_model(scheduler_output)
            ran = scheduler_output.total_num_scheduled_tokens > 0
            if ran:
                self._batch_queue.appendleft((scheduler_output, runner_output))
        if ran and len(self._batch_queue) < 2:
            return []
        if not self._batch_queue:
            if self.scheduler.has_unfinished_requests():
                raise RuntimeError("async scheduling stalled: nothing scheduled and no batch in flight")
            return []
        return self.scheduler.update_from_output(*self._batch_queue.pop())

    def get_output(self, request_id: str) -> RequestOutput:
        """What an unfinished request has generated so far."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            raise KeyError(f"request_id {request_id!r} is not an unfinished request of this engine")
        return self._output(request)

    def _output(self, request: Request) -> RequestOutput:
        return RequestOutput(
            request.request_id,
            self._prompts[request.request_id],
            list(request.prompt_token_ids),
            list(request.output_token_ids),
            self.tokenizer.decode(request.output_token_ids),
            request.is_finished,
        )


def generate(
    prompts: Sequence[str | Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] = _DEFAULT_PARAMS,
    *,
    num_speculative_tokens: int | None = 3,
    remote_prefill: bool | Sequence[bool] = False,
    max_steps: int | None = None,
    **engine_kwargs,
) -> GenerateResult:
    """Generate for a batch of prompts; ``engine_kwargs`` go to :class:`LLMEngine`, and per-prompt
    arguments take one value for all or one per prompt."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError("prompts must be a list of strings or token-id lists")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: nothing to generate")
    one = isinstance(sampling_params, SamplingParams)
    params = [sampling_params] * len(prompts) if one else list(sampling_params)
    remote = [remote_prefill] * len(prompts) if isinstance(remote_prefill, bool) else list(remote_prefill)
    for name, values in [("sampling_params", params), ("remote_prefill", remote)]:
        if len(values) != len(prompts):
            raise ValueError(f"{name} has {len(values)} entries for {len(prompts)} prompts")
    bad = [p for p in params if not isinstance(p, SamplingParams)]
    if bad:
        raise TypeError(f"sampling_params must be SamplingParams, got {type(bad[0]).__name__}")
    engine = LLMEngine(num_speculative_tokens=num_speculative_tokens, **engine_kwargs)
    req_ids = [
        engine.add_request(p, sp, remote_prefill=r) for p, sp, r in zip(prompts, params, remote, strict=True)
    ]
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests() and (max_steps is None or engine.num_steps < max_steps):
        done.update((out.request_id, out) for out in engine.step())
    outputs = [done[r] if r in done else engine.get_output(r) for r in req_ids]
    return GenerateResult(
        outputs, engine.scheduler.spec_decoding_stats, engine.num_steps, engine.model_runner.trace
    )


#: Openings whose next word is often *the* (token 0), to show what a placeholder written as 0 does.
DEMO_PROMPTS = ("the fox saw the crow and", "a lion was asleep in", "the north wind and", "the mice ran to")


# Chapter 2's crash, run on CUDA in a child process by ``specfix.lab.embedding_assert``.
def run_demo(
    fixes: Fixes = _DEFAULT_FIXES, device: torch.device | str = "cpu", steps: int | None = None
) -> GenerateResult:
    """A batch of four whose two prefilled requests get ``[-1] * 3`` drafts in the first step: with
    ``fixes.clamp_placeholders`` off the embedding fails (IndexError on CPU, device-side assert on CUDA)."""
    return generate(
        list(DEMO_PROMPTS),
        SamplingParams(temperature=0.7, seed=0, max_tokens=24),
        num_speculative_tokens=3,
        remote_prefill=[True, False, True, False],
        fixes=fixes,
        device=device,
        max_steps=steps,
    )
