"""Masked Gumbel-max sampling in Triton: Model Runner V2's sampler, with and without the -1 row fix.

Mirrors ``vllm/v1/worker/gpu/sample/gumbel.py`` (``gumbel_block_argmax``, ``_gumbel_sample_kernel``,
``gumbel_sample``) as of vLLM 0.25, the first release with PR #47066: a logit row whose
``expanded_idx_mapping`` entry is negative is padding, so the kernel masks its temperature and seed loads
and never stores its processed logits. ``Fixes(mask_invalid_reqs=False)`` compiles the kernel as it was
before the fix (no masks), which reads ``temperature[-1]``, ``seed[-1]`` and writes
``processed_logits[-1, col, :]``: memory that belongs to someone else.

``gumbel_block_argmax`` has vLLM's contract (0.25 and 0.33): it is handed one loaded tile of a row's
logits with its token ids, its in-vocabulary mask and the row (``token_idx``); it loads the row's
``req_state_idx``, temperature, seed and position itself, applies the #47066 masks, stores the processed
tile and returns the tile's max and its index within the tile. Its arguments are vLLM 0.25's, in vLLM's
order, where they carry over (specfix addresses the buffer by two strides, as 0.33 does, and takes the
column as an int as well as a tensor); the constexprs after them are specfix's switches. The loop over
tiles is the caller's, as in vLLM, but where vLLM's ``_gumbel_sample_kernel`` gives each program one tile
of 1,024, specfix's walks several tiles of one row: two per turn, each loaded one tile ahead of its use,
keeping the best (value, token) in two scalars. When one program covers a whole row (256 rows and more,
where rows alone fill the GPU) it stores the token and the call is one launch; with fewer rows each row is
split over several programs and stage 2 (grid rows, a second small Triton kernel: never more than two
launches and no torch ops) picks the best split, where vLLM reduces its tiles with two torch ops.
``launch_config`` chooses; ``block_size`` alone gives one tile per program.

Three noise modes, each a pure function of (request seed, position, token id)
(``specfix.mrv2.gumbel_reference`` defines them in torch):
- ``"exact"`` (default): specfix's own 32-bit hash and float32 logarithm, compiled without FMA
  contraction, so the GPU kernel, Triton's interpreter and the torch reference agree bit for bit. Golden
  tests and chapters 3 and 4 use it.
- ``"fast"``: the same hash, the hardware's approximate ``lg2`` (inline PTX on the GPU; ``tl.log2`` in
  the interpreter) with a series for the small-u tail. Same distribution to ~1e-6, about twice the
  throughput; its tokens may differ from the exact mode's in rare near-ties. Chapter 5 measures both.
- ``"vllm"``: vLLM 0.33's noise (MurmurHash3 of seed, position and token id; its log1p series; its
  division by the temperature), compiled as vLLM's kernel is: from the same inputs, vLLM 0.33's
  ``gumbel_sample`` picks the same tokens (``scripts/compare_vllm_noise.py``, ``tests/test_gumbel.py``).

Every mode: a temperature under ``SAMPLING_EPS`` (or NaN) is greedy; ``is_drafting`` adds vLLM 0.33's
drafting salt to the position; a NaN score never wins (a row of NaN and -inf scores gives token 0).

Performance (H200, fast noise, ``specfix bench``: L2 flushed, CUDA events around each call; 2026-11-29,
measured on the kernel before the per-tile contract, which kept a running best per lane and reduced once
per program). 630-770 G logits/s at 256 rows of 129,280-248,320 and 640-850 G/s at 1,024 rows; one row
of 248,320 in a CUDA graph: 3.9 us. The kernel is bound by instruction issue, not memory: ~30
instructions a logit (ncu: 36.3 M warp instructions at 256 x 151,936), ~40% of them on the integer/logic
pipe, which issues at half rate: the hash (2 multiplies, 3 xor-shifts), u (a conversion, an FMA), the
small-u series, two hardware lg2 and the argmax. At 256 x 151,936 fp32 ncu gives 56.7 us with 62% of
issue slots busy, reading 2.7 TB/s of the 3.97 TB/s an argmax reads. The 500 G/s goal is missed at 256 x
32,000: a program there has only 8 tiles, so its fixed costs (row key, first load from HBM with nothing to
hide it behind, final reductions) leave 48% of issue slots busy (16.8 us on the GPU, ncu). The per-tile
contract costs each tile a block-wide max and index (shuffles, four barriers): compiled offline for
sm_90 (triton 3.9, 2026-12-01, fast noise), the loop's SASS grows from 27.6 to 29.6 instructions a logit
at tile 4096 / 8 warps (256 to 511 rows, and the split programs of fewer rows at tile 2048 / 4 warps)
and from 28.6 to 32.1 at tile 2048 / 8 warps (512+ rows). Storing processed logits (the drafter) costs
more, from 28.9 to 34.0 and from 29.9 to 40.6, because triton hoists the row's loads and key out of a loop
only if the loop stores nothing. Time it with ``specfix bench`` or ``scripts/time_gumbel.py --sweep``.
"""

from __future__ import annotations

import functools

import torch

from specfix.fixes import Fixes
from specfix.mrv2 import gumbel_reference as ref
from specfix.runtime import HAS_TRITON, INTERPRET, tl, triton

NOISE_MODES = ref.NOISE_MODES
_INDEX_DTYPES = (torch.int32, torch.int64)
_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

if HAS_TRITON:
    _C1 = tl.constexpr(ref.FMIX_C1)
    _C2 = tl.constexpr(ref.FMIX_C2)
    _TOKEN_MULT = tl.constexpr(ref.TOKEN_MULT)
    _KEY_SALT = tl.constexpr(ref.KEY_SALT)
    _U_MAX = tl.constexpr(ref.U_MAX)
    _SQRT_HALF_BITS = tl.constexpr(ref.SQRT_HALF_BITS)
    _LN2 = tl.constexpr(ref.LN2)
    _LOG2E = tl.constexpr(ref.LOG2E)
    _P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7 = (tl.constexpr(c) for c in ref.LN1P_POLY)
    #: log2(e) / k in float32: -log2(1 - u) = log2(e) * (u + u**2/2 + u**3/3 + u**4/4 + ...)
    _S1, _S2, _S3, _S4 = (tl.constexpr(torch.tensor(ref.LOG2E / k, dtype=torch.float32).item())
                          for k in range(1, 5))
    _SAMPLING_EPS = tl.constexpr(ref.SAMPLING_EPS)
    _DRAFT_NOISE_SALT = tl.constexpr(ref.DRAFT_NOISE_SALT)
    _M_C1 = tl.constexpr(ref.MURMUR_C1)
    _M_C2 = tl.constexpr(ref.MURMUR_C2)
    _M_R1 = tl.constexpr(ref.MURMUR_R1)
    _M_R2 = tl.constexpr(ref.MURMUR_R2)
    _M_N = tl.constexpr(ref.MURMUR_N)
    _VLLM_KEY_BYTES = tl.constexpr(ref.VLLM_KEY_BYTES)
    _VLLM_SERIES_BELOW = tl.constexpr(ref.VLLM_SERIES_BELOW)
    _VLLM_ONE_MINUS_U_MIN = tl.constexpr(ref.VLLM_ONE_MINUS_U_MIN)
    #: The NOISE constexpr of the kernels, one per mode.
    _EXACT, _FAST, _VLLM = (tl.constexpr(i) for i in range(3))

    @triton.jit
    def _fmix32(x):
        x = x ^ (x >> 16)
        x = x * _C1
        x = x ^ (x >> 13)
        x = x * _C2
        return x ^ (x >> 16)

    @triton.jit
    def _row_key(seed, pos):
        """32-bit key of (seed, pos): both int64 scalars."""
        key = _fmix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ _KEY_SALT)
        key = _fmix32(key ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        key = _fmix32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))
        return _fmix32(key ^ ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))

    @triton.jit
    def _uniform(key_mixed, token_mult):
        """u of each token: ``fmix32(key ^ token_mult)``, ``token_mult = token id * TOKEN_MULT``, mapped to
        (0, 1) as the reference does.

        ``key_mixed = key ^ (key >> 16)`` is fmix32's first xor-shift of the key, done once per row (an
        xor-shift distributes over xor). ``bits * 2**-32 + 2**-33`` rounds once, exactly like the reference's
        ``(bits + 0.5) * 2**-32`` (scaling by a power of two is exact), and is one fused multiply-add."""
        x = key_mixed ^ token_mult ^ (token_mult >> 16)
        x = x * _C1
        x = x ^ (x >> 13)
        x = x * _C2
        bits = x ^ (x >> 16)
        return tl.minimum(bits.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10, _U_MAX)

    @triton.jit
    def _careful_log(x):
        """ln(x) from float32 adds and multiplies (see gumbel_reference.careful_log)."""
        bits = x.to(tl.int32, bitcast=True)
        exponent = (bits - _SQRT_HALF_BITS) >> 23
        f = (bits - exponent * 8388608).to(tl.float32, bitcast=True) - 1.0
        p = _P6 + f * _P7
        p = _P5 + f * p
        p = _P4 + f * p
        p = _P3 + f * p
        p = _P2 + f * p
        p = _P1 + f * p
        p = _P0 + f * p
        return exponent.to(tl.float32) * _LN2 + (f + (f * f) * p)

    @triton.jit
    def _exact_gumbel(u):
        """-log(-log1p(-u)); log1p(-u) = ln(w) + ((1 - w) - u) with w = 1 - u rounded."""
        w = 1.0 - u
        return -_careful_log(-(_careful_log(w) + ((1.0 - w) - u)))

    @triton.jit
    def _approx_log2(x, USE_ASM: tl.constexpr):
        """The hardware's approximate log2, flushing subnormals (our inputs are never below 2**-33, so the
        ``ftz`` form is exact here and spares the three instructions that rescale a subnormal input)."""
        if USE_ASM:
            return tl.inline_asm_elementwise(
                "lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            return tl.log2(x)

    @triton.jit
    def _fast_gumbel_log2(u, USE_ASM: tl.constexpr):
        """The Gumbel noise divided by ln 2, up to a constant: -log2(-log2(1 - u)).

        The hardware lg2 has an absolute error near 1, so -log2(1 - u) for u < 1/32 comes from its series.
        """
        series = u * (_S1 + u * (_S2 + u * (_S3 + u * _S4)))
        e2 = tl.where(u < 0.03125, series, -_approx_log2(1.0 - u, USE_ASM))
        return -_approx_log2(e2, USE_ASM)

    @triton.jit
    def _rotl32(x, r: tl.constexpr):
        return (x << r) | (x >> (32 - r))

    @triton.jit
    def _murmur3_mix(h, k):
        """MurmurHash3_x86_32's update of its state ``h`` by one 32-bit block ``k`` (uint32)."""
        k = _rotl32(k * _M_C1, _M_R1) * _M_C2
        return _rotl32(h ^ k, _M_R2) * 5 + _M_N

    @triton.jit
    def _vllm_row_state(seed, pos):
        """The hash state after a row's three words: seed low, seed high, position low (int64 scalars)."""
        seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
        h = _murmur3_mix(seed_lo ^ seed_lo, seed_lo)  # MurmurHash3 seed 0
        h = _murmur3_mix(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        return _murmur3_mix(h, (pos & 0xFFFFFFFF).to(tl.uint32))

    @triton.jit
    def _vllm_gumbel(row_state, token_ids):
        """vLLM 0.33's noise of each token (see gumbel_reference.vllm_gumbel_noise): the last word, the
        finaliser with length 16, u from the hash's 16-bit halves, the log1p series below u = 1/4."""
        bits = _fmix32(_murmur3_mix(row_state, token_ids.to(tl.uint32)) ^ _VLLM_KEY_BYTES)
        hi = (bits >> 16).to(tl.int32).to(tl.float32)
        lo = (bits & 0xFFFF).to(tl.int32).to(tl.float32)
        u = hi * 1.52587890625e-05 + (lo + 0.5) * 2.3283064365386963e-10
        p = u * 0.125 + 1.0 / 7.0
        for k in tl.static_range(6, 0, -1):
            p = u * p + 1.0 / k
        direct = tl.log(tl.maximum(1.0 - u, _VLLM_ONE_MINUS_U_MIN))
        return -tl.log(-tl.where(u < _VLLM_SERIES_BELOW, -u * p, direct))

    @triton.jit
    def _round_for_store(x, dtype: tl.constexpr, BF16_BY_HAND: tl.constexpr):
        """x in the buffer's dtype, rounded to nearest even. Triton's interpreter truncates float32 to
        bfloat16, so there we round the bits ourselves (the same result as the GPU's cvt.rn.bf16.f32)."""
        if BF16_BY_HAND:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + (0x7FFF + ((bits >> 16) & 1))
            return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(dtype)

    @triton.jit
    def gumbel_block_argmax(
        logits,
        block,
        mask,
        token_idx,
        expanded_idx_mapping_ptr,
        temp_ptr,
        seeds_ptr,
        pos_ptr,
        processed_logits_ptr,
        processed_logits_stride_0,
        processed_logits_stride_1,
        processed_logits_col_ptr,
        processed_logits_col,
        IS_DRAFTING: tl.constexpr,
        APPLY_TEMPERATURE: tl.constexpr,
        PER_TOKEN_COL: tl.constexpr,
        STORE_PROCESSED: tl.constexpr,
        MASK_INVALID: tl.constexpr,
        NOISE: tl.constexpr,
        USE_ASM: tl.constexpr,
        BF16_BY_HAND: tl.constexpr,
    ):
        """Gumbel-max over one tile of logit row ``token_idx``: returns the tile's max of logits (/ T) +
        noise and its index within the tile (ties to the lowest; a NaN never wins).

        ``logits``: the tile, loaded as float32 (lanes outside the vocabulary hold -inf); ``block``: its
        token ids; ``mask``: which lanes lie inside the vocabulary. The request-state row, temperature,
        seed and position are loaded here; the processed (temperature-applied) tile is stored to
        ``processed_logits[req_state_idx, col]`` on the way. A temperature under ``SAMPLING_EPS`` is greedy:
        plain logits, no noise. In the fast mode the value is in log2 units (logits * log2(e) + noise / ln 2).
        """
        req_state_idx = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
        is_valid_req = req_state_idx >= 0
        if MASK_INVALID:  # [fix]
            temp = tl.load(temp_ptr + req_state_idx, mask=is_valid_req, other=0.0)  # [fix]
            seed = tl.load(seeds_ptr + req_state_idx, mask=is_valid_req, other=0)  # [fix]
        else:  # [no fix]
            temp = tl.load(temp_ptr + req_state_idx)  # [no fix]
            seed = tl.load(seeds_ptr + req_state_idx)  # [no fix]
        temp = tl.where(temp >= _SAMPLING_EPS, temp, 0.0)  # NaN too
        pos = tl.load(pos_ptr + token_idx).to(tl.int64)
        if IS_DRAFTING:
            pos = pos + _DRAFT_NOISE_SALT
        x = logits
        scores = logits  # what the noise is added to
        if APPLY_TEMPERATURE:
            if temp != 0.0:
                x = tl.math.div_rn(x, temp)
                if NOISE == _VLLM:
                    scores = logits / temp  # vLLM's division (on the GPU div.full, not rounded as div_rn)
                else:
                    scores = x
        if STORE_PROCESSED:
            if PER_TOKEN_COL:
                col = tl.load(processed_logits_col_ptr + token_idx).to(tl.int64)
            else:
                col = processed_logits_col.to(tl.int64)
            row_ptr = (processed_logits_ptr + req_state_idx * processed_logits_stride_0
                       + col * processed_logits_stride_1)
            stored = _round_for_store(x, processed_logits_ptr.dtype.element_ty, BF16_BY_HAND)
            # The validity test is per lane: the interpreter cannot mask a store by a scalar comparison.
            if MASK_INVALID:  # [fix]
                lane_is_valid = tl.zeros_like(block).to(tl.int64) + req_state_idx >= 0  # [fix]
                tl.store(row_ptr + block, stored, mask=mask & lane_is_valid)  # [fix]
            else:  # [no fix]
                tl.store(row_ptr + block, stored, mask=mask)  # [no fix]
            if NOISE == _VLLM:
                seed = seed ^ (col << 32)  # vLLM 0.33's spec_step_seed: each drafter column its own stream
        if NOISE == _VLLM:
            row_state = _vllm_row_state(seed, pos)
        else:
            key = _row_key(seed, pos)
            key_mixed = key ^ (key >> 16)
        if temp != 0.0:
            if NOISE == _VLLM:
                scores = scores + _vllm_gumbel(row_state, block)
            elif NOISE == _FAST:
                scores = scores * _LOG2E + _fast_gumbel_log2(
                    _uniform(key_mixed, block.to(tl.uint32) * _TOKEN_MULT), USE_ASM)
            else:
                scores = scores + _exact_gumbel(_uniform(key_mixed, block.to(tl.uint32) * _TOKEN_MULT))
            scores = tl.where(mask, scores, float("-inf"))
        value = tl.max(scores, axis=0)
        lanes = tl.arange(0, scores.shape[0])
        return value, tl.min(tl.where(scores == value, lanes, scores.shape[0]), axis=0)

    # Sizes are plain runtime values: one compiled kernel serves every vocabulary and batch shape.
    @triton.jit(do_not_specialize=["col_scalar", "vocab_size", "num_tiles", "num_full_tiles",
                                   "tiles_per_program", "num_splits"])
    def _gumbel_sample_kernel(
        out_ptr,
        local_max_ptr,
        local_argmax_ptr,
        logits_ptr,
        logits_stride,
        idx_mapping_ptr,
        temperature_ptr,
        seed_ptr,
        pos_ptr,
        processed_ptr,
        processed_stride0,
        processed_stride1,
        col_ptr,
        col_scalar,
        vocab_size,
        num_tiles,
        num_full_tiles,
        tiles_per_program,
        num_splits,
        IS_DRAFTING: tl.constexpr,
        APPLY_TEMPERATURE: tl.constexpr,
        STORE_PROCESSED: tl.constexpr,
        PER_TOKEN_COL: tl.constexpr,
        MASK_INVALID: tl.constexpr,
        NOISE: tl.constexpr,
        USE_ASM: tl.constexpr,
        BF16_BY_HAND: tl.constexpr,
        BLOCK: tl.constexpr,
        STATIC_TILES: tl.constexpr,
    ):
        """Stage 1: grid (rows, splits); each program walks ``tiles_per_program`` tiles of its row, calls
        ``gumbel_block_argmax`` on each and keeps the best (a strict ``>``: an earlier tile wins a tie).
        With one split per row that is already the token (no stage 2). The next tile's logits are loaded
        before this tile's noise is computed, so the load's latency hides behind it."""
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        first_tile = split * tiles_per_program
        end_tile = tl.minimum(first_tile + tiles_per_program, num_tiles)
        full_end = tl.minimum(end_tile, num_full_tiles)
        logits_row_ptr = logits_ptr + row * logits_stride
        lanes = tl.arange(0, BLOCK)
        in_vocab = tl.full([BLOCK], True, tl.int1)  # every lane of a full tile
        best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
        best_token = first_tile * BLOCK  # what a program whose scores are all NaN or -inf returns
        if STATIC_TILES > 0:
            # Under triton 3.6's interpreter a runtime value cannot bound a range(): loop to a static bound
            # and skip the tiles past this program's share. Same arithmetic in the same order, no prefetch.
            for i in range(STATIC_TILES):
                tile = first_tile + i
                if tile < full_end:
                    block = tile * BLOCK + lanes
                    value, idx = gumbel_block_argmax(
                        tl.load(logits_row_ptr + block).to(tl.float32), block, in_vocab, row, idx_mapping_ptr,
                        temperature_ptr, seed_ptr, pos_ptr, processed_ptr, processed_stride0,
                        processed_stride1, col_ptr, col_scalar, IS_DRAFTING, APPLY_TEMPERATURE,
                        PER_TOKEN_COL, STORE_PROCESSED, MASK_INVALID, NOISE, USE_ASM, BF16_BY_HAND)
                    better = value > best
                    best = tl.where(better, value, best)
                    best_token = tl.where(better, tile * BLOCK + idx, best_token)
        else:
            # Two tiles per turn, each loaded one tile ahead of its use (its latency hides behind the other
            # tile's noise) into its own registers. A tile index past the program's last full tile is
            # clamped to it: in bounds, a cache hit, and a repeat of a tile already seen changes nothing.
            offs = first_tile * BLOCK + lanes
            x_even = tl.load(logits_row_ptr + offs, mask=offs < full_end * BLOCK, other=0.0)
            for tile in range(first_tile, full_end, 2):
                odd = tl.minimum(tile + 1, full_end - 1)
                x_odd = tl.load(logits_row_ptr + odd * BLOCK + lanes)
                value, idx = gumbel_block_argmax(
                    x_even.to(tl.float32), tile * BLOCK + lanes, in_vocab, row, idx_mapping_ptr,
                    temperature_ptr, seed_ptr, pos_ptr, processed_ptr, processed_stride0, processed_stride1,
                    col_ptr, col_scalar, IS_DRAFTING, APPLY_TEMPERATURE, PER_TOKEN_COL, STORE_PROCESSED,
                    MASK_INVALID, NOISE, USE_ASM, BF16_BY_HAND)
                better = value > best
                best = tl.where(better, value, best)
                best_token = tl.where(better, tile * BLOCK + idx, best_token)
                x_even = tl.load(logits_row_ptr + tl.minimum(tile + 2, full_end - 1) * BLOCK + lanes)
                value, idx = gumbel_block_argmax(
                    x_odd.to(tl.float32), odd * BLOCK + lanes, in_vocab, row, idx_mapping_ptr,
                    temperature_ptr, seed_ptr, pos_ptr, processed_ptr, processed_stride0, processed_stride1,
                    col_ptr, col_scalar, IS_DRAFTING, APPLY_TEMPERATURE, PER_TOKEN_COL, STORE_PROCESSED,
                    MASK_INVALID, NOISE, USE_ASM, BF16_BY_HAND)
                better = value > best
                best = tl.where(better, value, best)
                best_token = tl.where(better, odd * BLOCK + idx, best_token)
        if end_tile > num_full_tiles:  # this program owns the partial last tile
            block = num_full_tiles * BLOCK + lanes
            mask = block < vocab_size
            value, idx = gumbel_block_argmax(
                tl.load(logits_row_ptr + block, mask=mask, other=float("-inf")).to(tl.float32), block, mask,
                row, idx_mapping_ptr, temperature_ptr, seed_ptr, pos_ptr, processed_ptr, processed_stride0,
                processed_stride1, col_ptr, col_scalar, IS_DRAFTING, APPLY_TEMPERATURE, PER_TOKEN_COL,
                STORE_PROCESSED, MASK_INVALID, NOISE, USE_ASM, BF16_BY_HAND)
            better = value > best
            best = tl.where(better, value, best)
            best_token = tl.where(better, num_full_tiles * BLOCK + idx, best_token)
        if num_splits == 1:
            tl.store(out_ptr + row, best_token.to(tl.int64))
        else:
            tl.store(local_max_ptr + row * num_splits + split, best)
            tl.store(local_argmax_ptr + row * num_splits + split, best_token)

    @triton.jit
    def _gumbel_reduce_kernel(out_ptr, local_max_ptr, local_argmax_ptr, num_splits, SPLITS: tl.constexpr):
        """Stage 2: grid (rows,). The best split wins; ties go to the lower split, i.e. the lower token id."""
        row = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, SPLITS)
        values = tl.load(local_max_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
        best = tl.argmax(values, axis=0)
        token = tl.load(local_argmax_ptr + row * num_splits + best)
        tl.store(out_ptr + row, token.to(tl.int64))

    @triton.jit
    def _gumbel_noise_kernel(out_ptr, seed_ptr, pos_ptr, vocab_size, NOISE: tl.constexpr,
                             USE_ASM: tl.constexpr, BLOCK: tl.constexpr):
        """The noise itself, [rows, vocab] (exact and vllm modes: natural log; fast mode: log2 units)."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        seed = tl.load(seed_ptr + row)
        pos = tl.load(pos_ptr + row).to(tl.int64)
        if NOISE == _VLLM:
            g = _vllm_gumbel(_vllm_row_state(seed, pos), offs)
        else:
            key = _row_key(seed, pos)
            u = _uniform(key ^ (key >> 16), offs.to(tl.uint32) * _TOKEN_MULT)
            if NOISE == _FAST:
                g = _fast_gumbel_log2(u, USE_ASM)
            else:
                g = _exact_gumbel(u)
        tl.store(out_ptr + row * vocab_size + offs, g, mask=offs < vocab_size)


def _check_vector(name: str, t, dtypes, length: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}; got {str(t.dtype).removeprefix('torch.')}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} has {t.shape[0]} entries but logits has {length} rows")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _validate(logits, expanded_idx_mapping, temperature, seed, pos, processed_logits, processed_logits_col):
    """Refuse bad input before launching anything. Value checks (which would need a device-to-host sync,
    impossible inside a CUDA graph) run only on CPU tensors; dtypes, shapes and devices are always checked."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, float16 or bfloat16; got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_tokens, vocab_size], got shape {tuple(logits.shape)}")
    num_tokens, vocab_size = logits.shape
    if vocab_size == 0:
        raise ValueError("logits has an empty vocabulary (vocab_size 0)")
    if logits.stride(1) != 1:
        raise ValueError(f"logits rows must be contiguous (last stride 1), got strides {logits.stride()}")
    if not isinstance(expanded_idx_mapping, torch.Tensor):
        raise TypeError(
            f"expanded_idx_mapping must be a torch.Tensor, got {type(expanded_idx_mapping).__name__}"
        )
    if expanded_idx_mapping.dtype.is_floating_point or (
        expanded_idx_mapping.dtype not in _INDEX_DTYPES and not expanded_idx_mapping.dtype.is_signed
    ):
        raise TypeError(
            "expanded_idx_mapping must be int32 or int64 (signed: padding rows hold -1, which an unsigned "
            f"or floating type would turn into a huge index or a fraction); got {expanded_idx_mapping.dtype}"
        )
    _check_vector("expanded_idx_mapping", expanded_idx_mapping, _INDEX_DTYPES, num_tokens)
    _check_vector("temperature", temperature, (torch.float32,))
    _check_vector("seed", seed, (torch.int64,))
    _check_vector("pos", pos, _INDEX_DTYPES, num_tokens)
    if temperature.shape != seed.shape:
        raise ValueError(
            "temperature and seed are per-request tables of one length; "
            f"got {temperature.shape[0]} and {seed.shape[0]}"
        )
    tensors = {"expanded_idx_mapping": expanded_idx_mapping, "temperature": temperature, "seed": seed,
               "pos": pos}
    if processed_logits is not None:
        if not isinstance(processed_logits, torch.Tensor):
            raise TypeError(f"processed_logits must be a torch.Tensor, got {type(processed_logits).__name__}")
        if processed_logits.dtype not in _LOGIT_DTYPES:
            raise TypeError(
                f"processed_logits must be float32, float16 or bfloat16; got {processed_logits.dtype}"
            )
        if processed_logits.dim() != 3 or processed_logits.shape[2] != vocab_size:
            raise ValueError(
                f"processed_logits must have shape [max_num_reqs, num_cols, {vocab_size}]; "
                f"got {tuple(processed_logits.shape)}"
            )
        if processed_logits.shape[0] != temperature.shape[0]:
            raise ValueError(
                f"processed_logits has {processed_logits.shape[0]} request rows but temperature has "
                f"{temperature.shape[0]}"
            )
        if processed_logits.stride(2) != 1:
            raise ValueError(
                f"processed_logits must have last stride 1, got strides {processed_logits.stride()}"
            )
        num_cols = processed_logits.shape[1]
        if isinstance(processed_logits_col, torch.Tensor):
            _check_vector("processed_logits_col", processed_logits_col, _INDEX_DTYPES, num_tokens)
            tensors["processed_logits_col"] = processed_logits_col
        elif processed_logits_col is not None:
            if isinstance(processed_logits_col, bool) or not isinstance(processed_logits_col, int):
                raise TypeError(
                    "processed_logits_col must be an int or an int tensor, "
                    f"got {type(processed_logits_col).__name__}"
                )
            if not 0 <= processed_logits_col < num_cols:
                raise ValueError(f"processed_logits_col={processed_logits_col} outside [0, {num_cols})")
        tensors["processed_logits"] = processed_logits
    elif processed_logits_col is not None:
        raise ValueError("processed_logits_col given without processed_logits")
    for name, t in tensors.items():
        if t.device != logits.device:
            raise ValueError(f"{name} is on {t.device} but logits is on {logits.device}")
    if logits.device.type == "cpu":
        if temperature.numel() and not bool((temperature >= 0).all()):  # NaN is refused too
            bad = temperature[~(temperature >= 0)][:4].tolist()
            raise ValueError(f"temperature must be >= 0 (0 means greedy); got {bad}")
        if num_tokens and bool((expanded_idx_mapping >= temperature.shape[0]).any()):
            raise ValueError(
                f"expanded_idx_mapping holds {expanded_idx_mapping.max().item()}, beyond the "
                f"{temperature.shape[0]} request-state rows"
            )
        if isinstance(processed_logits_col, torch.Tensor) and num_tokens:
            bad = (processed_logits_col < 0) | (processed_logits_col >= processed_logits.shape[1])
            if bool(bad.any()):
                raise ValueError(f"processed_logits_col must lie in [0, {processed_logits.shape[1]})")


#: Below _FEW_ROWS rows, each row's vocabulary is split over several programs, about _PROGRAMS in all.
_FEW_ROWS = 256
_PROGRAMS = 512
_ROW_SPLITS = 8        # splits per row from _FEW_ROWS rows on (H200 sweep, scripts/time_gumbel.py)
_SPLIT_VOCAB = 100_000  # below it a row per program of 8 warps was as fast or faster in that sweep


@functools.cache
def launch_config(num_tokens: int, vocab_size: int) -> tuple[int, int, int]:
    """(BLOCK, num_warps, tiles_per_program) for ``gumbel_sample``.

    Interpreter: one program per row, tiles as large as possible (its cost is per program instance).
    GPU (tuned on the H200 with ``scripts/time_gumbel.py --sweep``): a thread holds at most 16 logits of a
    tile (more spill the per-lane state to local memory). From 256 rows of a large vocabulary on, each row is
    split over 8 one-warp programs (tile 512), whose per-tile reduction needs no block barrier; from 256 rows
    of a small vocabulary, one program per row loops over its tiles and stores the token itself: one launch,
    no stage 2; 8 warps each (tile 4096; from 512 rows, tile 2048). With fewer rows each row is split over
    several programs (~512 of 4 warps in all, tile 2048, or 1024 when the tiles are few) and stage 2 picks the
    best split."""
    fits = max(16, triton.next_power_of_2(vocab_size))  # a tiny vocabulary needs no larger tile
    if INTERPRET:
        block = min(fits, 1 << 16)
        return block, 4, triton.cdiv(vocab_size, block)
    if num_tokens >= _FEW_ROWS and vocab_size >= _SPLIT_VOCAB:
        # One-warp programs: the per-tile max and index reduce in warp shuffles, with no block barrier; each
        # row is split over _ROW_SPLITS of them and stage 2 picks the best split.
        block = min(512, fits)
        return block, 1, triton.cdiv(triton.cdiv(vocab_size, block), _ROW_SPLITS)
    if num_tokens >= _FEW_ROWS:
        block = min(2048 if num_tokens >= 2 * _FEW_ROWS else 4096, fits)
        return block, 8, triton.cdiv(vocab_size, block)
    block = min(2048 if num_tokens * triton.cdiv(vocab_size, 2048) >= _PROGRAMS else 1024, fits)
    tiles = triton.cdiv(vocab_size, block)
    return block, 4, triton.cdiv(tiles, min(tiles, triton.cdiv(_PROGRAMS, num_tokens)))


def gumbel_sample(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    apply_temperature: bool,
    processed_logits: torch.Tensor | None = None,
    processed_logits_col: int | torch.Tensor | None = None,
    *,
    is_drafting: bool = False,
    fixes: Fixes | None = None,
    noise: str = "exact",
    block_size: int | None = None,
    num_warps: int | None = None,
    tiles_per_program: int | None = None,
) -> torch.Tensor:
    """Sample one token per logit row by Gumbel-max: ``argmax(logits / T + g)``, ``g ~ Gumbel(0, 1)``.

    Args:
        logits: ``[num_tokens, vocab_size]`` float32/float16/bfloat16; rows may be strided.
        expanded_idx_mapping: ``[num_tokens]`` int32/int64, logit row -> request-state row; ``< 0`` = padding.
        temperature: ``[max_num_reqs]`` float32; under ``SAMPLING_EPS`` (0 included) means greedy.
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        pos: ``[num_tokens]`` int32/int64 positions; the noise is keyed by (seed, pos, token id).
        apply_temperature: divide the logits by the temperature (else the caller already did).
        processed_logits: optional ``[max_num_reqs, num_cols, vocab_size]`` buffer that receives the
            (temperature-applied) logits of each valid row at ``[req_state_idx, col]``.
        processed_logits_col: the column: an int, or an int tensor ``[num_tokens]``; default 0.
        is_drafting: a drafter's draw: ``DRAFT_NOISE_SALT`` is added to the position (vLLM 0.33).
        fixes: ``fixes.mask_invalid_reqs=False`` runs the pre-PR-#47066 kernel (no masks).
        noise: ``"exact"`` (bit-reproducible everywhere), ``"fast"`` (hardware log2 on the GPU) or
            ``"vllm"`` (vLLM 0.33's noise: its tokens, from the same inputs).
        block_size, num_warps, tiles_per_program: override the launch configuration (tests, benchmarks).
            A ``block_size`` given alone means one tile per program.

    Returns:
        ``[num_tokens]`` int64 token ids. A NaN score never wins; a row whose scores are all NaN or -inf
        gives token 0. No host sync and no value-dependent allocation: safe to capture in a CUDA graph.
    """
    fixes = Fixes() if fixes is None else fixes
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    _validate(logits, expanded_idx_mapping, temperature, seed, pos, processed_logits, processed_logits_col)
    if not HAS_TRITON:
        if not fixes.mask_invalid_reqs:
            raise RuntimeError("the unmasked (pre-fix) kernel needs triton; the torch reference is the fix")
        if noise == "fast":
            raise RuntimeError("the fast noise needs triton")
        return ref.gumbel_sample_reference(logits, expanded_idx_mapping, temperature, seed, pos,
                                           apply_temperature, processed_logits, processed_logits_col,
                                           noise=noise, is_drafting=is_drafting)
    num_tokens, vocab_size = logits.shape
    out = torch.empty(num_tokens, dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return out
    default_block, default_warps, default_tiles = launch_config(num_tokens, vocab_size)
    block = default_block if block_size is None else block_size
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    num_tiles = triton.cdiv(vocab_size, block)
    if tiles_per_program is None:
        tiles_per_program = 1 if block_size else default_tiles
    if isinstance(tiles_per_program, bool) or not isinstance(tiles_per_program, int) or tiles_per_program < 1:
        raise ValueError(f"tiles_per_program must be a positive int, got {tiles_per_program!r}")
    tiles_per_program = min(tiles_per_program, num_tiles)
    num_splits = triton.cdiv(num_tiles, tiles_per_program)
    local_max = torch.empty((num_tokens, num_splits), dtype=torch.float32, device=logits.device)
    local_argmax = torch.empty_like(local_max, dtype=torch.int32)
    store = processed_logits is not None
    per_token_col = isinstance(processed_logits_col, torch.Tensor)
    col_tensor = processed_logits_col if per_token_col else pos
    col_scalar = 0 if per_token_col or processed_logits_col is None else processed_logits_col
    processed = processed_logits if store else local_max
    stride0, stride1 = (processed_logits.stride(0), processed_logits.stride(1)) if store else (0, 0)
    # The exact mode is compiled without FMA contraction (its bits are the reference's); the vllm mode as
    # vLLM's kernel is compiled (triton's default), so that the two make the same float operations.
    fusion = {} if noise == "vllm" else {"enable_fp_fusion": noise == "fast"}
    _gumbel_sample_kernel[(num_tokens, num_splits)](
        out, local_max, local_argmax, logits, logits.stride(0), expanded_idx_mapping, temperature, seed, pos,
        processed, stride0, stride1, col_tensor, col_scalar, vocab_size, num_tiles, vocab_size // block,
        tiles_per_program, num_splits,
        IS_DRAFTING=bool(is_drafting), APPLY_TEMPERATURE=bool(apply_temperature), STORE_PROCESSED=store,
        PER_TOKEN_COL=per_token_col, MASK_INVALID=fixes.mask_invalid_reqs, NOISE=NOISE_MODES.index(noise),
        USE_ASM=not INTERPRET, BF16_BY_HAND=INTERPRET and store and processed_logits.dtype == torch.bfloat16,
        BLOCK=block, STATIC_TILES=tiles_per_program if INTERPRET else 0,
        num_warps=num_warps or default_warps, **fusion,
    )
    if num_splits > 1:
        _gumbel_reduce_kernel[(num_tokens,)](out, local_max, local_argmax, num_splits,
                                             SPLITS=triton.next_power_of_2(num_splits), num_warps=1)
    return out


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int,
                 noise: str = "exact") -> torch.Tensor:
    """``[rows, vocab_size]`` float32 noise exactly as the sampling kernel draws it (for teaching and tests).

    ``"exact"``: Gumbel noise in natural-log units, bitwise equal to ``gumbel_reference.gumbel_noise``.
    ``"fast"``: the fast mode's noise in log2 units (Gumbel / ln 2, shifted by a constant).
    ``"vllm"``: vLLM 0.33's noise in natural-log units (``gumbel_reference.vllm_gumbel_noise``)."""
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    _check_vector("seed", seed, (torch.int64,))
    _check_vector("pos", pos, _INDEX_DTYPES, seed.shape[0])
    if not HAS_TRITON:
        if noise == "fast":
            raise RuntimeError("the fast noise needs triton")
        return (ref.vllm_gumbel_noise if noise == "vllm" else ref.gumbel_noise)(seed, pos, vocab_size)
    out = torch.empty((seed.shape[0], vocab_size), dtype=torch.float32, device=seed.device)
    block = min(triton.next_power_of_2(vocab_size), 1 << 16 if INTERPRET else 4096)
    fusion = {} if noise == "vllm" else {"enable_fp_fusion": noise == "fast"}
    _gumbel_noise_kernel[(seed.shape[0], triton.cdiv(vocab_size, block))](
        out, seed, pos, vocab_size, NOISE=NOISE_MODES.index(noise), USE_ASM=not INTERPRET, BLOCK=block,
        **fusion,
    )
    return out


def guarded_table(shape: tuple[int, ...], fill: float, dtype: torch.dtype, guard_fill: float | None = None,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A request-state table with one guard row on each side, in one allocation: ``(table, whole)``.

    ``table = whole[1:-1]`` is what the kernel is given. The unmasked (pre-fix) kernel indexes row -1 of
    the table, which here is ``whole[0]``, inside the same storage: its out-of-bounds reads and writes land
    in a sentinel region we can inspect, instead of in memory the process does not own (on CPU the
    interpreter would read or scribble over the Python heap).
    """
    whole = torch.full((shape[0] + 2, *shape[1:]), fill, dtype=dtype, device=device)
    if guard_fill is not None:
        whole[0] = guard_fill
        whole[-1] = guard_fill
    return whole[1:-1], whole
