"""Chapter 1's scheduling figures: content read back from the returned objects (no image comparison)."""

import pytest

from specfix.figures import scheduling as figs
from specfix.figures import style
from specfix.lab import scheduling as lab
from specfix.tokenizer import get_tokenizer

VOCAB = get_tokenizer().vocab


@pytest.fixture(scope="module")
def runs():
    return {
        (name, mode): lab.run(name, mode == "async") for name in lab.WORKLOADS for mode in ("sync", "async")
    }


def _grid(ax):
    return ax.images[0].get_array().tolist()


def _caption(fig):
    return " ".join(t.get_text() for t in fig.texts)


def test_slot_timeline_marks_the_prefilled_requests_first_decode_in_both_modes(runs):
    fig = figs.slot_timeline({"sync": runs["decode node", "sync"], "async": runs["decode node", "async"]})
    sync, asyn = fig.axes
    prefilled = [i for i, remote in enumerate(lab.WORKLOADS["decode node"].remote_prefill) if remote]
    for ax, ordinary in ((sync, lab.SCHEDULER_DRAFTS), (asyn, lab.FILLED)):
        grid = _grid(ax)
        orange = [
            (row, col)
            for row, cells in enumerate(grid)
            for col, kind in enumerate(cells)
            if kind == lab.REACHES_EMBEDDING
        ]
        assert orange == [(row, 0) for row in prefilled]
        later = {kind for cells in grid for kind in cells[1:]}
        assert later <= {ordinary, lab.NOT_SCHEDULED} and ordinary in later
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(lab.SLOT_KINDS)
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["sync", "async"]
    assert "only the clamp makes safe" in _caption(fig)


def test_slot_timeline_writes_each_requests_number_of_draft_slots(runs):
    result = runs["tight budget", "async"]
    (ax,) = figs.slot_timeline({"async": result}).axes
    expected = sum(len(step.scheduler_output.scheduled_spec_decode_tokens) for step in result.trace)
    assert len(ax.texts) == expected and {t.get_text() for t in ax.texts} <= {"1", "2", "3"}


def test_slot_timeline_shows_the_waiting_request_reach_the_embedding_in_async_mode_only(runs):
    fig = figs.slot_timeline({"sync": runs["tight budget", "sync"], "async": runs["tight budget", "async"]})
    sync, asyn = (_grid(ax) for ax in fig.axes)
    assert not any(lab.REACHES_EMBEDDING in cells for cells in sync)
    waiting = asyn[2]  # the third request: prefilled in step 1, then left out while two others decode
    first = waiting.index(lab.REACHES_EMBEDDING)
    assert waiting[first - 1] == lab.NOT_SCHEDULED and lab.FILLED in waiting[first + 1 :]
    assert sum(cells.count(lab.REACHES_EMBEDDING) for cells in asyn) == 1


def test_placeholder_table_accounts_for_every_minus_one(runs):
    table = figs.placeholder_table({f"{name}, {mode}": r for (name, mode), r in runs.items()})
    assert list(table.columns) == [
        "batches",
        "draft slots verified",
        "-1 written by the scheduler",
        "-1 overwritten by the runner",
        "-1 reaching the embedding",
    ]
    for (name, mode), result in runs.items():
        row = table.loc[f"{name}, {mode}"]
        assert row["batches"] == len(result.trace)
        assert (
            row["-1 written by the scheduler"]
            == row["-1 overwritten by the runner"] + row["-1 reaching the embedding"]
        )
        if mode == "sync":
            assert row["-1 overwritten by the runner"] == 0
    k = 3
    assert table.loc["decode node, sync", "-1 reaching the embedding"] == 2 * k  # two prefilled
    assert table.loc["decode node, async", "-1 reaching the embedding"] == 2 * k


def test_follow_placeholder_shows_a_minus_one_clamped_or_overwritten(runs):
    result = runs["tight budget", "async"]
    kinds = lab.slot_kinds(result)["2"]
    starved = result.trace[kinds.index(lab.REACHES_EMBEDDING)]
    filled = result.trace[kinds.index(lab.FILLED)]
    (ax,) = figs.follow_placeholder(starved, "2", VOCAB, step_index=4).axes
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["-1\n"] * 6 + [f"0\n{VOCAB[0]}"] * 3
    assert ax.get_title(loc="left") == "request 2 in engine step 4: 3 -1 slots left for the embedding"
    fig = figs.follow_placeholder(filled, "2", VOCAB)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert fig.axes[0].get_title(loc="left") == "request 2 in one step: 3 -1 slots filled with real drafts"
    assert texts[:3] == ["-1\n"] * 3 and "-1\n" not in texts[3:] and texts[3:6] == texts[6:]
    assert "real draft written over a -1" in [t.get_text() for t in fig.legends[0].get_texts()]
    timeline = figs.slot_timeline(
        {"sync": runs["decode node", "sync"], "async": runs["decode node", "async"]}
    )
    for drawn in (fig, timeline):  # drawn for the book's column
        seen = style.legibility(drawn)
        assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen


def test_bad_input_is_refused_by_name(runs):
    with pytest.raises(ValueError, match="runs is empty"):
        figs.slot_timeline({})
    with pytest.raises(TypeError, match=r"runs\['x'\] must be a GenerateResult, got dict"):
        figs.placeholder_table({"x": {}})
    from specfix.v1.engine import generate

    unrecorded = generate(["the mice"], max_steps=1)
    with pytest.raises(ValueError, match=r"runs\['plain'\] has no trace: run it with record=True"):
        figs.slot_timeline({"plain": unrecorded})
    step = runs["decode node", "sync"].trace[0]
    with pytest.raises(ValueError, match="request '1' has no draft slots in this step"):
        figs.follow_placeholder(step, "1", VOCAB)


def test_waiting_paragraph_says_which_run_leaves_the_request_out(runs):
    grid = lab.slot_kinds(runs["tight budget", "async"])
    waiting, back = figs.waiting_request(runs["tight budget", "async"])
    assert grid[waiting][back] == lab.REACHES_EMBEDDING
    last = max(i for i in range(back) if grid[waiting][i] != lab.NOT_SCHEDULED)
    text = figs.waiting_text(runs["tight budget", "async"])
    # the wait is the async run's: the paragraph says so instead of stating it of both panels
    assert text.startswith(f"In the async run, request {waiting} sits out steps {last + 1} to {back - 1}.")


def test_count_paragraphs_quote_the_placeholder_counts(runs):
    sync, asyn = (lab.placeholder_counts(runs["decode node", m]) for m in ("sync", "async"))
    text = figs.decode_node_text(runs)
    assert f"the scheduler wrote {sync['-1 written by the scheduler']} `-1` slots" in text
    assert f"the runner overwrote {asyn['-1 overwritten by the runner']} of them" in text
    budget = figs.budget_text(runs)
    tight = lab.placeholder_counts(runs["tight budget", "async"])
    assert f"async scheduling ran {tight['batches']} batches" in budget
    assert f"{lab.wasted_steps(runs['tight budget', 'async'])} times" in budget
