"""Per-request sampling parameters for one step, as the rejection sampler needs them.

Mirrors vLLM 0.33.0's ``vllm/v1/sample/metadata.py``, keeping temperature and seeded generators only.

The greedy rule, said once for every sampler in specfix: a temperature below ``SAMPLING_EPS`` (vLLM 0.33.0's
``_SAMPLING_EPS``, ``vllm/sampling_params.py``) is greedy, and its row stores ``GREEDY_TEMPERATURE`` so that
no kernel divides by a tiny T (``logits / T`` would overflow and the softmax turn NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specfix.checks import is_int
from specfix.v1 import device_checks

#: A temperature below this is greedy decoding (vLLM's ``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5
#: What the runner stores for a greedy request (vLLM's ``GREEDY_TEMPERATURE``).
GREEDY_TEMPERATURE = 0


def check_temperature(name: str, t: object) -> None:
    if not (is_int(t) or isinstance(t, float)) or not math.isfinite(t):
        raise TypeError(f"{name} must be a finite number, got {t!r}")
    if t < 0:
        raise ValueError(f"{name} must be >= 0 (0 = greedy), got {t}")


def check_seed(name: str, seed: object) -> None:
    """None (unseeded) or an int for vLLM's int64 seed tables."""
    if seed is not None and not is_int(seed):
        raise TypeError(f"{name} must be an int or None, got {seed!r}")
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise ValueError(f"{name} must fit in an int64, got {seed}")


@dataclass
class SamplingMetadata:
    """Sampling parameters of a batch of B requests."""

    temperature: torch.Tensor | None  # [B] float32; None when every request is greedy (as in vLLM)
    all_greedy: bool
    all_random: bool
    generators: dict[int, torch.Generator]  # seeded random requests only; the rest use the global one

    def __post_init__(self) -> None:
        if not isinstance(self.generators, dict) or not all(
            isinstance(g, torch.Generator) for g in self.generators.values()
        ):
            raise TypeError(
                f"generators must be a dict of batch index -> torch.Generator, got {self.generators!r}"
            )
        for name in ("all_greedy", "all_random"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.temperature is None:
            if not self.all_greedy or self.all_random:
                raise ValueError("temperature may be None only when all_greedy=True and all_random=False")
            return
        t = self.temperature
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.dim() != 1:
            raise TypeError(f"temperature must be a 1-D float tensor, got {t!r}")
        if t.numel() == 0:
            raise ValueError("temperature is empty: a batch needs at least one request")
        bad = [i for i in self.generators if not (is_int(i) and 0 <= i < t.numel())]
        if bad:
            raise ValueError(f"generators keys must be batch indices in [0, {t.numel()}), got {bad}")
        if not device_checks.wanted(t):
            return  # reading a GPU tensor's values is a host sync: checked only under device_checks
        values = t.tolist()  # one host sync for all checks
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {values}")
        greedy = [v < SAMPLING_EPS for v in values]
        if self.all_greedy != all(greedy) or self.all_random != (not any(greedy)):
            raise ValueError(
                f"all_greedy={self.all_greedy} / all_random={self.all_random} disagree with "
                f"temperature {values}"
            )

    @classmethod
    def from_requests(
        cls, temperatures: list[float], seeds: list[int | None], device: torch.device | str = "cpu"
    ) -> SamplingMetadata:
        """Build from per-request temperatures and seeds (None: unseeded; a greedy request's is ignored)."""
        if len(temperatures) == 0:
            raise ValueError("temperatures is empty: a batch needs at least one request")
        if len(seeds) != len(temperatures):
            raise ValueError(f"seeds has {len(seeds)} entries but temperatures has {len(temperatures)}")
        for i, (t, s) in enumerate(zip(temperatures, seeds, strict=True)):
            check_temperature(f"temperatures[{i}]", t)
            check_seed(f"seeds[{i}]", s)
        greedy = [t < SAMPLING_EPS for t in temperatures]
        generators = {
            i: torch.Generator(device=device).manual_seed(s)
            for i, (s, g) in enumerate(zip(seeds, greedy, strict=True))
            if s is not None and not g
        }
        all_greedy = all(greedy)
        stored = [GREEDY_TEMPERATURE if g else t for t, g in zip(temperatures, greedy, strict=True)]
        return cls(
            temperature=None
            if all_greedy
            else device_checks.to_device(torch.tensor(stored, dtype=torch.float32), device),
            all_greedy=all_greedy,
            all_random=not any(greedy),
            generators=generators,
        )

    @property
    def is_greedy(self) -> torch.Tensor | None:
        """[B] bool, True where the request is greedy; None when all requests are greedy."""
        return None if self.temperature is None else self.temperature < SAMPLING_EPS
