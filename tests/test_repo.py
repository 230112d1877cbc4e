"""The repository's own promises: one dependency list, clean notebooks, a working runtime switch."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_environment_yml_installs_exactly_the_pyproject_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml must have exactly one pip section"
    (line,) = pip_sections[0]
    match = re.fullmatch(r"-e \.\[([a-z,]+)\]", line)
    assert match, f"pip section should install the project itself, got {line!r}"
    assert set(match.group(1).split(",")) == set(project["optional-dependencies"])
    conda_pkgs = [d for d in env["dependencies"] if isinstance(d, str)]
    assert {re.split(r"[<>=]", p)[0] for p in conda_pkgs} == {"python", "pip"}, "no second dependency list"


def test_makefile_installs_the_same_extras():
    makefile = (ROOT / "Makefile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = ",".join(sorted(project["optional-dependencies"]))
    assert f"-e '.[{extras}]'" in makefile


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^make (\w+)$", readme, flags=re.M)
    assert commands[:2] == ["lab", "test"]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_parameterised(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for cell in code:
        assert not cell.get("outputs"), f"{path.name}: committed with outputs"
        assert cell.get("execution_count") is None, f"{path.name}: committed with execution counts"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one 'parameters'-tagged cell"
    assert "SCALE" in "".join(tagged[0]["source"]), "the parameters cell reads SPECFIX_SCALE"
    assert "matplotlib.use" not in "".join("".join(c["source"]) for c in code)


def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECFIX_", "TRITON_"))}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env)


def test_runtime_turns_on_the_interpreter_on_cpu():
    out = _run(
        "import specfix, os; print(specfix.runtime.INTERPRET, os.environ.get('TRITON_INTERPRET'))",
        SPECFIX_DEVICE="cpu",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1"]


def test_runtime_refuses_triton_imported_first_without_interpreter():
    pytest.importorskip("triton")
    out = _run("import triton, specfix", SPECFIX_DEVICE="cpu")
    assert out.returncode != 0
    assert "TRITON_INTERPRET=1" in out.stderr and "import specfix first" in out.stderr


@pytest.mark.parametrize("var,value", [("SPECFIX_SCALE", "huge"), ("SPECFIX_DEVICE", "tpu")])
def test_runtime_rejects_bad_settings(var, value):
    out = _run("import specfix", **{var: value})
    assert out.returncode != 0 and var in out.stderr and value in out.stderr


def test_scale_picks_sizes():
    out = _run("from specfix.runtime import scaled; print(scaled(ci=1, full=2))", SPECFIX_SCALE="full")
    assert out.stdout.strip() == "2"


_EVERY_KERNEL = """
import json, sys
if sys.argv[1] == "blocked":
    sys.modules["triton"] = None          # what a machine without triton looks like to Python
import torch
import specfix
from specfix.mrv2 import gumbel
from specfix.mrv2.dflash import DFlashInputs, prepare_dflash_inputs
from specfix.v1.engine import SamplingParams, generate

out = generate(["the fox said"], SamplingParams(temperature=0.7, seed=1, max_tokens=8),
               num_speculative_tokens=3)
logits = torch.linspace(-3, 3, 300).reshape(3, 100)
tokens = gumbel.gumbel_sample(logits, torch.tensor([0, 1, -1]), torch.ones(2), torch.tensor([1, 2]),
                              torch.tensor([5, 6, 7]), True, False)
prep = prepare_dflash_inputs(2, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([4, 5, 6]),
                             torch.tensor([7, 9, 11]), 99, DFlashInputs.allocate(3, 2))
print(json.dumps({"triton": specfix.runtime.HAS_TRITON, "text": out.outputs[0].token_ids,
                  "tokens": tokens.tolist(), "dflash": {k: v.tolist() for k, v in prep.as_dict().items()}}))
"""


def test_without_triton_every_kernel_falls_back_to_its_torch_reference():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECFIX_", "TRITON_"))}
    env["SPECFIX_DEVICE"] = "cpu"
    blocked, normal = (
        subprocess.run([sys.executable, "-c", _EVERY_KERNEL, how], capture_output=True, text=True, env=env)
        for how in ("blocked", "normal")
    )
    assert blocked.returncode == 0 and normal.returncode == 0, blocked.stderr + normal.stderr
    assert blocked.stderr.count("kernels run their torch reference") == 1, "one one-line notice"
    got, want = json.loads(blocked.stdout), json.loads(normal.stdout)
    assert got.pop("triton") is False and want.pop("triton") is True
    assert got == want, "the torch references pick exactly what the kernels pick"


#: Our own tracker's issues, as a reader would meet them: "issue 6", "issue-6", "issue #6", "the issue".
#: vLLM's threads are cited by their (five-digit) numbers and are fine ("PR #47029", "Issue #37159").
_TRACKER = re.compile(r"\bissues?[\s-]*#?\d{1,3}\b|\bthe issue\b", flags=re.I)


def _reader_texts():
    yield "README.md", (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            yield f"{path.name} cell {index}", "".join(cell["source"])


def test_no_reader_facing_text_speaks_of_our_tracker():
    found = [
        f"{where}: {match.group(0)!r}" for where, text in _reader_texts() for match in _TRACKER.finditer(text)
    ]
    assert not found, "readers have no tracker; name the goal or the fact itself: " + "; ".join(found)


#: A code cell longer than this narrates badly; drawing and table code belongs in specfix.figures. (Code
#: wraps at the column's 80 characters, so the limit is the book's collapse limit, docs/conf.py.)
MAX_CODE_CELL_LINES = 25


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_code_cell_is_longer_than_the_limit_outside_exercises(path):
    long = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        lines = "".join(cell["source"]).rstrip("\n").splitlines()
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and "exercise" not in tags and len(lines) > MAX_CODE_CELL_LINES:
            long.append(f"cell {index} ({len(lines)} lines, starts {lines[0][:40]!r})")
    assert not long, f"{path.name}: code cells over {MAX_CODE_CELL_LINES} lines: {long}"


def _needs_gpu(node) -> bool:
    """Source that asks for a GPU: a skip on ``cuda.is_available``, ``.cuda()``, ``device="cuda"`` or
    ``torch.device("cuda")``."""
    import ast

    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "is_available" and "cuda" in ast.unparse(sub.value):
            return True
        if isinstance(sub, ast.Call):
            name = ast.unparse(sub.func)
            if name.endswith(".cuda") and not sub.args:
                return True
            if name in ("torch.device", "device") and sub.args and ast.unparse(sub.args[0]) in ("'cuda'",):
                return True
            if any(
                k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cuda"
                for k in sub.keywords
            ):
                return True
    return False


def _marked_cuda(decorators) -> bool:
    import ast

    return any(ast.unparse(d).startswith("pytest.mark.cuda") for d in decorators)


def test_every_test_that_needs_a_gpu_carries_the_cuda_mark():
    """`make unit` runs the GPU's tests by their `cuda` mark: one that skips without a GPU but lacks the mark
    is never run anywhere. A test needs a GPU when it, its decorators or a module-level name it is decorated
    with skip on ``cuda.is_available``, or when its body asks for the device (``.cuda()``, ``"cuda"``)."""
    import ast

    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(
            isinstance(n, ast.Assign)
            and ast.unparse(n.targets[0]) == "pytestmark"
            and "pytest.mark.cuda" in ast.unparse(n.value)
            for n in tree.body
        )
        gpu_names = {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign) and _needs_gpu(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        classes = {f: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
                continue
            decorators = fn.decorator_list + getattr(classes.get(fn), "decorator_list", [])
            needs = _needs_gpu(fn) or any(
                isinstance(n, ast.Name) and n.id in gpu_names for d in decorators for n in ast.walk(d)
            )
            if needs and not (module_marked or _marked_cuda(decorators)):
                unmarked.append(f"{path.name}::{fn.name}")
    assert not unmarked, f"these tests need a GPU but lack @pytest.mark.cuda: {unmarked}"
