"""The model runner: scheduler output in, sampled tokens (and next step's drafts) out.

Mirrors vLLM 0.33.0's ``vllm/v1/worker/gpu_model_runner.py`` and the ``CpuGpuBuffer`` of
``vllm/v1/utils.py``: the V1 runner, which 0.24 and 0.25 ran for most MoE models (DeepSeek-V4 among them);
0.33 runs Model Runner V2 by default (:mod:`specfix.mrv2.draft_slots`).

Read ``GPUModelRunner.execute_model`` first: the comment above it walks one step in order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from specfix.fixes import Fixes
from specfix.models import PAD_SLOT_ID, NgramLM
from specfix.mrv2.cudagraph import capture_sizes
from specfix.v1.input_batch import CachedRequestState, InputBatch
from specfix.v1.proposer import DraftModelProposer, NgramProposer
from specfix.v1.rejection_sampler import RejectionSampler
from specfix.v1.sampling_metadata import GREEDY_TEMPERATURE, SamplingMetadata
from specfix.v1.scheduler import SchedulerOutput, check_token_ids
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

_DEFAULT_FIXES = Fixes()


class CpuGpuBuffer:
    """A pinned-style CPU tensor, its numpy view, and a device twin (vLLM 0.33.0 ``vllm/v1/utils.py``)."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device | str):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(size, dtype=dtype, device=device)

    def copy_to_gpu(self, n: int) -> torch.Tensor:
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


@dataclass
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str  # "draft_model" or "ngram"


@dataclass
class ModelRunnerOutput:
    """Per request, the tokens this step produced; ``num_filled_spec_tokens`` (not in vLLM) lets the
    scheduler's statistics count the placeholders async scheduling filled as drafts."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    num_filled_spec_tokens: dict[str, int] = field(default_factory=dict)


@dataclass
class DraftTokenIds:
    req_ids: list[str]
    draft_token_ids: list[list[int]]


@dataclass
class StepTrace:
    """CPU copies of one step's tensors, for teaching and tests (``GPUModelRunner(record=True)``)."""

    req_ids: list[str]
    token_ids_cpu: np.ndarray  # after update_req_spec_token_ids
    input_ids_before_clamp: torch.Tensor  # input_ids.gpu[:num_input_tokens] after _prepare_inputs
    embedding_input: torch.Tensor  # ... after _preprocess: what the embedding receives
    num_scheduled_tokens: list[int]
    spec_decode_metadata: SpecDecodeMetadata | None
    logits: torch.Tensor  # [sum k_i + B, V] rows the sampler sees
    sampler_output: torch.Tensor  # [B, max_spec_len + 1] int32
    sampled_token_ids: list[list[int]]
    scheduler_output: SchedulerOutput | None = None
    num_filled_spec_tokens: dict[str, int] = field(default_factory=dict)  # async: placeholders filled


def cumsum_and_arange(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[2, 5, 3]`` -> ``([2, 7, 10], [0, 1, 0, 1, 2, 3, 4, 0, 1, 2])``."""
    cu = np.cumsum(counts)
    offsets = np.repeat(cu - counts, counts)
    return cu, np.arange(cu[-1] if len(cu) else 0) - offsets


class GPUModelRunner:
    """Runs the target model for a ``SchedulerOutput`` (on CUDA or CPU despite the vLLM name)."""

    #: Not in a failed engine step's snapshot: what a step never changes, and the trace (cut back instead).
    NOT_STEP_STATE = ("model", "drafter", "rejection_sampler", "trace")

    def __init__(
        self,
        model: NgramLM,
        *,
        drafter: DraftModelProposer | NgramProposer | None = None,
        fixes: Fixes = _DEFAULT_FIXES,
        device: torch.device | str = "cpu",
        max_num_reqs: int = 16,
        max_model_len: int = 256,
        max_num_batched_tokens: int = 256,
        cudagraph_capture_sizes: tuple[int, ...] | None = None,
        sampler_backend: str = "auto",
        record: bool = False,
        async_scheduling: bool = False,
    ):
        self.model = model
        self.drafter = drafter
        self.fixes = fixes
        self.device = torch.device(device)
        self.vocab_size = model.vocab_size
        self.max_model_len = max_model_len
        method = "ngram" if isinstance(drafter, NgramProposer) else "draft_model"
        self.speculative_config = SpeculativeConfig(drafter.k, method) if drafter is not None else None
        if cudagraph_capture_sizes is None:  # token counts a FULL graph is captured for, by vLLM 0.33's rule
            cudagraph_capture_sizes = capture_sizes(
                max_num_reqs, drafter.k if drafter else 0, max_num_batched_tokens, v1_runner=True
            )
        self.max_num_tokens = max(max_num_batched_tokens, max(cudagraph_capture_sizes, default=0))
        self.cudagraph_capture_sizes = sorted(cudagraph_capture_sizes)
        self.input_batch = InputBatch(max_num_reqs, max_model_len)
        self.requests: dict[str, CachedRequestState] = {}
        self.input_ids = CpuGpuBuffer(self.max_num_tokens, torch.int32, self.device)
        self.positions = CpuGpuBuffer(self.max_num_tokens, torch.int64, self.device)
        self.slot_mapping = CpuGpuBuffer(self.max_num_tokens, torch.int64, self.device)
        self.kv_cache = model.make_kv_cache(max_num_reqs * max_model_len, self.device)
        self.rejection_sampler = RejectionSampler(fixes, backend=sampler_backend)
        self._draft_token_ids: DraftTokenIds | None = None
        self.use_async_scheduling = async_scheduling
        # Async scheduling: the previous step's proposals, their rows (vLLM: on its InputBatch), counts
        self._prev_draft_token_ids: torch.Tensor | None = None
        self.prev_req_id_to_index: dict[str, int] = {}
        self._prev_num_sampled: list[int] = []
        self._num_filled_spec_tokens: dict[str, int] = {}
        self.record = record
        self.trace: list[StepTrace] = []

    # -- 1. states --------------------------------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        # Check every id before changing anything, so a bad request leaves no other request half-updated.
        for new in scheduler_output.scheduled_new_reqs:
            check_token_ids(f"prompt_token_ids of {new.req_id!r}", new.prompt_token_ids, self.vocab_size)
        for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            check_token_ids(
                f"scheduled_spec_decode_tokens[{req_id!r}]", spec, self.vocab_size, allow_placeholder=True
            )
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
            self.prev_req_id_to_index.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params.seed is not None and not params.is_greedy:
                generator = torch.Generator(device=self.device).manual_seed(params.seed)
            state = CachedRequestState(
                new.req_id,
                list(new.prompt_token_ids),
                params,
                generator,
                num_computed_tokens=new.num_computed_tokens,
            )
            self.requests[new.req_id] = state
            row = self.input_batch.add_request(state)
            if new.num_computed_tokens:
                self._receive_kv(row, new.prompt_token_ids[: new.num_computed_tokens])
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            num_computed -= self._rejected_in_previous_step(req_id)
            self.requests[req_id].num_computed_tokens = num_computed
            self.input_batch.num_computed_tokens_cpu[self.input_batch.req_id_to_index[req_id]] = num_computed
        for req_id in scheduler_output.num_scheduled_tokens:
            self.input_batch.update_req_spec_token_ids(
                self.requests[req_id], scheduler_output.scheduled_spec_decode_tokens
            )

    def _rejected_in_previous_step(self, req_id: str) -> int:
        """Async scheduling: drafts rejected in the previous step, which the scheduler counted as computed."""
        prev_index = self.prev_req_id_to_index.get(req_id)
        if not self.use_async_scheduling or prev_index is None:
            return 0
        num_accepted = self._prev_num_sampled[prev_index] - 1
        return self.requests[req_id].prev_num_draft_len - num_accepted

    def _receive_kv(self, row: int, token_ids: list[int]) -> None:
        """A request whose prompt was prefilled elsewhere (P/D disaggregation): its KV arrives."""
        start = row * self.max_model_len
        self.kv_cache[start : start + len(token_ids)] = torch.tensor(token_ids, device=self.device)

    # -- 2. inputs --------------------------------------------------------------------------------

    def _batch_order(self, scheduler_output: SchedulerOutput) -> list[str]:
        """Scheduled requests in persistent-batch row order (the order of every per-request tensor)."""
        index = self.input_batch.req_id_to_index
        return sorted(scheduler_output.num_scheduled_tokens, key=index.__getitem__)

    def _prepare_inputs(self, scheduler_output: SchedulerOutput):
        """Fill ``input_ids``, ``positions`` and ``slot_mapping``, and say which logits rows to compute."""
        req_ids = self._batch_order(scheduler_output)
        rows = np.array([self.input_batch.req_id_to_index[r] for r in req_ids], dtype=np.int64)
        num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)
        cu_num_scheduled, arange = cumsum_and_arange(num_scheduled)
        total = int(cu_num_scheduled[-1])
        req_indices = np.repeat(rows, num_scheduled)
        positions = self.input_batch.num_computed_tokens_cpu[req_indices] + arange
        token_indices = req_indices * self.max_model_len + positions
        if positions.max() >= self.max_model_len:
            raise ValueError(f"a scheduled position reaches max_model_len={self.max_model_len}")
        torch.index_select(
            self.input_batch.token_ids_cpu_tensor.flatten(),
            0,
            torch.from_numpy(token_indices),
            out=self.input_ids.cpu[:total],
        )
        self.positions.np[:total] = positions
        self.slot_mapping.np[:total] = token_indices  # KV slot = row * max_model_len + position
        self._num_filled_spec_tokens = self._prepare_input_ids(scheduler_output, req_ids, cu_num_scheduled)
        self.positions.copy_to_gpu(total)
        self.slot_mapping.copy_to_gpu(total)

        spec = scheduler_output.scheduled_spec_decode_tokens
        if not spec:
            logits_indices = torch.from_numpy(cu_num_scheduled - 1).to(self.device)
            return req_ids, cu_num_scheduled, logits_indices, None
        num_draft_tokens = np.array([len(spec.get(r, ())) for r in req_ids], dtype=np.int64)
        metadata = self._calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled)
        return req_ids, cu_num_scheduled, metadata.logits_indices, metadata

    def _prepare_input_ids(
        self, scheduler_output: SchedulerOutput, req_ids: list[str], cu_num_scheduled: np.ndarray
    ) -> dict[str, int]:
        """Copy ``input_ids`` to the device and, under async scheduling, scatter the previous step's
        proposals over its placeholders there (the CPU side keeps the scheduler's ``-1``)."""
        self.input_ids.copy_to_gpu(int(cu_num_scheduled[-1]))
        spec = scheduler_output.scheduled_spec_decode_tokens
        if not self.use_async_scheduling or self._prev_draft_token_ids is None or not spec:
            return {}
        width = self._prev_draft_token_ids.shape[1]  # k: a step never schedules more drafts
        dst, src, filled = [], [], {}
        for req_id, end in zip(req_ids, cu_num_scheduled.tolist(), strict=True):
            prev_index = self.prev_req_id_to_index.get(req_id)
            num_drafts = len(spec.get(req_id, ()))
            if prev_index is None or num_drafts == 0:
                continue
            first = end - num_drafts
            dst.extend(range(first, first + num_drafts))
            src.extend(range(prev_index * width, prev_index * width + num_drafts))
            filled[req_id] = num_drafts
        if dst:
            index = torch.tensor(dst, dtype=torch.int64).to(self.device, non_blocking=True)
            source = torch.tensor(src, dtype=torch.int64).to(self.device, non_blocking=True)
            self.input_ids.gpu.index_copy_(0, index, self._prev_draft_token_ids.flatten()[source])
        return filled

    def _calc_spec_decode_metadata(
        self, num_draft_tokens: np.ndarray, cu_num_scheduled_tokens: np.ndarray
    ) -> SpecDecodeMetadata:
        """Where each request's drafts sit and which logits rows verify them; ``draft_token_ids`` is a
        copy, so clamping ``input_ids`` later leaves its ``-1`` alone."""
        num_sampled = num_draft_tokens + 1
        cu_num_sampled, arange = cumsum_and_arange(num_sampled)
        logits_indices = np.repeat(cu_num_scheduled_tokens - num_sampled, num_sampled) + arange
        bonus_logits_indices = cu_num_sampled - 1
        cu_num_draft, arange = cumsum_and_arange(num_draft_tokens)
        target_logits_indices = np.repeat(cu_num_sampled - num_sampled, num_draft_tokens) + arange

        def to_device(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a.astype(np.int32)).to(self.device, non_blocking=True)

        logits_indices_t = to_device(logits_indices)
        target_t = to_device(target_logits_indices)
        draft_token_ids = self.input_ids.gpu[logits_indices_t.long()][target_t.long() + 1]
        return SpecDecodeMetadata(
            draft_token_ids=draft_token_ids,
            num_draft_tokens=[int(k) for k in num_draft_tokens],
            cu_num_draft_tokens=to_device(cu_num_draft),
            cu_num_sampled_tokens=to_device(cu_num_sampled),
            target_logits_indices=target_t,
            bonus_logits_indices=to_device(bonus_logits_indices),
            logits_indices=logits_indices_t,
        )

    def _get_num_input_tokens(self, num_tokens: int) -> int:
        """Pad to the next CUDA-graph capture size (as vLLM's cudagraph dispatcher does). The padded rows
        of ``input_ids`` hold stale ids from earlier steps and write nothing to the KV cache."""
        i = bisect.bisect_left(self.cudagraph_capture_sizes, num_tokens)
        return self.cudagraph_capture_sizes[i] if i < len(self.cudagraph_capture_sizes) else num_tokens

    # -- 3. preprocess ----------------------------------------------------------------------------

    def _preprocess(self, scheduler_output: SchedulerOutput, num_input_tokens: int):
        """The embedding's inputs. vLLM PR #47029: clamp speculative placeholders (-1) to 0 first."""
        if self.speculative_config is not None and self.fixes.clamp_placeholders:  # [fix]
            self.input_ids.gpu[:num_input_tokens].clamp_(min=0)  # [fix]
        return self.input_ids.gpu[:num_input_tokens], self.positions.gpu[:num_input_tokens]

    # -- the step ---------------------------------------------------------------------------------

    def _sampling_metadata(self, req_ids: list[str]) -> SamplingMetadata:
        """Greedy rows get ``GREEDY_TEMPERATURE``, as in vLLM, so no sampler divides by a vanishing T."""
        params = [self.requests[r].sampling_params for r in req_ids]
        temps = [GREEDY_TEMPERATURE if p.is_greedy else p.temperature for p in params]
        all_greedy = all(p.is_greedy for p in params)
        generators = {
            i: self.requests[r].generator
            for i, r in enumerate(req_ids)
            if self.requests[r].generator is not None
        }
        return SamplingMetadata(
            temperature=None if all_greedy else torch.tensor(temps, dtype=torch.float32, device=self.device),
            all_greedy=all_greedy,
            all_random=not any(p.is_greedy for p in params),
            generators=generators,
        )

    @torch.no_grad()
    # One step, in order (chapter 1 follows it):
    # 1. ``_update_states``: drafts, ``-1`` placeholders included, go verbatim into ``token_ids_cpu``.
    # 2. ``_prepare_inputs``: gather the scheduled tokens into ``input_ids`` and build the
    #    ``SpecDecodeMetadata``, whose ``draft_token_ids`` is a copy that keeps the ``-1``.
    # 3. ``_preprocess``: ``Fixes.clamp_placeholders`` (vLLM PR #47029) clamps ``input_ids.gpu`` to >= 0 in
    #    place, so the embedding sees token 0 where the metadata still says ``-1``.
    # 4. The model forward (the embedding first), then ``RejectionSampler``, which rejects every ``-1``.
    # 5. Commit sampled tokens; the drafter proposes for the next step.
    # Async scheduling (vLLM's ``use_async_scheduling``) changes two things, as in vLLM's runner:
    # ``_update_states`` takes off the drafts the previous step rejected (vLLM's ``prev_num_draft_len``),
    # and ``_prepare_input_ids`` scatters the previous proposals over the placeholders; a request absent
    # from the previous step keeps its ``-1`` up to ``_preprocess``.
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        token_table = self.input_batch.token_ids_cpu.copy() if self.record else None
        if not scheduler_output.total_num_scheduled_tokens:
            return ModelRunnerOutput([], {}, [])
        req_ids, cu_num_scheduled, logits_indices, spec_metadata = self._prepare_inputs(scheduler_output)
        num_tokens = int(cu_num_scheduled[-1])
        num_input_tokens = self._get_num_input_tokens(num_tokens)
        self.slot_mapping.gpu[num_tokens:num_input_tokens] = PAD_SLOT_ID
        before_clamp = self.input_ids.gpu[:num_input_tokens].to("cpu", copy=True) if self.record else None

        input_ids, positions = self._preprocess(scheduler_output, num_input_tokens)
        hidden = self.model(input_ids, positions, self.slot_mapping.gpu[:num_input_tokens], self.kv_cache)
        logits = hidden[logits_indices.long()]

        # No separate Sampler: a step without drafts runs the rejection sampler with every k_i = 0.
        metadata = spec_metadata or SpecDecodeMetadata.make_dummy([[] for _ in req_ids], self.device)
        sampler_output = self.rejection_sampler(metadata, None, logits, self._sampling_metadata(req_ids))
        partial_prefill = [
            i
            for i, r in enumerate(req_ids)
            if self.requests[r].num_computed_tokens + scheduler_output.num_scheduled_tokens[r]
            < self.requests[r].num_tokens
        ]
        sampled = RejectionSampler.parse_output(sampler_output, self.vocab_size, partial_prefill)

        for req_id, tokens in zip(req_ids, sampled, strict=True):
            self.requests[req_id].output_token_ids.extend(tokens)
            self.input_batch.append_sampled(req_id, tokens)
        if self.record:
            self.trace.append(
                StepTrace(
                    req_ids=req_ids,
                    token_ids_cpu=token_table,
                    input_ids_before_clamp=before_clamp,
                    embedding_input=input_ids.to("cpu", copy=True),
                    num_scheduled_tokens=np.diff(cu_num_scheduled, prepend=0).tolist(),
                    spec_decode_metadata=spec_metadata,
                    logits=logits.cpu(),
                    sampler_output=sampler_output.to("cpu", copy=True),
                    sampled_token_ids=sampled,
                    scheduler_output=scheduler_output,
                    num_filled_spec_tokens=dict(self._num_filled_spec_tokens),
                )
            )
        self._draft_token_ids = self.propose_draft_token_ids(req_ids, sampled)
        if self.use_async_scheduling:
            self._keep_proposals_on_device(self._draft_token_ids, req_ids, sampled)
        return ModelRunnerOutput(
            req_ids,
            {r: i for i, r in enumerate(req_ids)},
            sampled,
            num_filled_spec_tokens=self._num_filled_spec_tokens,
        )

    def _keep_proposals_on_device(
        self, drafts: DraftTokenIds | None, req_ids: list[str], sampled: list[list[int]]
    ) -> None:
        """Async scheduling: this step's proposals stay on the device, unseen by the scheduler."""
        num_sampled = dict(zip(req_ids, map(len, sampled), strict=True))
        if drafts is None or not drafts.req_ids:
            self._prev_draft_token_ids, self.prev_req_id_to_index, self._prev_num_sampled = None, {}, []
            return
        self._prev_draft_token_ids = torch.tensor(
            drafts.draft_token_ids, dtype=torch.int32, device=self.device
        )
        self.prev_req_id_to_index = {r: i for i, r in enumerate(drafts.req_ids)}
        self._prev_num_sampled = [num_sampled[r] for r in drafts.req_ids]

    def propose_draft_token_ids(self, req_ids: list[str], sampled: list[list[int]]) -> DraftTokenIds | None:
        """Next step's drafts, checked here: under async scheduling they skip the scheduler, and a bad one
        would reach the next step's embedding."""
        if self.drafter is None:
            return None
        ready = [r for r, tokens in zip(req_ids, sampled, strict=True) if tokens]
        batch = self.input_batch
        rows = [batch.req_id_to_index[r] for r in ready]
        proposals = self.drafter.propose_batch(
            [batch.token_ids_cpu[i, : batch.num_tokens_no_spec[i]] for i in rows]
        )
        checked = [
            check_token_ids(f"draft_token_ids[{i}]", d, self.vocab_size) for i, d in enumerate(proposals)
        ]
        # The async fill scatters exactly k per request: vLLM's V1 runner refuses async scheduling with
        # drafters that may propose fewer, such as the n-gram drafter.
        k, exact = self.speculative_config.num_speculative_tokens, self.use_async_scheduling
        bad = [i for i, d in enumerate(checked) if len(d) > k or (exact and len(d) < k)]
        if bad:
            need = "async scheduling needs exactly" if exact else "a step takes at most"
            raise ValueError(
                f"draft_token_ids[{bad[0]}] has {len(checked[bad[0]])} drafts, but {need} k = {k} proposals "
                "per request"
            )
        return DraftTokenIds(ready, checked)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts, self._draft_token_ids = self._draft_token_ids, None
        return drafts
