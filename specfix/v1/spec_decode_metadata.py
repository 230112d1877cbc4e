"""Where each request's draft tokens sit in a batch, and which logits rows verify them.

Mirrors vLLM 0.33.0's ``vllm/v1/spec_decode/metadata.py``. Request i's k_i drafts get k_i + 1 logits rows:
row j < k_i verifies draft j, row k_i yields the bonus token. ``draft_token_ids`` keeps the ``-1``
placeholders verbatim: the rejection sampler must see them to reject them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfix.checks import check_id_tensor, is_int
from specfix.v1 import device_checks


def _cumsum(values: list[int], device: torch.device | str) -> torch.Tensor:
    return device_checks.to_device(torch.tensor(values, dtype=torch.int64).cumsum(0).to(torch.int32), device)


@dataclass
class SpecDecodeMetadata:
    """One step's speculative-decoding layout for B requests (shapes as in vLLM)."""

    draft_token_ids: torch.Tensor  # [sum k_i] int32, request by request; may hold -1
    num_draft_tokens: list[int]  # [B] k_i, 0 for a request without drafts
    cu_num_draft_tokens: torch.Tensor  # [B] int32, inclusive cumsum of k_i (no leading 0)
    cu_num_sampled_tokens: torch.Tensor  # [B] int32, inclusive cumsum of k_i + 1
    target_logits_indices: torch.Tensor  # [sum k_i] the compact logits row verifying each draft
    bonus_logits_indices: torch.Tensor  # [B] the compact logits row of each bonus token
    logits_indices: torch.Tensor  # [sum k_i + B] token-stream positions whose logits are computed
    max_spec_len: int = field(init=False)  # max k_i; the output has max_spec_len + 1 columns

    def __post_init__(self) -> None:
        k = self.num_draft_tokens
        if not isinstance(k, (list, tuple)) or not all(is_int(n) for n in k):
            raise TypeError(f"num_draft_tokens must be a list of ints, got {k!r}")
        if len(k) == 0:
            raise ValueError("num_draft_tokens is empty: a batch needs at least one request")
        if min(k) < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {list(k)}")
        batch, total = len(k), sum(k)
        check_id_tensor("draft_token_ids", self.draft_token_ids, total)
        check_id_tensor("cu_num_draft_tokens", self.cu_num_draft_tokens, batch)
        check_id_tensor("cu_num_sampled_tokens", self.cu_num_sampled_tokens, batch)
        check_id_tensor("target_logits_indices", self.target_logits_indices, total)
        check_id_tensor("bonus_logits_indices", self.bonus_logits_indices, batch)
        check_id_tensor("logits_indices", self.logits_indices, total + batch)
        self.num_draft_tokens = list(k)
        self.max_spec_len = max(k, default=0)
        if not device_checks.wanted(self.cu_num_draft_tokens, self.cu_num_sampled_tokens):
            return  # reading GPU tensors back is a host sync: checked only under device_checks
        expected_cu = torch.tensor(k, dtype=torch.int64).cumsum(0).tolist()
        expected_cu_sampled = [c + i + 1 for i, c in enumerate(expected_cu)]
        cu = self.cu_num_draft_tokens
        got_cu, got_cu_sampled = torch.stack(
            [cu.long(), self.cu_num_sampled_tokens.to(cu.device).long()]
        ).tolist()
        if got_cu != expected_cu:
            raise ValueError(
                f"cu_num_draft_tokens must be the inclusive cumsum of num_draft_tokens {expected_cu}, "
                f"got {got_cu}"
            )
        if got_cu_sampled != expected_cu_sampled:
            raise ValueError(
                "cu_num_sampled_tokens must be the inclusive cumsum of num_draft_tokens + 1 "
                f"{expected_cu_sampled}, got {got_cu_sampled}"
            )

    @property
    def batch_size(self) -> int:
        return len(self.num_draft_tokens)

    @classmethod
    def make_dummy(
        cls, draft_token_ids: list[list[int]], device: torch.device | str = "cpu"
    ) -> SpecDecodeMetadata:
        """Metadata for per-request drafts with compact logits (unlike vLLM's zeroed indices), so
        ``RejectionSampler.forward`` takes ``sum k_i + B`` logits rows directly."""
        if not isinstance(draft_token_ids, (list, tuple)) or not all(
            isinstance(row, (list, tuple)) for row in draft_token_ids
        ):
            raise TypeError("draft_token_ids must be a list of lists of ints (one list per request)")
        flat = [t for row in draft_token_ids for t in row]
        if not all(is_int(t) for t in flat):
            raise TypeError(f"draft_token_ids must hold ints, got {flat!r}")
        if any(t < -1 for t in flat):
            raise ValueError(f"draft_token_ids must be token ids or -1 (a placeholder), got {flat!r}")
        k = [len(row) for row in draft_token_ids]
        batch, total = len(k), len(flat)
        cu_sampled = torch.tensor([n + 1 for n in k], dtype=torch.int64).cumsum(0)
        sampled_start = (cu_sampled - torch.tensor(k) - 1).tolist()
        target = [start + j for start, n in zip(sampled_start, k, strict=True) for j in range(n)]
        return cls(
            draft_token_ids=device_checks.to_device(torch.tensor(flat, dtype=torch.int32), device),
            num_draft_tokens=k,
            cu_num_draft_tokens=_cumsum(k, device),
            cu_num_sampled_tokens=device_checks.to_device(cu_sampled.to(torch.int32), device),
            target_logits_indices=device_checks.to_device(torch.tensor(target, dtype=torch.int32), device),
            bonus_logits_indices=device_checks.to_device((cu_sampled - 1).to(torch.int32), device),
            logits_indices=torch.arange(total + batch, dtype=torch.int32, device=device),
        )
