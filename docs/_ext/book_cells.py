"""How the book presents a chapter's cells: pure functions on a notebook's JSON, no Sphinx needed.

- A cell tagged `solution` is hidden behind a "Show the solution" toggle (a code cell through MyST-NB's
  `hide-cell` tag, a markdown cell inside a <details> element).
- A code cell longer than `collapse_lines` lines starts collapsed behind "Show the code (N lines)", unless
  it is an `exercise` (the reader works in it) or it already says how to show itself.
- A cell tagged `answer` (the run that answers a "predict, then run" exercise) keeps its output behind a
  "Show the output" toggle (MyST-NB's `hide-output`), so that the page does not give the answer away.
- Cells tagged `exercise` are left alone here: MyST-NB gives them the class `tag_exercise`, which
  _static/book.css marks.
"""

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
