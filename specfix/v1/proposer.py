"""Drafters: propose up to k next tokens per request for the target to verify.

``NgramProposer`` mirrors ``vllm/v1/spec_decode/ngram_proposer.py`` (prompt lookup: find the latest
earlier occurrence of the sequence's last n tokens, n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, and propose the tokens that followed it). It may propose fewer than k tokens, or
none: that is where the scheduler pads with ``-1``.

``DraftModelProposer`` mirrors ``vllm/v1/spec_decode/draft_model.py`` with greedy drafting
(``draft_sample_method="greedy"``): the small draft model is run k times, each time appending its argmax.
It always proposes exactly k tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specfix.models import NgramLM
from specfix.v1.scheduler import check_num_spec_tokens


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 3):
        check_num_spec_tokens(num_speculative_tokens)
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                f"got {prompt_lookup_min}, {prompt_lookup_max}"
            )
        self.k = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """Up to k tokens continuing ``token_ids`` (one request's committed tokens); [] if no match."""
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.prompt_lookup_max, len(ids) - 1), self.prompt_lookup_min - 1, -1):
            suffix = ids[len(ids) - n:]
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return ids[start: start + self.k].tolist()
        return []

    def propose_batch(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        return [self.propose(ids) for ids in token_ids]


class DraftModelProposer:
    def __init__(self, draft_model: NgramLM, num_speculative_tokens: int):
        check_num_spec_tokens(num_speculative_tokens)
        self.model = draft_model
        self.k = num_speculative_tokens

    @torch.no_grad()
    def propose_batch(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """k greedy drafts per request, from each request's committed tokens (one batched pass per step)."""
        drafts: list[list[int]] = [[] for _ in token_ids]
        widths = [min(self.model.order - 1, len(ids)) for ids in token_ids]
        for width in sorted(set(widths)):  # rows of one context width run together
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
            context = torch.cat([context, token], dim=1)[:, -(self.model.order - 1):]
        return torch.cat(drafts, dim=1).tolist()
