"""specfix: speculative decoding meets padding, taught with real code.

Layout, by role:

* ``specfix.v1``    the V1 engine in miniature (mirrors ``vllm/v1/``): scheduler, input batch, model runner,
  metadata, rejection sampler, drafters, engine loop.
* ``specfix.mrv2``  Model Runner V2 parts (mirrors ``vllm/v1/worker/gpu/``): speculator, CUDA graphs,
  DFlash, the Triton Gumbel sampler.
* ``specfix.lab``   the chapters' experiments: the embedding assert, the placeholder fixes, the padded-batch
  reproduction, the invariance checker, the index guard.
* ``specfix.tools`` benchmark, statistics, host-sync counter, GPU recordings, the vLLM map, the crash-log
  diagnosis.
* ``specfix.figures`` and ``specfix.exercises``: each chapter's drawings and its exercise checkers.
* top level: ``fixes`` (the switches), ``runtime`` (device, scale, Triton's interpreter), ``models`` and
  ``tokenizer`` (the tiny word-level models).

``specfix.runtime`` is imported first so that Triton's interpreter is switched on (on CPU-only machines)
before anything imports triton. Modules keep their short names here: ``from specfix import gumbel`` loads
``specfix.mrv2.gumbel`` on first use.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

from specfix import runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET before triton loads)
from specfix.fixes import Fixes

if os.environ.get("SPECFIX_CHECK_FIGURES") == "1":  # make notebooks, the book, make lab-check
    from specfix.figures import style as _style

    _style.watch_figures()

#: Each module of the role subpackages by its short name, read from the tree (nothing to keep in step).
_SUBPACKAGE = {info.name: role for role in ("v1", "mrv2", "lab", "tools")
               for info in pkgutil.iter_modules([str(Path(__file__).with_name(role))])
               if not info.name.startswith("_")}


def __getattr__(name: str):
    if name in _SUBPACKAGE:
        module = importlib.import_module(f"specfix.{_SUBPACKAGE[name]}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'specfix' has no attribute {name!r}")


__all__ = ["Fixes", "runtime", *_SUBPACKAGE]
