"""Requests, the schedulers and the accepted-token bookkeeping: where ``-1`` placeholders are born.

Mirrors vLLM 0.33.0's ``vllm/v1/core/sched/scheduler.py``, ``vllm/v1/core/sched/async_scheduler.py``,
``vllm/v1/core/sched/output.py``, ``vllm/v1/request.py``, ``vllm/sampling_params.py`` and
``vllm/v1/spec_decode/metrics.py``, cut to what speculative decoding needs (no KV-block manager, no
preemption, no structured output, no dynamic k). Unless a version is named beside it, every vLLM file
cited here is from vLLM 0.33.0.

Read ``Scheduler.schedule`` first. A ``-1`` (``PLACEHOLDER_TOKEN_ID``) enters the drafts in two places:
``Scheduler._pads_new_decode`` (synchronous scheduling) and ``AsyncScheduler._update_after_schedule``.
"""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass, field

import torch

from specfix.checks import check_count, check_id_tensor, is_int
from specfix.v1.rejection_sampler import MAX_SPEC_LEN, PLACEHOLDER_TOKEN_ID
from specfix.v1.sampling_metadata import SAMPLING_EPS, check_seed, check_temperature

#: ``"zero"`` pads with token 0, as 0.25's Model Runner V2 verified its slots (0.33 re-marks them ``-1``).
PLACEHOLDER_POLICIES = ("minus_one", "zero")
#: vLLM's default ``CacheConfig.block_size`` (``vllm/config/cache.py``, 0.24.0 to 0.33.0).
BLOCK_SIZE = 16
#: vLLM's ``_MAX_TEMP``: a random request's temperature is raised to at least this.
MAX_TEMP = 1e-2
#: The largest temperature vLLM 0.33's ``SamplingParams._verify_args`` accepts.
MAX_TEMPERATURE = 2.0


def check_num_spec_tokens(num_spec_tokens: int | None) -> None:
    """``None`` means speculative decoding is off."""
    if num_spec_tokens is None:
        return
    if not is_int(num_spec_tokens):
        raise TypeError(f"num_speculative_tokens must be an int or None, got {num_spec_tokens!r}")
    if not 1 <= num_spec_tokens <= MAX_SPEC_LEN:
        raise ValueError(
            f"num_speculative_tokens must lie in [1, MAX_SPEC_LEN={MAX_SPEC_LEN}], got "
            f"{num_spec_tokens} (use None to switch speculative decoding off)"
        )


def check_token_ids(
    name: str, token_ids: object, vocab_size: int, allow_placeholder: bool = False
) -> list[int]:
    """A list of ints in ``[0, vocab_size)`` (-1 too if allowed) from a list or a 1-D tensor."""
    if isinstance(token_ids, torch.Tensor):
        check_id_tensor(name, token_ids)
        token_ids = token_ids.tolist()
    if not isinstance(token_ids, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of ints or a 1-D integer tensor, got {type(token_ids).__name__}"
        )
    bad_type = [t for t in token_ids if not is_int(t)]
    if bad_type:
        raise TypeError(f"{name} must hold ints, got {bad_type[0]!r}")
    low = PLACEHOLDER_TOKEN_ID if allow_placeholder else 0
    bad = [t for t in token_ids if not low <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} must lie in [{low}, vocab_size={vocab_size}), got {bad[0]}")
    return list(token_ids)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, checked by vLLM 0.33's rules (``vllm/sampling_params.py``)."""

    temperature: float = 1.0
    seed: int | None = None
    max_tokens: int = 16

    def __post_init__(self) -> None:
        t = self.temperature
        check_temperature("temperature", t)
        if t > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], as in vLLM 0.33, got {t}")
        if 0 < t < MAX_TEMP:
            warnings.warn(
                f"temperature {t} is below {MAX_TEMP} and risks inf or NaN logits; raised to "
                f"{MAX_TEMP}, as vLLM 0.33 does",
                stacklevel=3,
            )
            object.__setattr__(self, "temperature", MAX_TEMP)
        if self.seed == -1:  # vLLM's "no seed"
            object.__setattr__(self, "seed", None)
        check_seed("seed", self.seed)
        check_count("max_tokens", self.max_tokens)

    @property
    def is_greedy(self) -> bool:
        """vLLM's ``SamplingType.GREEDY``."""
        return self.temperature < SAMPLING_EPS


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"


@dataclass
class Request:
    """One generation request as the scheduler tracks it (vllm/v1/request.py)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    num_computed_tokens: int = 0  # KV cached or being computed; a decode has one token (its last) more
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)  # next step's drafts (async: [-1] * k to fill)
    status: RequestStatus = RequestStatus.WAITING
    num_output_placeholders: int = 0  # async: tokens steps in flight may emit (1 + drafts each)
    is_prefill_chunk: bool = False  # after the last scheduling, prompt is left to compute

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED_LENGTH_CAPPED


@dataclass
class NewRequestData:
    """A request the model runner has not seen yet."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Requests the runner already holds; ``num_computed_tokens`` is each one's value before this step."""

    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """What the scheduler decided for one step (vllm/v1/core/sched/output.py)."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]  # the drafts to verify, placeholders included
    # Not in vLLM: how many of them the scheduler wrote as placeholders (the truth when they are zeros)
    num_placeholder_spec_tokens: dict[str, int]
    finished_req_ids: set[str]
    num_spec_tokens_to_schedule: int = 0  # the k next step's drafts are sized for (vLLM's dynamic k)
    step_id: int = -1  # not in vLLM: update_from_output refuses a step's output delivered twice


@dataclass
class SpecDecodingStats:
    """Acceptance counts over a run (vllm/v1/spec_decode/metrics.py), placeholder slots apart from drafts."""

    num_spec_tokens: int
    num_drafts: int = 0  # verification events: one request in one step with at least one real draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_draft_tokens_per_pos: list[int] = field(init=False)
    num_accepted_tokens_per_pos: list[int] = field(init=False)
    acceptance_lengths: list[int] = field(default_factory=list)  # 1 + accepted, per verification event
    num_placeholder_slots: int = 0
    num_placeholders_accepted: int = 0  # only under the "zero" policy, or a sampler bug

    def __post_init__(self) -> None:
        self.num_draft_tokens_per_pos = [0] * self.num_spec_tokens
        self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_slots: int, num_placeholders: int, num_accepted: int) -> None:
        """One request's verification; the last ``num_placeholders`` of its slots are padding."""
        num_real = num_slots - num_placeholders
        accepted_real = min(num_accepted, num_real)
        self.num_placeholder_slots += num_placeholders
        self.num_placeholders_accepted += num_accepted - accepted_real
        if num_real == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_real
        self.num_accepted_tokens += accepted_real
        self.acceptance_lengths.append(1 + accepted_real)
        for pos in range(num_real):
            self.num_draft_tokens_per_pos[pos] += 1
            self.num_accepted_tokens_per_pos[pos] += pos < accepted_real

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        return [
            a / d if d else math.nan
            for a, d in zip(self.num_accepted_tokens_per_pos, self.num_draft_tokens_per_pos, strict=True)
        ]

    @property
    def mean_acceptance_length(self) -> float:
        """The tokens one target pass yields, as vLLM reports it."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan


class Scheduler:
    """vLLM's synchronous scheduler: each step's output (and drafts) come back before the next one."""

    #: Whether a running request's drafts are placeholders (async) rather than the drafter's proposals.
    drafts_are_placeholders = False

    def __init__(
        self,
        *,
        vocab_size: int,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 256,
        max_model_len: int = 256,
        num_spec_tokens: int | None = None,
        placeholder_policy: str = "minus_one",
        enable_prefix_caching: bool = False,
        block_size: int = BLOCK_SIZE,
    ):
        check_num_spec_tokens(num_spec_tokens)
        if not isinstance(enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {enable_prefix_caching!r}")
        for name, value in [
            ("vocab_size", vocab_size),
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
            ("block_size", block_size),
        ]:
            check_count(name, value)
        if placeholder_policy not in PLACEHOLDER_POLICIES:
            raise ValueError(
                f"placeholder_policy must be one of {PLACEHOLDER_POLICIES}, got {placeholder_policy!r}"
            )
        if num_spec_tokens is not None and max_num_batched_tokens < 1 + num_spec_tokens:
            raise ValueError(
                f"max_num_batched_tokens={max_num_batched_tokens} cannot hold one decode of "
                f"1 + k = {1 + num_spec_tokens} tokens"
            )
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_spec_tokens = num_spec_tokens or 0
        self.placeholder_token_id = PLACEHOLDER_TOKEN_ID if placeholder_policy == "minus_one" else 0
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self._num_steps = 0  # steps scheduled so far: the next SchedulerOutput's step_id
        # step_id -> its request ids, for steps with tokens whose output has not come back (async: a request
        # may finish while a later step that carries it is still in flight)
        self._steps_in_flight: dict[int, set[str]] = {}
        self.spec_decoding_stats = SpecDecodingStats(self.num_spec_tokens)
        self.enable_prefix_caching = enable_prefix_caching
        self.block_size = block_size
        self.cached_block_hashes: set[int] = set()  # the prefix cache: one hash per full block computed

    def is_request_id_in_use(self, request_id: str) -> bool:
        """A new request may not take an id a step in flight still carries."""
        return request_id in self.requests or any(request_id in r for r in self._steps_in_flight.values())

    def add_request(self, request: Request) -> None:
        """Queue a request; checks it first (nothing changes when it is refused)."""
        if not isinstance(request, Request):
            raise TypeError(f"request must be a specfix.v1.scheduler.Request, got {type(request).__name__}")
        if not isinstance(request.request_id, str) or not request.request_id:
            raise TypeError(f"request_id must be a non-empty str, got {request.request_id!r}")
        if not isinstance(request.sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(request.sampling_params).__name__}"
            )
        if (
            request.output_token_ids
            or request.spec_token_ids
            or request.num_output_placeholders
            or request.status != RequestStatus.WAITING
        ):
            raise ValueError(
                f"request {request.request_id!r} is not new: it has output or draft tokens, "
                f"or status {request.status.name}"
            )
        if not is_int(request.num_computed_tokens):
            raise TypeError(f"num_computed_tokens must be an int, got {request.num_computed_tokens!r}")
        if self.is_request_id_in_use(request.request_id):
            where = (
                "is already in the scheduler"
                if request.request_id in self.requests
                else "finished, but a step that carries it is still in flight (async scheduling): "
                "use another id or step once more"
            )
            raise ValueError(f"request_id {request.request_id!r} {where}")
        prompt = check_token_ids("prompt_token_ids", request.prompt_token_ids, self.vocab_size)
        if not prompt:
            raise ValueError("prompt_token_ids is empty: a request needs at least one prompt token")
        if not 0 <= request.num_computed_tokens < len(prompt):
            raise ValueError(
                f"num_computed_tokens must lie in [0, {len(prompt)}) for a new request, "
                f"got {request.num_computed_tokens}"
            )
        max_tokens, k = request.sampling_params.max_tokens, self.num_spec_tokens
        if len(prompt) + max_tokens + k > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) + k ({k}) = "
                f"{len(prompt) + max_tokens + k} exceeds max_model_len={self.max_model_len}"
            )
        request.prompt_token_ids = prompt
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _schedule_running(self, request: Request, budget: int) -> tuple[int, list[int]]:
        """Tokens and drafts for a running request (vLLM's running loop); 0 tokens: skip it this step."""
        if (
            request.num_output_placeholders > 0
            and request.num_computed_tokens + 2 - request.num_output_placeholders
            >= request.num_prompt_tokens + request.sampling_params.max_tokens
        ):
            return 0, []  # async: the step in flight reaches max_tokens even if every draft is rejected
        num_new = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        num_new = min(num_new, budget, self.max_model_len - request.num_computed_tokens - 1)
        if num_new <= 0:
            return 0, []
        num_spec = (
            num_new + request.num_computed_tokens - request.num_tokens - request.num_output_placeholders
        )
        return num_new, request.spec_token_ids[: max(num_spec, 0)]

    # vLLM PR #45237 (not in 0.24.0): a waiting request with one token left (a P/D decode node's first
    # decode, a prompt the prefix cache holds, a one-token prompt) is scheduled as ``1 + k`` tokens with
    # drafts ``[-1] * k``, keeping the uniform query length a FULL CUDA graph replays. 0.33 asks for no
    # prefill chunk in the step, and KV already there or a running request before it (0.25.0: always the
    # latter). Running requests are never padded.
    def _pads_new_decode(
        self, request: Request, num_computed_tokens: int, running_scheduled: bool, prefill_scheduled: bool
    ) -> bool:
        return (
            self.num_spec_tokens > 0
            and request.num_tokens - num_computed_tokens == 1
            and not prefill_scheduled
            and (running_scheduled or num_computed_tokens > 0)
        )

    # Prefix caching (on by default in vLLM 0.33, ``vllm/config/cache.py``; off here): a new request starts
    # from its cached leading full blocks, at most ``num_tokens - 1`` tokens, as the last is computed for
    # its logits (``vllm/v1/core/kv_cache_manager.py`` 0.33.0 ~295-306). No block is ever evicted.
    def block_hashes(self, token_ids: list[int]) -> list[int]:
        """One hash per full block, chained over the prefix (``vllm/v1/core/kv_cache_utils.py``)."""
        hashes, parent = [], None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(token_ids[start : start + self.block_size])))
            hashes.append(parent)
        return hashes

    def num_cached_tokens(self, request: Request) -> int:
        """The tokens of a new request the prefix cache already holds (0 with prefix caching off)."""
        if not self.enable_prefix_caching:
            return 0
        hashes = self.block_hashes(request.all_token_ids[: request.num_tokens - 1])
        hits = next((i for i, h in enumerate(hashes) if h not in self.cached_block_hashes), len(hashes))
        return hits * self.block_size  # the leading blocks up to the first one not cached

    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then waiting ones, within the budgets."""
        new, cached, finished = [], CachedRequestData(), self.finished_req_ids
        output = SchedulerOutput(new, cached, {}, 0, {}, {}, finished, self.num_spec_tokens, self._num_steps)
        budget, prefill_scheduled = self.max_num_batched_tokens, False
        for request in self.running:
            if budget <= 0:
                break
            n, drafts = self._schedule_running(request, budget)
            if n == 0:
                continue
            output.scheduled_cached_reqs.req_ids.append(request.request_id)
            output.scheduled_cached_reqs.num_computed_tokens.append(request.num_computed_tokens)
            prefill_scheduled |= request.is_prefill_chunk  # a running request's prefill chunk is in this step
            budget -= n
            self._add(output, request, n, drafts, len(drafts) if self.drafts_are_placeholders else 0)
            request.spec_token_ids = []
        self._schedule_waiting(output, budget, prefill_scheduled)
        output.total_num_scheduled_tokens = sum(output.num_scheduled_tokens.values())
        self._num_steps += 1
        if output.num_scheduled_tokens:  # a step without tokens never runs, so no output comes back for it
            self._steps_in_flight[output.step_id] = set(output.num_scheduled_tokens)
        self._update_after_schedule(output)
        return output

    def _schedule_waiting(self, output: SchedulerOutput, budget: int, prefill_scheduled: bool) -> None:
        """vLLM's waiting loop: admit new requests (prefills, chunked to the budget) while there is room."""
        running_scheduled = bool(output.num_scheduled_tokens)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            computed = request.num_computed_tokens or self.num_cached_tokens(request)
            n = request.num_tokens - computed
            padded = self._pads_new_decode(request, computed, running_scheduled, prefill_scheduled)
            if padded:
                n = 1 + self.num_spec_tokens
                if n > budget:
                    break  # as vLLM: rather not schedule it than schedule it unpadded
            n = min(n, budget)
            self.waiting.pop(0)
            request.num_computed_tokens = computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled_new_reqs.append(
                NewRequestData(
                    request.request_id, list(request.prompt_token_ids), request.sampling_params, computed
                )
            )
            drafts = [self.placeholder_token_id] * self.num_spec_tokens if padded else []
            self._add(output, request, n, drafts, len(drafts))
            budget -= n

    @staticmethod
    def _add(output: SchedulerOutput, request: Request, n: int, drafts: list[int], num_placeholders: int):
        output.num_scheduled_tokens[request.request_id] = n
        if drafts:
            output.scheduled_spec_decode_tokens[request.request_id] = list(drafts)
            output.num_placeholder_spec_tokens[request.request_id] = num_placeholders

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Scheduled tokens count as computed until ``update_from_output`` rolls back rejected drafts."""
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += n
            request.is_prefill_chunk = (
                request.num_computed_tokens < request.num_tokens + request.num_output_placeholders
            )
            if self.enable_prefix_caching:  # vLLM's allocate_slots caches min(computed, num_tokens) (~621)
                computed = request.all_token_ids[: request.num_computed_tokens]  # stops at num_tokens
                self.cached_block_hashes.update(self.block_hashes(computed))
        self.finished_req_ids = set()

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output) -> list[Request]:
        """Append sampled tokens, roll back rejected drafts, return (and free) the requests that finished."""
        filled = model_runner_output.num_filled_spec_tokens
        generated_by_req = self._check_output(scheduler_output, model_runner_output)
        self._steps_in_flight.pop(scheduler_output.step_id, None)
        finished: list[Request] = []
        for req_id, generated in generated_by_req.items():
            request = self.requests.get(req_id)
            if request is None:  # freed while this step was in flight (async): dropped, as vLLM does
                continue
            spec = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if spec and generated:
                num_accepted = len(generated) - 1
                num_rejected = len(spec) - num_accepted
                request.num_computed_tokens -= num_rejected
                if request.num_output_placeholders > 0:
                    request.num_output_placeholders -= num_rejected
                num_pad = scheduler_output.num_placeholder_spec_tokens.get(req_id, 0) - filled.get(req_id, 0)
                self.spec_decoding_stats.observe(len(spec), num_pad, num_accepted)
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= len(generated)
            room = request.sampling_params.max_tokens - len(request.output_token_ids)
            request.output_token_ids.extend(generated[:room])
            if len(request.output_token_ids) >= request.sampling_params.max_tokens:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(request)
                del self.requests[req_id]
                self.finished_req_ids.add(req_id)
                finished.append(request)
        return finished

    def _check_output(self, scheduler_output: SchedulerOutput, model_runner_output) -> dict[str, list[int]]:
        """Each scheduled request's sampled ids, all checked before any request is touched."""
        if not isinstance(scheduler_output, SchedulerOutput):
            raise TypeError(
                f"scheduler_output must be a SchedulerOutput, got {type(scheduler_output).__name__}"
            )
        if scheduler_output.num_scheduled_tokens and scheduler_output.step_id not in self._steps_in_flight:
            raise ValueError(
                f"scheduler_output (step_id {scheduler_output.step_id}) is not a step of this scheduler "
                "still in flight: its output was delivered already, or another scheduler made it"
            )
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        missing = [r for r in scheduler_output.num_scheduled_tokens if r not in index]
        if missing:
            raise ValueError(f"model_runner_output has no result for scheduled request(s) {missing}")
        generated_by_req = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            name = f"sampled_token_ids of {req_id!r}"
            generated = check_token_ids(name, list(sampled[index[req_id]]), self.vocab_size)
            most = 1 + len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
            if len(generated) > most:
                raise ValueError(
                    f"{name} has {len(generated)} ids, but the step verified "
                    f"{most - 1} drafts: at most 1 + {most - 1} = {most}"
                )
            generated_by_req[req_id] = generated
        return generated_by_req

    def update_draft_token_ids(self, draft_token_ids) -> None:
        """Store ``DraftTokenIds`` for the next step; drop those of finished or prefilling ones (vLLM)."""
        req_ids, drafts = draft_token_ids.req_ids, draft_token_ids.draft_token_ids
        if len(req_ids) != len(drafts):
            raise ValueError(f"draft_token_ids has {len(req_ids)} req_ids but {len(drafts)} draft lists")
        checked = [check_token_ids(f"draft_token_ids[{i}]", d, self.vocab_size) for i, d in enumerate(drafts)]
        for req_id, ids in zip(req_ids, checked, strict=True):
            request = self.requests.get(req_id)
            if request is not None:
                request.spec_token_ids = [] if request.is_prefill_chunk else ids


class AsyncScheduler(Scheduler):
    """vLLM's ``AsyncScheduler``: plans step N + 1 before step N's drafts exist, so it schedules ``[-1] * k``;
    the runner writes its proposals over them (a request absent from step N keeps its ``-1``)."""

    drafts_are_placeholders = True  # set after the request's last step

    def update_draft_token_ids(self, draft_token_ids) -> None:
        raise RuntimeError(
            "AsyncScheduler takes no drafts: under async scheduling the model runner writes its own "
            "proposals over the placeholders (vLLM's engine core calls update_draft_token_ids only when "
            "scheduling is synchronous)"
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        # vLLM's name; every request shares this one list, sized by the step's (dynamic) k
        placeholders = [self.placeholder_token_id] * scheduler_output.num_spec_tokens_to_schedule
        self._spec_token_placeholders, spec = placeholders, scheduler_output.scheduled_spec_decode_tokens
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if not request.is_prefill_chunk:
                request.num_output_placeholders += 1 + len(spec.get(req_id, ()))
                request.spec_token_ids = placeholders
