"""Chapter 0's figures and tables: one speculative step box by box, the course map read from the chapters,
the package map read from the modules' docstrings, and the vLLM releases side by side."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.patches import FancyBboxPatch

from specfix.figures import style
from specfix.tools.mirrors import release_rows, roles, vllm_map

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"  # the chapters, next to the package

# fmt: off
#: The course in order: each chapter's notebook and, in one line, what it teaches.
COURSE = (
    ("00_tour", "speculative decoding step by step, the two kinds of padding, the map of the package, "
                "the glossary"),
    ("01_placeholder_lifecycle", "one `-1` placeholder through every stage of the V1 pipeline: where it must "
                                 "stay `-1`, where it must not, and what zeroing it instead breaks"),
    ("02_embedding_assert", "the device-side assert a `-1` causes in the embedding: why the traceback points "
                            "at the wrong line, how to find the real one, the clamp that fixes it"),
    ("03_cudagraph_idx_mapping", "CUDA-graph padding: stale `idx_mapping` rows overwrite live requests' "
                                 "draft logits and corrupt their text; the `-1` fill that stops it"),
    ("04_masked_gumbel_sampling", "the Triton Gumbel-max sampler of Model Runner V2, proven against softmax, "
                                  "and the `req_state_idx >= 0` mask that skips padded rows"),
    ("05_performance", "what each fix costs and how close the kernels come to the H200's limits"),
)
# fmt: on

MAP_ROLES = ("v1", "mrv2", "lab", "tools", "specfix")  # the module map's roles, in reading order
_CONTEXT_WORDS = 4  # context words drawn before the drafts (the last ones)
#: Each box's meaning and colour, in the key's order.
_KINDS = {
    "context": style.PADDING,
    "draft accepted": style.FIXED,
    "draft rejected": style.BUGGY,
    "placeholder -1": style.PLACEHOLDER,
    "recovered": style.NEUTRAL,
    "bonus": style.ACCENT,
}
#: Per verification outcome: the kind of the draft's box and of the target's box below it.
_OUTCOME_KINDS = {
    "accept": ("draft accepted", "draft accepted"),
    "recover": ("draft rejected", "recovered"),
    "bonus": (None, "bonus"),
}


def step_outcomes(drafts: Sequence[int], choices: Sequence[int]) -> list[str]:
    """Greedy verification: ``accept`` per matching draft, then ``recover`` at a mismatch, or ``bonus``."""
    if len(choices) != len(drafts) + 1:
        raise ValueError(
            f"choices must hold len(drafts) + 1 = {len(drafts) + 1} target tokens, got {len(choices)}"
        )
    for i, (draft, choice) in enumerate(zip(drafts, choices, strict=False)):
        if draft != choice:
            return ["accept"] * i + ["recover"]
    return ["accept"] * len(drafts) + ["bonus"]


def _box(ax, x, y, text, kind):
    fill = style.light(_KINDS[kind])
    ax.add_patch(FancyBboxPatch((x, y), 0.9, 0.6, boxstyle="round,pad=0.02", fc=fill, ec="#777"))
    ax.text(x + 0.45, y + 0.3, text, ha="center", va="center", fontsize=9, color="black")


def step_figure(
    context: Sequence[int],
    drafts: Sequence[int],
    choices: Sequence[int],
    word: Callable[[int], str],
    title: str,
):
    """One speculative step: the last context words, then each draft above what the target emits there."""
    outcomes = step_outcomes(drafts, choices)
    name = lambda i: "-1" if i < 0 else word(i)
    shown = list(context[-_CONTEXT_WORDS:])
    cut = len(context) - len(shown)
    left_out = f" The context shows its last {len(shown)} words ('...' marks the {cut} before them)."
    caption = (
        "Read each column top to bottom: the target keeps a draft it would have chosen itself, replaces "
        "the first one it would not, and stops there; if it keeps all of them it adds its own next "
        "token, the bonus." + (left_out if cut else "")
    )
    with style.figure(caption, 2.2) as (fig, ax):
        ax.set_axis_off()
        ax.set_title(title, loc="left")
        for x, token in enumerate(shown):
            _box(ax, x, 1.0, ("... " if x == 0 and cut else "") + name(token), "context")  # "...": words cut
        for slot, x in enumerate(range(len(shown), len(shown) + len(drafts) + 1)):
            outcome = outcomes[slot] if slot < len(outcomes) else None
            draft_kind, target_kind = _OUTCOME_KINDS.get(outcome, ("context", None))  # unreached: grey
            if slot < len(drafts):
                _box(ax, x, 1.0, name(drafts[slot]), "placeholder -1" if drafts[slot] < 0 else draft_kind)
            if outcome:
                _box(ax, x, 0.1, name(choices[slot]), target_kind)
                ax.text(x + 0.45, -0.15, outcome, ha="center", va="center", fontsize=8)
        ax.text(-0.2, 1.3, "draft", ha="right", va="center")
        ax.text(-0.2, 0.4, "target", ha="right", va="center")
        ax.set(xlim=(-1.2, len(shown) + len(drafts) + 1.2), ylim=(-0.4, 1.8))
        key = style.patches([style.light(c) for c in _KINDS.values()], _KINDS)
        style.legend_below(fig, ax, ncol=3, handles=key)
    return fig


def chapter_header(path: Path | str) -> dict[str, str]:
    """A chapter's title (its first heading, without the chapter number) and its **Time** paragraph."""
    path = Path(path)
    cells = json.loads(path.read_text())["cells"]
    first = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "markdown" else ""
    heading = re.search(r"^# (.+)$", first, flags=re.M)
    if heading is None:
        raise ValueError(f"{path.name}: its first cell has no '# title' heading")
    title = re.sub(r"^(Chapter\s+)?\d+\s*[.:\u2014\u2013-]\s*", "", heading.group(1)).strip()
    time = re.search(r"\*\*Time\b[^*]*\*\*[.:]?\s*(.+?)(?:\n\s*\n|$)", first, flags=re.S)
    return {"title": title, "time": " ".join(time.group(1).split()) if time else "(not stated)"}


def course_map(notebooks: Path | str = NOTEBOOKS) -> str:
    """The course as a markdown table: each chapter linked by its own title, what it teaches, its time."""
    rows = ["| chapter | what it teaches | time |", "|---|---|---|"]
    for number, (stem, teaches) in enumerate(COURSE):
        path = Path(notebooks) / f"{stem}.ipynb"
        if not path.exists():
            raise FileNotFoundError(f"chapter {number} is missing: no {path}")
        head = chapter_header(path)
        rows.append(f"| [{number}. {head['title']}]({stem}.ipynb) | {teaches} | {head['time']} |")
    return "\n".join(rows)


def module_map() -> dict[str, pd.DataFrame]:
    """Per role of :data:`MAP_ROLES`: its modules, the vLLM files they mirror and their one-line summaries."""
    table = pd.DataFrame(vllm_map())
    table = table.set_index(table["module"].str.removeprefix("specfix."))
    return {role: table.loc[table["role"] == role, ["mirrors", "summary"]] for role in MAP_ROLES}


def docstring_markdown(text: str) -> str:
    """A docstring's reStructuredText as markdown: ``x`` and :role:`x` become `x`."""
    return re.sub(r":[\w:]+:`", "`", text.replace("``", "`"))


def module_map_text() -> str:
    """:func:`module_map` as markdown lists (a list wraps at any width, a table of long paths would not)."""
    titles, parts = roles(), []
    for role, table in module_map().items():
        head = "**top level**" if role == "specfix" else f"**`specfix.{role}`**"
        parts.append(f"{head}: {docstring_markdown(titles[role])}\n")
        for module, row in table.iterrows():
            files = ", ".join(f"`{f.strip()}`" for f in row["mirrors"].split(","))
            mirrors = "" if row["mirrors"] == "(specfix's own)" else f" (mirrors {files})"
            parts.append(f"- `{module}`{mirrors}: {docstring_markdown(row['summary'])}")
        parts.append("")
    return "\n".join(parts)


def release_table() -> pd.DataFrame:
    """The vLLM releases side by side (one column each), from :func:`specfix.tools.mirrors.release_rows`."""
    return pd.DataFrame(release_rows()).set_index("vLLM").T
