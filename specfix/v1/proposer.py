"""Drafters: propose up to k next tokens per request for the target to verify.

``NgramProposer`` mirrors vLLM 0.33.0's ``vllm/v1/spec_decode/ngram_proposer.py`` (prompt lookup, the
earliest longest match, defaults from 0.33.0's ``vllm/config/speculative.py``): it may propose fewer than k
tokens, and the scheduler then verifies only those. ``DraftModelProposer`` mirrors vLLM 0.33.0's
``vllm/v1/spec_decode/draft_model.py`` with greedy drafting: always exactly k tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specfix.checks import check_count
from specfix.models import NgramLM
from specfix.v1.scheduler import check_num_spec_tokens


class NgramProposer:
    def __init__(
        self,
        num_speculative_tokens: int,
        prompt_lookup_min: int = 5,
        prompt_lookup_max: int = 5,
        max_model_len: int | None = None,
    ):
        check_num_spec_tokens(num_speculative_tokens)
        check_count("prompt_lookup_min", prompt_lookup_min)
        check_count("prompt_lookup_max", prompt_lookup_max, low=prompt_lookup_min)
        if max_model_len is not None:
            check_count("max_model_len", max_model_len)
        self.k = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self.max_model_len = max_model_len

    def _propose(self, ids: np.ndarray) -> list[int]:
        """Up to k tokens continuing one request's committed tokens (the runner checked them); [] if none."""
        k = self.k if self.max_model_len is None else min(self.k, self.max_model_len - len(ids))
        if k <= 0:  # no draft may reach past max_model_len
            return []
        for n in range(min(self.prompt_lookup_max, len(ids) - 1), self.prompt_lookup_min - 1, -1):
            suffix = ids[len(ids) - n :]
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n  # the earliest occurrence, as vLLM's
                return ids[start : start + k].tolist()
        return []

    def propose_batch(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        return [self._propose(np.asarray(ids, dtype=np.int64)) for ids in token_ids]


class DraftModelProposer:
    def __init__(self, draft_model: NgramLM, num_speculative_tokens: int):
        check_num_spec_tokens(num_speculative_tokens)
        if not isinstance(draft_model, NgramLM):
            raise TypeError(f"draft_model must be a specfix.models.NgramLM, got {type(draft_model).__name__}")
        self.model = draft_model
        self.k = num_speculative_tokens

    @torch.no_grad()
    def propose_batch(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """k greedy drafts per request (rows never empty), one batched pass per context width."""
        drafts: list[list[int]] = [[] for _ in token_ids]
        widths = [min(self.model.order - 1, len(ids)) for ids in token_ids]
        for width in sorted(set(widths)):
            rows = [i for i, w in enumerate(widths) if w == width]
            for i, row in zip(rows, self._propose_greedy([token_ids[i][-width:] for i in rows]), strict=True):
                drafts[i] = row
        return drafts

    def _propose_greedy(self, contexts: list[Sequence[int]]) -> list[list[int]]:
        context = torch.tensor([list(c) for c in contexts], device=self.model.embed_tokens.weight.device)
        drafts = []
        for _ in range(self.k):
            token = self.model.next_token_logits(context).argmax(dim=-1, keepdim=True)
            drafts.append(token)
            context = torch.cat([context, token], dim=1)[:, -(self.model.order - 1) :]
        return torch.cat(drafts, dim=1).tolist()
