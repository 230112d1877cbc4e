"""The book's promises that fail cheaply, without building it: every chapter in the toctree, a config that
fetches nothing and fails on a failing cell, CI that checks it after `make test`, the cell presentation
rules, and the link checker of scripts/book_check.py."""

import importlib.util
import json
import os
import re
import runpy
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # specfix_book imports book_cells by name, as Sphinx loads it
    spec.loader.exec_module(module)
    return module


book_cells = _load("book_cells", DOCS / "_ext" / "book_cells.py")
book_check = _load("book_check", ROOT / "scripts" / "book_check.py")


@pytest.fixture(scope="module")
def conf():
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", list(sys.path)):
        return runpy.run_path(str(DOCS / "conf.py"))


def _toctree_entries():
    index = (DOCS / "index.md").read_text()
    blocks = re.findall(r"```\{toctree\}\n(.*?)```", index, flags=re.S)
    assert blocks, "docs/index.md has no toctree"
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith(":")
    ]


def test_every_chapter_is_in_the_toctree_in_order():
    chapters = [f"../notebooks/{p.stem}" for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    assert chapters, "no notebooks found"
    assert _toctree_entries() == chapters


def test_conf_reads_the_chapters_where_they_live(conf):
    assert conf["root_doc"] == "docs/index"
    assert "notebooks/*.ipynb" in conf["include_patterns"]
    # the walk is pruned everywhere but docs/ and notebooks/ (a .venv holds thousands of files)
    assert {"specfix", "tests", "scripts"} <= set(conf["exclude_patterns"])
    assert not {"docs", "notebooks"} & set(conf["exclude_patterns"])


def test_conf_runs_every_chapter(conf):
    assert conf["nb_execution_mode"] == "force"
    assert conf["nb_execution_timeout"] >= 300
    assert "specfix_book" in conf["extensions"]


class _Env:
    def __init__(self, **succeeded):
        self.nb_metadata = {"docs/index": {}}
        self.nb_metadata.update(
            {f"notebooks/{name}": {"exec_data": {"succeeded": ok}} for name, ok in succeeded.items()}
        )


def test_a_failing_chapter_fails_the_build():
    pytest.importorskip("sphinx")
    specfix_book = _load("specfix_book", DOCS / "_ext" / "specfix_book.py")
    from sphinx.errors import ExtensionError

    specfix_book._fail_on_failed_chapters(None, _Env(a=True, b=True))
    with pytest.raises(ExtensionError, match=r"a cell raised in notebooks/b, notebooks/c \("):
        specfix_book._fail_on_failed_chapters(None, _Env(a=True, b=False, c=False))


def test_widget_state_is_left_out_of_the_pages():
    pytest.importorskip("sphinx")
    specfix_book = _load("specfix_book", DOCS / "_ext" / "specfix_book.py")
    env = _Env(a=True)
    env.nb_metadata["notebooks/a"]["js_files"] = {
        specfix_book.WIDGET_STATE_SCRIPT: (None, {"body": "{}"}),
        "other": ("x.js", {}),
    }
    specfix_book._drop_widget_state(None, env)
    assert env.nb_metadata["notebooks/a"]["js_files"] == {"other": ("x.js", {})}


def test_widget_views_are_dropped_and_other_outputs_kept():
    pytest.importorskip("sphinx")
    from docutils import nodes
    from docutils.utils import new_document

    specfix_book = _load("specfix_book", DOCS / "_ext" / "specfix_book.py")

    def cell(*mime_types):
        bundle = nodes.container(nb_element="mime_bundle")
        bundle.extend(nodes.container(mime_type=m) for m in mime_types)
        output = nodes.container(nb_element="cell_code_output")
        output.append(bundle)
        code = nodes.container(nb_element="cell_code")
        code.append(output)
        return code

    document = new_document("chapter")
    document.extend([cell(specfix_book.WIDGET_VIEW, "text/plain"), cell("image/svg+xml", "text/plain")])
    specfix_book.DropWidgetViews(document).run()
    widget_cell, figure_cell = document.children
    assert widget_cell.children == [], "the widget's output area should be gone"
    assert [c["mime_type"] for c in figure_cell.children[0].children[0].children] == [
        "image/svg+xml",
        "text/plain",
    ]


def test_conf_fetches_nothing(conf):
    assert not re.match(r"https?:|//", conf["mathjax_path"]), "MathJax must come from the book itself"
    assert conf["nb_ipywidgets_js"] == {}, "the ipywidgets loader comes from a CDN"
    assert conf["html_theme"] == "sphinx_book_theme"


def test_book_runs_at_ci_scale_on_the_cpu_by_default():
    with mock.patch.dict(os.environ, clear=True), mock.patch.object(sys, "path", list(sys.path)):
        runpy.run_path(str(DOCS / "conf.py"))
        assert (os.environ["SPECFIX_SCALE"], os.environ["SPECFIX_DEVICE"]) == ("ci", "cpu")


def _make_rule(makefile, target):
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, flags=re.M)
    assert match, f"no rule for {target!r}"
    return match.group(1).split(), match.group(2)


def test_make_test_runs_what_it_ran_and_not_the_book():
    makefile = (ROOT / "Makefile").read_text()
    prerequisites, recipe = _make_rule(makefile, "test")
    assert prerequisites == ["lint", "unit", "notebooks"] and not recipe.strip()
    for target in prerequisites:
        deps, recipe = _make_rule(makefile, target)
        assert not {"book", "book-check"} & set(deps), f"`make {target}` must not build the book"
        assert not re.search(r"sphinx|book_check|\$\(BOOK", recipe), f"`make {target}` builds the book"


def test_ci_checks_the_book_after_make_test():
    # a command may carry environment settings before it (SPECFIX_REQUIRE_PEER=1 make test)
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    lines = [re.sub(r"^(\w+=\S*\s+)*", "", line.strip()) for line in run]
    assert lines.index("make test") < lines.index("make book-check")
    assert _make_rule((ROOT / "Makefile").read_text(), "book-check")[0] == ["book"]


def test_ci_runs_the_chapters_in_jupyterlab_after_the_book_check():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert lines.index("make book-check") < lines.index("make lab-check")
    recipe = _make_rule((ROOT / "Makefile").read_text(), "lab-check")[1]
    assert "scripts/lab_check.py" in recipe
    # the check starts JupyterLab the way a reader does, through `make lab`
    assert '"make", "--no-print-directory", "lab"' in (ROOT / "scripts" / "lab_check.py").read_text()


def test_notebook_runs_fail_on_an_undisplayed_figure():
    assert re.search(r"SPECFIX_CHECK_FIGURES=1 \S+ -m pytest -q --nbmake", (ROOT / "Makefile").read_text())
    assert 'os.environ["SPECFIX_CHECK_FIGURES"] = "1"' in (DOCS / "conf.py").read_text()


def test_make_lab_keeps_the_token_and_the_loopback_address():
    makefile = (ROOT / "Makefile").read_text()
    _, recipe = _make_rule(makefile, "lab")
    assert "--ip=127.0.0.1" in recipe and "$(LAB_ROOT)" in recipe and "$(LAB_ARGS)" in recipe
    assert "token" not in recipe.lower() and "password" not in recipe.lower()
    assert re.search(r"^LAB_ROOT\s*:=.*id -u.*--allow-root", makefile, flags=re.M)


# --- how cells are presented ----------------------------------------------------------------------------


def _cell(kind, lines, tags=()):
    return {
        "cell_type": kind,
        "metadata": {"tags": list(tags)},
        "source": [f"line {i}\n" for i in range(lines)],
    }


def test_long_code_cells_start_collapsed_with_their_length():
    nb = {"cells": [_cell("code", 16), _cell("code", 15), _cell("markdown", 40)]}
    long, short, prose = book_cells.prepare_notebook(nb, collapse_lines=15)["cells"]
    assert "hide-input" in long["metadata"]["tags"]
    assert long["metadata"]["mystnb"]["code_prompt_show"] == "Show the code (16 lines)"
    assert short["metadata"]["tags"] == [] and "mystnb" not in short["metadata"]
    assert prose["metadata"]["tags"] == []


def test_exercises_stay_open_and_solutions_hide():
    nb = {
        "cells": [
            _cell("code", 40, ["exercise"]),
            _cell("code", 3, ["solution"]),
            _cell("markdown", 2, ["solution"]),
            _cell("code", 30, ["hide-output"]),
        ]
    }
    exercise, code_solution, prose_solution, chosen = book_cells.prepare_notebook(nb, 15)["cells"]
    assert exercise["metadata"]["tags"] == ["exercise"]
    assert code_solution["metadata"]["tags"] == ["solution", "hide-cell"]
    assert code_solution["metadata"]["mystnb"]["code_prompt_show"] == "Show the solution"
    assert prose_solution["source"].startswith('<details class="specfix-solution">')
    assert "line 1" in prose_solution["source"] and prose_solution["source"].endswith("</details>\n")
    assert chosen["metadata"]["tags"] == ["hide-output"], "a cell that chose how to show itself is kept"


def test_an_answer_keeps_its_output_behind_a_toggle():
    (answer,) = book_cells.prepare_notebook({"cells": [_cell("code", 3, ["answer"])]}, 15)["cells"]
    assert answer["metadata"]["tags"] == ["answer", "hide-output"]
    assert "predict first" in answer["metadata"]["mystnb"]["code_prompt_show"]


def test_predict_then_run_exercises_are_not_answered_on_the_page():
    """The first code cell after a "predict, then run" exercise (and its solution) is tagged `answer`."""
    found = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        tags = [cell["metadata"].get("tags", []) for cell in cells]
        for i, cell in enumerate(cells):
            heading = re.search(r"^#+ .*predict, then run", "".join(cell["source"]), re.I | re.M)
            if cell["cell_type"] != "markdown" or not heading:
                continue
            found += 1
            exercise = next(j for j in range(i + 1, len(cells)) if "exercise" in tags[j])
            run = next(
                j
                for j in range(exercise + 1, len(cells))
                if cells[j]["cell_type"] == "code" and not {"exercise", "solution"} & set(tags[j])
            )
            assert "answer" in tags[run], f"{path.name}: cell {run} shows the answer to {heading.group(0)!r}"
    assert found >= 2


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "15"])
def test_collapse_threshold_is_checked(bad):
    with pytest.raises(ValueError, match="collapse_lines must be a positive int"):
        book_cells.prepare_notebook({"cells": []}, bad)


def test_the_real_chapters_prepare_without_error():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = book_cells.prepare_notebook(json.loads(path.read_text()), 15)
        for cell in nb["cells"]:
            tags = cell["metadata"]["tags"]
            assert not ("exercise" in tags and "hide-input" in tags), f"{path.name}: exercise collapsed"


# --- the browser check's link rules -------------------------------------------------------------------------


@pytest.fixture
def site(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "_static").mkdir()
    (tmp_path / "index.html").write_text('<a href="notebooks/a.html#x">a</a>')
    (tmp_path / "notebooks" / "a.html").write_text('<h1 id="x">A</h1><a name="old">n</a>')
    (tmp_path / "notebooks" / "index.html").write_text("<p>folder index</p>")
    (tmp_path / "_static" / "theme.html").write_text("<p>asset</p>")
    return tmp_path


ORIGIN = "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    "url",
    [
        f"{ORIGIN}/notebooks/a.html",
        f"{ORIGIN}/notebooks/a.html#x",
        f"{ORIGIN}/notebooks/a.html#old",
        f"{ORIGIN}/notebooks/",
        "https://github.com/vllm-project/vllm/pull/47066",
        "mailto:a@example.org",
    ],
)
def test_links_that_resolve(site, url):
    assert book_check.broken_link(url, site, ORIGIN) is None


@pytest.mark.parametrize(
    "url, why",
    [
        (f"{ORIGIN}/notebooks/b.html", "no file notebooks/b.html"),
        (f"{ORIGIN}/notebooks/a.html#y", "has no anchor #y"),
        (f"{ORIGIN}/../../etc/passwd", "points outside the book"),
    ],
)
def test_links_that_do_not(site, url, why):
    assert why in book_check.broken_link(url, site, ORIGIN)


def test_pages_leave_out_theme_assets(site):
    pages = book_check.book_pages(site)
    assert pages == ["index.html", "notebooks/a.html", "notebooks/index.html"]
    assert book_check.chapter_pages(pages) == ["notebooks/a.html", "notebooks/index.html"]


def test_figure_legibility_and_count_rules(tmp_path):
    # a figure drawn at the column's width keeps its 8 pt text at 10.7 px; at twice the width, half that
    legible = {"src": "a.svg", "natural": 680, "shown": 680}
    shrunk = {"src": "b.svg", "natural": 1376, "shown": 688}
    assert book_check.small_figures([legible]) == []
    (problem,) = book_check.small_figures([legible, shrunk])
    assert problem.startswith("b.svg: 1376 px wide shown at 688 px") and "5.3 px tall" in problem
    cells = [
        {
            "cell_type": "code",
            "outputs": [
                {"data": {"image/svg+xml": "<svg/>", "text/plain": "fig"}},
                {"data": {"text/plain": "x"}},
            ],
        },
        {"cell_type": "code", "outputs": [{"output_type": "stream", "text": "y"}]},
        {"cell_type": "markdown", "source": ""},
        {"cell_type": "code", "outputs": [{"data": {"image/png": "iVBOR"}}]},
    ]
    executed = tmp_path / "ch.ipynb"
    executed.write_text(json.dumps({"cells": cells}))
    assert book_check.displayed_figures(executed) == 2


# The book's code cells show about 80 characters of 14 px monospace in the 688 px column; a longer line is
# cut off at its right edge. Every chapter's code fits, but for cells owned by others and left to them
# (2026-12-02): chapter 1's and 3's exercise, solution and answer cells, chapter 4's live timing cell.
CODE_COLUMNS = 80
LONG_CODE_LEFT = {
    "01_placeholder_lifecycle": {"exercise", "solution", "answer"},
    "03_cudagraph_idx_mapping": {"exercise", "solution", "answer"},
}
LONG_CODE_CELLS = {"896cacea"}


def _left_to_owner(stem, cell) -> bool:
    return cell.get("id") in LONG_CODE_CELLS or bool(
        LONG_CODE_LEFT.get(stem, set()) & set(cell["metadata"].get("tags", []))
    )


def _code_cells(path):
    return [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_code_lines_fit_the_column(path):
    long = [
        line
        for cell in _code_cells(path)
        if not _left_to_owner(path.stem, cell)
        for line in "".join(cell["source"]).splitlines()
        if len(line) > CODE_COLUMNS
    ]
    assert not long, f"{path.name}: {len(long)} code lines over {CODE_COLUMNS} characters, e.g. {long[-1]!r}"


def _python(source: str):
    """A code cell as Python: IPython's %magic and !shell lines left out."""
    import ast

    return ast.parse(
        "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    )


def paragraph_builders(source: str) -> list:
    """Why a code cell builds prose itself: each Markdown(...) call whose text is written in the cell (an
    f-string, a literal, a concatenation or a name bound to one) instead of returned by a package function."""
    import ast

    tree = _python(source)
    built = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Call)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Markdown" and node.args:
            arg = node.args[0]
            if (
                not isinstance(arg, ast.Call)
                or any(isinstance(n, ast.JoinedStr) for n in ast.walk(arg))
                or (isinstance(arg, ast.Name) and arg.id in built)
            ):
                found.append(ast.unparse(arg)[:60])
    return found


def test_paragraph_builders_are_found():
    assert paragraph_builders('display(Markdown(f"{n} of {m} rows"))') == ["f'{n} of {m} rows'"]
    assert paragraph_builders('text = "a" + b\ndisplay(Markdown(text))') == ["text"]
    assert paragraph_builders('display(Markdown("**a** " + b))')
    assert paragraph_builders('display(Markdown(figs.text(f"{x}")))')
    assert paragraph_builders("%config X\ndisplay(Markdown(figs.sources_text(sources)))") == []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_no_code_cell_builds_a_paragraph(path):
    import ast

    """A paragraph a cell shows comes from the package, one short call; a cell that does nothing else
    keeps its input out of the book (`remove-input`), so the reader sees the paragraph, not the call."""
    for i, cell in enumerate(_code_cells(path)):
        source = "".join(cell["source"])
        assert not paragraph_builders(source), (
            f"{path.name}, code cell {i} builds its paragraph: {source[:80]}"
        )
        statements = _python(source).body
        only_text = statements and all("Markdown(" in ast.unparse(s) for s in statements)
        if only_text:
            assert "remove-input" in cell["metadata"].get("tags", []), (
                f"{path.name}, code cell {i} only shows a paragraph: tag it remove-input ({source[:80]})"
            )


# Tags a chapter's prose may use; any other `<word>` outside a code span is swallowed as HTML by the book.
PROSE_HTML = {
    "a",
    "b",
    "br",
    "code",
    "details",
    "div",
    "em",
    "i",
    "img",
    "kbd",
    "li",
    "ol",
    "p",
    "pre",
    "small",
    "span",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "td",
    "th",
    "tr",
    "ul",
}


def test_prose_has_no_angle_brackets_the_book_would_take_for_html():
    swallowed = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                text = re.sub(r"```.*?```", "", "".join(cell["source"]), flags=re.S)
                text = re.sub(r"``.+?``|`[^`\n]*`", "", text)
                swallowed += [
                    f"{path.name} cell {i}: {m.group(0)}"
                    for m in re.finditer(r"</?([A-Za-z][\w-]*)[^>\n]*>", text)
                    if m.group(1).lower() not in PROSE_HTML
                ]
    assert not swallowed, swallowed


def test_the_builders_paths_are_found_in_a_page():
    text = f'File /tmp/ipykernel_4242/3141.py:7\n  File "{sys.prefix}/lib/site-packages/torch/functional.py"'
    assert {"/tmp/ipykernel_4242/3141.py", sys.prefix} <= set(book_check.local_paths(text))
    assert book_check.local_paths(f"see {ROOT}/notebooks") == [str(ROOT)]
    recorded = 'File "/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/__init__.py" (on the H200)'
    assert book_check.local_paths(f"vllm/v1/worker/gpu/model_runner.py, /tmp in prose; {recorded}") == []


# --- the glossary ------------------------------------------------------------------------------------------

# Terms each chapter uses without defining them where it uses them: each must have its entry in the glossary
# (chapter 0's last section). A term in the list that the chapter no longer uses fails too, so the list
# follows the chapters. Terms a chapter defines on the spot are not listed (e.g. prefix caching in chapter 1's
# section 2, the total variation distance in chapter 3's section 4).
GLOSSARY_TERMS = {
    "00_tour": ["Philox", "P/D", "MTP", "EAGLE", "n-gram", "bonus token", "recovered", "acceptance rate"],
    "01_placeholder_lifecycle": [
        "token budget",
        "prefill chunk",
        "BOS",
        "logits_indices",
        "target_logits_indices",
        "bonus_logits_indices",
        "structured output",
        "FULL",
        "async scheduling",
        "Model Runner V2",
        "P/D",
        "KV cache",
    ],
    "02_embedding_assert": ["BOS", "GEMM", "device-side assert", "host synchronisation", "CUDA graph"],
    "03_cudagraph_idx_mapping": [
        "chunked prefill",
        "idx_mapping",
        "persistent buffer",
        "chi-square",
        "DFlash",
        "draft logits",
        "req_state_idx",
    ],
    "04_masked_gumbel_sampling": [
        "Philox",
        "FMA contraction",
        "libdevice",
        "compute-sanitizer",
        "Gumbel-max",
        "expanded_idx_mapping",
        "tile",
    ],
    "05_performance": ["warp", "occupancy", "HBM", "SM", "Nsight Compute", "ceiling", "host synchronisation"],
}


def glossary_headings() -> list:
    """The bold heads of the glossary's entries in chapter 0, lower-case, backticks dropped."""
    cells = json.loads((ROOT / "notebooks" / "00_tour.ipynb").read_text())["cells"]
    (glossary,) = [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "markdown" and '<a id="glossary"></a>' in "".join(c["source"])
    ]
    return [head.replace("`", "").lower() for head in re.findall(r"^\*\*(.+?)\*\*", glossary, flags=re.M)]


def _in_glossary(term: str, heads: list) -> bool:
    word = re.compile(rf"(?<![\w]){re.escape(term.lower())}")
    return any(word.search(head) for head in heads)


def test_glossary_lookup():
    heads = ["hbm, sm, warp, occupancy.", "logits_indices, target_logits_indices, bonus_logits_indices."]
    assert _in_glossary("SM", heads) and _in_glossary("target_logits_indices", heads)
    assert not _in_glossary("GEMM", heads) and not _in_glossary("indices", heads)


@pytest.mark.parametrize("stem", sorted(GLOSSARY_TERMS))
def test_every_term_a_chapter_uses_is_in_the_glossary(stem):
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    text = "\n".join("".join(cell["source"]) for cell in cells).lower()
    heads = glossary_headings()
    unused = [term for term in GLOSSARY_TERMS[stem] if term.lower() not in text]
    assert not unused, f"{stem} no longer uses {unused}: take them off GLOSSARY_TERMS"
    missing = [term for term in GLOSSARY_TERMS[stem] if not _in_glossary(term, heads)]
    assert not missing, f"{stem} uses {missing}, which the glossary does not define"


def test_chip_contrast_and_search_excerpt_rules():
    assert book_check.contrast("rgb(27, 27, 27)", "rgb(238, 144, 64)") > 4.5  # book.css's chip, light mode
    assert book_check.contrast("rgb(206, 209, 214)", "rgb(255, 209, 158)") < 4.5  # pale text on a pale fill
    assert round(book_check.contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)")) == 21
    excerpts = ["... System Settings Light Dark Chapter 3 idx_mapping ...", "the stale idx_mapping rows ..."]
    assert book_check.chrome_in_excerpts(excerpts) == [excerpts[0]]


def test_the_book_loads_its_search_excerpt_filter_after_sphinx_search(conf):
    assert ("search_excerpts.js", {"defer": "defer"}) in conf["html_js_files"]
    script = (DOCS / "_static" / "search_excerpts.js").read_text()
    assert "Search.htmlToText" in script and ".article-header-buttons" in script
    css = (DOCS / "_static" / "book.css").read_text()
    chip = css[css.index("div.cell.tag_exercise::before") :]
    assert "background: var(--pst-color-warning)" in chip.split("}")[0], "the chip needs its own fill"


def test_tables_break_names_only_at_dots_and_slashes_align_numbers_right_and_drop_a_bare_index():
    import pandas as pd

    frame = pd.DataFrame({"call": ["RejectionSampler.forward", "host_mask"], "median us": ["1,034.5", "-"]})
    page = book_cells.present_tables(frame._repr_html_())
    assert "<th>0</th>" not in page and "<th>1</th>" not in page, "the unnamed 0..N-1 index says nothing"
    assert "RejectionSampler.<wbr>forward" in page and "host_mask<" in page, "no break at '_' outside code"
    assert re.findall(r'<t[dh] class="number">([^<]*)<', page) == ["median us", "1,034.5", "-"]
    assert '<th class="number">call' not in page and "<td>host_mask</td>" in page, "text stays on the left"
    # a named or a meaningful index stays, as a row label (read from the left)
    for kept in (frame.set_index("call"), frame.set_axis([1, 2])):
        shown = book_cells.present_tables(kept._repr_html_())
        assert re.search(r"<tbody>\s*<tr>\s*<th>", shown), shown
    code = '<span class="pre">vllm/v1/sample/rejection_sampler.py</span>'
    math = '<span class="math">\\(x_i.y\\)</span>'
    prose = f'<table class="table"><tbody><tr><td>{code} in 0.25 {math}</td><td>12</td></tr></tbody></table>'
    shown = book_cells.present_tables(prose)
    assert "vllm/<wbr>v1/<wbr>sample/<wbr>rejection_<wbr>sampler.<wbr>py" in shown, "in code, '_' too"
    assert "0.25" in shown and math in shown, "no break in a version number or in math"
    assert "number" not in shown, "a table the prose writes keeps the alignment its markdown gives"
