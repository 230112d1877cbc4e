"""Chapter 3's figures draw what they are given: checked by their content, not by pixels."""

import inspect
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import FancyArrowPatch

from specfix import Fixes
from specfix.exercises.cudagraph_idx_mapping import run_schedule
from specfix.figures import cudagraph_idx_mapping as F
from specfix.figures import style
from specfix.lab.padding_bench import one_step_distribution, padded_step_scenario
from specfix.mrv2.cudagraph import CudaGraphDispatcher
from specfix.tools import recorded

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "03_cudagraph_idx_mapping.ipynb"
EVENTS = ["step abcdef", "finish c", "step abdef"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _caption(fig):
    return " ".join(t.get_text() for t in fig.texts)


def test_launch_overhead_draws_both_series_and_reads_the_speedup_from_the_data():
    rows = [
        {"size": 1, "eager_us": 1000.0, "graph_us": 100.0},
        {"size": 8, "eager_us": 1500.0, "graph_us": 100.0},
    ]
    fig = F.launch_overhead(rows, "recorded on a machine with a long description " * 6)
    (ax,) = fig.axes
    seen = style.legibility(fig)  # a long source wraps: the figure keeps the column's width
    assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen
    assert [line.get_label() for line in ax.get_lines()] == ["eager launches", "one graph replay"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8"]
    assert "10 to 15 times" in _caption(fig)
    with pytest.raises(ValueError, match="graph_us"):
        F.launch_overhead([{"size": 1, "eager_us": 1.0}], "x")


def test_padded_buffers_draws_one_arrow_per_padded_write():
    states = [padded_step_scenario(EVENTS, fixes=Fixes(pad_idx_mapping=f)) for f in (False, True)]
    fig = F.padded_buffers(states, ["fix off", "fix on"])
    off, on = fig.axes
    arrows = lambda ax: (
        [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
        + [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    )
    assert len(arrows(off)) == len(states[0].writes) == 3 and arrows(on) == []
    freed = padded_step_scenario(
        ["step abcdef", "finish f", "step abcde"], fixes=Fixes(pad_idx_mapping=False)
    )
    (ax,) = F.padded_buffers([freed], ["f's slot is free"]).axes
    colours = [to_hex(a.arrow_patch.get_edgecolor()) for a in arrows(ax)]
    assert colours == [style.PADDING, style.BUGGY, style.BUGGY]  # row 5 names f's free slot, rows 6 and 7 a's
    assert "overwritten: a, f" in off.get_title() and "overwritten: none" in on.get_title()
    labels = [t.get_text() for t in off.texts]
    assert "row 5: 5  padded" in labels and "slot 2: free" in labels and "slot 5: f" in labels
    assert "magenta arrow" in _caption(fig) and "grey arrow names a free slot" in _caption(fig)
    assert style.legibility(fig)["text_px"] >= style.MIN_TEXT_PX
    with pytest.raises(ValueError, match="one title per state"):
        F.padded_buffers(states, ["only one"])


def test_output_distribution_has_a_panel_per_position_and_the_tables_agree():
    dists = {
        label: one_step_distribution(60, fixes=Fixes(pad_idx_mapping=fix))
        for label, fix in (("fix on", True), ("fix off", False))
    }
    fig = F.output_distribution(dists)
    assert [ax.get_title() for ax in fig.axes] == [
        "position 0 (draft)",
        "position 1 (draft)",
        "position 2 (bonus)",
    ]
    assert len(fig.axes[0].patches) == 2 * 16  # one bar per token and run
    table = F.chi_square_table(dists)
    assert list(table.index.get_level_values("fix")) == ["fix on"] * 3 + ["fix off"] * 3
    assert list(table.index.get_level_values("position")) == [0, 1, 2] * 2  # no 0..5 row counter
    assert list(table["role"]) == ["draft", "draft", "bonus"] * 2
    assert "bonus" in _caption(fig)
    assert style.legibility(fig)["text_px"] >= style.MIN_TEXT_PX  # drawn for the book's column
    with pytest.raises(ValueError, match="empty"):
        F.output_distribution({})


def test_bench_table_names_its_counts_and_its_origins_add_up_to_every_padded_write():
    summary = {c: 1 for c in F.BENCH_ROWS} | {
        "ran": ["eager"],
        "writes_by_origin": {F.ORIGINS[1]: 7, F.ORIGINS[3]: 2},
    }
    summary["writes_landed"] = 5
    table = F.bench_table({"fix off": summary, "fix on": summary | {"writes_by_origin": {}}})
    origins = [f"padded writes, stale entry from: {o}" for o in F.ORIGINS]
    assert list(table.columns) == ["fix off", "fix on"] and list(table.index[-4:]) == origins
    assert "_" not in "".join(table.index)  # words, not the summary's keys
    assert table.loc[origins, "fix off"].tolist() == [0, 7, 0, 2] and table.loc[origins, "fix on"].sum() == 0
    assert table.loc["padded writes, all"].tolist() == [9, 0]
    assert table.loc["padded writes that changed a live request's cached logits", "fix off"] == 5
    with pytest.raises(ValueError, match="differing"):
        F.bench_table({"x": {"num_requests": 1}})


def test_diff_transcript_keeps_each_marked_word_whole():
    text = F.diff_transcript([{"req_id": 7, "solo": "a [-lay-] <b>", "batched": "a {+dog+}"}])
    assert "<b>request 7</b>" in text
    assert '<span style="white-space: nowrap">[-lay-]</span>' in text
    assert '<span style="white-space: nowrap">{+dog+}</span>' in text
    assert "&lt;b&gt;" in text  # the texts are escaped, not read as HTML
    assert "responses that differ" not in text
    headed = F.diff_transcript([{"req_id": 7, "solo": "a", "batched": "b"}] * 2, differing=5)
    assert headed.startswith("<p><b>2 of the 5 responses that differ without the fix</b>")


def test_recorded_headings_count_from_the_recording():
    rec = recorded.load("cudagraph_h200")
    trials = rec["chi_square"]["False"]["positions"][0]["trials"]
    assert F.recorded_heading(rec, "bench").startswith(
        f"**{rec['bench']['fix_off']['num_requests']} requests"
    )
    assert f"{trials:,} trials a run" in F.recorded_heading(rec, "distribution")


def test_recorded_paragraph_quotes_the_h200_recording():
    from specfix.tools import recorded

    rec = recorded.load("cudagraph_h200")
    off, chi = rec["bench"]["fix_off"], rec["chi_square"]["False"]["positions"][0]
    text = F.recorded_text(rec)
    assert f"**{off['differing']} of {off['num_requests']}** responses differ" in text
    landed, writes = off["writes_landed"], sum(off["writes_by_origin"].values())
    assert 0 < landed < writes  # on the GPU some padded stores lost the race to the live row's
    assert f"only {landed} of its {writes} padded writes changed" in text
    assert f"chi² {chi['chi2']:,.0f} against a threshold of {chi['threshold']:.1f}" in text


def _markdown() -> list[str]:
    return [
        "".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"] if c["cell_type"] == "markdown"
    ]


def test_the_chapters_typed_numbers_agree_with_their_sources():
    """Numbers the chapter's markdown states: the H200's landed writes, the capture sizes, the minutes."""
    cells = _markdown()
    prose = " ".join(" ".join(cell.split()) for cell in cells)
    off = recorded.load("cudagraph_h200")["bench"]["fix_off"]
    landed = f"{off['writes_landed']} of the {sum(off['writes_by_origin'].values())} padded writes changed"
    assert landed in prose
    *sizes, last = CudaGraphDispatcher(max_num_reqs=8).capture_sizes  # exercise 1c's 8 slots, run_schedule's
    assert (
        f"8 request-state slots, the drafter padded to the capture sizes {', '.join(map(str, sizes))}"
        in prose
    )
    assert f"capture sizes {', '.join(map(str, sizes))} and {last})" in prose
    assert inspect.signature(run_schedule).parameters["max_num_reqs"].default == 8
    # the Time paragraph lists each exercise's minutes, in the order of the exercises' headings
    listed = re.search(r"with the exercises \(([\d, and]+) minutes\)", prose).group(1)
    headings = re.findall(r"^### Exercise \w+ \([^)]*?about (\d+) minutes\)", "\n".join(cells), re.M)
    assert re.findall(r"\d+", listed) == headings and len(headings) == 6
    total = int(re.search(r"About (\d+) minutes with the exercises", prose).group(1))
    assert total > sum(map(int, headings))  # the estimate covers the reading too
