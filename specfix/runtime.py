"""Where specfix runs: device choice, Triton (compiled or interpreted) and its launches, problem scale.

specfix imports triton through this module: without a GPU it turns the interpreter on first, and without
triton a stand-in ``triton.jit`` still defines every kernel (launchers check ``HAS_TRITON``).

Interpreter workarounds (triton 3.6), which kernels cite as "(interpreter: see specfix.runtime)": a runtime
value cannot bound a ``range()`` (loop to a static bound, mask off the rest); a store cannot be masked by a
scalar comparison (build the mask per lane); a constexpr expression such as ``1 + NUM_SPEC`` becomes a tensor
``range()`` cannot take (the host passes it as its own constexpr).

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


#: The triton versions whose JITFunction.run ``launch`` repeats (triton/runtime/jit.py, compiler/compiler.py,
#: backends/nvidia/driver.py read for each); any other launches through triton's own path.
_DIRECT_VERSIONS = ("3.6.0",)
_DIRECT = HAS_TRITON and not INTERPRET and triton.__version__ in _DIRECT_VERSIONS
#: (kernel, device, compile-time values, each argument's specialisation) -> the compiled kernel's launch.
_LAUNCHES: dict[tuple, tuple] = {}


def launch(kernel, grid: tuple[int, ...], *args, **constexprs) -> None:
    """``kernel[grid](*args, **constexprs)`` at a fraction of the host cost: a specialisation's first call
    goes through triton (which compiles), later ones straight to the compiled C launcher with tensors as
    addresses (no re-binding, string key, driver query or global-constexpr check). Not while a launch hook (a
    profiler) is set. ``constexprs``: hashable keyword arguments, in the same order call after call."""
    key, values = _launch_key(kernel, grid, args, constexprs) if _DIRECT else (None, None)
    hit = _LAUNCHES.get(key) if key is not None else None
    if hit is None:
        if key is None:  # the interpreter, no triton or another version, or an argument not keyed
            if not HAS_TRITON:
                kernel[grid](*args, **constexprs)  # the stand-in's error
            kernel.run(*args, grid=grid, warmup=False, **constexprs)
            return
        compiled = kernel.run(*args, grid=grid, warmup=False, **constexprs)
        if len(_LAUNCHES) > 4096:  # a bound on memory, should keys ever vary without end
            _LAUNCHES.clear()
        params = list(kernel.signature.parameters.values())[len(args) :]
        tail = tuple(constexprs.get(p.name, p.default) for p in params)  # bound in triton's order
        launcher, head = compiled.run, (compiled.packed_metadata, None, None, None)  # no metadata, no hooks
        if not (launcher.global_scratch_size or launcher.profile_scratch_size):
            # no scratch to allocate per call: the C launch itself, as CudaLauncher.__call__ would call it
            head = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, *head)
            launcher = launcher.launch
        _LAUNCHES[key] = (launcher, compiled.function, head, tail)
        return
    launcher, function, head, tail = hit
    grid = grid + (1, 1)
    # JITFunction.run's own call (triton 3.6) or, without scratch, the one CudaLauncher.__call__ makes
    launcher(grid[0], grid[1], grid[2], _stream(key[1]), function, *head, *values, *tail)


def _launch_key(kernel, grid, args, constexprs) -> tuple:
    """(the direct path's cache key, the launcher's arguments), or (None, None) where triton should launch."""
    if type(kernel) is not _JITFunction or type(grid) is not tuple or _hooked():
        return None, None
    specs, values = _args_key(args)
    if specs is None:
        return None, None
    return (id(kernel), torch._C._cuda_getDevice(), tuple(constexprs.items()), specs), values


def _args_key(args: tuple) -> tuple:
    """(what tells apart the kernels triton 3.6 compiles for ``args``, ``native_specialize_impl``'s key or
    finer, the arguments with each tensor as its address). A tensor is keyed by dtype, 16-byte alignment and
    device; an int or None by value; a bool or a float by type and value (True == 1 == 1.0, which triton
    compiles apart); anything else (a tensor subclass, a tuple) gives (None, None): triton launches it."""
    tensor = torch.Tensor
    values = [a.data_ptr() if type(a) is tensor else a for a in args]
    specs = [
        (a.dtype, v % 16 == 0, a.get_device())
        if type(a) is tensor
        else v
        if type(a) is int or v is None
        else (type(a), v)
        if type(a) is bool or type(a) is float
        else _UNKEYED
        for a, v in zip(args, values, strict=True)
    ]
    return (None, None) if _UNKEYED in specs else (tuple(specs), values)


_UNKEYED = object()


def _hooked() -> bool:
    """Has anyone (a profiler) hooked triton's launches?"""
    enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    return bool(enter is not None and getattr(enter, "calls", True)) or bool(
        leave is not None and getattr(leave, "calls", True)
    )


if _DIRECT:
    from torch._C import _cuda_getCurrentRawStream as _stream
    from triton import knobs as _knobs
    from triton.runtime.jit import JITFunction as _JITFunction


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
