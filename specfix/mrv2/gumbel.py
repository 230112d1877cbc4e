"""Masked Gumbel-max sampling in Triton: Model Runner V2's sampler, with and without the -1 row fix.

Mirrors ``vllm/v1/worker/gpu/sample/gumbel.py`` (``gumbel_block_argmax``, ``_gumbel_sample_kernel``,
``gumbel_sample``) as of vLLM 0.33. PR #47066 (first released in 0.25): a row whose ``expanded_idx_mapping``
entry is negative is padding, so its temperature and seed loads are masked and it never stores into the
draft-logits cache. ``Fixes(mask_invalid_reqs=False)`` compiles the kernel without the masks: padded rows
read ``temperature[-1]``, ``seed[-1]`` and write ``logits_cache[-1, col, :]``, someone else's memory.

Read ``gumbel_sample`` (the launcher) first, then ``gumbel_block_argmax`` (one tile: masks, noise, argmax).
The noise is in ``specfix.mrv2.noise``; ``specfix.mrv2.gumbel_reference`` is the torch twin that defines it.
"""

from __future__ import annotations

import torch

from specfix.fixes import Fixes
from specfix.mrv2 import gumbel_constants as K
from specfix.mrv2 import gumbel_reference as ref
from specfix.mrv2 import noise as N
from specfix.mrv2.gumbel_launch import (  # noqa: F401 (_REGISTER_CAP, launch_config: scripts read them here)
    _REGISTER_CAP,
    _capturing,
    _plan,
    _split_scratch,
    _validate,
    launch_config,
)
from specfix.mrv2.noise import NOISE_MODES, gumbel_noise  # noqa: F401 (re-exported for callers)
from specfix.runtime import HAS_TRITON, launch, tl, triton

_DEFAULT_FIXES = Fixes()


# vLLM 0.33's contract: one loaded tile in, its max and index out; the loop over tiles is the caller's.
# The arguments are 0.33's, in its order, where they carry over (specfix also takes the column as an int,
# with a stride for a 0-d column tensor); the constexprs after them are specfix's switches.
@triton.jit
def gumbel_block_argmax(
    logits,  # [DEPTH, LANES] float32 (vLLM: 1-D); -inf outside the vocabulary
    block,  # the tile's token ids
    mask,  # which lanes lie inside the vocabulary
    token_idx,  # the logit row
    expanded_idx_mapping_ptr,
    temp_ptr,
    seeds_ptr,
    pos_ptr,
    logits_cache_ptr,
    logits_cache_stride_0,
    logits_cache_stride_1,
    logits_cache_col_ptr,
    logits_cache_source_ptr,
    logits_cache_source_stride,
    logits_cache_col,
    logits_cache_col_stride,
    IS_DRAFTING: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
    MASK_INVALID: tl.constexpr,
    NOISE: tl.constexpr,
    USE_ASM: tl.constexpr,
    token_mult=None,  # block * TOKEN_MULT (uint32), where the caller has it for one add per logit
):
    """Max of logits (/ T) + Gumbel noise along the tile's first axis, and its index there (ties to the
    lowest, a NaN never wins); the row's request state is loaded here, under PR #47066's masks."""
    req_state_idx = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    is_valid_req = req_state_idx >= 0
    if MASK_INVALID:  # [fix]
        temp = tl.load(temp_ptr + req_state_idx, mask=is_valid_req, other=0.0)  # [fix]
        seed = tl.load(seeds_ptr + req_state_idx, mask=is_valid_req, other=0)  # [fix]
    else:  # [no fix]
        temp = tl.load(temp_ptr + req_state_idx)  # [no fix]
        seed = tl.load(seeds_ptr + req_state_idx)  # [no fix]
    pos = tl.load(pos_ptr + token_idx).to(tl.int64)
    if IS_DRAFTING:
        pos = pos + K.DRAFT_NOISE_SALT
    if logits_cache_ptr is not None:
        if PER_TOKEN_COL:
            col = tl.load(logits_cache_col_ptr + token_idx * logits_cache_col_stride).to(tl.int64)
        else:
            col = logits_cache_col.to(tl.int64)
        if logits_cache_source_ptr is not None:
            cached = tl.load(
                logits_cache_source_ptr + token_idx * logits_cache_source_stride + block, mask=mask
            )
        else:
            cached = logits  # its float32 values came from the cache's dtype: the store is an exact copy
        # the logits *before* temperature, in the cache's dtype, as vLLM 0.33 (0.25 cached logits / T, fp32)
        cached = cached.to(logits_cache_ptr.dtype.element_ty)
        row_ptr = logits_cache_ptr + req_state_idx * logits_cache_stride_0 + col * logits_cache_stride_1
        # the validity test is per lane (interpreter: see specfix.runtime)
        if MASK_INVALID:  # [fix]
            lane_is_valid = tl.zeros_like(block).to(tl.int64) + req_state_idx >= 0  # [fix]
            tl.store(row_ptr + block, cached, mask=mask & lane_is_valid)  # [fix]
        else:  # [no fix]
            tl.store(row_ptr + block, cached, mask=mask)  # [no fix]
        if NOISE == K.VLLM:
            seed = seed ^ (col << 32)  # vLLM 0.33's spec_step_seed: each drafter column its own stream
    scores = logits  # what the noise is added to
    if APPLY_TEMPERATURE:
        if temp != 0.0:
            if NOISE == K.VLLM:
                scores = logits / temp  # vLLM's division (on the GPU div.full, not rounded as div_rn)
            elif NOISE == K.EXACT:
                scores = tl.math.div_rn(logits, temp)  # IEEE division, torch's: a dozen instructions
    if NOISE == K.VLLM:
        row_state = N._vllm_row_state(seed, pos)
    else:
        key = N._row_key(seed, pos)
        key_mixed = key ^ (key >> 16)
        if token_mult is None:
            token_mult = block.to(tl.uint32) * K.TOKEN_MULT
    if temp != 0.0:  # only T == 0 is greedy: plain logits, no noise
        if NOISE == K.VLLM:
            scores = scores + N._vllm_gumbel(row_state, block)
        elif NOISE == K.FAST:  # in log2 units, logits * log2(e) / T + noise / ln 2: T costs no instruction
            scale = K.LOG2E
            if APPLY_TEMPERATURE:
                scale = K.LOG2E / temp  # once per tile; the logit's multiply by it is rounded once, not twice
            scores = scores * scale + N._fast_gumbel_log2(N._uniform(key_mixed, token_mult), USE_ASM)
        else:
            scores = scores + N._exact_gumbel(N._uniform(key_mixed, token_mult))
        scores = tl.where(mask, scores, float("-inf"))
    index = tl.arange(0, scores.shape[0])
    if len(scores.shape) == 2:  # specfix's tiles: each thread holds whole columns (tile_shape)
        return tl.reduce((scores, tl.broadcast_to(index[:, None], scores.shape)), 0, _first_max)
    else:  # vLLM's 1-D tile, reduced across threads: a maxnum, then the lowest index holding it
        value = tl.max(scores, axis=0)
        return value, tl.min(tl.where(scores == value, index, scores.shape[0]), axis=0)


@triton.jit
def _first_max(value_a, index_a, value_b, index_b):
    """Combine of a column's argmax in three instructions; among equal values the first combined keeps its
    index, the lowest only when combined in order (within a thread; not across a butterfly of shuffles)."""
    value = tl.maximum(value_a, value_b)  # maxnum: a NaN loses to any number
    return value, tl.where(value_a != value, index_b, index_a)  # b's index only where a lost (NaN or smaller)


@triton.jit
def _keep_best(best, best_token, tile_max, tile_argmax, tile_start, lanes, LANES: tl.constexpr):
    """Each column's running best over the tiles: a strict ``>``, so an earlier tile keeps a tie."""
    better = tile_max > best
    token = tile_start + tile_argmax * LANES + lanes
    return tl.where(better, tile_max, best), tl.where(better, token, best_token)


# vLLM 0.33 hands gumbel_block_argmax 1-D tiles of 1,024 logits, one per program, and reduces the
# programs' results with two torch ops. specfix hands it 2-D tiles laid out so that each thread holds
# whole columns (tile_shape): the tile's reduction stays in registers, with no shuffle or barrier per
# tile, and a row is split over several programs whose results the kernel combines itself.
# Sizes are plain runtime values: one compiled kernel serves every vocabulary and batch shape.
@triton.jit(
    do_not_specialize=[
        "col_scalar",
        "vocab_size",
        "num_tiles",
        "num_full_tiles",
        "tiles_per_program",
        "num_splits",
    ]
)
def _gumbel_sample_kernel(
    out_ptr,
    split_best_ptr,
    arrivals_ptr,
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    temperature_ptr,
    seed_ptr,
    pos_ptr,
    cache_ptr,
    cache_stride0,
    cache_stride1,
    col_ptr,
    source_ptr,
    source_stride,
    col_scalar,
    col_stride,
    vocab_size,
    num_tiles,
    num_full_tiles,
    tiles_per_program,
    num_splits,
    IS_DRAFTING: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
    MASK_INVALID: tl.constexpr,
    NOISE: tl.constexpr,
    USE_ASM: tl.constexpr,  # not in vLLM's kernel: inline PTX on the compiled path, off in the interpreter
    LANES: tl.constexpr,
    DEPTH: tl.constexpr,
    SPLITS: tl.constexpr,
    ARRIVE: tl.constexpr,
    STATIC_TILES: tl.constexpr,  # not in vLLM's kernel: the interpreter's static loop bound (0 when compiled)
):
    """Grid (rows, splits): each program keeps a running best per column over its share of the row's tiles,
    then one reduction across the columns; a row's splits meet in ``split_best``."""
    BLOCK: tl.constexpr = DEPTH * LANES  # tile token = tile * BLOCK + d * LANES + lane
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    first_tile = split * tiles_per_program
    end_tile = tl.minimum(first_tile + tiles_per_program, num_tiles)
    full_end = tl.minimum(end_tile, num_full_tiles)
    logits_row_ptr = logits_ptr + row * logits_stride
    lanes = tl.arange(0, LANES)
    offsets = tl.arange(0, DEPTH)[:, None] * LANES + lanes[None, :]
    # the noise hashes token * TOKEN_MULT: the tile's part of it is one scalar, the lanes' part is kept
    offsets_mult = offsets.to(tl.uint32) * K.TOKEN_MULT
    in_vocab = tl.full([DEPTH, LANES], True, tl.int1)  # every lane of a full tile
    best = tl.full([LANES], float("-inf"), tl.float32)
    best_token = first_tile * BLOCK + lanes  # what a program whose scores are all NaN or -inf returns
    if STATIC_TILES > 0:
        # a static bound, the tiles past this program's share skipped (interpreter: see specfix.runtime);
        # same arithmetic in the same order, no prefetch
        for i in range(STATIC_TILES):
            tile = first_tile + i
            if tile < full_end:
                block = tile * BLOCK + offsets
                value, idx = gumbel_block_argmax(
                    tl.load(logits_row_ptr + block).to(tl.float32),
                    block,
                    in_vocab,
                    row,
                    idx_mapping_ptr,
                    temperature_ptr,
                    seed_ptr,
                    pos_ptr,
                    cache_ptr,
                    cache_stride0,
                    cache_stride1,
                    col_ptr,
                    source_ptr,
                    source_stride,
                    col_scalar,
                    col_stride,
                    IS_DRAFTING,
                    APPLY_TEMPERATURE,
                    PER_TOKEN_COL,
                    MASK_INVALID,
                    NOISE,
                    USE_ASM,
                    (tile * BLOCK).to(tl.uint32) * K.TOKEN_MULT + offsets_mult,
                )
                best, best_token = _keep_best(best, best_token, value, idx, tile * BLOCK, lanes, LANES)
    else:
        # Two tiles per turn, each loaded one tile ahead of its use (its latency hides behind the other
        # tile's noise) into its own registers. A tile index past the program's last full tile is
        # clamped to it: in bounds, a cache hit, and a repeat of a tile already seen changes nothing.
        x_even = tl.load(
            logits_row_ptr + first_tile * BLOCK + offsets,
            mask=first_tile * BLOCK + offsets < full_end * BLOCK,
            other=0.0,
        )
        for tile in range(first_tile, full_end, 2):
            odd = tl.minimum(tile + 1, full_end - 1)
            x_odd = tl.load(logits_row_ptr + odd * BLOCK + offsets)
            value, idx = gumbel_block_argmax(
                x_even.to(tl.float32),
                tile * BLOCK + offsets,
                in_vocab,
                row,
                idx_mapping_ptr,
                temperature_ptr,
                seed_ptr,
                pos_ptr,
                cache_ptr,
                cache_stride0,
                cache_stride1,
                col_ptr,
                source_ptr,
                source_stride,
                col_scalar,
                col_stride,
                IS_DRAFTING,
                APPLY_TEMPERATURE,
                PER_TOKEN_COL,
                MASK_INVALID,
                NOISE,
                USE_ASM,
                (tile * BLOCK).to(tl.uint32) * K.TOKEN_MULT + offsets_mult,
            )
            best, best_token = _keep_best(best, best_token, value, idx, tile * BLOCK, lanes, LANES)
            x_even = tl.load(logits_row_ptr + tl.minimum(tile + 2, full_end - 1) * BLOCK + offsets)
            value, idx = gumbel_block_argmax(
                x_odd.to(tl.float32),
                odd * BLOCK + offsets,
                in_vocab,
                row,
                idx_mapping_ptr,
                temperature_ptr,
                seed_ptr,
                pos_ptr,
                cache_ptr,
                cache_stride0,
                cache_stride1,
                col_ptr,
                source_ptr,
                source_stride,
                col_scalar,
                col_stride,
                IS_DRAFTING,
                APPLY_TEMPERATURE,
                PER_TOKEN_COL,
                MASK_INVALID,
                NOISE,
                USE_ASM,
                (odd * BLOCK).to(tl.uint32) * K.TOKEN_MULT + offsets_mult,
            )
            best, best_token = _keep_best(best, best_token, value, idx, odd * BLOCK, lanes, LANES)
    if end_tile > num_full_tiles:  # this program owns the partial last tile
        block = num_full_tiles * BLOCK + offsets
        mask = block < vocab_size
        value, idx = gumbel_block_argmax(
            tl.load(logits_row_ptr + block, mask=mask, other=float("-inf")).to(tl.float32),
            block,
            mask,
            row,
            idx_mapping_ptr,
            temperature_ptr,
            seed_ptr,
            pos_ptr,
            cache_ptr,
            cache_stride0,
            cache_stride1,
            col_ptr,
            source_ptr,
            source_stride,
            col_scalar,
            col_stride,
            IS_DRAFTING,
            APPLY_TEMPERATURE,
            PER_TOKEN_COL,
            MASK_INVALID,
            NOISE,
            USE_ASM,
            (num_full_tiles * BLOCK).to(tl.uint32) * K.TOKEN_MULT + offsets_mult,
        )
        best, best_token = _keep_best(best, best_token, value, idx, num_full_tiles * BLOCK, lanes, LANES)
    value = tl.max(best, axis=0)
    token = tl.min(tl.where(best == value, best_token, 2147483647), axis=0)
    if num_splits == 1:  # the program owns the row
        tl.store(out_ptr + row, token.to(tl.int64))
    else:
        # One int64 key per split: the max's bits made sortable as a signed int, then the token reversed
        # (a tie goes to the lower token), so the max key holds the row's token.
        bits = value.to(tl.int32, bitcast=True)
        sortable = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
        key = sortable * 4294967296 + (2147483647 - token)
        tl.store(split_best_ptr + row * num_splits + split, key)
        if ARRIVE:  # the row's last program to arrive picks the token; else _gumbel_reduce_kernel does
            tl.debug_barrier()  # every thread's stores happen before the release below
            arrived = tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel")
            if arrived == num_splits - 1:  # the row's last program: every split's key is in split_best
                _store_best_split(out_ptr, split_best_ptr, row, num_splits, SPLITS)
                tl.store(arrivals_ptr + row, 0)  # ready for the next call


@triton.jit
def _store_best_split(out_ptr, split_best_ptr, row, num_splits, SPLITS: tl.constexpr):
    """The token of the row's largest split key."""
    s = tl.arange(0, SPLITS)
    keys = tl.load(
        split_best_ptr + row * num_splits + s,
        mask=s < num_splits,
        other=-9223372036854775807,
        cache_modifier=".cg",
    )
    tl.store(out_ptr + row, 2147483647 - (tl.max(keys, axis=0) & 0xFFFFFFFF))


@triton.jit
def _gumbel_reduce_kernel(out_ptr, split_best_ptr, num_splits, SPLITS: tl.constexpr):
    """Stage 2 of a captured call: grid (rows,); each program stores its row's best split's token."""
    _store_best_split(out_ptr, split_best_ptr, tl.program_id(0).to(tl.int64), num_splits, SPLITS)


def gumbel_sample(  # the positional arguments are vLLM 0.33's, in its order and meaning
    logits: torch.Tensor,  # [num_tokens, vocab_size]; rows may be strided
    expanded_idx_mapping: torch.Tensor,  # [num_tokens]; < 0 marks a padded row
    temperature: torch.Tensor,  # [max_num_reqs] float32; 0 is greedy
    seed: torch.Tensor,  # [max_num_reqs] int64
    pos: torch.Tensor,  # [num_tokens]
    apply_temperature: bool,
    is_drafting: bool,
    logits_cache: torch.Tensor | None = None,  # [max_num_reqs, num_cols, >= vocab_size]: logits before T
    logits_cache_col: int | torch.Tensor | None = None,  # an int, a 0-d or a [num_tokens] int tensor
    use_fp64: bool = False,  # refused: specfix reduces in float32
    logits_cache_source: torch.Tensor | None = None,  # [num_tokens, vocab_size]: cached instead of logits
    *,
    fixes: Fixes | None = None,  # mask_invalid_reqs=False runs the pre-PR-#47066 kernel
    noise: str = "exact",  # "exact" (bit-reproducible), "fast" (hardware log2), "vllm" (0.33's tokens)
    block_size: int | None = None,  # block_size, num_warps, tiles_per_program: override the launch
    num_warps: int | None = None,
    tiles_per_program: int | None = None,
) -> torch.Tensor:
    """One token per row, ``argmax(logits / T + Gumbel noise)``, with no host sync and no value-dependent
    allocation, so a CUDA graph can capture it; a row of only NaN or -inf gives token 0."""
    fixes = _DEFAULT_FIXES if fixes is None else fixes
    tables = (logits, expanded_idx_mapping, temperature, seed, pos)
    cache, col, source = logits_cache, logits_cache_col, logits_cache_source
    _validate(*tables, cache, col, source, use_fp64, noise, block_size, tiles_per_program)
    if not HAS_TRITON:  # the torch reference, which is the fixed kernel in the exact and vllm modes
        if not fixes.mask_invalid_reqs:
            raise RuntimeError("the unmasked (pre-fix) kernel needs triton; the torch reference is the fix")
        if noise == "fast":
            raise RuntimeError("the fast noise needs triton")
        return ref.gumbel_sample_reference(
            *tables, apply_temperature, is_drafting, cache, col, logits_cache_source=source, noise=noise
        )
    num_tokens, vocab_size = logits.shape
    out = logits.new_empty(num_tokens, dtype=torch.int64)
    if num_tokens == 0:
        return out
    per_token_col = isinstance(col, torch.Tensor)
    switches = (noise, bool(is_drafting), bool(apply_temperature), per_token_col, fixes.mask_invalid_reqs)
    overrides = (block_size, num_warps, tiles_per_program)
    plan = _plan(num_tokens, vocab_size, logits.element_size(), switches, overrides)
    cache_args = _NO_CACHE if cache is None else _cache_args(logits, cache, col, source, per_token_col)
    args = (logits, logits.stride(0), *tables[1:], *cache_args, *plan.sizes)
    if plan.num_splits == 1:  # one program per row: no split keys, no arrivals (any memory will do)
        launch(_gumbel_sample_kernel, plan.grid, out, out, out, *args, **plan.eager)
    elif not _capturing(logits.device):  # the row's last program to arrive picks its token: one launch
        arrivals, keys = _split_scratch(logits.device, num_tokens, plan.num_splits)
        launch(_gumbel_sample_kernel, plan.grid, out, keys, arrivals, *args, **plan.eager)
    else:  # in a graph a second kernel picks it (cheaper on the GPU than arrival atomics); keys in its pool
        keys = out.new_empty(num_tokens * plan.num_splits)
        launch(_gumbel_sample_kernel, plan.grid, out, keys, out, *args, **plan.captured)
        launch(_gumbel_reduce_kernel, (num_tokens,), out, keys, plan.num_splits, **plan.reduce)
    return out


#: The kernel's cache arguments without a cache, from ``cache_ptr`` to ``col_stride``.
_NO_CACHE = (None, 0, 0, None, None, 0, 0, 0)


def _cache_args(logits, cache, col, source, per_token_col) -> tuple:
    """The kernel's arguments from ``cache_ptr`` to ``col_stride``: the cache and its strides, the column as
    a per-row tensor or an int, the source (None where it is the logits themselves)."""
    if per_token_col and col.dim() == 0:
        col = col.expand(logits.shape[0])  # stride 0: every row reads the one column, no sync
    if source is not None and (source.data_ptr(), source.stride(0)) == (logits.data_ptr(), logits.stride(0)):
        source = None  # the kernel stores the tile it has loaded
    return (
        cache,
        cache.stride(0),
        cache.stride(1),
        col if per_token_col else None,
        source,
        0 if source is None else source.stride(0),
        0 if per_token_col or col is None else col,
        col.stride(0) if per_token_col else 0,
    )


def guarded_table(
    shape: tuple[int, ...],
    fill: float,
    dtype: torch.dtype,
    guard_fill: float | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, whole)``: a request-state table ``whole[1:-1]`` with a guard row on each side, so the
    unmasked kernel's row -1 lands in ``whole[0]``, inspectable, not in memory the process does not own."""
    whole = torch.full((shape[0] + 2, *shape[1:]), fill, dtype=dtype, device=device)
    if guard_fill is not None:
        whole[0] = guard_fill
        whole[-1] = guard_fill
    return whole[1:-1], whole
