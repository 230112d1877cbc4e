"""specfix: speculative decoding meets padding, taught with real code.

Layout, by role:

* ``specfix.v1``    the V1 engine in miniature (mirrors ``vllm/v1/``): scheduler, runner, samplers, engine.
* ``specfix.mrv2``  Model Runner V2 parts (mirrors ``vllm/v1/worker/gpu/``): speculator, CUDA graphs,
  DFlash, the Triton Gumbel sampler.
* ``specfix.lab``   the chapters' experiments; ``specfix.tools`` bench, statistics, recordings, diagnosis.
* ``specfix.figures`` and ``specfix.exercises``: each chapter's drawings and its exercise checkers.
* top level: ``fixes`` (the switches), ``runtime`` (device, scale), ``checks`` (argument checks), ``timing``
  (the one timing harness), ``models`` and ``tokenizer`` (the tiny word-level models).

Importing specfix imports no torch (``specfix diagnose`` needs none) and, where no GPU is visible, switches
Triton's interpreter on first. ``from specfix import gumbel`` loads ``specfix.mrv2.gumbel`` on first use.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path

from specfix.fixes import Fixes


def _setting(name: str, choices: tuple[str, ...], default: str) -> str:
    """The environment variable ``name``, lower-cased, one of ``choices``."""
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ValueError(f"{name} must be {' or '.join(repr(c) for c in choices if c)}, got {value!r}")
    return value


def _no_usable_gpu() -> bool:
    """True where torch cannot see a GPU, decided without importing torch; False where it may."""
    wanted = _setting("SPECFIX_DEVICE", ("", "cpu", "cuda"), "")
    if wanted or sys.platform == "darwin":
        return wanted != "cuda"
    gpu_nodes = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL, ROCm
    return sys.platform.startswith("linux") and not any(os.path.exists(p) for p in gpu_nodes)


def _switch_on_interpreter() -> None:
    """``TRITON_INTERPRET=1``, which must precede ``import triton`` (triton decorates its helpers then)."""
    if sys.modules.get("triton") is not None and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "triton was imported before specfix without TRITON_INTERPRET=1, so its kernels cannot run "
            "on this CPU-only machine. Restart the kernel and import specfix first, or set "
            "TRITON_INTERPRET=1 in the environment before starting Python."
        )
    os.environ["TRITON_INTERPRET"] = "1"


_setting("SPECFIX_SCALE", ("ci", "full"), "ci")  # a bad setting fails at import
if _no_usable_gpu():
    _switch_on_interpreter()

if os.environ.get("SPECFIX_CHECK_FIGURES") == "1":  # make notebooks, the book, make lab-check
    from specfix.figures import style as _style

    _style.watch_figures()

#: Each module of the role subpackages by its short name, read from the tree (nothing to keep in step).
_SUBPACKAGE = {
    info.name: role
    for role in ("v1", "mrv2", "lab", "tools")
    for info in pkgutil.iter_modules([str(Path(__file__).with_name(role))])
    if not info.name.startswith("_")
}


def __getattr__(name: str):
    if name == "runtime":
        return importlib.import_module("specfix.runtime")
    if name in _SUBPACKAGE:
        module = importlib.import_module(f"specfix.{_SUBPACKAGE[name]}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'specfix' has no attribute {name!r}")


__all__ = ["Fixes", "runtime", *_SUBPACKAGE]
