"""The verification kernels of the V1 rejection sampler: greedy and random, each with its torch twin.

Mirrors the two kernels of vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py``: one program per request
walks its drafts. Each launcher's torch branch restates its kernel, tied bit for bit by the tests.
"""

from __future__ import annotations

import torch

from specfix import runtime
from specfix.runtime import HAS_TRITON, launch, tl, triton

#: Fills the output past each request's last token, and marks a draft slot the drafter left empty.
PLACEHOLDER_TOKEN_ID = -1
#: Lanes that cover one output row, ``max_spec_len + 1 <= MAX_SPEC_LEN + 1`` columns (a kernel constant,
#: so one compilation still serves every k).
_ROW_BLOCK = 256
_BACKENDS = ("auto", "triton", "torch")


def _use_triton(backend: str, device: torch.device | None = None) -> bool:
    """Whether to launch the Triton kernel: on CUDA tensors, or anywhere under Triton's interpreter."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    usable = HAS_TRITON and (runtime.INTERPRET or device is None or device.type == "cuda")
    if backend == "triton" and not usable:
        raise RuntimeError(
            f"backend='triton' cannot run here (triton installed: {HAS_TRITON}, tensors on {device}, "
            f"interpreter: {runtime.INTERPRET}); use backend='torch' or move the tensors to the GPU"
        )
    return usable


# The verification kernels run one program per request, which walks its drafts (grid (B,)).
@triton.jit
def _fill_row_tail(row_ptr, last, max_spec_len, ROW: tl.constexpr):
    """PLACEHOLDER_TOKEN_ID in columns ``last + 1 .. max_spec_len`` of one output row: with every row
    written whole, the output needs no fill kernel before the verification kernels."""
    cols = tl.arange(0, ROW)
    tl.store(row_ptr + cols, tl.full([ROW], -1, tl.int32), mask=(cols > last) & (cols <= max_spec_len))


@triton.jit(do_not_specialize=["max_spec_len"])
def rejection_greedy_sample_kernel(
    output_token_ids_ptr,  # [B, max_spec_len + 1] int32
    cu_num_draft_tokens_ptr,  # [B] int32, inclusive
    draft_token_ids_ptr,  # [T] int32
    target_argmax_ptr,  # [T] int32 or int64
    bonus_token_ids_ptr,  # [B] int32 or int64
    is_greedy_ptr,  # [B] bool (ignored unless HAS_IS_GREEDY)
    max_spec_len,  # a runtime int: one compilation serves every k
    HAS_IS_GREEDY: tl.constexpr,
    ROW: tl.constexpr,  # a power of 2 >= max_spec_len + 1
):
    """Emit the target argmax until a draft differs from it: a -1 draft never equals one."""
    req_idx = tl.program_id(0)
    active = True
    if HAS_IS_GREEDY:
        active = tl.load(is_greedy_ptr + req_idx)
    if active:
        start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
        num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
        row_ptr = output_token_ids_ptr + req_idx * (max_spec_len + 1)
        rejected = False
        last = num_draft  # the row's last token: the bonus, or the first rejection's
        # Loop to the static bound, not to the loaded count (interpreter: see specfix.runtime).
        for pos in range(max_spec_len):
            if not rejected and pos < num_draft:
                draft = tl.load(draft_token_ids_ptr + start + pos)
                target = tl.load(target_argmax_ptr + start + pos)
                tl.store(row_ptr + pos, target)
                if draft != target:
                    rejected = True
                    last = pos
        if not rejected:
            tl.store(row_ptr + num_draft, tl.load(bonus_token_ids_ptr + req_idx))
        _fill_row_tail(row_ptr, last, max_spec_len, ROW)


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    *,
    backend: str = "auto",
) -> None:
    """Write the greedy rows of ``output_token_ids`` in place, whole: emit the argmax at every position up
    to the first draft that differs from it, the bonus if none differs (Triton kernel or torch twin). Like
    vLLM's kernels it trusts its inputs, ``0 <= max_spec_len <= MAX_SPEC_LEN`` included (``rejection_sample``
    checks them)."""
    if not _use_triton(backend, output_token_ids.device):
        accepted = draft_token_ids.long() == target_argmax.long()
        _write_rows(
            output_token_ids, cu_num_draft_tokens, accepted, target_argmax, bonus_token_ids, is_greedy
        )
        return
    launch(
        rejection_greedy_sample_kernel,
        (output_token_ids.shape[0],),
        output_token_ids,
        _as(cu_num_draft_tokens, torch.int32),
        _as(draft_token_ids, torch.int32),
        target_argmax.contiguous(),  # argmax's int64 as it comes: a conversion would cost a launch
        bonus_token_ids.contiguous(),  # any int dtype: the store converts it
        is_greedy if is_greedy is not None else output_token_ids,  # dummy pointer when every row is greedy
        max_spec_len,
        HAS_IS_GREEDY=is_greedy is not None,
        ROW=_ROW_BLOCK,
    )


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous ``dtype`` tensor, checked on the host first: a no-op ``.to`` costs a dispatch."""
    return t if t.dtype == dtype and t.is_contiguous() else t.to(dtype).contiguous()


@triton.jit
def _best_split_token(keys_ptr, token_idx, num_splits, SPLITS: tl.constexpr):
    """The recovered token of one draft from its ``num_splits`` split keys (``specfix.v1.recovered_tokens``):
    the largest key holds the best score, then the lowest column."""
    s = tl.arange(0, SPLITS)
    keys = tl.load(keys_ptr + token_idx * num_splits + s, mask=s < num_splits, other=-1)
    return (2147483647 - (tl.max(keys, axis=0) & 0xFFFFFFFF)).to(tl.int32)


@triton.jit(do_not_specialize=["max_spec_len"])
def rejection_random_sample_kernel(
    output_token_ids_ptr,  # [B, max_spec_len + 1] int32
    cu_num_draft_tokens_ptr,  # [B] int32, inclusive
    draft_token_ids_ptr,  # [T] int32
    draft_probs_ptr,  # [T, V] float32 (ignored when NO_DRAFT_PROBS)
    target_probs_ptr,  # [T, V] float32
    bonus_token_ids_ptr,  # [B] int32 or int64
    recovered_token_ids_ptr,  # [T] int32, or [T, num_splits] int64 split keys when SPLITS > 1
    uniform_probs_ptr,  # [T] float64
    is_greedy_ptr,  # [B] bool (ignored unless HAS_IS_GREEDY)
    max_spec_len,  # a runtime int: one compilation serves every k
    vocab_size,
    num_splits,
    SPLITS: tl.constexpr,  # 1, or a power of 2 >= num_splits: the split keys are reduced here
    NO_DRAFT_PROBS: tl.constexpr,
    HAS_IS_GREEDY: tl.constexpr,
    REJECT_NEGATIVE_DRAFTS: tl.constexpr,
    ROW: tl.constexpr,  # a power of 2 >= max_spec_len + 1
):
    """Accept draft d iff q(d) > 0 and p(d) / q(d) >= u. Without REJECT_NEGATIVE_DRAFTS (vLLM PR #46533)
    d = -1 reads the previous row's last probability at flat offset ``t * V - 1`` and can be accepted."""
    req_idx = tl.program_id(0)
    active = True
    if HAS_IS_GREEDY:
        active = tl.load(is_greedy_ptr + req_idx) == 0
    if active:
        start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
        num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
        row_ptr = output_token_ids_ptr + req_idx * (max_spec_len + 1)
        rejected = False
        last = num_draft  # the row's last token: the bonus, or the first rejection's
        # Loop to the static bound, not to the loaded count (interpreter: see specfix.runtime).
        for pos in range(max_spec_len):
            if not rejected and pos < num_draft:
                token_idx = (start + pos).to(tl.int64)
                draft = tl.load(draft_token_ids_ptr + token_idx)
                u = tl.load(uniform_probs_ptr + token_idx)
                flat = token_idx * vocab_size + draft
                # Unreadable drafts load nothing and are rejected; without the fix the batch's first -1
                # (offset -1, before the tensor: undefined on a GPU) is masked off here too.
                if REJECT_NEGATIVE_DRAFTS:  # [fix]
                    readable = draft >= 0  # [fix]
                else:  # [no fix]
                    readable = flat >= 0  # [no fix]
                p = tl.load(target_probs_ptr + flat, mask=readable, other=0.0)
                if NO_DRAFT_PROBS:
                    accepted = readable & (p.to(tl.float64) >= u)
                else:
                    q = tl.load(draft_probs_ptr + flat, mask=readable, other=0.0)
                    # div_rn: IEEE division like torch's (Triton's `/` is approximate on NVIDIA GPUs).
                    ratio = tl.math.div_rn(p, tl.where(q > 0, q, 1.0))
                    accepted = readable & (q > 0) & (ratio.to(tl.float64) >= u)
                if accepted:
                    token = draft
                else:
                    rejected = True
                    last = pos
                    if SPLITS == 1:
                        token = tl.load(recovered_token_ids_ptr + token_idx)
                    else:  # only a rejected draft needs its recovered token: no reduce kernel
                        token = _best_split_token(recovered_token_ids_ptr, token_idx, num_splits, SPLITS)
                tl.store(row_ptr + pos, token)
        if not rejected:
            tl.store(row_ptr + num_draft, tl.load(bonus_token_ids_ptr + req_idx))
        _fill_row_tail(row_ptr, last, max_spec_len, ROW)


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    *,
    reject_negative_drafts: bool = True,
    backend: str = "auto",
) -> None:
    """Write the random rows of ``output_token_ids`` in place, whole; like vLLM's kernels it trusts its
    inputs, ``0 <= max_spec_len <= MAX_SPEC_LEN`` included (``rejection_sample`` checks them).
    ``recovered_token_ids`` [T, splits] int64: the recovered draw's split keys (Triton only)."""
    if not _use_triton(backend, output_token_ids.device):  # the torch twin, ``-1`` behaviour included
        num_tokens, vocab_size = target_probs.shape
        draft = draft_token_ids.long()
        flat = torch.arange(num_tokens, device=draft.device) * vocab_size + draft
        readable = draft >= 0 if reject_negative_drafts else flat >= 0
        p = _gather_flat(target_probs.float().contiguous(), flat, readable)
        if draft_probs is None:
            accepted = readable & (p.double() >= uniform_probs)
        else:
            q = _gather_flat(draft_probs.float().contiguous(), flat, readable)
            ratio = p / torch.where(q > 0, q, torch.ones_like(q))
            accepted = readable & (q > 0) & (ratio.double() >= uniform_probs)
        emitted = torch.where(accepted, draft, recovered_token_ids.long())
        rows = None if is_greedy is None else ~is_greedy.bool()
        _write_rows(output_token_ids, cu_num_draft_tokens, accepted, emitted, bonus_token_ids, rows)
        return
    num_splits = 1 if recovered_token_ids.dim() == 1 else recovered_token_ids.shape[1]
    target_probs = _as(target_probs, torch.float32)
    launch(
        rejection_random_sample_kernel,
        (output_token_ids.shape[0],),
        output_token_ids,
        _as(cu_num_draft_tokens, torch.int32),
        _as(draft_token_ids, torch.int32),
        _as(draft_probs, torch.float32) if draft_probs is not None else target_probs,
        target_probs,
        bonus_token_ids.contiguous(),  # any int dtype: the store converts it
        _as(recovered_token_ids, torch.int32) if num_splits == 1 else recovered_token_ids.contiguous(),
        uniform_probs.contiguous(),
        is_greedy if is_greedy is not None else output_token_ids,
        max_spec_len,
        target_probs.shape[1],
        num_splits,
        SPLITS=1 << (num_splits - 1).bit_length(),  # the next power of 2, in plain ints
        NO_DRAFT_PROBS=draft_probs is None,
        HAS_IS_GREEDY=is_greedy is not None,
        REJECT_NEGATIVE_DRAFTS=reject_negative_drafts,
        ROW=_ROW_BLOCK,
    )


# The torch twins' parts: vectorised restatements of the kernels, tied to them bit for bit by the tests.


def _write_rows(output_token_ids, cu_num_draft_tokens, accepted, emitted, bonus_token_ids, rows) -> None:
    """Each of the sampler's ``rows`` (a bool mask; None: every row) whole, as the kernels write it: its
    tokens up to its first rejection (``emitted``) included, the bonus when none is rejected, then -1."""
    if rows is None:
        active = torch.ones(output_token_ids.shape[0], dtype=torch.bool, device=output_token_ids.device)
    else:
        active = rows.bool()
    cu = cu_num_draft_tokens.long()
    num_draft = torch.diff(cu, prepend=cu.new_zeros(1))
    num_tokens = accepted.numel()
    req = torch.repeat_interleave(
        torch.arange(cu.numel(), device=cu.device), num_draft, output_size=num_tokens
    )
    pos = torch.arange(num_tokens, device=cu.device) - (cu - num_draft)[req]  # position within the request
    output_token_ids.masked_fill_(active.unsqueeze(1), PLACEHOLDER_TOKEN_ID)
    rejected = (~accepted).long()
    before = torch.cumsum(rejected, 0) - rejected  # rejections before each token, across the batch
    start_of_token = torch.arange(num_tokens, device=req.device) - pos
    before_in_req = before - before[start_of_token]  # ... within its own request
    write = (before_in_req == 0) & active[req]
    output_token_ids[req[write], pos[write]] = emitted[write].to(output_token_ids.dtype)
    rejections_in_req = torch.zeros_like(num_draft).index_add_(0, req, rejected)
    bonus_rows = torch.nonzero(active & (rejections_in_req == 0)).flatten()
    output_token_ids[bonus_rows, num_draft[bonus_rows]] = bonus_token_ids[bonus_rows].to(
        output_token_ids.dtype
    )


def _gather_flat(table: torch.Tensor, flat: torch.Tensor, readable: torch.Tensor) -> torch.Tensor:
    """``table.flatten()[flat]`` where ``readable``, 0.0 elsewhere (a load the kernel masks off)."""
    values = table.reshape(-1)[torch.where(readable, flat, 0)]
    return torch.where(readable, values, torch.zeros_like(values))
