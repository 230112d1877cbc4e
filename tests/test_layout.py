"""The package's layout and its house rules, checked so that a regression fails a test.

By role: every module (or subpackage) of v1/, mrv2/, lab/ and tools/ keeps its short name in ``specfix``
(``from specfix import gumbel``), and no two roles use the same short name. By size: no module over 600
lines, no function over 60 (a Triton kernel excepted), no module docstring over 15, and the package within
its line budget. By structure: no import cycle, no string import of specfix outside the places that exist
for it, one timing harness (``specfix/timing.py``), and kernels defined whether or not triton is installed.
"""

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import specfix

#: Lines of specfix/**/*.py at most. Growth is cost: delete before adding; raise this only with the reason
#: in the commit message.
PACKAGE_LINES_BUDGET = 17290

ROLES = ("v1", "mrv2", "lab", "tools")
PACKAGE = Path(specfix.__file__).parent
ROOT = PACKAGE.parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_DOCSTRING_LINES = 600, 60, 15
#: The files that import specfix modules by a name in a string, and why they must.
STRING_IMPORTERS = {
    "__init__.py": "the short-name loader: ``specfix.gumbel`` loads specfix.mrv2.gumbel on first use",
    "exercises/core.py": "a checker loads its chapter's solution module, named in the exercise, on demand",
}
#: What times code: CUDA events and ``do_bench`` wherever they appear, a clock read beside a synchronize.
TIMING = re.compile(r"cuda\.Event\(|enable_timing|do_bench\(")
CLOCKS = {f"{m}{f}{ns}" for m in ("", "time.") for f in ("perf_counter", "monotonic") for ns in ("", "_ns")}
CLOCKS |= {"time.time", "time.time_ns"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_nodes(node: ast.AST):
    """The nodes under ``node`` that run when it runs, not those inside the functions it defines."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _load_time_nodes(child)


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _is_kernel(fn: ast.FunctionDef) -> bool:
    """Decorated ``@triton.jit`` or ``@triton.jit(...)``."""
    return any(
        ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in fn.decorator_list
    )


def test_no_short_name_is_used_twice():
    names = [p.stem for role in ROLES for p in (PACKAGE / role).glob("[!_]*.py")]
    names += [p.parent.name for role in ROLES for p in (PACKAGE / role).glob("[!_]*/__init__.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert set(specfix._SUBPACKAGE) == set(names)


@pytest.mark.parametrize("name", sorted(specfix._SUBPACKAGE))
def test_a_short_name_loads_the_module_of_its_role(name):
    module = getattr(specfix, name)
    assert module is importlib.import_module(f"specfix.{specfix._SUBPACKAGE[name]}.{name}")


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        specfix.no_such_module  # noqa: B018


def test_no_module_is_over_the_line_limit():
    lines = {_rel(p): len(p.read_text().splitlines()) for p in MODULES}
    assert not {p: n for p, n in lines.items() if n > MAX_MODULE_LINES}


def test_the_package_keeps_within_its_line_budget():
    total = sum(len(p.read_text().splitlines()) for p in MODULES)
    assert total <= PACKAGE_LINES_BUDGET, (
        f"{total} lines, budget {PACKAGE_LINES_BUDGET}: delete before adding"
    )


def test_no_function_but_a_triton_kernel_is_over_the_line_limit():
    too_long = [
        f"{_rel(p)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for p in MODULES
        for fn in _functions(_tree(p))
        if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES and not _is_kernel(fn)
    ]
    assert not too_long


def test_module_docstrings_are_short():
    long_docs = {}
    for p in MODULES:
        body = _tree(p).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if (n := body[0].end_lineno - body[0].lineno + 1) > MAX_DOCSTRING_LINES:
                long_docs[_rel(p)] = n
    assert not long_docs


def test_no_kernel_is_defined_only_where_triton_is_installed():
    """``runtime``'s stand-in ``triton.jit`` defines every kernel; launchers check ``HAS_TRITON`` instead."""
    guarded = [
        f"{_rel(p)}:{node.lineno}"
        for p in MODULES
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("HAS_TRITON", "runtime.HAS_TRITON")
    ]
    assert not guarded


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The specfix modules ``path`` imports when it loads (relative imports resolved, ``from p import m``
    read as an import of the submodule ``p.m``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _load_time_nodes(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            anchor = parts[: len(parts) + 1 - node.level] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return (found & modules) - {name}


def test_no_import_cycle_among_specfix_modules():
    modules = {_module_name(p): p for p in MODULES}
    graph = {name: _imports(path, set(modules)) for name, path in modules.items()}
    done, path = set(), []

    def cycle_from(name):
        if name in path:
            return path[path.index(name) :] + [name]
        if name in done:
            return None
        path.append(name)
        found = next(filter(None, map(cycle_from, sorted(graph[name]))), None)
        done.add(path.pop())
        return found

    cycle = next(filter(None, map(cycle_from, sorted(graph))), None)
    assert cycle is None, " -> ".join(cycle)


def _names_specfix(arg: ast.expr) -> bool:
    if isinstance(arg, ast.JoinedStr) and arg.values:
        arg = arg.values[0]
    return isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("specfix")


def test_specfix_modules_are_imported_by_string_only_where_that_is_the_point():
    importers = {
        p.relative_to(PACKAGE).as_posix()
        for p in MODULES
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
        and node.args
        and _names_specfix(node.args[0])
    }
    assert importers == set(STRING_IMPORTERS)


def _code() -> dict[str, str]:
    """The source of the package, the scripts and the chapters' code cells (magics blanked), by place."""
    sources = {_rel(p): p.read_text() for p in [*MODULES, *sorted((ROOT / "scripts").glob("*.py"))]}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                sources[f"{_rel(nb)} cell {i}"] = "\n".join(
                    "" if s.startswith(("%", "!")) else s for s in lines
                )
    sources.pop("specfix/timing.py")
    return sources


def _times_with_a_sync(scope: ast.AST) -> bool:
    """Whether ``scope`` (a function, or a module's own statements) both synchronises and reads a clock."""
    calls = {ast.unparse(n.func) for n in _load_time_nodes(scope) if isinstance(n, ast.Call)}
    return any(c.endswith("synchronize") for c in calls) and bool(calls & CLOCKS)


def test_one_timing_harness():
    """CUDA events, ``do_bench`` and clocks around a synchronize live in ``specfix/timing.py`` only
    (a synchronize alone, to surface an error or count syncs, is no timer)."""
    timers = set()
    for place, source in _code().items():
        timers |= {f"{place}:{i}" for i, line in enumerate(source.splitlines(), 1) if TIMING.search(line)}
        tree = ast.parse(source)
        timers |= {
            f"{place}:{getattr(s, 'lineno', 1)}" for s in [tree, *_functions(tree)] if _times_with_a_sync(s)
        }
    assert not timers, sorted(timers)
