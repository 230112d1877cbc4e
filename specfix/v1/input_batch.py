"""The model runner's persistent batch: one row per request, token ids kept on the CPU.

Mirrors vLLM 0.33.0's ``vllm/v1/worker/gpu_input_batch.py``, keeping what speculative decoding touches.
Read ``update_req_spec_token_ids``: the scheduler's drafts, ``-1`` included, go *verbatim* into
``token_ids_cpu`` (the runner clamps only its ``input_ids``). Unlike vLLM, rows never move: a new request
takes the lowest free row instead of the batch being condensed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from specfix.checks import is_int
from specfix.v1.sampling_metadata import GREEDY_TEMPERATURE
from specfix.v1.scheduler import SamplingParams, check_token_ids


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

    def __init__(self, max_num_reqs: int, max_model_len: int, vocab_size: int):
        for name, value in [
            ("max_num_reqs", max_num_reqs),
            ("max_model_len", max_model_len),
            ("vocab_size", vocab_size),
        ]:
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # A torch tensor and a numpy view of the same memory, as in vLLM.
        self.token_ids_cpu_tensor = torch.zeros((max_num_reqs, max_model_len), dtype=torch.int32)
        self.token_ids_cpu = self.token_ids_cpu_tensor.numpy()
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        self.temperature_cpu = np.zeros(max_num_reqs, dtype=np.float32)
        self.spec_token_ids: list[list[int]] = [[] for _ in range(max_num_reqs)]
        self.generators: dict[int, torch.Generator] = {}
        self._req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}

    @property
    def req_ids(self) -> list[str]:
        return [r for r in self._req_ids if r is not None]

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, request: CachedRequestState) -> int:
        """Give ``request`` the lowest free row, fill it with its tokens; return the row."""
        if not isinstance(request, CachedRequestState):
            raise TypeError(f"request must be a CachedRequestState, got {type(request).__name__}")
        if not isinstance(request.req_id, str):
            raise TypeError(f"req_id must be a str, got {request.req_id!r}")
        if not isinstance(request.sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(request.sampling_params).__name__}"
            )
        if request.req_id in self.req_id_to_index:
            raise ValueError(f"request {request.req_id!r} is already in the batch")
        if None not in self._req_ids:
            raise ValueError(f"the batch is full (max_num_reqs={self.max_num_reqs})")
        tokens = check_token_ids("prompt_token_ids", request.prompt_token_ids, self.vocab_size)
        tokens += check_token_ids("output_token_ids", request.output_token_ids, self.vocab_size)
        if len(tokens) > self.max_model_len:
            raise ValueError(f"request has {len(tokens)} tokens, over max_model_len={self.max_model_len}")
        computed = request.num_computed_tokens
        if not is_int(computed) or not 0 <= computed <= len(tokens):
            raise ValueError(f"num_computed_tokens must be an int in [0, {len(tokens)}], got {computed!r}")
        index = self._req_ids.index(None)
        self._req_ids[index] = request.req_id
        self.req_id_to_index[request.req_id] = index
        self.token_ids_cpu[index, : len(tokens)] = tokens
        self.num_tokens_no_spec[index] = len(tokens)
        self.num_prompt_tokens[index] = len(request.prompt_token_ids)
        self.num_computed_tokens_cpu[index] = request.num_computed_tokens
        params = request.sampling_params
        self.temperature_cpu[index] = GREEDY_TEMPERATURE if params.is_greedy else params.temperature
        self.spec_token_ids[index] = []
        if request.generator is not None:
            self.generators[index] = request.generator
        return index

    def remove_request(self, req_id: str) -> int | None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._req_ids[index] = None
            self.spec_token_ids[index] = []
            self.generators.pop(index, None)
        return index

    def update_req_spec_token_ids(
        self, request: CachedRequestState, scheduled_spec_tokens: Mapping[str, list[int]]
    ) -> None:
        """This step's drafts become the row's tentative tail, placeholders verbatim (``num_tokens_no_spec``
        does not move)."""
        index = self.req_id_to_index.get(request.req_id)
        if index is None:
            raise ValueError(f"request {request.req_id!r} is not in the batch")
        spec = check_token_ids(
            f"scheduled_spec_tokens[{request.req_id!r}]",
            scheduled_spec_tokens.get(request.req_id, []),
            self.vocab_size,
            allow_placeholder=True,
        )
        start = int(self.num_tokens_no_spec[index])
        if start + len(spec) > self.max_model_len:
            raise ValueError(
                f"{len(spec)} drafts after {start} tokens overflow max_model_len={self.max_model_len}"
            )
        self.spec_token_ids[index].clear()
        request.prev_num_draft_len = len(spec)
        if not spec:
            return
        self.token_ids_cpu[index, start : start + len(spec)] = spec
        self.spec_token_ids[index].extend(spec)

    def append_sampled(self, req_id: str, token_ids: list[int]) -> None:
        """Commit sampled tokens after the row's committed ones (overwriting the tentative drafts)."""
        index = self.req_id_to_index.get(req_id)
        if index is None:
            raise ValueError(f"request {req_id!r} is not in the batch")
        token_ids = check_token_ids(f"sampled tokens of {req_id!r}", token_ids, self.vocab_size)
        start = int(self.num_tokens_no_spec[index])
        end = start + len(token_ids)
        if end > self.max_model_len:
            raise ValueError(
                f"{len(token_ids)} sampled tokens after {start} overflow max_model_len={self.max_model_len}"
            )
        self.token_ids_cpu[index, start:end] = token_ids
        self.num_tokens_no_spec[index] = end
