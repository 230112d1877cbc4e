"""Every vLLM file the package, the notebooks and the README cite names its version, and exists in it.

The convention: a path ``vllm/...py`` is cited from the vLLM version written nearest to it in the same
paragraph (``0.33``, ``0.33.0``; a paragraph ends at a blank line). A paragraph that names no version takes
its source's default, declared once in that source (a module's docstring, a notebook's cells) as "every vLLM
file cited here is from vLLM 0.33.0". A citation with neither fails. Each path is then looked up in vLLM's
released source of that version, unpacked into ``.peer/src/<version>/`` by ``scripts/fetch_vllm_peer.py``
(``vllm/v1/``, ``vllm/config/``, ``vllm/engine/``, ``vllm/sampling_params.py``, ``vllm/envs.py``); a path
outside what was unpacked is listed in ``CHECKED_IN_WHEEL``, read from the release's wheel by hand. Without
that source the check is skipped, or fails where ``SPECFIX_REQUIRE_PEER=1`` (CI fetches it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".peer" / "src"
PATH = re.compile(r"vllm/[\w/]+\.py")
VERSION = re.compile(r"(?<![\w.])(0\.\d{2})(\.\d+)?(?![\w.]*\d)")
DEFAULT = re.compile(r"every\s+vLLM\s+file\s+cited\s+here\s+is\s+from\s+vLLM\s+(0\.\d{2}(?:\.\d+)?)")
#: Paths outside the unpacked source, checked in the release's wheel (``unzip -l``): version -> paths.
CHECKED_IN_WHEEL = {
    "0.33.0": {"vllm/entrypoints/llm.py", "vllm/tokenizers/registry.py", "vllm/tokenizers/hf.py"},
}


def _full(version: str) -> str:
    return version if version.count(".") == 2 else version + ".0"


def _sources():
    """(where, text) for every module, every notebook cell (markdown and code) and the README."""
    for path in sorted((ROOT / "specfix").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), [path.read_text()]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path.relative_to(ROOT).as_posix(), ["".join(cell["source"]) for cell in cells]
    yield "README.md", [(ROOT / "README.md").read_text()]


def citations() -> list[tuple[str, str, str | None]]:
    """(where, vLLM path, version or None) for every vLLM file path cited."""
    out = []
    for where, texts in _sources():
        default = next((m.group(1) for t in texts for m in DEFAULT.finditer(t)), None)
        for text in texts:
            for para in re.split(r"\n\s*#?\s*\n", text):
                versions = [(m.start(), m.group(1) + (m.group(2) or "")) for m in VERSION.finditer(para)]
                for m in PATH.finditer(para):
                    near = min(versions, key=lambda v: abs(v[0] - m.start()))[1] if versions else default
                    out.append((where, m.group(0), near and _full(near)))
    return out


CITATIONS = citations()


def test_the_scan_finds_the_citations():
    assert len(CITATIONS) > 50
    assert ("specfix/v1/scheduler.py", "vllm/v1/core/sched/scheduler.py") in {c[:2] for c in CITATIONS}
    assert any(where.startswith("notebooks/") for where, *_ in CITATIONS)


def test_every_cited_vllm_file_names_its_version():
    bare = sorted({f"{where}: {path}" for where, path, version in CITATIONS if version is None})
    assert not bare, "cite a version beside these (or a default for the source):\n" + "\n".join(bare)


@pytest.mark.parametrize("version", sorted({v for *_, v in CITATIONS if v}))
def test_every_cited_vllm_file_exists_in_its_version(version):
    src = PEER / version
    if not src.is_dir():
        why = f"vLLM {version}'s source is not in .peer/src/: run python scripts/fetch_vllm_peer.py {version}"
        (pytest.fail if os.environ.get("SPECFIX_REQUIRE_PEER") == "1" else pytest.skip)(why)
    unpacked = {p.name for p in (src / "vllm").iterdir()}
    missing, unchecked = [], []
    for where, path, v in CITATIONS:
        if v != version or (src / path).exists() or path in CHECKED_IN_WHEEL.get(version, ()):
            continue
        (missing if path.split("/")[1] in unpacked else unchecked).append(f"{where}: {path}")
    assert not missing, f"not in vLLM {version}:\n" + "\n".join(sorted(set(missing)))
    assert not unchecked, (
        f"outside what .peer/src/{version} holds; check in the wheel and list in "
        "CHECKED_IN_WHEEL:\n" + "\n".join(sorted(set(unchecked)))
    )
