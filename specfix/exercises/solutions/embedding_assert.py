"""Reference solutions of chapter 2's exercises (``specfix.exercises.embedding_assert``). Try them first."""

from __future__ import annotations

import torch


def preprocess(input_ids: torch.Tensor, num_tokens: int, num_input_tokens: int,
               draft_token_ids: torch.Tensor) -> torch.Tensor:
    # Clamp everything the embedding reads (the CUDA-graph padding after num_tokens included), in place on the
    # persistent buffer: no allocation, and a captured graph reads this very memory. draft_token_ids is a copy
    # made before this point and keeps its -1, so the rejection sampler still rejects the placeholder.
    return input_ids[:num_input_tokens].clamp_(min=0)


which_ops = {"F.embedding", "torch.index_select", "torch.gather"}  # w[idx] and take wrap -1 around instead

first_bad_op = "probs = self.embed_tokens(input_ids)"  # the only index_select-family lookup fed the raw ids
