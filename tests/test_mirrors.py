"""Chapter 0's module map is read from docstrings: every module that stands for a vLLM file must name it."""

import importlib
import os
import re
from pathlib import Path

import pytest

from specfix.tools import mirrors
from specfix.tools.mirrors import FIXES, RELEASES, has_fix, release_rows, roles, vllm_map

# Modules that re-implement a piece of vLLM (the rest are specfix's own tools: runtime, guard, bench...).
MIRRORING = {
    "v1.scheduler": "vllm/v1/core/sched/scheduler.py",
    "v1.input_batch": "vllm/v1/worker/gpu_input_batch.py",
    "v1.model_runner": "vllm/v1/worker/gpu_model_runner.py",
    "v1.spec_decode_metadata": "vllm/v1/spec_decode/metadata.py",
    "v1.rejection_sampler": "vllm/v1/sample/rejection_sampler.py",
    "mrv2.gumbel": "vllm/v1/worker/gpu/sample/gumbel.py",
    "mrv2.draft_slots": "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py",
}


def test_every_mirroring_module_names_its_vllm_file():
    rows = {row["module"]: row for row in vllm_map()}
    for name, path in MIRRORING.items():
        importlib.import_module(f"specfix.{name}")
        assert path in rows[f"specfix.{name}"]["mirrors"], name


def test_own_modules_say_so():
    rows = {row["module"]: row for row in vllm_map()}
    assert rows["specfix.fixes"]["mirrors"] == "(specfix's own)"
    assert all(row["summary"] for row in rows.values()), "every module has a one-line docstring summary"


def test_each_module_has_the_role_of_its_subpackage():
    rows = {row["module"]: row["role"] for row in vllm_map()}
    assert rows["specfix.v1.scheduler"] == "v1"
    assert rows["specfix.mrv2.gumbel"] == "mrv2"
    assert rows["specfix.timing"] == "specfix"
    assert rows["specfix.fixes"] == "specfix"
    assert {"v1", "mrv2", "lab", "tools", "specfix"} <= set(rows.values())


def test_every_role_is_described_by_its_own_docstring():
    described = roles()
    assert set(described) >= {row["role"] for row in vllm_map()}
    assert "vllm/v1/" in described["v1"] and "vllm/v1/worker/gpu/" in described["mrv2"]
    assert "fixes" in described["specfix"] and "runtime" in described["specfix"]
    assert all(text and "\n" not in text for text in described.values())


PEER = Path(__file__).resolve().parents[1] / ".peer" / "src"


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_each_release_row_is_what_that_releases_source_says(release):
    src = PEER / release.version
    if not src.is_dir():
        why = f"needs vLLM {release.version}'s source in .peer/src/ (python scripts/fetch_vllm_peer.py)"
        (pytest.fail if os.environ.get("SPECFIX_REQUIRE_PEER") == "1" else pytest.skip)(why)

    def read(path):
        return (src / "vllm" / path).read_text()

    config = read("config/vllm.py")
    runner = re.search(r"def use_v2_model_runner\(self\).*?\n    (?:@|def )", config, re.S).group(0)
    listed = re.search(r"DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = frozenset\(\s*\{(.*?)\}", config, re.S)
    by_model = "_is_default_v2_model_runner_model" in runner
    archs = frozenset(re.findall(r'"(\w+)"', listed.group(1))) if by_model else None
    assert archs == release.v2_architectures
    assert ("or not model_config.is_moe" in config) == release.v2_for_dense_models
    sched = read("v1/core/sched/scheduler.py")
    assert bool(re.search(r"\[\s*-1\s*\]\s*\*\s*self\.num_spec_tokens", sched)) == release.sync_scheduler_pads
    assert (
        "input_ids.gpu[:num_input_tokens].clamp_(min=0)" in read("v1/worker/gpu_model_runner.py")
    ) == release.v1_clamp
    gpu = "v1/worker/gpu/"
    marks = "is_placeholder" in read(gpu + "spec_decode/rejection_sampler.py")
    assert marks == release.mrv2_marks_placeholders
    gumbel, spec = read(gpu + "sample/gumbel.py"), read(gpu + "spec_decode/speculator.py")
    dflash = read(gpu + "spec_decode/dflash/speculator.py")
    masks = (
        "req_state_idx >= 0" in gumbel,
        "self.idx_mapping[num_reqs:].fill_(-1)" in spec,
        "tl.store(out_sample_idx_mapping_ptr + block, -1" in dflash,
    )
    assert masks == (release.masks_47066,) * 3
    assert (
        "if dummy_run:\n            self.idx_mapping.fill_(-1)" in spec
        and "self.sample_idx_mapping.fill_(-1)" in dflash
    ) == release.dummy_runs_minus_one
    assert ("murmur3_uniform32(" in gumbel, "tl.randint(seed, pos)" in gumbel) == (
        release.murmur3_noise,
        not release.murmur3_noise,
    )
    assert ("logits_cache_source" in gumbel) == release.cache_before_temperature


def test_release_rows_say_each_fact_in_words():
    rows = {row["vLLM"]: row for row in release_rows()}
    assert list(rows) == ["0.24.0", "0.25.0", "0.33.0"]
    assert rows["0.33.0"]["default model runner"].startswith("Model Runner V2;")
    assert "Llama" in rows["0.24.0"]["default model runner"]
    assert "Llama" not in rows["0.25.0"]["default model runner"]
    assert "prefix-cache" not in rows["0.24.0"]["where -1 placeholders come from"]
    assert "clamps" in rows["0.25.0"]["what keeps them from the embedding"]
    assert "marked -1" in rows["0.33.0"]["what keeps them from the embedding"]
    assert rows["0.24.0"]["#47066 masks"].startswith("none")
    assert "murmur3" in rows["0.33.0"]["noise"] and "Philox" in rows["0.25.0"]["noise"]
    assert "before temperature" in rows["0.33.0"]["draft cache holds"]


@pytest.mark.parametrize(
    "version, has",
    [
        ("0.24.0", False),
        ("0.25.0", True),
        ("0.33.0", True),
        ("0.11.0+cu128", False),
        ("0.24.0+cu128", False),
        ("0.25.0+cu128", True),
        ("0.25.0.post1", True),
        ("0.24.0.post1", None),
        ("0.25.0rc1", None),
        ("0.24.1.dev45+g3fa2c71d0", None),
        ("0.24.0.dev2", False),
        ("0.26.0.dev3", True),
        ("dev", None),
        (None, None),
    ],
)
def test_has_fix(version, has):
    assert has_fix(version, FIXES["placeholder_embedding"]) is has


def test_first_releases_agree_with_the_release_table():
    by_version = {r.version: r for r in RELEASES}
    for verdict, field in (("placeholder_embedding", "v1_clamp"), ("cudagraph_outputs", "masks_47066")):
        fix = FIXES[verdict]
        assert getattr(by_version[fix.first_release], field), verdict
        assert not getattr(by_version[fix.last_release_without], field), verdict


def test_the_map_lists_importable_modules_only(tmp_path, monkeypatch):
    """JupyterLab saves checkpoints of an opened .py file beside it; they are no modules of the package."""
    for name in ("a.py", "_private.py", "__init__.py", "sub/__init__.py", "sub/b.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f'"""{name}: a module."""\n')
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.py").write_text('"""a copy."""\n')
    monkeypatch.setattr(mirrors, "_ROOT", tmp_path)
    assert [row["module"] for row in mirrors.vllm_map()] == ["specfix.a", "specfix.sub.b"]
