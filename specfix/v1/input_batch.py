"""The model runner's persistent batch: one row per request, token ids kept on the CPU.

Mirrors vLLM 0.33.0's ``vllm/v1/worker/gpu_input_batch.py``, keeping what speculative decoding touches.
Read ``update_req_spec_token_ids``: the scheduler's drafts, ``-1`` included, go *verbatim* into
``token_ids_cpu`` (the runner clamps only its ``input_ids``). Unlike vLLM, rows never move: a new request
takes the lowest free row instead of the batch being condensed. The runner checks every id before it calls
in here (``GPUModelRunner._update_states``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from specfix.v1.scheduler import SamplingParams


@dataclass
class CachedRequestState:
    """What the runner remembers about one request between steps."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    prev_num_draft_len: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    """Rows of per-request state, sized for ``max_num_reqs`` requests of up to ``max_model_len`` tokens."""

    def __init__(self, max_num_reqs: int, max_model_len: int):
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        # A torch tensor and a numpy view of the same memory, as in vLLM.
        self.token_ids_cpu_tensor = torch.zeros((max_num_reqs, max_model_len), dtype=torch.int32)
        self.token_ids_cpu = self.token_ids_cpu_tensor.numpy()
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        self.spec_token_ids: list[list[int]] = [[] for _ in range(max_num_reqs)]
        self._req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}

    def add_request(self, request: CachedRequestState) -> int:
        if None not in self._req_ids:
            raise ValueError(f"the batch is full (max_num_reqs={self.max_num_reqs})")
        tokens = request.prompt_token_ids + request.output_token_ids
        index = self._req_ids.index(None)
        self._req_ids[index] = request.req_id
        self.req_id_to_index[request.req_id] = index
        self.token_ids_cpu[index, : len(tokens)] = tokens
        self.num_tokens_no_spec[index] = len(tokens)
        self.num_computed_tokens_cpu[index] = request.num_computed_tokens
        self.spec_token_ids[index] = []
        return index

    def remove_request(self, req_id: str) -> int | None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._req_ids[index] = None
            self.spec_token_ids[index] = []
        return index

    def update_req_spec_token_ids(
        self, request: CachedRequestState, scheduled_spec_tokens: Mapping[str, list[int]]
    ) -> None:
        """This step's drafts, placeholders verbatim, become the row's tentative tail."""
        index = self.req_id_to_index[request.req_id]
        spec = scheduled_spec_tokens.get(request.req_id, [])
        start = int(self.num_tokens_no_spec[index])
        self.token_ids_cpu[index, start : start + len(spec)] = spec
        self.spec_token_ids[index] = list(spec)
        request.prev_num_draft_len = len(spec)

    def append_sampled(self, req_id: str, token_ids: list[int]) -> None:
        """Commit sampled tokens after the row's committed ones (overwriting the tentative drafts)."""
        index = self.req_id_to_index[req_id]
        start = int(self.num_tokens_no_spec[index])
        self.token_ids_cpu[index, start : start + len(token_ids)] = token_ids
        self.num_tokens_no_spec[index] = start + len(token_ids)
