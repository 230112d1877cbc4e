"""Masked Gumbel-max sampling in Triton: Model Runner V2's sampler, with and without the -1 row fix.

Mirrors ``vllm/v1/worker/gpu/sample/gumbel.py`` (``gumbel_block_argmax``, ``_gumbel_sample_kernel``,
``gumbel_sample``) as of vLLM 0.33; PR #47066 (first released in 0.25): a logit row whose
``expanded_idx_mapping`` entry is negative is padding, so the kernel masks its temperature and seed loads
and never stores into the draft-logits cache. ``Fixes(mask_invalid_reqs=False)`` compiles the kernel as it
was before the fix (no masks), which reads ``temperature[-1]``, ``seed[-1]`` and writes
``logits_cache[-1, col, :]``: memory that belongs to someone else.

Read ``gumbel_sample`` first (the launcher), then ``gumbel_block_argmax`` (one tile: the fix's masks, the
noise, the argmax). ``specfix.mrv2.gumbel_reference`` is the torch twin that defines the noise modes;
what the kernel costs is measured by ``specfix bench`` and recorded in ``specfix/recorded/``.
"""

from __future__ import annotations

import functools

import torch

from specfix.checks import check_device, check_vector, is_int
from specfix.fixes import Fixes
from specfix.mrv2 import gumbel_reference as ref
from specfix.runtime import HAS_TRITON, INTERPRET, tl, triton

# Three noise modes, each a pure function of (request seed, position, token id), defined in torch by
# gumbel_reference:
# - "exact" (default): specfix's own 32-bit hash and float32 logarithm, compiled without FMA contraction, so
#   the GPU kernel, Triton's interpreter and the torch reference agree bit for bit (golden tests, chapters
#   3 and 4).
# - "fast": the same hash, the hardware's approximate lg2 (inline PTX on the GPU; tl.log2 in the
#   interpreter) with a series for the small-u tail: the same distribution, tokens that may differ from
#   the exact mode's in rare near-ties (chapter 5 measures both).
# - "vllm": vLLM 0.33's noise (MurmurHash3 of seed, position and token id; its log1p series; its division
#   by the temperature), compiled as vLLM's kernel is: from the same inputs vLLM 0.33's gumbel_sample picks
#   the same tokens and caches the same logits (scripts/compare_vllm_noise.py, tests/test_gumbel.py).
NOISE_MODES = ref.NOISE_MODES
_INDEX_DTYPES = (torch.int32, torch.int64)
_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

if HAS_TRITON:
    from specfix.mrv2 import gumbel_constants as K

    @triton.jit
    def _fmix32(x):
        x = x ^ (x >> 16)
        x = x * K.C1
        x = x ^ (x >> 13)
        x = x * K.C2
        return x ^ (x >> 16)

    @triton.jit
    def _row_key(seed, pos):
        """32-bit key of (seed, pos): both int64 scalars."""
        key = _fmix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ K.KEY_SALT)
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
        x = x * K.C1
        x = x ^ (x >> 13)
        x = x * K.C2
        bits = x ^ (x >> 16)
        return tl.minimum(bits.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10, K.U_MAX)

    @triton.jit
    def _careful_log(x):
        """ln(x) from float32 adds and multiplies (see gumbel_reference.careful_log)."""
        bits = x.to(tl.int32, bitcast=True)
        exponent = (bits - K.SQRT_HALF_BITS) >> 23
        f = (bits - exponent * 8388608).to(tl.float32, bitcast=True) - 1.0
        p = K.P6 + f * K.P7
        p = K.P5 + f * p
        p = K.P4 + f * p
        p = K.P3 + f * p
        p = K.P2 + f * p
        p = K.P1 + f * p
        p = K.P0 + f * p
        return exponent.to(tl.float32) * K.LN2 + (f + (f * f) * p)

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
        series = u * (K.S1 + u * (K.S2 + u * (K.S3 + u * K.S4)))
        e2 = tl.where(u < 0.03125, series, -_approx_log2(1.0 - u, USE_ASM))
        return -_approx_log2(e2, USE_ASM)

    @triton.jit
    def _rotl32(x, r: tl.constexpr):
        return (x << r) | (x >> (32 - r))

    @triton.jit
    def _murmur3_mix(h, k):
        """MurmurHash3_x86_32's update of its state ``h`` by one 32-bit block ``k`` (uint32)."""
        k = _rotl32(k * K.M_C1, K.M_R1) * K.M_C2
        return _rotl32(h ^ k, K.M_R2) * 5 + K.M_N

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
        bits = _fmix32(_murmur3_mix(row_state, token_ids.to(tl.uint32)) ^ K.VLLM_KEY_BYTES)
        hi = (bits >> 16).to(tl.int32).to(tl.float32)
        lo = (bits & 0xFFFF).to(tl.int32).to(tl.float32)
        u = hi * 1.52587890625e-05 + (lo + 0.5) * 2.3283064365386963e-10
        p = u * 0.125 + 1.0 / 7.0
        for k in tl.static_range(6, 0, -1):
            p = u * p + 1.0 / k
        direct = tl.log(tl.maximum(1.0 - u, K.VLLM_ONE_MINUS_U_MIN))
        return -tl.log(-tl.where(u < K.VLLM_SERIES_BELOW, -u * p, direct))

    # vLLM 0.33's contract: one loaded tile of a row in, its max and index out; the row's request-state
    # index, temperature, seed and position are loaded here, under PR #47066's masks. The arguments are
    # 0.33's, in its order, where they carry over (specfix also takes the column as an int, with a stride
    # for a 0-d column tensor); the constexprs after them are specfix's switches. The loop over tiles is the
    # caller's, as in vLLM. vLLM 0.25 cached logits / T in float32 instead (its output_processed_logits).
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
    ):
        """Gumbel-max over one tile of logit row ``token_idx``: the max of logits (/ T) + noise along the
        tile's first axis and its index there (ties to the lowest; a NaN never wins).

        ``logits``: the tile, loaded as float32 (lanes outside the vocabulary hold -inf); ``block``: its
        token ids; ``mask``: which lanes lie inside the vocabulary. vLLM's tiles are 1-D, so this is the
        tile's max and its index in the tile; specfix's caller hands in ``[DEPTH, LANES]`` tiles and gets
        one (max, index) per column. The request-state row, temperature, seed and position are loaded here.
        With a cache (``logits_cache_ptr`` not None) the tile's logits *before* temperature are stored to
        ``logits_cache[req_state_idx, col]`` in the cache's dtype, as vLLM 0.33 does: from
        ``logits_cache_source`` when given (None: the tile itself, whose float32 values came from that dtype,
        so the store is an exact copy). Only a temperature of 0 is greedy: plain logits, no noise. In the
        fast mode the value is in log2 units (logits * log2(e) + noise / ln 2).
        """
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
                cached = tl.load(logits_cache_source_ptr + token_idx * logits_cache_source_stride + block,
                                 mask=mask)
            else:
                cached = logits
            cached = cached.to(logits_cache_ptr.dtype.element_ty)
            row_ptr = logits_cache_ptr + req_state_idx * logits_cache_stride_0 + col * logits_cache_stride_1
            # The validity test is per lane: the interpreter cannot mask a store by a scalar comparison.
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
                else:
                    scores = tl.math.div_rn(logits, temp)
        if NOISE == K.VLLM:
            row_state = _vllm_row_state(seed, pos)
        else:
            key = _row_key(seed, pos)
            key_mixed = key ^ (key >> 16)
        if temp != 0.0:
            if NOISE == K.VLLM:
                scores = scores + _vllm_gumbel(row_state, block)
            elif NOISE == K.FAST:
                scores = scores * K.LOG2E + _fast_gumbel_log2(
                    _uniform(key_mixed, block.to(tl.uint32) * K.TOKEN_MULT), USE_ASM)
            else:
                scores = scores + _exact_gumbel(_uniform(key_mixed, block.to(tl.uint32) * K.TOKEN_MULT))
            scores = tl.where(mask, scores, float("-inf"))
        index = tl.arange(0, scores.shape[0])
        if len(scores.shape) == 2:  # specfix's tiles: each thread holds whole columns (tile_shape)
            return tl.reduce((scores, tl.broadcast_to(index[:, None], scores.shape)), 0, _first_max)
        else:  # vLLM's 1-D tile, reduced across threads: a maxnum, then the lowest index holding it
            value = tl.max(scores, axis=0)
            return value, tl.min(tl.where(scores == value, index, scores.shape[0]), axis=0)

    @triton.jit
    def _first_max(value_a, index_a, value_b, index_b):
        """Combine of a column's argmax, three instructions: the larger value by maxnum (a NaN loses to any
        number), and b's index only where a did not hold that value (a NaN, or smaller), so among equal
        values the first one combined keeps its index. That is the lowest index when the entries are combined
        in order, as a thread does with the column it holds; across threads (shuffles in butterfly order) it
        need not be, which is why a 1-D tile takes the two-pass reduction instead."""
        value = tl.maximum(value_a, value_b)
        return value, tl.where(value_a != value, index_b, index_a)

    @triton.jit
    def _keep_best(best, best_token, tile_max, tile_argmax, tile_start, lanes, LANES: tl.constexpr):
        """Each column's running best over the tiles: a strict ``>``, so an earlier tile keeps a tie."""
        better = tile_max > best
        token = tile_start + tile_argmax * LANES + lanes
        return tl.where(better, tile_max, best), tl.where(better, token, best_token)


def _validate(logits, expanded_idx_mapping, temperature, seed, pos, cache, col, source):
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
    check_vector("expanded_idx_mapping", expanded_idx_mapping, _INDEX_DTYPES, num_tokens, contiguous=True)
    check_vector("temperature", temperature, (torch.float32,), contiguous=True)
    check_vector("seed", seed, (torch.int64,), contiguous=True)
    check_vector("pos", pos, _INDEX_DTYPES, num_tokens, contiguous=True)
    if temperature.shape != seed.shape:
        raise ValueError(
            "temperature and seed are per-request tables of one length; "
            f"got {temperature.shape[0]} and {seed.shape[0]}"
        )
    tensors = {"expanded_idx_mapping": expanded_idx_mapping, "temperature": temperature, "seed": seed,
               "pos": pos}
    if cache is not None:
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"logits_cache must be a torch.Tensor, got {type(cache).__name__}")
        if cache.dim() != 3 or cache.shape[2] < vocab_size:
            raise ValueError(f"logits_cache must have shape [max_num_reqs, num_cols, >= {vocab_size}]; "
                             f"got {tuple(cache.shape)}")
        if cache.shape[0] != temperature.shape[0]:
            raise ValueError(f"logits_cache has {cache.shape[0]} request rows but temperature has "
                             f"{temperature.shape[0]}")
        if cache.stride(2) != 1:
            raise ValueError(f"logits_cache must have last stride 1, got strides {cache.stride()}")
        if source is not None:
            if not isinstance(source, torch.Tensor) or source.shape != logits.shape or source.stride(1) != 1:
                raise ValueError("logits_cache_source must be a tensor of logits' shape "
                                 f"{tuple(logits.shape)} with last stride 1")
            tensors["logits_cache_source"] = source
        src_dtype = logits.dtype if source is None else source.dtype
        if cache.dtype != src_dtype:  # the cache holds the source's values as they are (vLLM 0.33)
            raise TypeError(f"logits_cache ({cache.dtype}) must have the dtype of the logits it caches, "
                            f"{'logits_cache_source' if source is not None else 'logits'} ({src_dtype})")
        num_cols = cache.shape[1]
        if isinstance(col, torch.Tensor):
            if col.dim() == 0:
                check_vector("logits_cache_col", col.view(1), _INDEX_DTYPES, contiguous=True)
            else:
                check_vector("logits_cache_col", col, _INDEX_DTYPES, num_tokens, contiguous=True)
            tensors["logits_cache_col"] = col
        elif col is not None:
            if not is_int(col):
                raise TypeError(f"logits_cache_col must be an int or an int tensor, got {type(col).__name__}")
            if not 0 <= col < num_cols:
                raise ValueError(f"logits_cache_col={col} outside [0, {num_cols})")
        tensors["logits_cache"] = cache
    elif col is not None or source is not None:
        raise ValueError("logits_cache_col and logits_cache_source need logits_cache")
    for name, t in tensors.items():
        check_device(name, t, logits.device, "logits")
    if logits.device.type == "cpu":
        if temperature.numel() and not bool((temperature >= 0).all()):  # NaN is refused too
            bad = temperature[~(temperature >= 0)][:4].tolist()
            raise ValueError(f"temperature must be >= 0 (0 means greedy); got {bad}")
        if num_tokens and bool((expanded_idx_mapping >= temperature.shape[0]).any()):
            raise ValueError(
                f"expanded_idx_mapping holds {expanded_idx_mapping.max().item()}, beyond the "
                f"{temperature.shape[0]} request-state rows"
            )
        if isinstance(col, torch.Tensor) and num_tokens and bool(((col < 0) | (col >= cache.shape[1])).any()):
            raise ValueError(f"logits_cache_col must lie in [0, {cache.shape[1]})")

#: Below _FEW_ROWS rows, each row's vocabulary is split over several programs, about _PROGRAMS in all; from
#: _FEW_ROWS rows on, over _ROW_SPLITS of them (_SMALL_VOCAB_SPLITS for a vocabulary under _LARGE_VOCAB).
_FEW_ROWS = 256
_PROGRAMS = 1024
_ROW_SPLITS = 16
_SMALL_VOCAB_SPLITS = 8
_LARGE_VOCAB = 100_000
#: Up to _FEWEST_ROWS rows, _FEWEST_ROWS_SPLITS one-warp programs per row (``scripts/time_gumbel.py --sweep``
#: times one row of 248,320 in a CUDA graph under each launch configuration: ``graph_one_row``).
_FEWEST_ROWS = 4
_FEWEST_ROWS_SPLITS = 256
#: A tile is DEPTH x LANES tokens, LANES = the logits of one 16-byte load per thread, times the threads.
_BYTES_PER_LOAD = 16
#: Registers per thread the compiled sampling kernel may use. Left to itself, ptxas gave the masked kernel
#: that also stores the logits more registers than the unmasked one (the ncu profile's run before the cap,
#: ``gumbel_ncu_h200.json``, has the counts), and fewer warps then fit on an SM to hide the store's latency;
#: capped, no variant spills (ptxas -v, sm_90, triton 3.6).
_REGISTER_CAP = {} if INTERPRET else {"maxnreg": 96}


@functools.cache
def launch_config(num_tokens: int, vocab_size: int) -> tuple[int, int, int]:
    """(BLOCK, num_warps, tiles_per_program) for ``gumbel_sample``; a tile of BLOCK logits is laid out by
    ``tile_shape``.

    Interpreter: one program per row, tiles as large as possible (its cost is per program instance).
    GPU (tuned on the H200 with ``scripts/time_gumbel.py --sweep``): small programs, each row split over
    several: tiles of 1,024 for 2 warps (16 logits a thread), about 1,024 programs in all below 256 rows and
    16 per row from 256 rows on; tiles of 512 for 1 warp, 256 programs per row, up to 4 rows, and 8 per row
    for a vocabulary under 100,000 from 256 rows on."""
    fits = max(16, triton.next_power_of_2(vocab_size))  # a tiny vocabulary needs no larger tile
    if INTERPRET:
        block = min(fits, 1 << 16)
        return block, 4, triton.cdiv(vocab_size, block)
    if num_tokens >= _FEW_ROWS and vocab_size < _LARGE_VOCAB:
        block, warps, splits = min(512, fits), 1, _SMALL_VOCAB_SPLITS
    elif num_tokens <= _FEWEST_ROWS:
        block, warps, splits = min(512, fits), 1, _FEWEST_ROWS_SPLITS
    else:
        block, warps = min(1024, fits), 2
        splits = _ROW_SPLITS if num_tokens >= _FEW_ROWS else triton.cdiv(_PROGRAMS, num_tokens)
    tiles = triton.cdiv(vocab_size, block)
    return block, warps, triton.cdiv(tiles, min(tiles, splits))


def tile_shape(block: int, num_warps: int, itemsize: int) -> tuple[int, int]:
    """(DEPTH, LANES) of a tile of ``block`` logits of ``itemsize`` bytes handled by ``num_warps`` warps:
    a 16-byte load per thread per row of the tile, so that a thread holds whole columns and the tile's
    reduction along its first axis never leaves its registers."""
    lanes = min(block, _BYTES_PER_LOAD // itemsize * 32 * num_warps)
    return block // lanes, lanes


#: Scratch of split rows in eager calls, kept per (device, stream): the arrival counters, one int32 per row,
#: which the kernel leaves at 0 (so a call needs no memset), and the splits' keys, which each call writes
#: before it reads them (so a call needs no allocation). Calls on one stream run one after another; calls
#: that may overlap (two streams) get separate scratch. A captured call allocates its own keys, inside the
#: graph's memory pool, and uses no counters (two kernels instead).
_SPLIT_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _capturing(device: torch.device) -> bool:
    """Is a CUDA graph being captured on the current stream?"""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _split_scratch(device: torch.device, rows: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(arrival counters, split keys) for an eager call of ``rows`` rows of ``splits`` splits each."""
    # The raw stream handle, read as triton's launcher reads it (a Stream object costs microseconds).
    key = (device, torch._C._cuda_getCurrentRawStream(device.index)) if device.type == "cuda" else (device,)
    cached = _SPLIT_SCRATCH.get(key)
    if cached is None or cached[0].numel() < rows or cached[1].numel() < rows * splits:
        rows, keys = max(rows, 1024), max(rows * splits, 16 * 1024)
        cached = _SPLIT_SCRATCH[key] = (torch.zeros(rows, dtype=torch.int32, device=device),
                                        torch.empty(keys, dtype=torch.int64, device=device))
    return cached


if HAS_TRITON:
    # vLLM 0.33 hands gumbel_block_argmax 1-D tiles of 1,024 logits, one per program, and reduces the
    # programs' results with two torch ops. specfix hands it 2-D tiles laid out so that each thread holds
    # whole columns (tile_shape): the tile's reduction stays in registers, with no shuffle or barrier per
    # tile, and a row is split over several programs whose results the kernel combines itself.
    # Sizes are plain runtime values: one compiled kernel serves every vocabulary and batch shape.
    @triton.jit(do_not_specialize=["col_scalar", "vocab_size", "num_tiles", "num_full_tiles",
                                   "tiles_per_program", "num_splits"])
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
        USE_ASM: tl.constexpr,
        LANES: tl.constexpr,
        DEPTH: tl.constexpr,
        SPLITS: tl.constexpr,
        ARRIVE: tl.constexpr,
        STATIC_TILES: tl.constexpr,
    ):
        """Grid (rows, splits); each program walks ``tiles_per_program`` tiles of ``DEPTH x LANES`` tokens
        of its row (token ``tile * DEPTH * LANES + d * LANES + lane``), calls ``gumbel_block_argmax`` on
        each and keeps a running best per column (each thread holds its columns' ``DEPTH`` rows, so the
        tile's reduction stays in registers); one reduction across the columns ends the program. The next
        tile's logits are loaded before this tile's noise is computed, so the load's latency hides behind it.

        With one split per row the program stores the token. With several, each stores its best to
        ``split_best`` (one int64 key: its max, then its token). With ``ARRIVE`` each then counts itself
        in ``arrivals[row]`` and the row's last program to arrive takes the largest key (ties to the lower
        token) and sets the counter back to 0 for the next call; without, ``_gumbel_reduce_kernel`` does."""
        BLOCK: tl.constexpr = DEPTH * LANES
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        first_tile = split * tiles_per_program
        end_tile = tl.minimum(first_tile + tiles_per_program, num_tiles)
        full_end = tl.minimum(end_tile, num_full_tiles)
        logits_row_ptr = logits_ptr + row * logits_stride
        lanes = tl.arange(0, LANES)
        offsets = tl.arange(0, DEPTH)[:, None] * LANES + lanes[None, :]
        in_vocab = tl.full([DEPTH, LANES], True, tl.int1)  # every lane of a full tile
        best = tl.full([LANES], float("-inf"), tl.float32)
        best_token = first_tile * BLOCK + lanes  # what a program whose scores are all NaN or -inf returns
        if STATIC_TILES > 0:
            # Under triton 3.6's interpreter a runtime value cannot bound a range(): loop to a static bound
            # and skip the tiles past this program's share. Same arithmetic in the same order, no prefetch.
            for i in range(STATIC_TILES):
                tile = first_tile + i
                if tile < full_end:
                    block = tile * BLOCK + offsets
                    value, idx = gumbel_block_argmax(
                        tl.load(logits_row_ptr + block).to(tl.float32), block, in_vocab, row, idx_mapping_ptr,
                        temperature_ptr, seed_ptr, pos_ptr, cache_ptr, cache_stride0, cache_stride1,
                        col_ptr, source_ptr, source_stride, col_scalar, col_stride, IS_DRAFTING,
                        APPLY_TEMPERATURE, PER_TOKEN_COL, MASK_INVALID, NOISE, USE_ASM)
                    best, best_token = _keep_best(best, best_token, value, idx, tile * BLOCK, lanes, LANES)
        else:
            # Two tiles per turn, each loaded one tile ahead of its use (its latency hides behind the other
            # tile's noise) into its own registers. A tile index past the program's last full tile is
            # clamped to it: in bounds, a cache hit, and a repeat of a tile already seen changes nothing.
            x_even = tl.load(logits_row_ptr + first_tile * BLOCK + offsets,
                             mask=first_tile * BLOCK + offsets < full_end * BLOCK, other=0.0)
            for tile in range(first_tile, full_end, 2):
                odd = tl.minimum(tile + 1, full_end - 1)
                x_odd = tl.load(logits_row_ptr + odd * BLOCK + offsets)
                value, idx = gumbel_block_argmax(
                    x_even.to(tl.float32), tile * BLOCK + offsets, in_vocab, row, idx_mapping_ptr,
                    temperature_ptr, seed_ptr, pos_ptr, cache_ptr, cache_stride0, cache_stride1, col_ptr,
                    source_ptr, source_stride, col_scalar, col_stride, IS_DRAFTING, APPLY_TEMPERATURE,
                    PER_TOKEN_COL, MASK_INVALID, NOISE, USE_ASM)
                best, best_token = _keep_best(best, best_token, value, idx, tile * BLOCK, lanes, LANES)
                x_even = tl.load(logits_row_ptr + tl.minimum(tile + 2, full_end - 1) * BLOCK + offsets)
                value, idx = gumbel_block_argmax(
                    x_odd.to(tl.float32), odd * BLOCK + offsets, in_vocab, row, idx_mapping_ptr,
                    temperature_ptr, seed_ptr, pos_ptr, cache_ptr, cache_stride0, cache_stride1, col_ptr,
                    source_ptr, source_stride, col_scalar, col_stride, IS_DRAFTING, APPLY_TEMPERATURE,
                    PER_TOKEN_COL, MASK_INVALID, NOISE, USE_ASM)
                best, best_token = _keep_best(best, best_token, value, idx, odd * BLOCK, lanes, LANES)
        if end_tile > num_full_tiles:  # this program owns the partial last tile
            block = num_full_tiles * BLOCK + offsets
            mask = block < vocab_size
            value, idx = gumbel_block_argmax(
                tl.load(logits_row_ptr + block, mask=mask, other=float("-inf")).to(tl.float32), block, mask,
                row, idx_mapping_ptr, temperature_ptr, seed_ptr, pos_ptr, cache_ptr, cache_stride0,
                cache_stride1, col_ptr, source_ptr, source_stride, col_scalar, col_stride, IS_DRAFTING,
                APPLY_TEMPERATURE, PER_TOKEN_COL, MASK_INVALID, NOISE, USE_ASM)
            best, best_token = _keep_best(best, best_token, value, idx, num_full_tiles * BLOCK, lanes, LANES)
        value = tl.max(best, axis=0)
        token = tl.min(tl.where(best == value, best_token, 2147483647), axis=0)
        if num_splits == 1:
            tl.store(out_ptr + row, token.to(tl.int64))
        else:
            # One int64 key per split: the max's bits made sortable as a signed int, then the token reversed
            # (a tie goes to the lower token), so the max key holds the row's token.
            bits = value.to(tl.int32, bitcast=True)
            sortable = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
            key = sortable * 4294967296 + (2147483647 - token)
            tl.store(split_best_ptr + row * num_splits + split, key)
            if ARRIVE:
                tl.debug_barrier()  # every thread's stores happen before the release below
                arrived = tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel")
                if arrived == num_splits - 1:  # the row's last program: every split's key is in split_best
                    _store_best_split(out_ptr, split_best_ptr, row, num_splits, SPLITS)
                    tl.store(arrivals_ptr + row, 0)

    @triton.jit
    def _store_best_split(out_ptr, split_best_ptr, row, num_splits, SPLITS: tl.constexpr):
        """The token of the row's largest split key."""
        s = tl.arange(0, SPLITS)
        keys = tl.load(split_best_ptr + row * num_splits + s, mask=s < num_splits,
                       other=-9223372036854775807, cache_modifier=".cg")
        tl.store(out_ptr + row, 2147483647 - (tl.max(keys, axis=0) & 0xFFFFFFFF))

    @triton.jit
    def _gumbel_reduce_kernel(out_ptr, split_best_ptr, num_splits, SPLITS: tl.constexpr):
        """Stage 2 of a captured call: grid (rows,); each program stores its row's best split's token."""
        _store_best_split(out_ptr, split_best_ptr, tl.program_id(0).to(tl.int64), num_splits, SPLITS)


def gumbel_sample(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    apply_temperature: bool,
    is_drafting: bool,
    logits_cache: torch.Tensor | None = None,
    logits_cache_col: int | torch.Tensor | None = None,
    use_fp64: bool = False,
    logits_cache_source: torch.Tensor | None = None,
    *,
    fixes: Fixes | None = None,
    noise: str = "exact",
    block_size: int | None = None,
    num_warps: int | None = None,
    tiles_per_program: int | None = None,
) -> torch.Tensor:
    """Sample one token per logit row by Gumbel-max: ``argmax(logits / T + g)``, ``g ~ Gumbel(0, 1)``.

    The positional arguments are vLLM 0.33's, in its order, so that a call copied from vLLM means the same
    here; specfix's own are keyword-only.

    Args:
        logits: ``[num_tokens, vocab_size]`` float32/float16/bfloat16; rows may be strided.
        expanded_idx_mapping: ``[num_tokens]`` int64 (vLLM 0.33; int32 as in 0.25 is accepted), logit row ->
            request-state row; ``< 0`` = padding.
        temperature: ``[max_num_reqs]`` float32; 0 means greedy, any other value divides and adds noise
            (vLLM's ``SamplingParams`` has already raised every ``0 < T < 0.01`` to 0.01).
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        pos: ``[num_tokens]`` int64 (or int32) positions; the noise is keyed by (seed, pos, token id).
        apply_temperature: divide the logits by the temperature (else the caller already did).
        is_drafting: a drafter's draw: ``DRAFT_NOISE_SALT`` is added to the position (vLLM 0.33).
        logits_cache: optional ``[max_num_reqs, num_cols, >= vocab_size]`` draft-logits cache that receives
            each valid row's logits *before* temperature, in its own dtype, at ``[req_state_idx, col]``
            (vLLM 0.33; the verifier divides by the temperature when it reads them).
        logits_cache_col: the column: an int, a 0-d int tensor or an int tensor ``[num_tokens]``; default 0.
        use_fp64: vLLM's float64 reduction; specfix reduces in float32 (vLLM's default) and refuses True.
        logits_cache_source: what to cache instead of ``logits`` (same shape, the cache's dtype).
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
    if use_fp64:
        raise ValueError("use_fp64=True is not supported: specfix reduces in float32, vLLM's default")
    _validate(logits, expanded_idx_mapping, temperature, seed, pos, logits_cache, logits_cache_col,
              logits_cache_source)
    if not HAS_TRITON:
        if not fixes.mask_invalid_reqs:
            raise RuntimeError("the unmasked (pre-fix) kernel needs triton; the torch reference is the fix")
        if noise == "fast":
            raise RuntimeError("the fast noise needs triton")
        return ref.gumbel_sample_reference(logits, expanded_idx_mapping, temperature, seed, pos,
                                           apply_temperature, is_drafting, logits_cache, logits_cache_col,
                                           logits_cache_source=logits_cache_source, noise=noise)
    num_tokens, vocab_size = logits.shape
    out = torch.empty(num_tokens, dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return out
    default_block, default_warps, default_tiles = launch_config(num_tokens, vocab_size)
    block = default_block if block_size is None else block_size
    if not is_int(block) or block < 16 or block & (block - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    num_tiles = triton.cdiv(vocab_size, block)
    if tiles_per_program is None:
        tiles_per_program = 1 if block_size else default_tiles
    if not is_int(tiles_per_program) or tiles_per_program < 1:
        raise ValueError(f"tiles_per_program must be a positive int, got {tiles_per_program!r}")
    tiles_per_program = min(tiles_per_program, num_tiles)
    num_splits = triton.cdiv(num_tiles, tiles_per_program)
    col_tensor = logits_cache_col if isinstance(logits_cache_col, torch.Tensor) else None
    if col_tensor is not None and col_tensor.dim() == 0:
        col_tensor = col_tensor.expand(num_tokens)  # stride 0: every row reads the one column, no sync
    col_scalar = logits_cache_col if isinstance(logits_cache_col, int) else 0
    source = logits_cache_source
    if source is not None and (source.data_ptr(), source.stride(0)) == (logits.data_ptr(), logits.stride(0)):
        source = None  # the kernel stores the tile it has loaded
    # Split rows: eagerly, the last program of a row to finish picks its token (one launch: host time is
    # what an eager call pays most); in a CUDA graph a second small kernel does (GPU time is what a replay
    # pays, and a kernel boundary costs less of it than every program's arrival atomic).
    # Where a buffer is never read, any memory of its dtype will do.
    two_kernels = num_splits > 1 and _capturing(logits.device)
    arrivals, split_best = out.view(torch.int32), out
    if two_kernels:
        split_best = torch.empty(num_tokens * num_splits, dtype=torch.int64, device=logits.device)
    elif num_splits > 1:
        arrivals, split_best = _split_scratch(logits.device, num_tokens, num_splits)
    stride0, stride1 = (0, 0) if logits_cache is None else (logits_cache.stride(0), logits_cache.stride(1))
    warps = num_warps or default_warps
    depth, lanes = tile_shape(block, warps, logits.element_size())
    splits_bound = max(64, triton.next_power_of_2(num_splits))  # a few compiled variants, not one per count
    # The exact mode is compiled without FMA contraction (its bits are the reference's); the vllm mode as
    # vLLM's kernel is compiled (triton's default), so that the two make the same float operations.
    fusion = {} if noise == "vllm" else {"enable_fp_fusion": noise == "fast"}
    _gumbel_sample_kernel[(num_tokens, num_splits)](
        out, split_best, arrivals, logits, logits.stride(0), expanded_idx_mapping, temperature, seed, pos,
        logits_cache, stride0, stride1, col_tensor, source, 0 if source is None else source.stride(0),
        col_scalar, 0 if col_tensor is None else col_tensor.stride(0), vocab_size, num_tiles,
        vocab_size // block, tiles_per_program, num_splits,
        IS_DRAFTING=bool(is_drafting), APPLY_TEMPERATURE=bool(apply_temperature),
        PER_TOKEN_COL=col_tensor is not None, MASK_INVALID=fixes.mask_invalid_reqs,
        NOISE=NOISE_MODES.index(noise), USE_ASM=not INTERPRET,
        LANES=lanes, DEPTH=depth, SPLITS=splits_bound, ARRIVE=not two_kernels,
        STATIC_TILES=tiles_per_program if INTERPRET else 0, num_warps=warps, **fusion, **_REGISTER_CAP,
    )
    if two_kernels:
        _gumbel_reduce_kernel[(num_tokens,)](out, split_best, num_splits, SPLITS=splits_bound, num_warps=1)
    return out


if HAS_TRITON:

    @triton.jit
    def _gumbel_noise_kernel(out_ptr, seed_ptr, pos_ptr, vocab_size, NOISE: tl.constexpr,
                             USE_ASM: tl.constexpr, BLOCK: tl.constexpr):
        """The noise itself, [rows, vocab] (exact and vllm modes: natural log; fast mode: log2 units)."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        seed = tl.load(seed_ptr + row)
        pos = tl.load(pos_ptr + row).to(tl.int64)
        if NOISE == K.VLLM:
            g = _vllm_gumbel(_vllm_row_state(seed, pos), offs)
        else:
            key = _row_key(seed, pos)
            u = _uniform(key ^ (key >> 16), offs.to(tl.uint32) * K.TOKEN_MULT)
            if NOISE == K.FAST:
                g = _fast_gumbel_log2(u, USE_ASM)
            else:
                g = _exact_gumbel(u)
        tl.store(out_ptr + row * vocab_size + offs, g, mask=offs < vocab_size)


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int,
                 noise: str = "exact") -> torch.Tensor:
    """``[rows, vocab_size]`` float32 noise exactly as the sampling kernel draws it (for teaching and tests).

    ``"exact"``: Gumbel noise in natural-log units, bitwise equal to ``gumbel_reference.gumbel_noise``.
    ``"fast"``: the fast mode's noise in log2 units (Gumbel / ln 2, shifted by a constant).
    ``"vllm"``: vLLM 0.33's noise in natural-log units (``gumbel_reference.vllm_gumbel_noise``)."""
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    check_vector("seed", seed, (torch.int64,), contiguous=True)
    check_vector("pos", pos, _INDEX_DTYPES, seed.shape[0], contiguous=True)
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
