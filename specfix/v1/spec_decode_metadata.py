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

#: each tensor field's length, from (batch B, total drafts sum k_i)
_LENGTH_BY_FIELD = {
    "draft_token_ids": lambda batch, total: total,
    "cu_num_draft_tokens": lambda batch, total: batch,
    "cu_num_sampled_tokens": lambda batch, total: batch,
    "target_logits_indices": lambda batch, total: total,
    "bonus_logits_indices": lambda batch, total: batch,
    "logits_indices": lambda batch, total: total + batch,
}


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
        for name, length in _LENGTH_BY_FIELD.items():
            check_id_tensor(name, getattr(self, name), length(batch, total))
        self.num_draft_tokens = list(k)
        self.max_spec_len = max(k, default=0)
        if not device_checks.wanted(self.cu_num_draft_tokens, self.cu_num_sampled_tokens):
            return  # reading GPU tensors back is a host sync: checked only under device_checks
        cumsum = torch.tensor(k, dtype=torch.int64).cumsum(0)
        cu = self.cu_num_draft_tokens
        got = torch.stack([cu.long(), self.cu_num_sampled_tokens.to(cu.device).long()]).tolist()
        checks = [
            ("cu_num_draft_tokens", "", cumsum.tolist(), got[0]),
            ("cu_num_sampled_tokens", " + 1", (cumsum + torch.arange(1, batch + 1)).tolist(), got[1]),
        ]
        for name, plus, expected, found in checks:
            if found != expected:
                raise ValueError(
                    f"{name} must be the inclusive cumsum of num_draft_tokens{plus} {expected}, got {found}"
                )

    def __setattr__(self, name: str, value) -> None:
        # RejectionSampler.forward trusts what was checked when the metadata was built (no re-check per step),
        # so a tensor set later has its length checked here as __post_init__ does, and the counts stay as
        # built (max_spec_len is set last in __post_init__: its presence means "built")
        if "max_spec_len" in self.__dict__:
            if name in ("num_draft_tokens", "max_spec_len"):
                raise AttributeError(f"{name} is fixed when the metadata is built: build a new one instead")
            if name in _LENGTH_BY_FIELD:
                k = self.num_draft_tokens
                check_id_tensor(name, value, _LENGTH_BY_FIELD[name](len(k), sum(k)))
        super().__setattr__(name, value)

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
        cu_sampled = torch.tensor(k, dtype=torch.int64).add(1).cumsum(0)  # [B] inclusive cumsum of k_i + 1
        target = [end - 1 - n + j for end, n in zip(cu_sampled.tolist(), k, strict=True) for j in range(n)]

        def put(values) -> torch.Tensor:  # an int32 tensor on ``device``, without a blocking copy
            return device_checks.to_device(torch.as_tensor(values).to(torch.int32), device)

        return cls(
            draft_token_ids=put(flat),
            num_draft_tokens=k,
            cu_num_draft_tokens=put(torch.tensor(k, dtype=torch.int64).cumsum(0)),
            cu_num_sampled_tokens=put(cu_sampled),
            target_logits_indices=put(target),
            bonus_logits_indices=put(cu_sampled - 1),
            logits_indices=torch.arange(len(flat) + len(k), dtype=torch.int32, device=device),
        )
