"""Counting host-device synchronisations, the cost a serving step must not pay.

:func:`sync_warnings` runs a function under torch's sync debug mode, which warns wherever the host waits for
the GPU (``.item()``, blocking copies, ``nonzero``...); :func:`host_reads` needs no GPU: it lists the tensor
methods a function calls that hand a value to the host, each one a synchronisation on a GPU.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

#: What torch says at each synchronising call (not to be confused with its one-time notice that the debug
#: mode "is a prototype feature", which also mentions synchronisation and comes on first use).
_SYNC_WARNING = "called a synchronizing CUDA operation"


def sync_warnings(fn: Callable[[], object]) -> list[str]:
    """The first line of every synchronisation warning torch raises while ``fn()`` runs once on CUDA."""
    # Collect garbage first and pause the collector: freeing an earlier object (a CUDA graph's memory pool
    # synchronises) must not be charged to fn.
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        if collecting:
            gc.enable()
    return [str(w.message).splitlines()[0] for w in caught if _SYNC_WARNING in str(w.message)]


def count_host_syncs(fn: Callable[[], object], device: torch.device) -> int | None:
    """How many times ``fn()`` makes the host wait for the GPU; None on a CPU, where nothing is waited for."""
    return len(sync_warnings(fn)) if device.type == "cuda" else None


#: Tensor methods that hand a value to the host, so on a GPU they wait for every kernel queued before them.
HOST_READS = frozenset(
    "__bool__ __int__ __float__ __index__ item tolist numpy cpu nonzero masked_select unique".split()
)


class _HostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def host_reads(fn: Callable[[], object]) -> tuple[object, list[str]]:
    """``fn()``'s result and the host reads it made (``bool(t)``, ``.item()``, ``.tolist()``, ``nonzero``...),
    on any device: each one is a synchronisation on a GPU, so a CPU run already shows code that would sync."""
    with _HostReads() as mode:
        result = fn()
    return result, mode.calls
