"""The exercises work: every checker accepts its reference solution, each notebook has its exercises, and each
notebook's exercise cells call every checker of its chapter (so that, run with ``SOLUTIONS = True``, it
reports every exercise solved).

Each chapter's own test file (``tests/test_exercises_<chapter>.py``) feeds its checkers the typical wrong
answers and checks that each gets its own hint."""

import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import specfix.exercises
from specfix.exercises import core

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: At least this many ``exercise``-tagged cells per chapter (chapters 0 has none).
MIN_EXERCISES = {"01": 4, "02": 4, "03": 4, "04": 4, "05": 3}

for info in pkgutil.iter_modules(specfix.exercises.__path__):
    if not info.ispkg and info.name != "core":
        importlib.import_module(f"specfix.exercises.{info.name}")


@pytest.fixture
def solutions_on():
    core.use_solutions(True)
    yield
    core.use_solutions(False)


@pytest.mark.parametrize("exercise", sorted(core.CHECKERS))
def test_reference_solution_is_accepted(exercise, solutions_on):
    verdict = core.CHECKERS[exercise]()
    assert verdict.solved, str(verdict)
    assert "correct" in str(verdict)


@pytest.mark.parametrize("exercise", sorted(core.CHECKERS))
def test_an_unsolved_stub_says_what_to_do_and_does_not_raise(exercise):
    def stub(*args, **kwargs):
        raise NotImplementedError

    # A function stub means "not written yet" where the answer is a function; for a value, ... or None does.
    stubs = (stub, None, ...) if callable(core.CHECKERS[exercise].reference()) else (None, ...)
    for answer in stubs:
        verdict = core.CHECKERS[exercise](answer)
        assert not verdict.solved and verdict.hint_ids == ["todo"], str(verdict)


def test_a_hint_shows_its_names_as_code_not_as_backticks():
    verdict = core.Verdict("chX.toy", [("slip", "read `idx_mapping` by slot, not <row>")])
    shown = verdict._repr_html_()
    assert "<code>idx_mapping</code>" in shown and "`" not in shown and "&lt;row&gt;" in shown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_its_exercises(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "exercise" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) >= MIN_EXERCISES.get(path.name[:2], 0), f"{path.name}: {len(tagged)} exercise cells"
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if MIN_EXERCISES.get(path.name[:2]):
        assert "SOLUTIONS = False" in "".join(params[0]["source"]), f"{path.name}: parameters lack SOLUTIONS"


@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if MIN_EXERCISES.get(p.name[:2])], ids=lambda p: p.name
)
def test_notebook_checks_every_exercise_of_its_chapter(path):
    """With SOLUTIONS = True a checker checks its reference solution, whatever the cell passes it, so a
    chapter run with the solutions reports every exercise solved exactly when its exercise cells call every
    checker of the chapter (this test) and each reference is accepted (test_reference_solution_is_accepted).
    The chapter itself runs once, as a reader runs it, in `make notebooks`."""
    by_name = {
        name: made.exercise
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").startswith("specfix.exercises.")
        for name, made in vars(module).items()
        if isinstance(made, core.Checker)
    }
    nb = json.loads(path.read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if "exercise" in c.get("metadata", {}).get("tags", [])]
    called = {
        by_name[name] for cell in cells for name in re.findall(r"\b(check_\w+)\(", cell) if name in by_name
    }
    chapter = f"ch{int(path.name[:2])}."
    assert called == {name for name in core.CHECKERS if name.startswith(chapter)}, path.name
    assert len(called) >= MIN_EXERCISES[path.name[:2]]
