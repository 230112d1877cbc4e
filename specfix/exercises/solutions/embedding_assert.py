"""Reference solutions of chapter 2's exercises (``specfix.exercises.embedding_assert``). Try them first."""

from __future__ import annotations

import torch


def preprocess(
    input_ids: torch.Tensor, num_tokens: int, num_input_tokens: int, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    # Clamp everything the embedding reads (the CUDA-graph padding after num_tokens included), in place on the
    # persistent buffer: no allocation, and a captured graph reads this very memory. draft_token_ids is a copy
    # made before this point and keeps its -1, so the rejection sampler still rejects the placeholder.
    return input_ids[:num_input_tokens].clamp_(min=0)


which_ops = {"F.embedding", "torch.index_select", "torch.gather"}  # w[idx] and take wrap -1 around instead

first_bad_op = "probs = self.embed_tokens(input_ids)"  # the only index_select-family lookup fed the raw ids


def requests_at(positions, cu_num_tokens, req_ids):
    owners = []
    for p in positions:
        # Request i holds positions cu[i - 1] (0 for i = 0) up to cu[i], excluded: the first i with
        # p < cu[i] owns p. A request of 0 tokens has cu[i] == cu[i - 1] and is skipped by the strict <.
        i = next(i for i, end in enumerate(cu_num_tokens) if p < end)
        owners.append(req_ids[i])
    return owners
