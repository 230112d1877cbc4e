"""Which vLLM file each specfix module mirrors, read from the modules' own docstrings.

Every module that mirrors vLLM names the file(s) in its docstring (``vllm/...py``); this keeps the
chapter-0 map true by construction instead of maintaining a second list by hand. Each module's *role* is the
subpackage it lives in (``v1``, ``mrv2``, ``lab``, ``tools``, ``figures``, ``exercises``; ``specfix`` for
the top level), described by that subpackage's own docstring.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import specfix

_VLLM_PATH = re.compile(r"vllm/[\w/]+\.py")


def _summary(doc: str | None) -> str:
    """The first sentence of a docstring, on one line."""
    text = " ".join((doc or "").split())
    match = re.match(r"(.+?[.:])(\s|$)", text)
    return match.group(1).rstrip(":") if match else text


def role_of(module: str) -> str:
    """``specfix.v1.scheduler`` -> ``v1``; a top-level module (``specfix.fixes``) -> ``specfix``."""
    if not module.startswith("specfix."):
        raise ValueError(f"module must be a specfix module, got {module!r}")
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "specfix"


def vllm_map() -> list[dict[str, str]]:
    """One row per module (subpackages included): its name, role, the vLLM files it mirrors, its summary."""
    rows = []
    for info in sorted(pkgutil.walk_packages(specfix.__path__, "specfix."), key=lambda m: m.name):
        if info.ispkg or info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        doc = importlib.import_module(info.name).__doc__ or ""
        files = sorted(dict.fromkeys(_VLLM_PATH.findall(doc)))
        rows.append({
            "module": info.name,
            "role": role_of(info.name),
            "mirrors": ", ".join(files) if files else "(specfix's own)",
            "summary": doc.strip().splitlines()[0] if doc.strip() else "",
        })
    return rows


def roles() -> dict[str, str]:
    """Each role (subpackage) and what it holds: the first sentence of the subpackage's docstring."""
    top = re.search(r"^\* top level: (.+?)(?=\n\n|\n\* )", specfix.__doc__ or "", flags=re.M | re.S)
    if top is None:
        raise LookupError("specfix's docstring lost its '* top level: ...' line, which describes that role")
    out = {"specfix": _summary(top.group(1))}
    for info in pkgutil.iter_modules(specfix.__path__):
        if info.ispkg:
            out[info.name] = _summary(importlib.import_module(f"specfix.{info.name}").__doc__)
    return out
