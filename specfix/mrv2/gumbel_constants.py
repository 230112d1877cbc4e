"""The Gumbel kernels' constants as triton constexprs, read as attributes of this module (``K.C1``).

Triton re-checks before every launch each global constexpr a kernel reads, but not a module's attributes:
as module globals these would cost more host time than the rest of the launch. The values are
``gumbel_reference``'s (vLLM's for the ``vllm`` noise).
"""

from __future__ import annotations

import torch

from specfix.mrv2 import gumbel_reference as ref
from specfix.runtime import tl

C1 = tl.constexpr(ref.FMIX_C1)
C2 = tl.constexpr(ref.FMIX_C2)
TOKEN_MULT = tl.constexpr(ref.TOKEN_MULT)
KEY_SALT = tl.constexpr(ref.KEY_SALT)
U_MAX = tl.constexpr(ref.U_MAX)
SQRT_HALF_BITS = tl.constexpr(ref.SQRT_HALF_BITS)
LN2 = tl.constexpr(ref.LN2)
LOG2E = tl.constexpr(ref.LOG2E)
P0, P1, P2, P3, P4, P5, P6, P7 = (tl.constexpr(c) for c in ref.LN1P_POLY)
#: log2(e) / k in float32: -log2(1 - u) = log2(e) * (u + u**2/2 + u**3/3 + u**4/4 + ...)
S1, S2, S3, S4 = (tl.constexpr(torch.tensor(ref.LOG2E / k, dtype=torch.float32).item()) for k in range(1, 5))
DRAFT_NOISE_SALT = tl.constexpr(ref.DRAFT_NOISE_SALT)
M_C1 = tl.constexpr(ref.MURMUR_C1)
M_C2 = tl.constexpr(ref.MURMUR_C2)
M_R1 = tl.constexpr(ref.MURMUR_R1)
M_R2 = tl.constexpr(ref.MURMUR_R2)
M_N = tl.constexpr(ref.MURMUR_N)
VLLM_KEY_BYTES = tl.constexpr(ref.VLLM_KEY_BYTES)
VLLM_SERIES_BELOW = tl.constexpr(ref.VLLM_SERIES_BELOW)
VLLM_ONE_MINUS_U_MIN = tl.constexpr(ref.VLLM_ONE_MINUS_U_MIN)
#: The NOISE constexpr of the kernels, one per mode of ``ref.NOISE_MODES``.
EXACT, FAST, VLLM = (tl.constexpr(i) for i in range(3))
