"""Model Runner V2's draft slots: what becomes of a scheduler's ``-1`` on vLLM 0.33's default runner.

Mirrors where vLLM 0.33.0's Model Runner V2 (MRV2) treats draft slots unlike the V1 runner:
``RequestState.add_request`` and ``draft_tokens`` (``vllm/v1/worker/gpu/states.py``),
``combine_sampled_and_draft_tokens`` (``vllm/v1/worker/gpu/input_batch.py``), ``gather_draft_sampled``
(``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``) and the runner's write of the draft table
(``vllm/v1/worker/gpu/model_runner.py``); the rest of a step is :mod:`specfix.v1.model_runner`'s.
Read ``GPUModelRunnerV2._prepare_input_ids`` and ``gather_draft_sampled`` first.
"""

from __future__ import annotations

import numpy as np
import torch

from specfix.fixes import Fixes
from specfix.models import NgramLM
from specfix.v1.model_runner import DraftTokenIds, GPUModelRunner, cumsum_and_arange
from specfix.v1.rejection_sampler import PLACEHOLDER_TOKEN_ID
from specfix.v1.scheduler import SchedulerOutput

_DEFAULT_FIXES = Fixes()


# Token 0 is a real token, so vLLM 0.33 marks placeholders -1 again before verification, and the rejection
# sampler rejects them. 0.24.0 and 0.25.0 verify input_ids[logits_indices] as they are, so 0.25's padded
# steps had their zeros judged as drafts, accepted wherever the target agreed (vLLM PR #54137, closed
# unmerged, reported BOS emitted this way on P/D decode nodes). Off, Fixes.mark_placeholder_drafts verifies
# as 0.25's MRV2 did.
def gather_draft_sampled(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    logits_indices: torch.Tensor,  # [num_logits]: row i checks the draft that is row i + 1's token
    expanded_idx_mapping: torch.Tensor,  # [num_logits]: each row's request-state row
    expanded_local_pos: torch.Tensor,  # [num_logits]: 0 for the last committed token, j for draft j
    prefill_len: torch.Tensor,  # [max_num_reqs]
    *,
    fixes: Fixes = _DEFAULT_FIXES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each logits row's input token and position; -1 for drafts of a step starting inside the prefill."""
    token_ids = input_ids[logits_indices.long()]
    pos = positions[logits_indices.long()]
    if fixes.mark_placeholder_drafts:  # [fix]
        local_pos = expanded_local_pos.to(pos.dtype)  # [fix]
        step_start = pos - local_pos  # [fix]
        is_placeholder = (local_pos > 0) & (step_start < prefill_len[expanded_idx_mapping.long()])  # [fix]
        token_ids = torch.where(is_placeholder, PLACEHOLDER_TOKEN_ID, token_ids)  # [fix]
    return token_ids, pos


class GPUModelRunnerV2(GPUModelRunner):
    """specfix's runner with MRV2's draft slots; tables are indexed by input-batch row (``req_state_idx``)."""

    def __init__(self, model: NgramLM, **kwargs):
        super().__init__(model, **kwargs)
        k = self.speculative_config.num_speculative_tokens if self.speculative_config else 0
        rows = self.input_batch.max_num_reqs
        self.draft_tokens = torch.zeros(rows, k, dtype=torch.int64, device=self.device)
        self.prefill_len = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._has_drafts: set[str] = set()  # requests whose table row holds the drafter's proposals

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_states(scheduler_output)
        self._has_drafts -= scheduler_output.finished_req_ids
        for new in scheduler_output.scheduled_new_reqs:  # MRV2's RequestState.add_request
            row = self.input_batch.req_id_to_index[new.req_id]
            self.prefill_len[row] = len(new.prompt_token_ids)
            self.draft_tokens[row].zero_()

    # MRV2 reads scheduled_spec_decode_tokens only for each request's draft *count*; the ids come from the
    # draft table, which the runner writes after every step (vllm/v1/worker/gpu/model_runner.py:
    # req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens) and add_request zeroes (0.24.0, 0.25.0
    # and 0.33.0 alike). So a padded first step (P/D, prefix cache) and, under async scheduling, a request the
    # drafter has not seen yet feed token 0: no -1 reaches the embedding, and MRV2 has no clamp.
    def _prepare_input_ids(
        self, scheduler_output: SchedulerOutput, req_ids: list[str], cu_num_scheduled: np.ndarray
    ) -> dict[str, int]:
        """``combine_sampled_and_draft_tokens``; returns, per request, the placeholders its row filled."""
        self.input_ids.copy_to_gpu(int(cu_num_scheduled[-1]))
        spec = scheduler_output.scheduled_spec_decode_tokens
        filled = {}
        for req_id, end in zip(req_ids, cu_num_scheduled.tolist(), strict=True):
            num_drafts = len(spec.get(req_id, ()))
            if num_drafts:
                row = self.input_batch.req_id_to_index[req_id]
                self.input_ids.gpu[end - num_drafts : end] = self.draft_tokens[row, :num_drafts]
                if req_id in self._has_drafts and scheduler_output.num_placeholder_spec_tokens.get(req_id):
                    filled[req_id] = scheduler_output.num_placeholder_spec_tokens[req_id]
        return filled

    def _prepare_inputs(self, scheduler_output: SchedulerOutput):
        """The V1 runner's inputs, then the drafts to verify from ``gather_draft_sampled``."""
        req_ids, cu_num_scheduled, logits_indices, metadata = super()._prepare_inputs(scheduler_output)
        if metadata is not None:
            rows = [self.input_batch.req_id_to_index[r] for r in req_ids]
            span = np.array(metadata.num_draft_tokens) + 1
            idx = torch.tensor(np.repeat(rows, span), device=self.device)
            local_pos = torch.from_numpy(cumsum_and_arange(span)[1]).to(self.device)
            draft_sampled, _ = gather_draft_sampled(
                self.input_ids.gpu,
                self.positions.gpu,
                logits_indices,
                idx,
                local_pos,
                self.prefill_len,
                fixes=self.fixes,
            )
            metadata.draft_token_ids = draft_sampled[local_pos > 0].to(torch.int32)
        return req_ids, cu_num_scheduled, logits_indices, metadata

    def _preprocess(self, scheduler_output: SchedulerOutput, num_input_tokens: int):
        """No clamp: MRV2's ``input_ids`` hold the draft table's ids, never the scheduler's ``-1``."""
        return self.input_ids.gpu[:num_input_tokens], self.positions.gpu[:num_input_tokens]

    def propose_draft_token_ids(self, req_ids: list[str], sampled: list[list[int]]) -> DraftTokenIds | None:
        """The drafter's proposals, also written into each request's ``draft_tokens`` row, as MRV2 does."""
        drafts = super().propose_draft_token_ids(req_ids, sampled)
        if drafts is not None:
            for req_id, ids in zip(drafts.req_ids, drafts.draft_token_ids, strict=True):
                row = self.input_batch.req_id_to_index[req_id]
                self.draft_tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
                self._has_drafts.add(req_id)
        return drafts
