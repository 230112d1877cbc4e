"""The Gumbel noise in Triton: the hash and logarithm functions the sampling kernel calls.

``gumbel_noise`` draws the noise alone, so that tests and chapter 4 can look at it. The torch twin that
defines each mode is ``specfix.mrv2.gumbel_reference``; read ``NOISE_MODES`` first.
"""

from __future__ import annotations

import torch

from specfix.checks import check_vector
from specfix.mrv2 import gumbel_constants as K
from specfix.mrv2 import gumbel_reference as ref
from specfix.runtime import HAS_TRITON, INTERPRET, tl, triton

#: Each a pure function of (request seed, position, token id). "exact" (default): specfix's 32-bit hash and a
#: float32 logarithm without FMA contraction, the same bits on the GPU, in Triton's interpreter and in torch;
#: "fast": the same hash and the hardware's approximate lg2 (the same distribution, tokens that may differ in
#: rare near-ties); "vllm": vLLM 0.33's noise, compiled as its kernel is, so that vLLM 0.33's gumbel_sample
#: picks the same tokens from the same inputs.
NOISE_MODES = ref.NOISE_MODES
#: Each mode's compile options: exact without FMA contraction (its bits are the reference's), vllm as vLLM's
#: kernel is compiled (triton's default), so that the two make the same float operations.
FP_FUSION = {"exact": {"enable_fp_fusion": False}, "fast": {"enable_fp_fusion": True}, "vllm": {}}
#: The dtypes of a position or request-row tensor the kernels read.
INDEX_DTYPES = (torch.int32, torch.int64)


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
    """u in (0, 1) of each token: ``fmix32(key ^ token_mult)``, ``token_mult = token id * TOKEN_MULT``."""
    # key_mixed = key ^ (key >> 16): fmix32's first xor-shift, once per row (it distributes over xor)
    x = key_mixed ^ token_mult ^ (token_mult >> 16)
    x = x * K.C1
    x = x ^ (x >> 13)
    x = x * K.C2
    bits = x ^ (x >> 16)
    # bits * 2**-32 + 2**-33: one FMA, rounded once, exactly the reference's (bits + 0.5) * 2**-32
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
def _neg_log2(x, USE_ASM: tl.constexpr):
    """-log2(x) by the hardware's approximate lg2 (``-tl.log2`` in the interpreter)."""
    if USE_ASM:  # ftz: inputs are never below 2**-33, and it spares rescaling a subnormal
        # The neg sits inside the asm: triton writes -y as 0 - y (not a negation at y = +0), which ptxas
        # keeps as an instruction of its own, where a neg.f32 folds into the instruction that reads it.
        return tl.inline_asm_elementwise(
            "{ .reg .f32 t; lg2.approx.ftz.f32 t, $1; neg.f32 $0, t; }",
            "=r,r",
            [x],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        return -tl.log2(x)


@triton.jit
def _fast_gumbel_log2(u, USE_ASM: tl.constexpr):
    """The Gumbel noise divided by ln 2, up to a constant: -log2(-log2(1 - u))."""
    # the hardware lg2 has an absolute error near 1, so -log2(1 - u) for u < 1/32 comes from its series
    series = u * (K.S1 + u * (K.S2 + u * (K.S3 + u * K.S4)))
    return _neg_log2(tl.where(u < 0.03125, series, _neg_log2(1.0 - u, USE_ASM)), USE_ASM)


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


@triton.jit
def _gumbel_noise_kernel(
    out_ptr, seed_ptr, pos_ptr, vocab_size, NOISE: tl.constexpr, USE_ASM: tl.constexpr, BLOCK: tl.constexpr
):
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


def gumbel_noise(
    seed: torch.Tensor, pos: torch.Tensor, vocab_size: int, noise: str = "exact"
) -> torch.Tensor:
    """``[rows, vocab_size]`` float32 noise exactly as the sampling kernel draws it: natural-log units, but
    log2 units (Gumbel / ln 2, shifted by a constant) in the fast mode."""
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    check_vector("seed", seed, (torch.int64,), contiguous=True)
    check_vector("pos", pos, INDEX_DTYPES, seed.shape[0], contiguous=True)
    if not HAS_TRITON:
        if noise == "fast":
            raise RuntimeError("the fast noise needs triton")
        return (ref.vllm_gumbel_noise if noise == "vllm" else ref.gumbel_noise)(seed, pos, vocab_size)
    out = torch.empty((seed.shape[0], vocab_size), dtype=torch.float32, device=seed.device)
    block = min(triton.next_power_of_2(vocab_size), 1 << 16 if INTERPRET else 4096)
    _gumbel_noise_kernel[(seed.shape[0], triton.cdiv(vocab_size, block))](
        out,
        seed,
        pos,
        vocab_size,
        NOISE=NOISE_MODES.index(noise),
        USE_ASM=not INTERPRET,
        BLOCK=block,
        **FP_FUSION[noise],
    )
    return out
