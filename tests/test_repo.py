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
    out = _run("import specfix, os; print(specfix.runtime.INTERPRET, os.environ.get('TRITON_INTERPRET'))",
               SPECFIX_DEVICE="cpu")
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
