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


def _history(name: str, token_ids: object) -> np.ndarray:
    """One request's committed tokens as an int64 array; they are real tokens, never a -1."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.cpu().numpy()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of token ids, got {type(token_ids).__name__}")
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(
            f"{name} must be a 1-D sequence of int token ids, got dtype {ids.dtype} shape {ids.shape}"
        )
    if ids.size and ids.min() < 0:
        raise ValueError(
            f"{name} must hold token ids >= 0 (committed tokens are never placeholders), got {int(ids.min())}"
        )
    return ids.astype(np.int64)


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

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """Up to k tokens continuing ``token_ids`` (one request's committed tokens); [] if no match."""
        return self._propose(_history("token_ids", token_ids))

    def _propose(self, ids: np.ndarray) -> list[int]:
        """``propose`` on an int64 history the runner has checked."""
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
