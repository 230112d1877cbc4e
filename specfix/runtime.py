"""Where specfix runs: device choice, Triton (compiled or interpreted), problem scale.

Import this module before anything imports triton. On a machine without a usable GPU it turns on
Triton's interpreter (``TRITON_INTERPRET=1``), which must happen before ``import triton`` because
triton's own helpers (``tl.rand``...) are decorated at import time.

Environment:
    SPECFIX_DEVICE  ``cuda`` or ``cpu``; default: ``cuda`` when available.
    SPECFIX_SCALE   ``ci`` (small, fast; the default) or ``full`` (the sizes a GPU run uses).
"""

from __future__ import annotations

import os
import platform
import sys
from types import ModuleType

import torch


def _choose_device() -> torch.device:
    wanted = os.environ.get("SPECFIX_DEVICE", "").strip().lower()
    if wanted not in ("", "cpu", "cuda"):
        raise ValueError(f"SPECFIX_DEVICE must be 'cpu' or 'cuda', got {wanted!r}")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("SPECFIX_DEVICE=cuda but torch sees no CUDA GPU")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def _choose_scale() -> str:
    scale = os.environ.get("SPECFIX_SCALE", "ci").strip().lower()
    if scale not in ("ci", "full"):
        raise ValueError(f"SPECFIX_SCALE must be 'ci' or 'full', got {scale!r}")
    return scale


DEVICE: torch.device = _choose_device()
SCALE: str = _choose_scale()
#: Triton kernels are simulated on the CPU by triton's interpreter.
INTERPRET: bool = DEVICE.type == "cpu"


def _load_triton() -> tuple[ModuleType | None, ModuleType | None]:
    if INTERPRET:
        if sys.modules.get("triton") is not None and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "triton was imported before specfix without TRITON_INTERPRET=1, so its kernels cannot run "
                "on this CPU-only machine. Restart the kernel and import specfix first, or set "
                "TRITON_INTERPRET=1 in the environment before starting Python."
            )
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl
    except ImportError:
        print(
            f"specfix: triton is not installed on {platform.system()}; kernels run their torch reference.",
            file=sys.stderr,
        )
        return None, None
    return triton, tl


triton, tl = _load_triton()
HAS_TRITON: bool = triton is not None


def scaled(ci, full):
    """Pick a problem size by ``SPECFIX_SCALE``."""
    return full if SCALE == "full" else ci


def describe() -> dict[str, str]:
    """Versions and device, for labelling results."""
    info = {
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", "not installed"),
        "triton_mode": "interpreter" if INTERPRET else "compiled",
        "python": platform.python_version(),
        "scale": SCALE,
    }
    if DEVICE.type == "cuda":
        info["cuda"] = str(torch.version.cuda)
    return info
