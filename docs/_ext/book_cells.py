"""How the book presents a chapter's cells: pure functions on a notebook's JSON and a page's HTML, no Sphinx.

- A cell tagged `solution` is hidden behind a "Show the solution" toggle (a code cell through MyST-NB's
  `hide-cell` tag, a markdown cell inside a <details> element).
- A code cell longer than `collapse_lines` lines starts collapsed behind "Show the code (N lines)", unless
  it is an `exercise` (the reader works in it) or it already says how to show itself.
- A cell tagged `answer` (the run that answers a "predict, then run" exercise) keeps its output behind a
  "Show the output" toggle (MyST-NB's `hide-output`), so that the page does not give the answer away.
- Cells tagged `exercise` are left alone here: MyST-NB gives them the class `tag_exercise`, which
  _static/book.css marks.
- Tables (`present_tables`, on a page's HTML): a line breaks inside a name only after a `.` or `/` (in code
  also after a `_`), never mid-word; in a table a cell displayed, number cells are marked for book.css to
  set on the right (text stays on the left), and a DataFrame's unnamed 0..N-1 row index, which says
  nothing, is left out.
"""

import html
import re

SOLUTION_PROMPTS = {"code_prompt_show": "Show the solution", "code_prompt_hide": "Hide the solution"}
ANSWER_PROMPTS = {
    "code_prompt_show": "Show the output (it answers the exercise: predict first)",
    "code_prompt_hide": "Hide the output",
}
# A cell carrying one of these tags has chosen how it is shown; the book leaves it as it is.
SHOW_TAGS = {
    "exercise",
    "hide-cell",
    "hide-input",
    "hide-output",
    "remove-cell",
    "remove-input",
    "remove_cell",
    "remove_input",
}


def _text(source):
    return "".join(source) if isinstance(source, list) else source


def _code_lines(source):
    return len(_text(source).rstrip("\n").splitlines())


def prepare_notebook(nb: dict, collapse_lines: int) -> dict:
    """Set the tags and per-cell prompts that present `nb` in the book; change `nb` in place, return it."""
    if isinstance(collapse_lines, bool) or not isinstance(collapse_lines, int) or collapse_lines < 1:
        raise ValueError(f"collapse_lines must be a positive int, got {collapse_lines!r}")
    for cell in nb["cells"]:
        metadata = cell.setdefault("metadata", {})
        tags = metadata.setdefault("tags", [])
        if "solution" in tags:
            if cell["cell_type"] == "code":
                tags.append("hide-cell")
                metadata.setdefault("mystnb", {}).update(SOLUTION_PROMPTS)
            elif cell["cell_type"] == "markdown":
                cell["source"] = (
                    f'<details class="specfix-solution">\n'
                    f"<summary>{SOLUTION_PROMPTS['code_prompt_show']}</summary>\n\n"
                    f"{_text(cell['source'])}\n\n</details>\n"
                )
        elif cell["cell_type"] == "code" and "answer" in tags:
            tags.append("hide-output")
            metadata.setdefault("mystnb", {}).update(ANSWER_PROMPTS)
        elif cell["cell_type"] == "code" and not SHOW_TAGS & set(tags):
            lines = _code_lines(cell["source"])
            if lines > collapse_lines:
                tags.append("hide-input")
                metadata.setdefault("mystnb", {}).update(
                    code_prompt_show=f"Show the code ({lines} lines)", code_prompt_hide="Hide the code"
                )
    return nb


_TABLE = re.compile(r"(<table\b[^>]*>)(.*?</table>)", re.S)
_ROW = re.compile(r"<tr\b[^>]*>.*?</tr>", re.S)
_CELL = re.compile(r"<(t[dh])\b([^>]*)>(.*?)</\1>", re.S)
_TEXT = re.compile(r">([^<>]+)(?=<)")
# After a '.' that starts a name (not a decimal point), or a '/' (or, in code, a '_') inside a word.
_NAME_BREAK = re.compile(r"(?<=[\w)])(\.(?=[A-Za-z_])|/(?=\w))")
_CODE_BREAK = re.compile(r"(?<=[\w)])(\.(?=[A-Za-z_])|[/_](?=\w))")
_CODE = re.compile(r'(<span class="pre">)([^<]*)')
_NUMBER = re.compile(
    r"[-+\u2212]?(\d[\d,]*(\.\d+)?|\.\d+)(e[-+]?\d+)?( ?[%x])?( \([-\d.,]+\.\.[-\d.,]+\))?", re.I
)
_MISSING = {"", "-", "nan", "none", "<na>", "nat"}


def _kind(cell_html: str) -> str:
    """ "number", "missing" or "text": what a table cell holds, read from its text."""
    text = html.unescape(re.sub(r"<[^>]+>", "", cell_html)).strip()
    if text.lower() in _MISSING:
        return "missing"
    return "number" if _NUMBER.fullmatch(text) else "text"


def _mark(cell: re.Match) -> str:
    tag, attrs, inner = cell.groups()
    if 'class="' in attrs:
        attrs = attrs.replace('class="', 'class="number ', 1)
    else:
        attrs += ' class="number"'
    return f"<{tag}{attrs}>{inner}</{tag}>"


def _unnamed_range_index(cells: list, body: list) -> bool:
    """Whether each row starts with a plain <th>, empty in the header rows and 0, 1, ... in the body."""
    firsts = [row[0] if row else None for row in cells]
    if not body or any(c is None or c.group(1) != "th" or "span=" in c.group(2) for c in firsts):
        return False
    texts = [c.group(3).strip() for c in firsts]
    return [texts[i] for i in body] == [str(n) for n in range(len(body))] and not "".join(
        t for i, t in enumerate(texts) if i not in body
    )


def _displayed_table(rows: list) -> list:
    """A DataFrame's rows (HTML), number cells marked and an unnamed 0..N-1 index left out."""
    cells = [list(_CELL.finditer(row)) for row in rows]
    body = [i for i, row in enumerate(rows) if "<td" in row]
    if _unnamed_range_index(cells, body):
        rows = [row[: c[0].start()] + row[c[0].end() :] for row, c in zip(rows, cells, strict=True)]
        cells = [list(_CELL.finditer(row)) for row in rows]
    data = [[c for c in cells[i] if c.group(1) == "td"] for i in body]
    width = max(map(len, data), default=0)
    kinds = [{_kind(row[j].group(3)) for row in data if len(row) == width} for j in range(width)]
    numeric = [kind - {"missing"} == {"number"} for kind in kinds]
    out = []
    for i, (row, found) in enumerate(zip(rows, cells, strict=True)):
        # the row's last `width` cells are the data columns' (a header row's only where nothing spans)
        aligned = len(found) >= width and not any("colspan" in c.group(2) for c in found)
        column = {id(c): numeric[j] for j, c in enumerate(found[len(found) - width :])} if aligned else {}
        for c in reversed(found):
            if c.group(1) == "th" and i in body:
                continue  # a row's label reads from the left, a number or not
            kind = _kind(c.group(3)) if i in body else "header"
            if kind == "number" or (kind != "text" and column.get(id(c))):
                row = row[: c.start()] + _mark(c) + row[c.end() :]
        out.append(row)
    return out


def present_tables(page: str) -> str:
    """``page`` (a chapter's HTML body) with its tables presented as the module docstring says."""

    def breaks(text: re.Match) -> str:  # math, \\( ... \\) for MathJax, keeps its text
        words = text.group(1)
        return ">" + (words if "\\(" in words else _NAME_BREAK.sub(r"\1<wbr>", words))

    def table(match: re.Match) -> str:
        start, rest = match.groups()
        rest = _CODE.sub(lambda code: code.group(1) + _CODE_BREAK.sub(r"\1<wbr>", code.group(2)), rest)
        rest = _TEXT.sub(breaks, rest)
        if 'class="dataframe"' in start or 'id="T_' in start:
            rows = iter(_displayed_table(_ROW.findall(rest)))
            rest = _ROW.sub(lambda _: next(rows), rest)
        return start + rest

    return _TABLE.sub(table, page)
