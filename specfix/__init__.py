"""specfix: speculative decoding meets padding, taught with real code.

``specfix.runtime`` is imported first so that Triton's interpreter is switched on (on CPU-only
machines) before anything imports triton.
"""

from specfix import runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET before triton loads)
from specfix.fixes import Fixes

__all__ = ["Fixes", "runtime"]
