"""Results recorded on a GPU and shipped with the repo, so CPU-only readers see real GPU evidence.

Scripts under ``scripts/`` write each recording (``specfix/recorded/*.json``, golden files under
``tests/golden/``) with a ``meta`` block: the machine, and the code it measured (the commit and a hash of
each file in :data:`SOURCES`). Notebooks show it with :func:`label`, so a reader knows where a number came
from and whether its code has changed since (``"stale"``: a sentence saying it has). Read :data:`SOURCES`.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED_DIR = ROOT / "specfix" / "recorded"

# the kernels launch through runtime.launch: its cached direct path is part of what a timing measures
_LAUNCH = "specfix/runtime.py"
_GUMBEL = (
    *(f"specfix/mrv2/{m}.py" for m in ("gumbel", "gumbel_launch", "noise", "gumbel_constants")),
    _LAUNCH,
)
_REJECTION = (
    *(f"specfix/v1/{m}.py" for m in ("rejection_sampler", "rejection_kernels", "recovered_tokens")),
    _LAUNCH,
)
#: the one timing harness: how every timing recording measured
_TIMING = "specfix/timing.py"
#: the Gumbel inputs and torch baselines time_gumbel.py and the host trace build their cases from
_GUMBEL_INPUTS = ("specfix/lab/masked_gumbel.py", "specfix/tools/bench/gumbel_cases.py")
_BENCH_MODULES = ("__init__", "report", "peer", "gumbel_cases", "rejection_cases", "step_cases")
_BENCH = (*(f"specfix/tools/bench/{m}.py" for m in _BENCH_MODULES), _TIMING)
#: Each recording (its file name without the suffix) -> the files, relative to the repository root, whose
#: code it measured: the script that records it and the modules that script runs.
SOURCES: dict[str, tuple[str, ...]] = {
    "bench_h200": (
        *_BENCH,
        *_GUMBEL,
        "specfix/lab/placeholder_fixes.py",
        "specfix/lab/masked_gumbel.py",
        "specfix/mrv2/speculator.py",
        "specfix/mrv2/dflash.py",
        *_REJECTION,
    ),
    "cudagraph_h200": (
        "scripts/record_cudagraph.py",
        "specfix/mrv2/cudagraph.py",
        _TIMING,
        "specfix/mrv2/speculator.py",
        "specfix/mrv2/dflash.py",
        "specfix/lab/padding_bench.py",
        "specfix/lab/stale_rows.py",
        "specfix/lab/invariance.py",
        *_GUMBEL,
    ),
    "embedding_assert_ops": ("scripts/record_embedding_assert.py", "specfix/lab/embedding_assert.py"),
    "embedding_assert_transcripts": (
        "scripts/record_embedding_assert.py",
        "specfix/lab/embedding_assert.py",
        "specfix/models.py",
        "specfix/v1/engine.py",
        "specfix/v1/model_runner.py",
    ),
    "host_trace_h200": (
        "scripts/record_host_trace.py",
        _TIMING,
        *_GUMBEL,
        *_REJECTION,
        "specfix/checks.py",
        *_GUMBEL_INPUTS,
        "specfix/tools/bench/peer.py",
    ),
    "gumbel_ncu_h200": (
        "scripts/profile_gumbel.py",
        "scripts/time_gumbel.py",
        _TIMING,
        *_GUMBEL,
        *_GUMBEL_INPUTS,
    ),
    "gumbel_perf": ("scripts/time_gumbel.py", _TIMING, *_GUMBEL, *_GUMBEL_INPUTS),
    "gumbel_sanitizer": ("scripts/sanitize_gumbel.py", *_GUMBEL),
    "gumbel_sweep_h200": ("scripts/time_gumbel.py", _TIMING, *_GUMBEL, *_GUMBEL_INPUTS),
    "gumbel_sweep_before_after_h200": ("scripts/time_gumbel.py", _TIMING, *_GUMBEL, *_GUMBEL_INPUTS),
    "vllm_noise_comparison": ("scripts/compare_vllm_noise.py", *_GUMBEL),
    "gumbel_golden": ("scripts/record_gumbel_golden.py", *_GUMBEL),
    "dflash_prepare": ("scripts/record_cudagraph.py", "specfix/mrv2/dflash.py"),
    # what `make gpu-check` ran is the whole suite at one commit (meta["commit"]); its script is hashed here
    "gpu_check_h200": ("scripts/gpu_check.py",),
}


def code_digest(source: bytes) -> str:
    """sha256 (16 hex digits) of a Python file's syntax tree without docstrings, comments or layout: rewording
    prose leaves a recording of it fresh, any change to what runs makes it stale."""
    # field by field, not ast.dump (whose text differs between Python versions), skipping empty fields, so
    # that the GPU machine's Python and the CPU's agree
    parts: list[str] = []

    def walk(node) -> None:
        if isinstance(node, ast.AST):
            parts.append(type(node).__name__)
            for field, value in ast.iter_fields(node):
                if field in ("ctx", "kind", "type_comment") or value is None or value == []:
                    continue
                if field == "body" and isinstance(node, _DOCUMENTED) and ast.get_docstring(node) is not None:
                    value = value[1:]
                parts.append(field)
                walk(value)
        elif isinstance(node, list):
            parts.append("[")
            for item in node:
                walk(item)
            parts.append("]")
        else:
            parts.append(repr(node))

    walk(ast.parse(source))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)  # what may hold a docstring


def source_hashes(name: str) -> dict[str, str]:
    """:func:`code_digest` of each source file of recording ``name``, as the files are now."""
    if name not in SOURCES:
        raise ValueError(f"no recording {name!r} in recorded.SOURCES: add the files it measures there")
    return {path: code_digest((ROOT / path).read_bytes()) for path in SOURCES[name]}


def _commit() -> str | None:
    """``$SPECFIX_COMMIT`` when set (a copied tree's own git history may be older than the files: say which
    commit they are), else the checkout's commit (``+changes`` if it has uncommitted changes), or None."""
    if os.environ.get("SPECFIX_COMMIT"):
        return os.environ["SPECFIX_COMMIT"]
    head = _output("git", "rev-parse", "HEAD")
    if not head:
        return None
    return head + ("+changes" if _output("git", "status", "--porcelain", "--untracked-files=no") else "")


def _output(*command: str) -> str:
    """A command's stdout, stripped; "" where it cannot run or fails (no git, no GPU driver)."""
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def gpu_meta(name: str | None = None) -> dict:
    """Device, driver, versions and today's date, for labelling a recording; with the recording's ``name``
    (a key of :data:`SOURCES`), also the commit and the hashes of the source files it measures."""
    from specfix import runtime  # here: reading a recording needs no torch (``specfix diagnose``)

    meta = dict(runtime.describe())
    driver = _output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
    meta["driver"] = driver[0] if driver else "unknown"
    meta["date"] = datetime.date.today().isoformat()
    if name is not None:
        meta["commit"] = _commit()
        meta["source_hash"] = source_hashes(name)
    return meta


def save(name: str, data: dict, directory: Path | str = RECORDED_DIR) -> Path:
    """Write ``data`` plus a ``meta`` label (sources from :data:`SOURCES`) to ``directory/name.json``."""
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": gpu_meta(name), **data}, indent=1) + "\n")
    return path


def load(name: str) -> dict:
    """Read a shipped recording; raises FileNotFoundError naming the script that makes it."""
    path = RECORDED_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no recording {path.name} in {RECORDED_DIR}; run the scripts/ recorder on a GPU"
        )
    return json.loads(path.read_text())


def label(meta: dict) -> str:
    """One line that says where and when a recording was made, at which commit, and, for a recording of older
    code (``meta["stale"]``), that it is one."""
    versions = ", ".join(f"{key} {meta.get(key, '?')}" for key in ("driver", "torch", "triton"))
    text = f"recorded on {meta.get('device', '?')} ({versions}) on {meta.get('date', '?')}"
    if meta.get("commit"):
        text += f" at commit {meta['commit'][:12]}"
    if meta.get("stale"):
        text += f" [OLDER CODE: {meta['stale']}]"
    return text
