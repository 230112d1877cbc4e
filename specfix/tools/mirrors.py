"""Which vLLM file each specfix module mirrors, read from the modules' own docstrings.

Reading the ``vllm/...py`` paths from the docstrings keeps chapter 0's map true with no second list kept by
hand; a module's role is its subpackage, described by that subpackage's docstring.

:data:`RELEASES` holds what changed about placeholders between the vLLM releases the course compares
(chapter 0's table by release); a test reads each fact again from that release's source. :data:`FIXES`
holds the three vLLM fixes the course re-creates, each with the first release that carries it (``specfix
diagnose`` tells from a logged version whether it has one: :func:`has_fix`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

import specfix

_VLLM_PATH = re.compile(r"vllm/[\w/]+\.py")
_ROOT = Path(specfix.__file__).parent


def _doc(path: Path) -> str:
    """A module's docstring, read from its source: nothing is imported (no torch, no import cycle)."""
    return ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""


def _summary(doc: str) -> str:
    """The first sentence of a docstring, on one line."""
    text = " ".join(doc.split())
    match = re.match(r"(.+?[.:])(\s|$)", text)
    return match.group(1).rstrip(":") if match else text


def vllm_map() -> list[dict[str, str]]:
    """One row per module (subpackages included): its name, role, the vLLM files it mirrors, its summary."""
    rows = []
    for path in _ROOT.rglob("*.py"):
        parts = ("specfix", *path.relative_to(_ROOT).with_suffix("").parts)
        # importable names only (JupyterLab's .ipynb_checkpoints/x-checkpoint.py is not), not __init__,
        # __main__ or a private module
        if not all(part.isidentifier() for part in parts) or parts[-1].startswith("_"):
            continue
        doc = _doc(path)
        files = sorted(set(_VLLM_PATH.findall(doc)))
        rows.append(
            {
                "module": ".".join(parts),
                # specfix.v1.scheduler has the role v1, specfix.fixes the role specfix
                "role": parts[1] if len(parts) > 2 else "specfix",
                "mirrors": ", ".join(files) if files else "(specfix's own)",
                "summary": doc.strip().splitlines()[0] if doc.strip() else "",
            }
        )
    return sorted(rows, key=lambda row: row["module"])


def roles() -> dict[str, str]:
    """Each role (subpackage) and what it holds: the first sentence of the subpackage's docstring."""
    top = re.search(r"^\* top level: (.+?)(?=\n\n|\n\* )", specfix.__doc__ or "", flags=re.M | re.S)
    if top is None:
        raise LookupError("specfix's docstring lost its '* top level: ...' line, which describes that role")
    subpackages = {init.parent.name: _summary(_doc(init)) for init in sorted(_ROOT.glob("*/__init__.py"))}
    return {"specfix": _summary(top.group(1)), **subpackages}


# -- what changed between the vLLM releases the course compares ------------------------------------------


@dataclass(frozen=True)
class Release:
    """One vLLM release's placeholder-relevant facts, each read from its source (``tests/test_mirrors.py``
    re-reads them from ``.peer/src/<version>/`` when that is present)."""

    version: str
    #: Model Runner V2 is the default only for these architectures (None: for every model it supports).
    v2_architectures: frozenset[str] | None
    v2_for_dense_models: bool  # ... and for every dense (non-MoE) model
    sync_scheduler_pads: bool  # the synchronous scheduler pads a new decode with [-1] * k (PR #45237)
    v1_clamp: bool  # the V1 runner's _preprocess clamps input_ids to >= 0 (PR #47029)
    mrv2_marks_placeholders: bool  # MRV2's rejection sampler marks placeholder slots -1 again
    masks_47066: bool  # gumbel masks req_state_idx < 0; padded idx_mapping and DFlash rows get -1
    dummy_runs_minus_one: bool  # dummy runs and DFlash graph capture name no request (-1) as well
    murmur3_noise: bool  # Gumbel noise from a murmur3 hash (else Philox: tl.randint, tl.rand)
    cache_before_temperature: bool  # the draft cache holds logits before temperature (else logits / T, fp32)


def _archs(names: str) -> frozenset[str]:
    return frozenset(f"{name}ForCausalLM" for name in names.split())


# After the architectures, the booleans in field order: v2_for_dense_models, sync_scheduler_pads, v1_clamp,
# mrv2_marks_placeholders, masks_47066, dummy_runs_minus_one, murmur3_noise, cache_before_temperature.
# fmt: off
RELEASES = (
    Release("0.24.0", _archs("Llama Mistral Qwen3 DeepseekV2 Qwen2Moe GraniteMoe"),
            False, False, False, False, False, False, False, False),
    Release("0.25.0", _archs("DeepseekV2 Qwen2Moe GraniteMoe"),
            True, True, True, False, True, False, False, False),
    Release("0.33.0", None,
            False, True, True, True, True, True, True, True),
)
# fmt: on


def release_rows() -> list[dict[str, str]]:
    """Chapter 0's table by release: one row per :data:`RELEASES` entry, in words."""
    rows = []
    for r in RELEASES:
        if r.v2_architectures is None:
            runner = "Model Runner V2; V1 with `VLLM_USE_V2_MODEL_RUNNER=0` or a feature MRV2 lacks"
        else:
            names = ", ".join(sorted(a.removesuffix("ForCausalLM") for a in r.v2_architectures))
            dense = "dense models and " if r.v2_for_dense_models else ""
            runner = f"Model Runner V2 for {dense}{names}; V1 otherwise"
        born = "async scheduling: every decode's drafts until the runner fills them"
        if r.sync_scheduler_pads:
            born = "a new decode with one token left (P/D first decode, full prefix-cache hit); " + born
        v1 = (
            "V1: no clamp (under async scheduling the runner writes real drafts over them, "
            "except for a request absent from the previous step, whose -1 stays)"
        )
        if r.v1_clamp:
            v1 = "V1: `_preprocess` clamps to 0"
        mrv2 = "MRV2: its own draft table, zeroed per request" + (
            ", slots marked -1 again before verification" if r.mrv2_marks_placeholders else ""
        )
        masks = "none: padded rows write slot 0 or stale slots"
        if r.masks_47066:
            masks = "kernel skips `req_state_idx < 0`; padded rows get -1" + (
                ", dummy runs and DFlash capture too" if r.dummy_runs_minus_one else ""
            )
        noise = "murmur3 hash, drafting salt" if r.murmur3_noise else "Philox (`tl.randint`, `tl.rand`)"
        cache = (
            "logits before temperature, head dtype" if r.cache_before_temperature else "logits / T, float32"
        )
        rows.append(
            {
                "vLLM": r.version,
                "default model runner": runner,
                "where -1 placeholders come from": born,
                "what keeps them from the embedding": f"{v1}; {mrv2}",
                "#47066 masks": masks,
                "noise": noise,
                "draft cache holds": cache,
            }
        )
    return rows


@dataclass(frozen=True)
class Fix:
    pr: int
    short: str
    what: str
    where: str  # vLLM file (and function) the fix changed
    verified: str  # what was read in the release source, and where
    chapter: str
    first_release: str = "0.25.0"
    last_release_without: str = "0.24.0"


# Checked in the source of vLLM's release wheels (``scripts/fetch_vllm_peer.py`` unpacks them into
# ``.peer/src/<version>/``): each fix's code is in 0.25.0 and 0.33.0, not in 0.24.0, and PyPI lists no
# release between 0.24.0 and 0.25.0 (``pip index versions vllm``, 2026-12-01).
FIXES = {
    "placeholder_embedding": Fix(
        47029,
        "the clamp before the embedding",
        "clamps input_ids to >= 0 before the embedding lookup, after the drafts were copied for the "
        "rejection sampler",
        "vllm/v1/worker/gpu_model_runner.py, GPUModelRunner._preprocess",
        "`input_ids.gpu[:num_input_tokens].clamp_(min=0)` under the comment 'Clamp speculative scheduler "
        "placeholders (-1) before embedding lookup' in _preprocess: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/02_embedding_assert.ipynb",
    ),
    "negative_draft": Fix(
        46533,
        "negative drafts always rejected",
        "always rejects a negative draft id in the rejection sampler (V1 and Model Runner V2 kernels)",
        "vllm/v1/sample/rejection_sampler.py (rejection_random_sample_kernel); "
        "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
        "`if draft_token_id < 0: accepted = False` in rejection_random_sample_kernel and `is_valid_draft = "
        "draft_sampled >= 0` in rejection_sampler_utils.py: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/01_placeholder_lifecycle.ipynb",
    ),
    "cudagraph_outputs": Fix(
        47066,
        "-1 padding of the drafter's idx_mapping",
        "pads the drafter's idx_mapping with -1 and makes Gumbel sampling skip those rows, so padded "
        "rows of a CUDA-graph replay no longer overwrite live requests' draft logits",
        "vllm/v1/worker/gpu/spec_decode/speculator.py; vllm/v1/worker/gpu/sample/gumbel.py",
        "`self.idx_mapping[num_reqs:].fill_(-1)` in speculator.py and `is_valid_req = req_state_idx >= 0` in "
        "gumbel.py: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/03_cudagraph_idx_mapping.ipynb",
    ),
}


def has_fix(version: str | None, fix: Fix) -> bool | None:
    """Whether a logged vLLM version carries ``fix``; None when the log cannot say (no version, or a build
    between the last release without the fix and the first with it: a release candidate, a dev build)."""
    try:
        v = Version(Version(version or "").public)  # a local build (0.25.0+cu128) is its release's code
    except InvalidVersion:
        return None
    if v >= Version(fix.first_release):
        return True
    return False if v <= Version(fix.last_release_without) else None
