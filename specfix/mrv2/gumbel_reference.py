"""The Gumbel noise of specfix's sampler, defined in plain torch, and a reference ``gumbel_sample``.

Mirrors the contract of vLLM Model Runner V2's ``vllm/v1/worker/gpu/sample/gumbel.py`` (see
``specfix.mrv2.gumbel`` for the Triton kernel). The noise for token ``v`` of a row is a pure function of
(request seed, position, v), so a draw does not depend on what else is in the batch, and the Triton
kernel, Triton's interpreter and this file all produce the same bits:

1. ``row_key(seed, pos)``: four rounds of murmur3's 32-bit finaliser ``fmix32`` over the seed's and the
   position's two 32-bit halves.
2. ``token_bits = fmix32(row_key ^ (v * 0x9E3779B1))`` (a bijection of v: no two tokens of a row share bits).
3. ``u = (bits + 0.5) * 2**-32``, capped at ``1 - 2**-24``: a uniform in (0, 1).
4. ``g = -log(-log1p(-u))``, the careful form: the large noise that wins the argmax lives at u -> 0,
   where ``log1p`` keeps full precision and a naive ``log(1 - u)`` would round to 0. The logarithm is our
   own (exponent split + a degree-9 polynomial) built from float32 adds and multiplies only, so IEEE
   arithmetic makes it bit-identical on every machine (the GPU kernel is compiled without FMA
   contraction for this "exact" mode).

All integer work is done in int64 holding 32-bit values (no reliance on overflow), all float work in
float32 in the same order as the kernel.
"""

from __future__ import annotations

import torch

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
    -0.5000000596046448, 0.33333829045295715, -0.250003457069397, 0.19966205954551697,
    -0.1660885214805603, 0.14910957217216492, -0.14012959599494934, 0.08381369709968567,
)


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
    """ln(x) for positive normal float32 x, from float32 adds and multiplies only.

    Accurate relative to ln(x) even for x next to 1, because f = m - 1 is exact.
    """
    bits = x.view(torch.int32)
    exponent = (bits - SQRT_HALF_BITS) >> 23
    m = (bits - exponent * (1 << 23)).view(torch.float32)
    f = m - 1.0
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
    """The careful form -log(-log1p(-u))."""
    return -careful_log(-log1p_neg(u))


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, vocab_size]`` float32 Gumbel noise for rows with the given seeds and positions."""
    return gumbel_from_uniform(bits_to_uniform(token_bits(row_key(seed, pos), vocab_size)))


def gumbel_sample_reference(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    apply_temperature: bool,
    processed_logits: torch.Tensor | None = None,
    processed_logits_col: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """What the fixed kernel computes, row by row in torch (same noise, same tokens, same stores).

    Rows with ``expanded_idx_mapping < 0`` are padding: temperature 0 (plain argmax), nothing stored.
    """
    num_tokens, vocab_size = logits.shape
    idx = expanded_idx_mapping.to(torch.int64)
    valid = idx >= 0
    safe = idx.clamp(min=0)
    temp = torch.where(valid, temperature[safe], torch.zeros((), dtype=temperature.dtype, device=idx.device))
    row_seed = torch.where(valid, seed[safe], torch.zeros((), dtype=seed.dtype, device=idx.device))
    x = logits.to(torch.float32)
    sampling = temp != 0
    if apply_temperature:
        x = torch.where(sampling[:, None], x / torch.where(sampling, temp, 1.0)[:, None], x)
    if processed_logits is not None:
        if processed_logits_col is None:
            cols = torch.zeros(num_tokens, dtype=torch.int64, device=idx.device)
        elif isinstance(processed_logits_col, int):
            cols = torch.full((num_tokens,), processed_logits_col, dtype=torch.int64, device=idx.device)
        else:
            cols = processed_logits_col.to(torch.int64)
        processed_logits[idx[valid], cols[valid]] = x[valid].to(processed_logits.dtype)
    noise = gumbel_noise(row_seed, pos, vocab_size)
    scores = torch.where(sampling[:, None], x + noise, x)
    return scores.argmax(dim=-1)
