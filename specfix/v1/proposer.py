"""Drafters: propose up to k next tokens per request for the target to verify.

``NgramProposer`` mirrors ``vllm/v1/spec_decode/ngram_proposer.py`` (prompt lookup: find the latest
earlier occurrence of the sequence's last n tokens, n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, and propose the tokens that followed it). It may propose fewer than k tokens, or
none when nothing matches; the scheduler then verifies only the drafts it has.

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


def _history(name: str, token_ids: object) -> np.ndarray:
    """One request's committed tokens as an int64 array; they are real tokens, never a -1."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.cpu().numpy()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of token ids, got {type(token_ids).__name__}")
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be a 1-D sequence of int token ids, got dtype {ids.dtype} "
                        f"shape {ids.shape}")
    if ids.size and ids.min() < 0:
        raise ValueError(f"{name} must hold token ids >= 0 (committed tokens are never placeholders), "
                         f"got {int(ids.min())}")
    return ids.astype(np.int64)


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 3):
        check_num_spec_tokens(num_speculative_tokens)
        for name, value in (("prompt_lookup_min", prompt_lookup_min),
                            ("prompt_lookup_max", prompt_lookup_max)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
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
        ids = _history("token_ids", token_ids)
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
        if not isinstance(draft_model, NgramLM):
            raise TypeError(f"draft_model must be a specfix.models.NgramLM, got {type(draft_model).__name__}")
        self.model = draft_model
        self.k = num_speculative_tokens

    @torch.no_grad()
    def propose_batch(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """k greedy drafts per request, from each request's committed tokens (one batched pass per step)."""
        for i, ids in enumerate(token_ids):
            history = _history(f"token_ids[{i}]", ids)
            if history.size == 0 or history.max() >= self.model.vocab_size:
                raise ValueError(f"token_ids[{i}] must be a non-empty history of ids in "
                                 f"[0, vocab_size={self.model.vocab_size})")
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
