"""Chapter 0's figures and tables: the step drawing, the course map read from the chapters, the module map."""

import json
import re

import matplotlib.pyplot as plt
import pytest

from specfix.figures import style, tour
from specfix.tools.mirrors import roles

WORDS = {i: f"w{i}" for i in range(20)}


def _box_texts(fig):
    (ax,) = fig.axes
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize(
    "drafts,choices,expected",
    [
        ([1, 2, 3], [1, 2, 3, 4], ["accept", "accept", "accept", "bonus"]),
        ([1, 9, 3], [1, 2, 3, 4], ["accept", "recover"]),
        ([-1, -1], [5, 6, 7], ["recover"]),
        ([], [5], ["bonus"]),
    ],
)
def test_step_outcomes_follow_greedy_verification(drafts, choices, expected):
    assert tour.step_outcomes(drafts, choices) == expected


def test_step_outcomes_need_one_target_token_more_than_drafts():
    with pytest.raises(ValueError, match=r"len\(drafts\) \+ 1 = 3"):
        tour.step_outcomes([1, 2], [1, 2])


def test_step_figure_draws_context_drafts_and_what_the_target_emits():
    fig = tour.step_figure([1, 2, 3, 4, 5], [6, 7, 8], [6, 9, 10, 11], WORDS.get, "a step")
    try:
        texts = _box_texts(fig)
        assert [t for t in texts if t in ("accept", "recover", "bonus")] == ["accept", "recover"]
        # the last four context words, the first marked as following words left out, and the caption says so
        assert {"... w2", "w3", "w4", "w5"} <= set(texts) and "w1" not in texts
        assert any("last 4 words ('...' marks the 1 before them)" in t.get_text() for t in fig.texts)
        assert {"w6", "w7", "w8", "w9"} <= set(texts) and "w10" not in texts  # nothing after the mismatch
        fig.canvas.draw()
        legend, ax = fig.axes[0].get_legend(), fig.axes[0]
        renderer = fig.canvas.get_renderer()
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
        assert any(t.get_style() == "italic" and "bonus" in t.get_text() for t in fig.texts)
        seen = style.legibility(fig)  # drawn for the book's column
        assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen
    finally:
        plt.close(fig)


def test_step_figure_writes_placeholders_as_minus_one():
    fig = tour.step_figure([1], [-1, -1], [3, 4, 5], WORDS.get, "padded")
    try:
        texts = _box_texts(fig)
        assert texts.count("-1") == 2 and "w3" in texts and "recover" in texts
        assert "w1" in texts and not any("..." in t.get_text() for t in fig.texts)  # a short context: whole
    finally:
        plt.close(fig)


def _notebook(path, first_cell):
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": first_cell}]}))
    return path


@pytest.mark.parametrize(
    "heading,title",
    [
        ("# Chapter 3 \u2014 Stale rows", "Stale rows"),
        ("# 3. Stale rows", "Stale rows"),
        ("# Stale rows", "Stale rows"),
    ],
)
def test_chapter_header_reads_the_title_without_its_number(tmp_path, heading, title):
    text = f"{heading}\n\nIntro.\n\n**Time.** About 9 s to run.\nSecond line.\n"
    path = _notebook(tmp_path / "x.ipynb", text)
    assert tour.chapter_header(path) == {"title": title, "time": "About 9 s to run. Second line."}


def test_chapter_header_says_when_no_time_is_stated(tmp_path):
    assert tour.chapter_header(_notebook(tmp_path / "x.ipynb", "# T\n\ntext"))["time"] == "(not stated)"
    with pytest.raises(ValueError, match="no '# title' heading"):
        tour.chapter_header(_notebook(tmp_path / "y.ipynb", "no heading"))


def test_course_map_links_every_chapter_in_order(tmp_path):
    for number, (stem, _) in enumerate(tour.COURSE):
        text = f"# Chapter {number} \u2014 Title {number}\n\n**Time.** {number} s\n"
        _notebook(tmp_path / f"{stem}.ipynb", text)
    lines = tour.course_map(tmp_path).splitlines()
    assert len(lines) == 2 + len(tour.COURSE)
    for number, ((stem, teaches), line) in enumerate(zip(tour.COURSE, lines[2:], strict=True)):
        assert line.startswith(f"| [{number}. Title {number}]({stem}.ipynb) | {teaches} | {number} s |")


def test_course_map_refuses_a_missing_chapter(tmp_path):
    with pytest.raises(FileNotFoundError, match="chapter 0 is missing"):
        tour.course_map(tmp_path)


def test_every_shipped_chapter_states_its_time():
    lines = tour.course_map().splitlines()[2:]
    assert len(lines) == len(tour.COURSE)
    assert not [line for line in lines if "(not stated)" in line]


def test_module_map_shows_each_role_with_its_mirrors():
    tables = tour.module_map()
    assert list(tables) == list(tour.MAP_ROLES)
    assert "vllm/v1/core/sched/scheduler.py" in tables["v1"].loc["v1.scheduler", "mirrors"]
    assert tables["specfix"].loc["fixes", "mirrors"] == "(specfix's own)"
    assert all(len(table) for table in tables.values())
    assert set(roles()) >= set(tour.MAP_ROLES)  # every role shown has a title


def test_release_table_has_one_column_per_release_and_one_row_per_fact():
    table = tour.release_table()
    assert list(table.columns) == ["0.24.0", "0.25.0", "0.33.0"]
    assert list(table.index) == [
        "default model runner",
        "where -1 placeholders come from",
        "what keeps them from the embedding",
        "#47066 masks",
        "noise",
        "draft cache holds",
    ]


def test_module_map_text_lists_every_module_without_docstring_markup():
    text = tour.module_map_text()
    modules = [m for table in tour.module_map().values() for m in table.index]
    assert [line.split("`")[1] for line in text.splitlines() if line.startswith("- ")] == modules
    assert "- `v1.scheduler` (mirrors `vllm/sampling_params.py`, " in text
    assert "- `fixes`: One switch per fix" in text  # specfix's own modules mirror nothing
    assert "``" not in text and not re.search(r":\w+:`", text), "reStructuredText markup reached the page"
    assert tour.docstring_markdown("a ``-1`` and :data:`SLOT_KINDS`") == "a `-1` and `SLOT_KINDS`"


def test_module_map_summaries_are_whole_sentences():
    """The map shows each docstring's first line: it must hold the docstring's whole first sentence."""
    cut = {
        module: row["summary"]
        for table in tour.module_map().values()
        for module, row in table.iterrows()
        if not row["summary"].rstrip().endswith((".", ")"))
    }
    assert not cut, f"first lines cut mid-sentence (put the first sentence on one line): {cut}"
