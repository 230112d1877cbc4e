"""Chapter 4's figures and tables draw what they are given: bars, lines, marks, captions, table cells."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.container import ErrorbarContainer

from specfix.figures import masked_gumbel_sampling as figs
from specfix.figures import style


def _caption(fig) -> str:
    return " ".join(t.get_text() for t in fig.texts)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_draws_vs_softmax_has_one_bar_per_token_and_series_as_high_as_its_frequency():
    probs = np.array([0.5, 0.3, 0.2])
    draws = {"numpy toy": np.array([0, 0, 1, 2]), "kernel": np.array([0, 1, 1])}
    tests = pd.DataFrame({"passed": [True, False]}, index=list(draws))
    fig = figs.draws_vs_softmax(probs, draws, 0.8, tests)
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == pytest.approx(
        [0.5, 0.3, 0.2, 0.5, 0.25, 0.25, 1 / 3, 2 / 3, 0]
    )
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "softmax(logits / T)",
        "numpy toy (4 draws)",
        "kernel (3 draws)",
        "softmax ± 2σ over the sampler's draws",
    ]
    colours = {
        tuple(p.get_facecolor()[:3]) for p in ax.patches
    }  # the suite's: softmax dark grey, then series
    assert colours == {to_rgb(style.CEILING), to_rgb(style.NEUTRAL), to_rgb(style.ACCENT)}
    # the kernel's whiskers: softmax +- 2 sqrt(p (1 - p) / 3) at its bars
    whiskers = [c.lines[2][0] for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(whiskers) == 2
    ends = np.array([seg[:, 1] for seg in whiskers[1].get_segments()])  # the kernel's: 3 draws
    sigma = np.sqrt(probs * (1 - probs) / 3)
    assert ends == pytest.approx(np.stack([probs - 2 * sigma, probs + 2 * sigma], axis=1))
    # 3 draws leave wide whiskers: 2/3 for 0.3 lies inside (0.3 + 0.53); 30 draws all of token 1 do not
    assert figs.outside_whiskers(probs, draws) == 0
    assert figs.outside_whiskers(probs, {"always 1": np.ones(30, dtype=int)}) == 3
    assert "0 of 6 bars fall outside" in _caption(fig) and "1 of 2 samplers pass" in _caption(fig)
    assert "The kernel's 3 draws leave the widest band" in _caption(fig)


def test_gumbel_tail_marks_the_naive_overflow_instead_of_clipping_it():
    u = torch.logspace(-9, -0.1, 60, dtype=torch.float32)
    naive = -torch.log(-torch.log(1 - u))
    exact = -np.log(-np.log1p(-u.double().numpy()))
    fig = figs.gumbel_tail(u, exact, exact, naive)
    ax = fig.axes[0]
    overflow = int((~torch.isfinite(naive)).sum())
    assert overflow > 0, "the example must overflow"
    triangles = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert len(triangles) == 1 and len(triangles[0].get_xdata()) == len(range(0, overflow, 8))
    naive_line = next(line for line in ax.get_lines() if line.get_label().startswith("naive -log"))
    assert np.isnan(naive_line.get_ydata()).sum() == overflow  # +inf is not drawn as a clipped value
    assert "+inf" in _caption(fig)


def test_gumbel_tail_without_overflow_draws_no_marks():
    u = np.array([0.1, 0.2, 0.5])
    g = -np.log(-np.log1p(-u))
    fig = figs.gumbel_tail(u, g, g, g)
    assert not [line for line in fig.axes[0].get_lines() if line.get_marker() == "^"]


def test_tile_winners_marks_one_maximum_per_tile_and_names_the_winner():
    noisy = np.array([0.0, 5.0, 1.0, 2.0, 9.0, 3.0, 4.0])
    fig = figs.tile_winners(noisy, 3)
    ax = fig.axes[0]
    maxima = next(line for line in ax.get_lines() if line.get_label().startswith("each tile"))
    assert list(maxima.get_xdata()) == [1, 4, 6] and list(maxima.get_ydata()) == [5.0, 9.0, 4.0]
    assert "3 tiles of 3" in ax.get_title()
    assert "token 4" in _caption(fig)


def test_draft_logits_cells_tell_live_writes_from_stray_ones():
    sentinel = -1.0
    buf = np.full((4, 2, 3), sentinel)
    buf[1, 1] = 7.0  # a live slot
    buf[0, 1, 2] = 7.0  # one value in the guard row
    cells = figs.draft_logits_cells(buf, sentinel, [(1, 1), (2, 1)])
    assert cells.tolist() == [[0, 2], [0, 1], [0, 0], [0, 0]]


def test_padded_rows_buffers_draws_one_panel_per_variant_with_readable_text():
    sentinel = -1.0
    clean = np.full((3, 2, 4), sentinel)
    clean[1, 1] = 0.0
    dirty = clean.copy()
    dirty[0, 1] = 3.0
    fig = figs.padded_rows_buffers(
        {"masked": clean, "unmasked": dirty}, sentinel, [(1, 1)], ["guard", "slot 0", "guard"]
    )
    assert [ax.get_title() for ax in fig.axes] == ["masked", "unmasked"]
    words = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert words[0].count("stray write") == 0 and words[1].count("stray write") == 1
    for ax in fig.axes:
        for text in ax.texts:
            if text.get_text() != "sentinel":
                assert text.get_color() == "white"  # white on the dark fills


def test_draws_at_temperature_reports_the_test_in_its_caption():
    fig = figs.draws_at_temperature(np.array([0.5, 0.5]), np.array([0, 1, 1, 0]), 0.5, 1.25, 11.0)
    assert len(fig.axes[0].patches) == 4
    assert "1.2" in _caption(fig) and "the draws pass the test" in _caption(fig)
    fig = figs.draws_at_temperature(np.array([0.5, 0.5]), np.array([0, 0, 0, 0]), 0.5, 30.0, 11.0)
    assert "the draws fail the test" in _caption(fig)


def _bench():
    def result(case, impl, us, metrics=None, **params):
        timing = {"median_us": us, "p20_us": us, "p80_us": us, "n": 1}  # bench.frame reads every timing field
        return {"case": case, "impl": impl, "params": params, "metrics": metrics or {}, **timing}

    samplers = {
        "specfix_fast": 1.0,
        "specfix_exact": 2.0,
        "torch_gumbel_max": 4.0,
        "torch_softmax_multinomial": 8.0,
    }
    results = [
        result(
            "gumbel", impl, us, {"G_logits_per_s": rows * 1000 / us / 1e3}, vocab=1000, rows=rows, dtype=dtype
        )
        for impl, us in samplers.items()
        for rows in (1, 256, 1024)
        for dtype in ("fp32", "bf16")
    ]
    results += [  # more rows take longer per call: a table that averaged the rows would not give 3.0
        result("gumbel_graph", impl, us * rows, vocab=1000, rows=rows, calls_per_graph=200 // rows)
        for impl, us in (("specfix_fast", 3.0), ("specfix_exact", 4.0))
        for rows in (1, 8)
    ]
    for store, masked_us, unmasked_us in ((False, 10.0, 10.0), (True, 9.0, 10.0)):
        shape = {"vocab": 1000, "rows": 256, "store_processed_logits": store}
        results.append(
            result("gumbel_mask", "masked", masked_us, {"overhead": masked_us / unmasked_us - 1}, **shape)
        )
        results.append(result("gumbel_mask", "unmasked", unmasked_us, **shape))
    goals = [
        {"case": "gumbel", "unit": "us", "goal": "fast >= 1x vLLM at 1 x 1,000", "target": 1.0},
        {"case": "gumbel", "unit": "G logits/s", "goal": "fast >= 500 G logits/s at 1,024 x 32,000 bf16"},
        {
            "case": "gumbel",
            "unit": "G logits/s",
            "goal": "fast >= 500 G logits/s at 1,024 x 1,000 bf16, apply_temperature=False",
            "target": 500.0,
            "measured": 480.4,
            "status": "miss",
        },
        {"case": "gumbel_graph", "unit": "us", "goal": "one row", "target": 4.0, "status": "pass"},
    ]
    return {"results": results, "goals": goals}


def test_bench_speed_draws_four_lines_the_goal_at_its_own_shape_and_four_bars():
    fig = figs.bench_speed(_bench(), vocab=1000, rows_at=256)
    left, right = fig.axes
    lines = [line for line in left.get_lines() if line.get_label().endswith(("fp32", "bf16"))]
    assert len(lines) == 4
    goal = [line for line in left.get_lines() if line.get_label().startswith("goal")]
    assert len(goal) == 1 and list(goal[0].get_xydata()[0]) == [1024, 500.0]  # the vocabulary's own goal
    assert goal[0].get_label() == "goal: 500 G/s at 1,024 rows, bf16 (miss)"
    widths = [p.get_width() for p in right.patches]
    assert widths == pytest.approx([8.0, 4.0, 2.0, 1.0])
    assert "256 to 1024 G logits/s" in _caption(fig)  # rows x 1000 logits in 1 us
    assert "at 1,024 rows bf16, apply_temperature=False: miss (480 measured" in _caption(fig)


def test_bench_speed_without_a_goal_at_its_vocabulary_draws_none():
    bench = _bench()
    bench["goals"] = [g for g in bench["goals"] if "x 1,000 " not in g["goal"]]
    fig = figs.bench_speed(bench, vocab=1000, rows_at=256)
    assert not [line for line in fig.axes[0].get_lines() if line.get_label().startswith("goal")]
    assert "goal" not in _caption(fig)


def test_bench_tables_read_the_recording():
    bench = _bench()
    table = figs.throughput_table(bench)
    assert list(table.index.get_level_values("rows")) == [256, 1024]
    graph = figs.graph_table(bench)
    assert (
        graph.loc["specfix_fast", (1000, 1, 200)] == 3.0 and graph.loc["specfix_fast", (1000, 8, 25)] == 24.0
    )
    assert (
        graph.index.name == "median us per call"
        and list(table.columns.get_level_values(0)).count("fp32, G logits/s") == 2
    )  # the units in the headers
    store = pd.DataFrame({"store adds (us)": [0.25, 0.5]})
    assert figs.graph_text(bench, store).startswith(
        "One row of 1,000 logits with the fast noise: 3.00 us per call (goal: at most 4 us, pass)."
    )
    mask = figs.mask_table(bench)
    assert mask.loc["with", "overhead %"] == pytest.approx(-10.0)
    assert mask.loc["without", "overhead %"] == 0.0


def test_graph_text_gives_the_recorded_one_row_goal():
    from specfix.tools import recorded

    bench = recorded.load("bench_h200")
    target = next(g for g in bench["goals"] if g["case"] == "gumbel_graph")
    store = figs.drafter_store_table(recorded.load("gumbel_perf"))
    assert f"fast noise: {target['measured']:.2f} us per call" in figs.graph_text(bench, store)


def test_sanitizer_text_counts_what_each_summary_adds_to_its_reports():
    from specfix.tools import recorded

    san = recorded.load("gumbel_sanitizer")
    text = figs.sanitizer_text(san)
    for name in ("unmasked", "unmasked_guarded_tables"):
        variant = san["variants"][name]
        assert variant["errors"] - sum(k["count"] for k in variant["kinds"].values()) == 2, name
        assert len(variant["program_hit"]) == 2
    assert "Each of the two summaries counts 2 errors more than its reports" in text
    assert "(`cudaDeviceSynchronize`, `cudaGetLastError`)" in text
    (hit,) = {tuple(v["program_hit"]) for v in san["variants"].values() if v["program_hit"]}
    assert all("cudaErrorLaunchFailure" in line for line in hit)
    assert text.startswith(f"{san['variants']['masked']['errors']} errors with the mask")


def test_drafter_store_table_subtracts_the_two_timings():
    perf = {
        "graph_one_row": [
            {"vocab": 10, "noise": "fast", "drafter_store": False, "us_per_call": 3.0},
            {"vocab": 10, "noise": "fast", "drafter_store": True, "us_per_call": 3.5},
        ]
    }
    table = figs.drafter_store_table(perf)
    assert table.loc[(10, "fast"), "store adds (us)"] == pytest.approx(0.5)


def test_every_figure_is_drawn_for_the_books_column():
    probs, u = np.array([0.2, 0.3, 0.5] * 8) / 8, np.logspace(-9, -0.1, 60)
    g = -np.log(-np.log1p(-u))
    clean = np.full((3, 4, 4), -1.0)
    made = [
        figs.draws_vs_softmax(
            probs,
            {"numpy toy": np.arange(24), "Triton kernel": np.arange(24)},
            0.8,
            pd.DataFrame({"passed": [True, True]}, index=["numpy toy", "Triton kernel"]),
        ),
        figs.gumbel_tail(u, g, g, np.where(u < 1e-7, np.inf, g)),
        figs.tile_winners(np.sin(np.arange(300.0)), 64),
        figs.padded_rows_buffers(
            {"masked": clean, "unmasked": clean}, -1.0, [(1, 1)], ["guard", "slot 0", "guard"]
        ),
        figs.draws_at_temperature(probs, np.arange(24), 0.5, 1.25, 11.0),
        figs.bench_speed(_bench(), vocab=1000, rows_at=256),
    ]
    for fig in made:
        seen = style.legibility(fig)
        assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen


def test_noise_comparison_table_sums_the_recording_up_instead_of_dumping_it():
    from specfix.tools import recorded

    rec = recorded.load("vllm_noise_comparison")
    table = figs.noise_comparison_table(rec)
    facts = table["recorded"]
    assert len(table) < 12 and "cases" not in table.index  # the per-case list is not dumped
    assert facts["rows compared"] == f"{rec['rows']:,}"
    assert facts["tokens that differ"] == f"{rec['mismatches']:,}"
    assert facts["cases run"] == f"{len(rec['cases'])} of {rec['cases_planned']}"
