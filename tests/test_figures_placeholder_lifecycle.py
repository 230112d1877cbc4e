"""Chapter 1's figures and tables: content read back from the returned objects (no image comparison)."""

import math
import re

import numpy as np
import pytest
from matplotlib.colors import to_hex, to_rgb

from specfix.figures import placeholder_lifecycle as figs
from specfix.figures import style
from specfix.tokenizer import get_tokenizer
from specfix.v1.engine import LLMEngine, SamplingParams, generate

VOCAB = get_tokenizer().vocab
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def step():
    """One step: "pd" arrives prefilled (padded with three -1 drafts), "fresh" is prefilled from scratch."""
    engine = LLMEngine(num_speculative_tokens=3, device="cpu", record=True)
    engine.add_request("the fox saw the crow", GREEDY, request_id="pd", remote_prefill=True)
    engine.add_request("a lion was", GREEDY, request_id="fresh")
    engine.step()
    return engine.model_runner.trace[0]


def _cell_texts(ax):
    return [t.get_text() for t in ax.texts]


def _caption(fig):
    return " ".join(t.get_text() for t in fig.texts)


def test_token_table_writes_the_filled_cells_only(step):
    fig = figs.token_table(step, VOCAB, width=10)
    (ax,) = fig.axes
    pd_prompt, fresh_prompt = (len(get_tokenizer().encode(p)) for p in ("the fox saw the crow", "a lion was"))
    assert len(ax.texts) == pd_prompt + 3 + fresh_prompt  # pd: its prompt and 3 drafts; fresh: its prompt
    assert _cell_texts(ax).count("-1\n") == 3
    assert [t.get_text() for t in ax.get_yticklabels()] == ["pd", "fresh"]
    assert "-1 is still only a value" in _caption(fig)
    assert fig.legends and ax.get_legend() is None  # the colour key sits outside the grid
    with pytest.raises(ValueError, match="rows has 1 entries for 2 requests"):
        figs.token_table(step, VOCAB, rows=[0])


def test_step_stages_shows_the_minus_one_kept_in_the_metadata_and_clamped_for_the_embedding(step):
    fig = figs.step_stages(step, VOCAB)
    before, drafts, after = fig.axes
    assert _cell_texts(before).count("-1\n") == 3
    assert _cell_texts(drafts) == ["-1\n"] * 3  # only the draft positions are written
    assert "-1\n" not in _cell_texts(after) and _cell_texts(after).count("0\nthe") >= 3
    labels = [t.get_text() for t in before.get_xticklabels()]
    assert labels[:4] == ["pd"] * 4 and set(labels[4:]) <= {"fresh", "pad"}
    assert "clamped to 0" in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    key = [p.get_facecolor()[:3] for p in fig.legends[0].get_patches()]
    assert any(np.allclose(fill, to_rgb(style.PLACEHOLDER)) for fill in key)  # the suite's colours


def test_draft_positions_point_at_the_drafts_in_input_ids(step):
    positions = figs.draft_positions(step)
    drafts = step.spec_decode_metadata.draft_token_ids
    assert step.input_ids_before_clamp[positions].tolist() == drafts.tolist()


def test_sampler_output_has_one_row_per_request_and_a_bonus_column(step):
    fig = figs.sampler_output(step, VOCAB)
    (ax,) = fig.axes
    assert len(ax.texts) == step.sampler_output.numel()
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"column {j}" for j in range(4)]
    assert "bonus" in _caption(fig)


@pytest.fixture(scope="module")
def two_runs():
    prompts = ["the fox saw the crow", "a lion was asleep"]
    return {
        "greedy": generate(prompts, GREEDY, num_speculative_tokens=3).stats,
        "T = 0.7": generate(
            prompts, SamplingParams(temperature=0.7, seed=1, max_tokens=6), num_speculative_tokens=3
        ).stats,
    }


def test_acceptance_draws_one_bar_per_position_and_run_with_the_legend_off_the_data(two_runs):
    fig = figs.acceptance(two_runs)
    rates, lengths = fig.axes
    assert len(rates.patches) == 3 * 2 and len(lengths.patches) == 4 * 2
    assert rates.get_legend() is None and lengths.get_legend() is None
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["greedy", "T = 0.7"]
    heights = [p.get_height() for p in rates.patches[:3]]  # the greedy run, draft 1..3
    assert np.allclose(heights, two_runs["greedy"].acceptance_rate_per_pos)
    # the runs in plain series colours: green means "fix on" elsewhere in the book
    colours = {to_hex(p.get_facecolor()) for p in rates.patches + lengths.patches}
    assert colours == {style.SERIES[0], style.SERIES[1]} and style.FIXED not in colours
    assert "only verified when" in _caption(fig)
    with pytest.raises(ValueError, match="stats is empty"):
        figs.acceptance({})


def test_the_grids_and_plots_are_drawn_for_the_books_column(step, two_runs):
    for fig in (
        figs.token_table(step, VOCAB),
        figs.step_stages(step, VOCAB),
        figs.sampler_output(step, VOCAB),
        figs.acceptance(two_runs),
    ):
        seen = style.legibility(fig)
        assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen


@pytest.fixture(scope="module")
def designs():
    prompts = ["the fox saw the crow", "a lion was asleep", "the north wind"]
    work = dict(num_speculative_tokens=3, proposer="ngram", remote_prefill=True, record=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    return (
        generate(prompts, greedy, placeholder_policy="zero", **work),
        generate(prompts, greedy, **work),
        generate(prompts, greedy, num_speculative_tokens=None),
    )


def test_design_table_counts_drafts_and_placeholder_slots_apart(designs):
    zero, clamp, plain = designs
    table = figs.design_table({"crash": IndexError("boom"), "zero": zero, "clamp": clamp}, plain)
    assert table.loc["crash", "outcome"] == "crash: IndexError"
    for name, result in [("zero", zero), ("clamp", clamp)]:
        row, stats = table.loc[name], result.stats
        assert row["real drafts"] == stats.num_draft_tokens
        assert row["placeholder slots"] == stats.num_placeholder_slots
        assert row["placeholder slots accepted"] == stats.num_placeholders_accepted
        assert row["slots verified"] == row["real drafts"] + row["placeholder slots"]
        assert math.isclose(row["rate over real drafts"], round(stats.acceptance_rate, 3))
    recognisable = table["placeholders recognisable by id (< 0)"]
    assert recognisable["zero"] == 0 and recognisable["clamp"] == table.loc["clamp", "placeholder slots"] > 0
    assert table.loc["clamp", "text == plain greedy"]


def test_comparison_table_names_the_runs_and_the_word():
    summary = {
        group: {
            "verifications": i,
            "drafts": 2 * i,
            "accepted in a": i,
            "accepted in b": 0,
            "after token_id": i,
        }
        for i, group in enumerate(["both", "only a", "only b"])
    }
    table = figs.comparison_table(summary, "zero", "clamp", "the")
    assert list(table.index) == ["verified by both runs", "only by the zero run", "only by the clamp run"]
    assert table.loc["only by the clamp run", "real drafts"] == 4
    assert "right after 'the'" in table.columns and "accepted (zero run)" in table.columns


def test_the_runner_paths_table_and_text_read_the_rows():
    from specfix.lab import placeholder_lifecycle as lab

    rows = {
        name: {
            "cached tokens": 16,
            "scheduler sends": [-1, -1],
            "embedding reads": [0, 0],
            "verification sees": [-1, -1],
            "emitted": [5],
            "placeholders accepted": 0,
            "error": None,
        }
        for name in lab.RUNNER_PATHS
    }
    names = list(lab.RUNNER_PATHS)
    rows[names[1]] = {"error": "IndexError: index out of range in self"}
    rows[names[3]] = dict(
        rows[names[2]], **{"verification sees": [0, 0], "emitted": [0, 7], "placeholders accepted": 1}
    )
    table = figs.runner_paths_table(rows, VOCAB)
    assert table.loc[names[1], "embedding reads"] == "IndexError: index out of range in self"
    assert set(table.loc[names[1]].drop("embedding reads")) == {"—", "not reached"}  # no blank cell
    assert table.loc[names[3], "verification sees"] == f"0 ({VOCAB[0]}) 0 ({VOCAB[0]})"
    text = figs.runner_paths_text(rows, VOCAB)
    assert "found 16 of its 17 tokens" in text and "as the V1 runner did" in text
    assert "1 of the 2 zero slots" in text and f"7 ({VOCAB[7]})" in text
    rows[names[2]] = dict(rows[names[2]], emitted=[6])
    assert f"the V1 runner emitted 5 ({VOCAB[5]})" in figs.runner_paths_text(rows, VOCAB)


def test_the_sources_table_adds_the_share():
    table = figs.sources_table(
        {"a": {"draft slots": 8, "-1 slots": 2}, "b": {"draft slots": 0, "-1 slots": 0}}
    )
    assert table.loc["a", "share of -1"] == 0.25 and math.isnan(table.loc["b", "share of -1"])
    text = figs.sources_text(
        {
            "a": {"draft slots": 8, "-1 slots": 2},
            "b": {"draft slots": 5, "-1 slots": 0},
            "c": {"draft slots": 4, "-1 slots": 4},
        }
    )
    assert text == (
        "*a*: 2 of 8 of its draft slots left the scheduler as `-1`. *b*: none of its draft slots "
        "left the scheduler as `-1`. *c*: all of its draft slots left the scheduler as `-1`."
    )


def test_counting_and_negative_draft_paragraphs_quote_their_tables():
    import pandas as pd

    table = pd.DataFrame(
        {
            "placeholders recognisable by id (< 0)": [0, 24],
            "placeholder slots": [24, 24],
            "placeholder slots accepted": [7, 0],
            "rate over all slots": [0.41, 0.35],
            "rate over real drafts": [0.52, 0.5],
        },
        index=["(b) zero in the scheduler", "(c) clamp in _preprocess"],
    )
    text = " ".join(figs.counting_text(table).split())  # the paragraph's own line breaks left out
    assert "(24 of 24 are negative)" in text and "(0 of 24)" in text and "and 7 of them were accepted" in text
    assert "0.41 for (b), 0.35 for (c)" in text
    one = table.assign(**{"placeholder slots accepted": [1, 0]})
    assert "and 1 of them was accepted as such" in " ".join(figs.counting_text(one).split())
    said = figs.negative_drafts_text({"rows with an accepted -1": 3}, {"rows with an accepted -1": 0})
    assert said.startswith("With the check off, 3 sampler rows") and "With the check on, 0 do." in said


def test_placeholder_origin_text_counts_in_words_that_agree_with_the_numbers(designs):
    _, clamp, _ = designs
    text = figs.placeholder_origin_text(clamp, 3)
    short = re.search(r"fewer than 3 tokens in (\d+) later verification(s?)\b", text)
    bare = re.search(r", and (\d+) decode step(s?) had no drafts", text)
    assert short and bare, text
    for match in (short, bare):  # "1 verification", "2 verifications"
        assert (match.group(2) == "s") == (match.group(1) != "1"), text


def test_acceptance_text_states_only_numbers_it_was_given(two_runs):
    text = figs.acceptance_text(two_runs, (0.4, 0.9))
    rates = {f"{s.acceptance_rate:.0%}" for s in two_runs.values()} | {"40%", "90%"}
    assert set(re.findall(r"\d+%", text)) <= rates, text  # no measurement from elsewhere typed in
    assert "#" not in text  # nor a pull request's number standing for one
