"""Which vLLM file each specfix module mirrors, read from the modules' own docstrings.

Every module that mirrors vLLM names the file(s) in its docstring (``vllm/...py``); this keeps the
chapter-0 map true by construction instead of maintaining a second list by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import specfix

_VLLM_PATH = re.compile(r"vllm/[\w/]+\.py")


def vllm_map() -> list[dict[str, str]]:
    """One row per specfix module: its name, the vLLM files it mirrors, and its one-line summary."""
    rows = []
    for info in sorted(pkgutil.iter_modules(specfix.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        doc = importlib.import_module(f"specfix.{info.name}").__doc__ or ""
        files = sorted(dict.fromkeys(_VLLM_PATH.findall(doc)))
        rows.append({
            "module": f"specfix.{info.name}",
            "mirrors": ", ".join(files) if files else "(specfix's own)",
            "summary": doc.strip().splitlines()[0] if doc.strip() else "",
        })
    return rows
