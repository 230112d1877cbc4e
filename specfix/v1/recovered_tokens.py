"""The recovered-token draw of the V1 rejection sampler: the Triton kernel, its launcher and its torch twin.

Mirrors ``sample_recovered_tokens`` in vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py``: a rejected
draft is replaced by a draw from the residual ``max(p - q, 0)``. Read ``sample_recovered_tokens`` first.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from specfix import runtime
from specfix.runtime import launch, tl, triton
from specfix.v1.rejection_kernels import _as, _best_split_token, _use_triton
from specfix.v1.sampling_metadata import SamplingMetadata


def _token_to_request(cu_num_tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the request each flat token belongs to, from the inclusive cumulative counts
    (a binary search on the device: no host sync, unlike ``repeat_interleave``, and graph-capturable)."""
    tokens = torch.arange(num_tokens, device=cu_num_tokens.device, dtype=cu_num_tokens.dtype)
    return torch.searchsorted(cu_num_tokens, tokens, right=True)


def _exponential_noise(
    batch_size: int, vocab_size: int, generators: dict[int, torch.Generator], redraw: Sequence | None, device
) -> torch.Tensor:
    """[B, V] Exp(1) noise; seeded rows with ``redraw[i]`` (every seeded row when None) are redrawn from
    their own generator."""
    noise = torch.empty((batch_size, vocab_size), dtype=torch.float32, device=device).exponential_()
    if generators:  # the common unseeded batch skips the sort
        for i, gen in sorted(generators.items()):
            if redraw is None or redraw[i]:
                noise[i].exponential_(generator=gen)
    return noise


#: Programs a recovered-token draw aims for: with fewer draft tokens than this, each token's row is split
#: over several programs, so that a batch of a few requests still keeps the GPU's SMs busy.
RECOVERED_PROGRAMS = 1024
#: Most programs one token's row is split over.
MAX_RECOVERED_SPLITS = 64


def recovered_launch(num_programs: int, vocab_size: int) -> tuple[int, int]:
    """``(BLOCK, splits per token)``: vLLM's one program per token leaves SMs idle at small batches, so
    rows are split (none under the interpreter, whose cost is per program)."""
    if runtime.INTERPRET:
        return min(triton.next_power_of_2(vocab_size), 1 << 16), 1
    return _gpu_launch(num_programs, vocab_size)


@functools.cache
def _gpu_launch(num_programs: int, vocab_size: int) -> tuple[int, int]:
    block = 2048
    if num_programs >= RECOVERED_PROGRAMS:
        return block, 1
    wanted = triton.next_power_of_2(triton.cdiv(RECOVERED_PROGRAMS, num_programs))
    return block, max(1, min(wanted, MAX_RECOVERED_SPLITS, triton.cdiv(vocab_size, block)))


@functools.cache
def _split_geometry(block: int, splits: int, vocab_size: int) -> tuple[int, int, int]:
    """``(BLOCK, columns per split, splits)``, cached: Triton's ``cdiv`` costs microseconds per call."""
    split_size = triton.cdiv(triton.cdiv(vocab_size, splits), block) * block
    return block, split_size, triton.cdiv(vocab_size, split_size)  # every split holds a column


@triton.jit
def sample_recovered_tokens_kernel(
    out_ptr,  # [T] int32 tokens, or [T, num_splits] int64 split keys when num_splits > 1
    cu_num_draft_tokens_ptr,  # [B] int32, inclusive
    draft_token_ids_ptr,  # [T] int32
    draft_probs_ptr,  # [T, V] float32 (ignored when NO_DRAFT_PROBS)
    target_probs_ptr,  # [T, V] float32
    noise_ptr,  # [B, V] float32, Exp(1)
    vocab_size,
    split_size,  # columns per split, a multiple of BLOCK
    num_splits,
    BLOCK: tl.constexpr,
    NO_DRAFT_PROBS: tl.constexpr,
):
    """Program (i, j, s) scores split s of request i's j-th residual, ``residual[v] * (1 / E_i[v])``; ties
    go to the lowest column and nothing is fused, so it matches torch's argmax bit for bit."""
    req_idx = tl.program_id(0)
    pos = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
    num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
    if pos < num_draft:
        token_idx = (start + pos).to(tl.int64)
        draft = tl.load(draft_token_ids_ptr + token_idx)
        row = token_idx * vocab_size
        noise_row = req_idx.to(tl.int64) * vocab_size
        first = split * split_size
        best = tl.full([BLOCK], -1.0, tl.float32)  # every score is >= 0
        best_col = tl.zeros([BLOCK], dtype=tl.int32)
        for offset in range(0, split_size, BLOCK):
            cols = first + offset + tl.arange(0, BLOCK)
            inside = cols < vocab_size
            p = tl.load(target_probs_ptr + row + cols, mask=inside, other=0.0)
            if NO_DRAFT_PROBS:
                residual = tl.where(cols == draft, 0.0, p)  # a -1 draft matches no column
            else:
                q = tl.load(draft_probs_ptr + row + cols, mask=inside, other=0.0)
                residual = tl.maximum(p - q, 0.0)
            e = tl.load(noise_ptr + noise_row + cols, mask=inside, other=1.0)
            score = tl.where(inside, residual * tl.math.div_rn(1.0, e), -1.0)
            better = score > best
            best = tl.where(better, score, best)
            best_col = tl.where(better, cols, best_col)
        top = tl.max(best, axis=0)
        col = tl.min(tl.where(best == top, best_col, vocab_size), axis=0)
        if num_splits == 1:
            tl.store(out_ptr + token_idx, col)
        else:  # top >= 0 (each split holds a column), so its bits sort as the float does
            key = top.to(tl.int32, bitcast=True).to(tl.int64) * 4294967296 + (2147483647 - col)
            tl.store(out_ptr + token_idx * num_splits + split, key)


@triton.jit
def _recovered_tokens_reduce_kernel(output_ptr, split_best_ptr, num_splits, SPLITS: tl.constexpr):
    """Grid (T,): each token's largest split key gives its recovered token (``sample_recovered_tokens``
    only: the rejection path leaves the keys to the random kernel)."""
    token_idx = tl.program_id(0).to(tl.int64)
    tl.store(output_ptr + token_idx, _best_split_token(split_best_ptr, token_idx, num_splits, SPLITS))


def sample_recovered_tokens(
    max_spec_len: int,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    device=None,
    *,
    backend: str = "auto",
    split_keys: bool = False,
) -> torch.Tensor:
    """[num_draft_total] int32 residual draws by the exponential race (``argmax residual / E``); torch draws
    the noise (on ``device``, by default the probabilities'), so a seed gives the same tokens on every
    backend. ``split_keys``: split rows return their [T, splits] int64 keys for the random kernel."""
    num_tokens, vocab_size = target_probs.shape
    device = target_probs.device if device is None else device
    noise = _exponential_noise(
        len(num_draft_tokens), vocab_size, sampling_metadata.generators, num_draft_tokens, device
    )
    if not _use_triton(backend, target_probs.device):  # the torch twin: the first index wins a tie
        if draft_probs is None:  # zero each row's draft entry; a -1 draft writes its column 0 back unchanged
            residual = target_probs.clone()
            column = draft_token_ids.long().clamp_min(0).unsqueeze(-1)
            residual.scatter_(1, column, residual.gather(1, column) * (draft_token_ids < 0).unsqueeze(-1))
        else:
            residual = (target_probs - draft_probs).clamp_min_(0)
        inv_noise = (1.0 / noise)[_token_to_request(cu_num_draft_tokens, num_tokens)]
        return (residual * inv_noise).argmax(dim=-1).to(torch.int32)
    if num_tokens == 0:
        return torch.empty(0, dtype=torch.int32, device=target_probs.device)
    block, split_size, splits = _split_geometry(
        *recovered_launch(len(num_draft_tokens) * max_spec_len, vocab_size), vocab_size
    )
    shape, dtype = ((num_tokens,), torch.int32) if splits == 1 else ((num_tokens, splits), torch.int64)
    out = torch.empty(shape, dtype=dtype, device=target_probs.device)
    target_probs = _as(target_probs, torch.float32)
    launch(
        sample_recovered_tokens_kernel,
        (len(num_draft_tokens), max_spec_len, splits),
        out,
        _as(cu_num_draft_tokens, torch.int32),
        _as(draft_token_ids, torch.int32),
        _as(draft_probs, torch.float32) if draft_probs is not None else target_probs,
        target_probs,
        noise,
        vocab_size,
        split_size,
        splits,
        BLOCK=block,
        NO_DRAFT_PROBS=draft_probs is None,
        num_warps=8,
    )
    if splits == 1 or split_keys:
        return out
    tokens = torch.empty(num_tokens, dtype=torch.int32, device=out.device)
    bound = 1 << (splits - 1).bit_length()  # the next power of 2, in plain ints
    launch(_recovered_tokens_reduce_kernel, (num_tokens,), tokens, out, splits, SPLITS=bound)
    return tokens
