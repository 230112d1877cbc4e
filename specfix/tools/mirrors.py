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
    """One row per module (subpackages included): its name, the vLLM files it mirrors, its summary."""
    rows = []
    for info in sorted(pkgutil.walk_packages(specfix.__path__, "specfix."), key=lambda m: m.name):
        if info.ispkg or info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        doc = importlib.import_module(info.name).__doc__ or ""
        files = sorted(dict.fromkeys(_VLLM_PATH.findall(doc)))
        rows.append({
            "module": info.name,
            "mirrors": ", ".join(files) if files else "(specfix's own)",
            "summary": doc.strip().splitlines()[0] if doc.strip() else "",
        })
    return rows
