"""Where specfix runs: device choice, Triton (compiled or interpreted), problem scale.

specfix's modules import triton through this one: without a GPU it turns the interpreter on first, and
without triton a stand-in ``triton.jit`` still defines every kernel (launchers check ``HAS_TRITON``).

Interpreter workarounds (triton 3.6), which the kernels refer to as "(interpreter: see specfix.runtime)":
a runtime or loaded value cannot bound a ``range()`` (kernels loop to a static bound and mask off the rest);
a store cannot be masked by a scalar comparison (the mask is built per lane); an expression of constexprs
such as ``1 + NUM_SPEC`` becomes a tensor ``range()`` cannot take (the host passes it as its own constexpr).

Environment: SPECFIX_DEVICE ``cuda`` or ``cpu`` (default: ``cuda`` when available); SPECFIX_SCALE ``ci``
(the default) or ``full``.
"""

from __future__ import annotations

import platform
import sys
from types import ModuleType, SimpleNamespace

import torch

from specfix import _setting, _switch_on_interpreter


def _choose_device() -> torch.device:
    wanted = _setting("SPECFIX_DEVICE", ("", "cpu", "cuda"), "")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("SPECFIX_DEVICE=cuda but torch sees no CUDA GPU")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


DEVICE: torch.device = _choose_device()
SCALE: str = _setting("SPECFIX_SCALE", ("ci", "full"), "ci")
#: Triton kernels are simulated on the CPU by triton's interpreter.
INTERPRET: bool = DEVICE.type == "cpu"


class _Unlaunchable:
    """A kernel defined without triton: its launcher should have taken the torch reference."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        raise RuntimeError(f"{self.fn.__name__} needs triton, which is not installed")


def _jit(fn=None, **_options):
    return _Unlaunchable(fn) if fn is not None else _Unlaunchable


#: The stand-ins where triton is missing: ``triton.jit`` (bare or with options) and ``tl.constexpr``.
_NO_TRITON = SimpleNamespace(jit=_jit)
_NO_TL = SimpleNamespace(constexpr=lambda value=None: value)


def _load_triton() -> tuple[ModuleType | SimpleNamespace, ModuleType | SimpleNamespace]:
    if INTERPRET:
        _switch_on_interpreter()
    try:
        import triton
        import triton.language as tl
    except ImportError:
        print(
            f"specfix: triton is not installed on {platform.system()}; kernels run their torch reference.",
            file=sys.stderr,
        )
        return _NO_TRITON, _NO_TL
    return triton, tl


triton, tl = _load_triton()
HAS_TRITON: bool = triton is not _NO_TRITON


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
