"""What every checker shares: a verdict that displays well, hints with ids, and no exception ever escaping.

A chapter registers each checker with :func:`checker`; its body calls the reader's ``answer`` and stops at the
first failed ``verdict.require(ok, hint_id)``. An unsolved stub (``NotImplementedError``, ``None`` or ``...``)
gets the ``todo`` text; any other exception from the answer becomes a hint naming it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import html
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

from specfix.checks import is_int

_use_solutions = False
#: Every checker defined so far, by exercise id (tests walk it).
CHECKERS: dict[str, Checker] = {}
#: The last verdict of each exercise in this process (``summary`` reads it).
RESULTS: dict[str, Verdict] = {}


def use_solutions(enabled: bool) -> None:
    """Check the reference solutions instead of the reader's answers (the notebooks' ``SOLUTIONS`` flag)."""
    global _use_solutions
    _use_solutions = bool(enabled)


class _Stop(Exception):
    """A requirement failed: the check ends there."""


class _Bypass(Exception):
    """The answer called a specfix function that the exercise asks the reader to write or work out."""


@dataclass
class Verdict:
    """The outcome of one check: solved, or the hints (id, message) of what is still wrong."""

    exercise: str
    hints: list[tuple[str, str]] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        return not self.hints

    @property
    def hint_ids(self) -> list[str]:
        return [hint_id for hint_id, _ in self.hints]

    def require(self, ok: bool, hint_id: str, detail: str = "") -> None:
        """Record hint ``hint_id`` (plus ``detail``) and stop the check unless ``ok``."""
        if not ok:
            message = CHECKERS[self.exercise].hints[hint_id]
            self.hints.append((hint_id, f"{message} {detail}".strip()))
            raise _Stop

    def match(self, ok: bool, detail: str, last: str = "wrong", **slipped: bool) -> None:
        """Unless ``ok``, stop with the hint of the first slip made (in the order given), else ``last``."""
        if not ok:
            for hint_id, made in slipped.items():
                self.require(not made, hint_id, detail)
            self.require(False, last, detail)

    def __str__(self) -> str:
        if self.solved:
            return f"[solved] {self.exercise}: correct."
        return "\n".join([f"[not yet] {self.exercise}:"] + [f"  - {message}" for _, message in self.hints])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        div = "<div style='border-left:4px solid {};padding:4px 8px'><b>{}</b>: <code>{}</code>{}</div>"
        if self.solved:
            return div.format("#1b7837", "Solved", self.exercise, " is correct.")
        # a hint's `name` in backticks shows as code, as in the chapters' markdown
        spans = (re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(m)) for _, m in self.hints)
        items = "".join(f"<li>{span}</li>" for span in spans)
        return div.format("#f1a340", "Not yet", self.exercise, f"<ul style='margin:2px 0'>{items}</ul>")


@dataclass
class Checker:
    exercise: str
    solution: str  # "module:name" under specfix.exercises.solutions
    todo: str
    hints: dict[str, str]
    body: Callable
    # "module:owner.attr" of specfix's own versions, refused if the answer calls one
    forbid: tuple[str, ...] = ()

    def _guarded(self, answer):
        """``answer`` made to raise :class:`_Bypass` if it calls one of ``forbid`` (a kernel: as it is)."""
        if not self.forbid or not callable(answer) or hasattr(answer, "fn") or hasattr(answer, "__getitem__"):
            return answer

        @functools.wraps(answer)
        def guarded(*args, **kwargs):
            with contextlib.ExitStack() as patches:  # each forbidden function refuses, and is put back after
                for target in self.forbid:
                    module, path = target.split(":")
                    *owner_path, attr = path.split(".")
                    owner = functools.reduce(getattr, owner_path, importlib.import_module(module))
                    patches.enter_context(mock.patch.object(owner, attr, side_effect=_Bypass(path)))
                return answer(*args, **kwargs)

        return guarded

    def _solution_module(self):
        module, name = self.solution.split(":")
        return importlib.import_module(f"specfix.exercises.solutions.{module}"), name

    def reference(self):
        return getattr(*self._solution_module())

    def __call__(self, answer=None) -> Verdict:
        if _use_solutions:
            answer = self.reference()
        verdict = Verdict(self.exercise)
        try:
            if answer is None or answer is Ellipsis:
                raise NotImplementedError
            self.body(self._guarded(answer), verdict)
        except _Stop:
            pass  # its hint is recorded
        except _Bypass as called:
            work_out = "that is what this exercise asks you to work out"
            verdict.hints.append(("bypass", f"your answer calls specfix's own {called}: {work_out}."))
        except NotImplementedError:
            verdict.hints.append(("todo", self.todo))
        except Exception as error:  # the reader's code failed: that is feedback, not a crash
            verdict.hints.append(("raised", f"your answer raised {type(error).__name__}: {error}"))
        RESULTS[self.exercise] = verdict
        return verdict


def checker(exercise: str, *, solution: str, todo: str, hints: dict[str, str], forbid: tuple[str, ...] = ()):
    """Register ``body(answer, verdict)`` as ``exercise``'s checker."""

    def wrap(body: Callable) -> Checker:
        made = functools.update_wrapper(Checker(exercise, solution, todo, dict(hints), body, forbid), body)
        CHECKERS[exercise] = made
        return made

    return wrap


def value_of(answer):
    """The answer, or what a function-valued answer returns; ``None`` or ``...`` (in a dict too): unsolved."""
    value = answer() if callable(answer) else answer
    if value is None or value is ... or (isinstance(value, dict) and any(v is ... for v in value.values())):
        raise NotImplementedError
    return value


def as_int(value) -> int | None:
    """A whole number in any container, else None (a bool or a float is no count)."""
    if hasattr(value, "dtype") and getattr(value, "shape", ()) in ((), (1,)):  # tensor or numpy scalar/array
        return int(value.item()) if "int" in str(value.dtype) else None
    return int(value) if is_int(value) else None


def as_int_list(value) -> list[int] | None:
    """A list of ints from a list, tuple, set, 1-D array or tensor of whole numbers, else None."""
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # tensor or numpy array
        if "int" not in str(value.dtype) or getattr(value, "ndim", 1) != 1:
            return None
        return [int(v) for v in value.tolist()]
    if not isinstance(value, (list, tuple, set, frozenset)):
        return None
    ints = [as_int(v) for v in value]
    return None if None in ints else ints


def as_str_set(value) -> set[str] | None:
    """A set of names from a set, list, tuple or 1-D array of strings, else None."""
    if hasattr(value, "tolist") and not isinstance(value, str):  # a numpy array of names
        value = value.tolist()
    ok = isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value)
    return set(value) if ok else None


def summary() -> dict[str, bool]:
    """Exercise id -> solved, for the exercises checked so far."""
    return {name: verdict.solved for name, verdict in sorted(RESULTS.items())}


class Source(str):
    """Python source that displays as a code block (the live text of a reference solution)."""

    __repr__ = str.__str__

    def _repr_markdown_(self) -> str:
        return f"```python\n{self}\n```"


def show_solution(exercise: str) -> Source:
    """The live source of ``exercise``'s reference solution (a function, or the line that sets a value)."""
    if exercise not in CHECKERS:
        raise ValueError(f"exercise must be one of {sorted(CHECKERS)}, got {exercise!r}")
    module, name = CHECKERS[exercise]._solution_module()
    answer = getattr(module, name)
    if inspect.isfunction(answer) or inspect.isclass(answer):
        return Source(inspect.getsource(answer).rstrip())
    text = inspect.getsource(module)
    assigned = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)]
    node = next(n for n in assigned if any(getattr(t, "id", None) == name for t in n.targets))
    lines = text.splitlines()
    start = node.lineno - 1  # the comment lines right above the value explain it: they belong to the solution
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return Source("\n".join(lines[start : node.end_lineno]))
