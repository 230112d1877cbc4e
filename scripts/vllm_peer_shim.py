"""Stand-ins for the ``vllm`` modules that vLLM's sampler files import, so that those files run alone.

``scripts/fetch_vllm_peer.py`` copies this file into ``.peer/`` and points every top-level ``from vllm...
import`` of the files it takes from vLLM's wheels at it. What the sampler functions use at call time is
real here: triton, a logger, ``SamplingMetadata`` (the fields they read), ``apply_top_k_top_p`` without
top-k/top-p (vLLM's own first branch), and vLLM 0.33's Triton launcher as it behaves at call time. Any other
imported name (the engine's classes, FLy verification, penalties...) is a stub that raises if it is used.
For measuring and comparing only; nothing of vLLM enters specfix.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["HAS_TRITON", "tl", "tldevice", "triton"]


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


@dataclass
class SamplingMetadata:
    """``vllm/v1/sample/metadata.py``'s fields that the rejection sampler's functions read."""

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None


def apply_top_k_top_p(logits: torch.Tensor, k, p, *args, **kwargs) -> torch.Tensor:
    if k is None and p is None:
        return logits
    raise NotImplementedError("vllm_peer_shim: top-k and top-p are not part of the comparison")


class WarmupChoices:
    """The warm-up inputs' choice of values; only the first is ever looked at (no warm-up runs here)."""

    def __init__(self, *values: Any):
        self.values = values

    def __bool__(self) -> bool:
        return bool(self.values[0])


@dataclass(frozen=True)
class TritonWarmupTensor:
    dtype: Any
    aligned: bool = True
    shape: tuple = (1,)
    strides: tuple | None = None
    init: Any = 0


DispatchSpec = tuple


def triton_kernel_dispatcher_with_warmup(*, kernel, warmup_inputs=None):
    """vLLM 0.33's launcher at call time: the decorated function returns ``(grid, launch kwargs)``, and
    its own arguments reach the kernel by name (``x`` binds the kernel's ``x`` or ``x_ptr``)."""

    def decorate(dispatch):
        signature = inspect.signature(dispatch)
        params = set(kernel.arg_names)

        @functools.wraps(dispatch)
        def launch(*args, **kwargs):
            grid, launch_kwargs = dispatch(*args, **kwargs)[:2]
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            by_name = {}
            for name, value in bound.arguments.items():
                target = name if name in params else f"{name}_ptr"
                if target in params:
                    by_name[target] = value
            return kernel[grid](**by_name, **launch_kwargs)

        launch.register_warmup = lambda *a, **k: None
        return launch

    return decorate


# vLLM 0.24 and 0.25 import these from vllm.triton_utils too: triton is present here, and ``tldevice`` is
# Triton's libdevice (their Gumbel kernels call its log1p), which only a compiled kernel on a GPU has.
HAS_TRITON = True
try:
    from triton.language.extra import libdevice as tldevice
except ImportError:  # an older triton: the kernels that need it fail when compiled, and say why
    tldevice = None


class _Unavailable:
    """A name vLLM's file imports but the comparison never uses: calling or indexing it raises."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"vllm_peer_shim: {self.name} is not available outside vLLM")

    __getitem__ = __call__


def __getattr__(name: str) -> _Unavailable:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)
