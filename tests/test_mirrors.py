"""Chapter 0's module map is read from docstrings: every module that stands for a vLLM file must name it."""

import importlib

import pytest

from specfix.tools.mirrors import role_of, roles, vllm_map

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
    assert rows["specfix.tools.bench"] == "tools"
    assert rows["specfix.fixes"] == "specfix"
    assert {"v1", "mrv2", "lab", "tools", "specfix"} <= set(rows.values())


def test_every_role_is_described_by_its_own_docstring():
    described = roles()
    assert set(described) >= {row["role"] for row in vllm_map()}
    assert "vllm/v1/" in described["v1"] and "vllm/v1/worker/gpu/" in described["mrv2"]
    assert "fixes" in described["specfix"] and "runtime" in described["specfix"]
    assert all(text and "\n" not in text for text in described.values())


def test_role_of_refuses_a_foreign_module():
    with pytest.raises(ValueError, match="specfix module"):
        role_of("vllm.v1.core")
