"""The suite's figure style leaves Jupyter's display alone, the figure watcher fails a cell that leaves a
figure undisplayed, and shows a DataFrame's cells whole. They run a small notebook in a real kernel (as
nbmake and the book do)."""

import matplotlib as mpl
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from specfix.figures import style

IMPORTS = "import matplotlib as mpl\nimport matplotlib.pyplot as plt\nfrom specfix.figures import style"
# A figure neither shown nor the cell's value: the inline backend displays it only in interactive mode.
UNSHOWN = "fig2, ax2 = plt.subplots()\nax2.plot([3, 1])\nNone"


def _executed(tmp_path, monkeypatch, cells, watch):
    monkeypatch.setenv("SPECFIX_CHECK_FIGURES", "1" if watch else "0")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
    return nb.cells


def _run(tmp_path, monkeypatch, first_figure, watch):
    cells = _executed(tmp_path, monkeypatch, (IMPORTS, first_figure, UNSHOWN, "x = 1"), watch)
    return [sum("image/png" in o.get("data", {}) for o in cell.outputs) for cell in cells]


def test_apply_keeps_the_kernel_interactive_so_every_later_figure_is_displayed(tmp_path, monkeypatch):
    first = "with style.apply():\n    fig, ax = plt.subplots()\n    ax.plot([1, 2])"
    assert _run(tmp_path, monkeypatch, first, watch=True) == [0, 1, 1, 0]


def test_the_watcher_fails_a_cell_whose_figure_is_never_displayed(tmp_path, monkeypatch):
    # The bug apply() once had: rc_context rolls back the interactive mode the first figure switched on.
    first = "with mpl.rc_context(style.RC):\n    fig, ax = plt.subplots()\n    ax.plot([1, 2])"
    with pytest.raises(CellExecutionError, match="left 1 figure.s. undisplayed"):
        _run(tmp_path, monkeypatch, first, watch=True)
    assert _run(tmp_path, monkeypatch, first, watch=False) == [0, 1, 0, 0]  # what a reader saw: nothing


def test_apply_restores_only_its_own_keys():
    before = dict(mpl.rcParams)
    with style.apply():
        assert mpl.rcParams["font.size"] == style.RC["font.size"]
        mpl.rcParams["interactive"] = not before["interactive"]
        mpl.rcParams["lines.linewidth"] = 7.0
    assert mpl.rcParams["interactive"] is not before["interactive"]  # not rolled back
    assert mpl.rcParams["lines.linewidth"] == 7.0
    assert all(mpl.rcParams[key] == before[key] for key in style.RC)
    mpl.rcParams.update({"interactive": before["interactive"], "lines.linewidth": before["lines.linewidth"]})


def test_the_book_shows_a_dataframe_cell_whole_whatever_the_chapter_set(tmp_path, monkeypatch):
    # pandas cuts a cell past display.max_colwidth to "...", which a page cannot unfold
    long = "rejection core <= 1x vLLM 0.33.0's GPU time (greedy, k = 4)"
    cut = "import pandas as pd\npd.set_option('display.max_colwidth', 20)"
    table = f"{cut}\npd.DataFrame({{'goal': [{long!r}]}})"
    for watch in (True, False):
        html = _executed(tmp_path, monkeypatch, (IMPORTS, table), watch)[1].outputs[0]["data"]["text/html"]
        assert (long.replace("<", "&lt;") in html) is watch, html


def test_watch_figures_outside_ipython_does_nothing():
    assert style.watch_figures() is False


def test_tidy_writes_counts_without_decimals_and_missing_values_as_a_dash():
    import pandas as pd

    frame = pd.DataFrame(
        {
            "count": [95.0, 1200.0, None],
            "rate": [0.5, 0.12345, 1.0],
            "ids": pd.array([1, None, 3], dtype="Int64"),
            "name": ["a", None, "c"],
            "ok": [True, False, True],
        }
    )
    shown = style.tidy(frame, digits=2)
    assert shown["count"].tolist() == ["95", "1,200", "-"]
    assert shown["rate"].tolist() == ["0.50", "0.12", "1.00"]
    assert shown["ids"].tolist() == ["1", "-", "3"]
    assert shown["name"].tolist() == ["a", "-", "c"] and shown["ok"].tolist() == [True, False, True]
    assert frame["count"].iloc[0] == 95.0, "the numbers stay in the frame given"
    assert "NaN" not in shown.to_html() and "&lt;NA&gt;" not in shown.to_html()
    spaced = style.tidy(frame.rename(columns={"count": "host_syncs"}).rename_axis("num_tokens"))
    assert "host syncs" in spaced.columns and spaced.index.name == "num tokens"  # headers can wrap


def test_counted_is_plural_unless_the_count_is_one():
    assert style.counted(1, "decode step") == "1 decode step" and style.counted(0, "step") == "0 steps"
    assert style.counted(2, "-1 slot") == "2 -1 slots"
