"""The Gumbel noise of specfix's sampler, defined in plain torch, and a reference ``gumbel_sample``.

Mirrors the contract of vLLM 0.33.0's Model Runner V2 ``vllm/v1/worker/gpu/sample/gumbel.py`` (the Triton
kernel is ``specfix.mrv2.gumbel``). The noise of token ``v`` is a pure function of (request seed, position,
v), so a draw does not depend on the rest of the batch. Two noise modes are defined here, each recipe in a
comment above its functions: specfix's own ("exact") and vLLM 0.33's ("vllm").

Read ``gumbel_noise`` and ``vllm_gumbel_noise`` first, then ``gumbel_sample_reference``.
"""

from __future__ import annotations

import torch

#: The noise modes of ``gumbel_sample``: this file defines "exact" and "vllm"; "fast" needs the GPU's lg2.
NOISE_MODES = ("exact", "fast", "vllm")
#: Added to the position of a drafter's draw (``is_drafting``), as vLLM 0.33's ``_DRAFT_NOISE_SALT``.
DRAFT_NOISE_SALT = 1 << 30
MASK32 = 0xFFFFFFFF
#: murmur3 ``fmix32`` multipliers, the token multiplier (2**32 / golden ratio) and the row-key salt.
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
TOKEN_MULT = 0x9E3779B1
KEY_SALT = 0x243F6A88
#: ``u`` is capped just below 1 so that ``-log(1 - u)`` stays finite.
U_MAX = 1.0 - 2.0**-24
#: float32 bits of sqrt(1/2): the logarithm splits x = 2**e * m with m in [sqrt(1/2), sqrt(2)).
SQRT_HALF_BITS = 0x3F3504F3
#: float32 ln(2) and log2(e).
LN2 = 0.6931471824645996
LOG2E = 1.4426950216293335
#: ln(1 + f) = f + f**2 * P(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1]; P's power-basis coefficients
#: (a weighted Chebyshev fit, rounded to float32: max relative error 1.4e-7 in float32 Horner).
LN1P_POLY = (
    -0.5000000596046448,
    0.33333829045295715,
    -0.250003457069397,
    0.19966205954551697,
    -0.1660885214805603,
    0.14910957217216492,
    -0.14012959599494934,
    0.08381369709968567,
)


# ---- specfix's noise ("exact" mode): a 32-bit row key from (seed, position), each token's bits from it, a
# uniform, then the careful -log(-log1p(-u)) (the noise that wins the argmax lives at u -> 0, where a naive
# log(1 - u) rounds to 0). The logarithm is built from float32 adds and multiplies only, so IEEE arithmetic
# makes it bit-identical everywhere (the GPU kernel is compiled without FMA contraction for this mode).
# Integers are held in int64 (no reliance on overflow), floats in float32 in the kernel's order.


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """(a * b) mod 2**32 for a in [0, 2**32), without int64 overflow (b split into 16-bit halves)."""
    lo = a * (b & 0xFFFF)
    hi = ((a * (b >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser: a bijection of uint32 with good avalanche (values held in int64)."""
    x = x ^ (x >> 16)
    x = _mul32(x, FMIX_C1)
    x = x ^ (x >> 13)
    x = _mul32(x, FMIX_C2)
    return x ^ (x >> 16)


def row_key(seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """32-bit key of (request seed, position); both int64 of any sign."""
    seed, pos = seed.to(torch.int64), pos.to(torch.int64)
    key = fmix32((seed & MASK32) ^ KEY_SALT)
    key = fmix32(key ^ ((seed >> 32) & MASK32))
    key = fmix32(key ^ (pos & MASK32))
    return fmix32(key ^ ((pos >> 32) & MASK32))


def token_bits(key: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab_size]`` 32-bit hashes of every token id under each row's key."""
    tokens = _mul32(torch.arange(vocab_size, dtype=torch.int64, device=key.device), TOKEN_MULT)
    return fmix32(key[:, None] ^ tokens[None, :])


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """Uniform in [2**-33, 1 - 2**-24] (float32)."""
    u = (bits.to(torch.float32) + 0.5) * 2.0**-32
    return torch.clamp(u, max=U_MAX)


def careful_log(x: torch.Tensor) -> torch.Tensor:
    """ln(x) for positive normal float32 x, from float32 adds and multiplies only."""
    bits = x.view(torch.int32)
    exponent = (bits - SQRT_HALF_BITS) >> 23
    m = (bits - exponent * (1 << 23)).view(torch.float32)
    f = m - 1.0  # exact, so the result is accurate relative to ln(x) even next to 1
    p = torch.full_like(f, LN1P_POLY[-1])
    for c in LN1P_POLY[-2::-1]:
        p = p * f + c
    return exponent.to(torch.float32) * LN2 + (f + (f * f) * p)


def log1p_neg(u: torch.Tensor) -> torch.Tensor:
    """log1p(-u) for u in (0, 1): ln of the rounded w = 1 - u plus the exactly computed rounding error."""
    w = 1.0 - u
    d = (1.0 - w) - u
    return careful_log(w) + d


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    return -careful_log(-log1p_neg(u))


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab_size]`` float32 Gumbel noise for rows with the given seeds and positions."""
    return gumbel_from_uniform(bits_to_uniform(token_bits(row_key(seed, pos), vocab_size)))


# ---- vLLM 0.33's noise ("vllm" mode; ``vllm/v1/worker/gpu/sample/gumbel.py``, PR #51367), so that specfix
# and vLLM pick the same tokens from the same inputs: MurmurHash3_x86_32 (seed 0) of the seed's two words,
# the position's low word and the token id; u from the hash's 16-bit halves; -log(-log1p(-u)) with vLLM's
# series. The logarithms are the platform's: this file matches the kernel's hashes and uniforms bit for bit
# and its noise within a rounding. The kernel divides by the temperature as vLLM does (``div.full.f32`` on
# a GPU), this file with IEEE division: in a GPU near-tie the two can differ.
# A drafter's draw (``is_drafting``) adds DRAFT_NOISE_SALT to the position in every mode (PR #54282: a
# draft and the residual it may be resampled from must not share noise). A call filling the drafter's
# logits cache mixes the column into the seed's high word, ``seed ^ (col << 32)``, as vLLM 0.33's
# ``spec_step_seed`` (vllm mode only).

#: MurmurHash3_x86_32's block multipliers, rotations and the constant of its per-block update.
MURMUR_C1 = 0xCC9E2D51
MURMUR_C2 = 0x1B873593
MURMUR_R1 = 15
MURMUR_R2 = 13
MURMUR_N = 0xE6546B64
#: Bytes hashed per (seed, position, token): four 32-bit words.
VLLM_KEY_BYTES = 16
#: float32 constants of the vllm mode's log1p series and its floor under 1 - u (2**-24).
VLLM_SERIES_BELOW = 0.25
VLLM_ONE_MINUS_U_MIN = 5.960464477539063e-08


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & MASK32


def murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """MurmurHash3_x86_32's update of the state ``h`` by one 32-bit block ``k`` (both held in int64)."""
    k = _mul32(_rotl32(_mul32(k, MURMUR_C1), MURMUR_R1), MURMUR_C2)
    h = _rotl32(h ^ k, MURMUR_R2)
    return (_mul32(h, 5) + MURMUR_N) & MASK32


def vllm_token_bits(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab_size]`` hashes of (seed low word, seed high word, position low word, token id)."""
    seed, pos = seed.to(torch.int64), pos.to(torch.int64)
    h = torch.zeros_like(seed)
    for word in (seed & MASK32, (seed >> 32) & MASK32, pos & MASK32):  # the row's part, once per row
        h = murmur3_mix(h, word)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=seed.device)
    return fmix32(murmur3_mix(h[:, None], tokens[None, :]) ^ VLLM_KEY_BYTES)


def vllm_uniform(bits: torch.Tensor) -> torch.Tensor:
    """u in (0, 1] from the hash's two 16-bit halves: ``(bits + 0.5) * 2**-32`` rounded once to float32."""
    hi = (bits >> 16).to(torch.float32)
    lo = (bits & 0xFFFF).to(torch.float32)
    return hi * 2.0**-16 + (lo + 0.5) * 2.0**-32


def vllm_gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab_size]`` float32 noise of the vllm mode (vLLM 0.33's ``murmur3_uniform32`` noise)."""
    u = vllm_uniform(vllm_token_bits(seed, pos, vocab_size))
    # log1p(-u) as vLLM 0.33 computes it: -u * (1 + u/2 + ... + u**7/8) (Horner, float32) below u = 0.25,
    # log(max(1 - u, 2**-24)) above
    p = torch.full_like(u, 1.0 / 8.0)
    for k in range(7, 0, -1):
        p = torch.tensor(1.0 / k, dtype=torch.float32) + u * p
    direct = torch.log(torch.clamp(1.0 - u, min=VLLM_ONE_MINUS_U_MIN))
    return -torch.log(-torch.where(u < VLLM_SERIES_BELOW, -u * p, direct))


def gumbel_sample_reference(
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
    noise: str = "exact",
) -> torch.Tensor:
    """The fixed kernel's noise, tokens and cache stores in torch, with ``gumbel_sample``'s arguments."""
    if noise not in ("exact", "vllm"):
        raise ValueError(f"noise must be 'exact' or 'vllm' for the torch reference, got {noise!r}")
    if use_fp64:
        raise ValueError("use_fp64=True is not supported: specfix reduces in float32, vLLM's default")
    num_tokens, vocab_size = logits.shape
    idx = expanded_idx_mapping.to(torch.int64)
    valid = idx >= 0  # padding rows: temperature 0 (a plain argmax), nothing stored
    safe = idx.clamp(min=0)
    temp = torch.where(valid, temperature[safe], torch.zeros((), dtype=temperature.dtype, device=idx.device))
    row_seed = torch.where(valid, seed[safe], torch.zeros((), dtype=seed.dtype, device=idx.device))
    row_pos = pos.to(torch.int64) + (DRAFT_NOISE_SALT if is_drafting else 0)
    x = logits.to(torch.float32)
    sampling = temp != 0  # NaN too, as in vLLM 0.33's kernel
    if apply_temperature:
        x = torch.where(sampling[:, None], x / torch.where(sampling, temp, 1.0)[:, None], x)
    if logits_cache is not None:
        col = 0 if logits_cache_col is None else logits_cache_col
        cols = torch.as_tensor(col, dtype=torch.int64, device=idx.device).expand(num_tokens)
        slot = (idx * logits_cache.shape[1] + cols).clamp(min=0)
        last = torch.full(
            (logits_cache.shape[0] * logits_cache.shape[1],), -1, dtype=torch.int64, device=idx.device
        )
        rows = torch.arange(num_tokens, device=idx.device)
        # rows storing into one [req_state_idx, col]: the highest wins, as in the interpreter (GPU: a race)
        last.scatter_reduce_(0, slot[valid], rows[valid], reduce="amax")
        keep = valid & (last[slot] == rows)
        source = logits if logits_cache_source is None else logits_cache_source  # before temperature, as is
        logits_cache[idx[keep], cols[keep], :vocab_size] = source[keep].to(logits_cache.dtype)
        if noise == "vllm":
            row_seed = row_seed ^ (cols << 32)
    g = (vllm_gumbel_noise if noise == "vllm" else gumbel_noise)(row_seed, row_pos, vocab_size)
    scores = torch.where(sampling[:, None], x + g, x)
    # a NaN never wins; ties go to the lowest token; a row of only NaN and -inf gives token 0
    return torch.where(scores.isnan(), float("-inf"), scores).argmax(dim=-1)
