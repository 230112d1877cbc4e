"""The debug switch for value checks that would make the host wait for the GPU.

A serving step must not synchronise (a ``.tolist()`` on a CUDA tensor stalls the host), so checks that
read values run on CPU tensors always and on GPU tensors only with this switch on; shapes, dtypes and
devices live on the host and are checked always.

    SPECFIX_DEVICE_CHECKS=1 python ...        # on from the start
    with device_checks.enabled():             # on for a block (tests, debugging a crash)
        sampler(...)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

_on = os.environ.get("SPECFIX_DEVICE_CHECKS", "") == "1"


def on() -> bool:
    """Whether GPU-reading value checks run (off by default: the step path never syncs)."""
    return _on


@contextlib.contextmanager
def enabled(value: bool = True) -> Iterator[None]:
    """Turn the GPU-reading value checks on (or off) inside the block."""
    global _on
    previous, _on = _on, bool(value)
    try:
        yield
    finally:
        _on = previous


def wanted(*tensors: torch.Tensor | None) -> bool:
    """Whether to run a value check on ``tensors``: always when none is on a GPU (no sync)."""
    return _on or all(t is None or t.device.type == "cpu" for t in tensors)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CPU tensor on ``device`` without a blocking copy: through pinned memory, asynchronously, on CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
