"""Chapter 2's figures and tables, drawn from small hand-made data: their content, not their pixels."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from specfix.figures import embedding_assert as fig2
from specfix.figures import style
from specfix.lab import embedding_assert as ea
from specfix.lab import placeholder_fixes as pf
from specfix.lab.guard import GuardTiming

ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], "
    "thread: [1,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
)


def _run(blocking: bool) -> ea.ChildRun:
    during = "F.embedding(ids, weight)" if blocking else "torch.cuda.synchronize()"
    events = [
        {"kind": "start", "blocking": blocking},
        {"kind": "raised", "during": during, "type": "AcceleratorError"},
    ]
    if not blocking:
        events.insert(1, {"kind": "returned", "launch_us": 7.0})
    return ea.ChildRun("minimal", "", {}, 1, ASSERT, 1.0, events)


def test_crash_timeline_names_the_kernel_and_where_python_heard():
    fig = fig2.crash_timeline(_run(False), _run(True))
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "torch.cuda.synchronize()" in titles[0] and "F.embedding(ids, weight)" in titles[1]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]
    assert sum("indexSelectSmallIndex" in t for t in texts) == 2
    assert "returns" in texts and "CUDA_LAUNCH_BLOCKING=1" in fig.texts[-1].get_text()
    plt.close(fig)


def _row(op, num_indices, cpu, kernel=None, condition=""):
    cuda = {"outcome": "returned", "wrapped": True}
    if kernel:
        cuda = {"outcome": "device assert", "kernel": kernel, "where": "K.cu:1", "condition": condition}
    return {"op": op, "bad": "-1", "num_indices": num_indices, "cpu": cpu, "cuda": cuda}


OUT_OF_RANGE = {"outcome": "raised", "type": "IndexError", "message": "index out of range in self"}
ROWS = [
    _row("F.embedding", 3, OUT_OF_RANGE, "indexSelectSmallIndex", "srcIndex < srcSelectDimSize"),
    _row("F.embedding", 4096, OUT_OF_RANGE, "vectorized_gather_kernel", "ind >= 0"),
    _row(
        "torch.gather",
        4096,
        {"outcome": "raised", "type": "RuntimeError", "message": "index -1 is out"},
        "vectorized_gather_kernel",
        "ind >= 0",
    ),
    _row("w[idx]", 3, {"outcome": "returned", "wrapped": True}),
]


def test_ops_table_one_row_per_op_and_bad_index_a_column_per_count():
    frame = fig2.ops_table(ROWS)
    assert list(frame.columns) == ["CPU", "CUDA, 3 indices", "CUDA, 4,096 indices"]
    cell = frame.loc[("F.embedding", "-1"), "CUDA, 3 indices"]
    assert cell.startswith("device assert in indexSelectSmallIndex")
    assert frame.loc[("w[idx]", "-1"), "CPU"] == "no error: -1 wrapped around"
    assert frame.loc[("torch.gather", "-1"), "CPU"].startswith("RuntimeError")


def test_kernel_table_says_which_ops_share_a_kernel_at_each_count():
    frame = fig2.kernel_table(ROWS)
    assert set(frame.index) == {"indexSelectSmallIndex", "vectorized_gather_kernel"}
    big = frame.loc["vectorized_gather_kernel"]
    assert big["4,096 indices"] == "F.embedding (-1), torch.gather (-1)" and big["3 indices"] == "-"
    assert fig2.ops_by_kernel(ROWS)["indexSelectSmallIndex"] == {3: [("F.embedding", "-1")]}


def _costs(busy: bool) -> pd.DataFrame:
    rows = []
    for i, fix in enumerate(pf.FIXES):
        for n in (256, 8192):
            scale = (i + 1) * n / 256
            us = {"median_us": 10.0 * scale, "p20_us": 9.0 * scale, "p80_us": 11.0 * scale}
            rows.append({"fix": fix, "label": pf.LABELS[fix], "num_tokens": n, **us})
            if busy:
                rows[-1]["host_us_behind_busy_gpu"] = 5.0 * (i + 1)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("busy", [True, False])
def test_fix_costs_figure_one_line_per_fix_ticks_at_the_measured_sizes(busy):
    fig = fig2.fix_costs_figure(_costs(busy), "test machine")
    assert len(fig.axes) == (2 if busy else 1)
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["256", "8,192"]
        assert len(ax.get_lines()) >= len(pf.FIXES)
        xs = {tuple(line.get_xdata()) for line in ax.get_lines() if len(line.get_xdata()) == 2}
        assert len(xs) >= len(pf.FIXES)  # nudged apart: no two fixes share their x positions
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [pf.LABELS[f] for f in pf.FIXES]
    assert "no line hides another" in fig.texts[-1].get_text()
    seen = style.legibility(fig)  # drawn for the book's column
    assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen
    plt.close(fig)


def test_guard_timing_figure_shows_every_run():
    timing = GuardTiming((0.010, 0.012, 0.011), (0.020, 0.019, 0.021), checked=5)
    fig = fig2.guard_timing(timing, "4 engine steps")
    ax = fig.axes[0]
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert sum(len(d.get_xdata()) for d in dots) == 6
    assert "3 of each" in fig.texts[-1].get_text() and ax.get_xlabel() == "wall time of 4 engine steps (ms)"
    plt.close(fig)


def test_short_traceback_names_files_by_package_never_by_this_machines_path():
    import torch
    import torch.nn.functional as F

    try:
        F.embedding(torch.tensor([5, -1]), torch.randn(8, 4))
    except IndexError as err:
        text = fig2.short_traceback(err)
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1].startswith("IndexError: index out")
    assert '  File "torch/nn/functional.py", line ' in text and "in embedding" in text
    assert "/" not in text.replace("torch/nn/functional.py", ""), text  # no absolute path left


def test_acceptance_view_puts_the_runs_in_columns_and_the_crashes_in_lines():
    rows = [
        {
            "fix": "clamp (a)",
            "temperature": 0.0,
            "crashes": "no",
            "real drafts": 42,
            "accepted drafts": 18,
            "acceptance rate, real drafts": 18 / 42,
        },
        {
            "fix": "host_mask (b)",
            "temperature": 0.0,
            "crashes": "no",
            "real drafts": 42,
            "accepted drafts": 42,
            "acceptance rate, real drafts": 1.0,
        },
        {"fix": "no fix", "temperature": 0.0, "crashes": "IndexError: index out of range in self"},
    ]
    view, crashed = fig2.acceptance_view(rows)
    assert list(view.columns) == [(0.0, "clamp (a)"), (0.0, "host_mask (b)")] and "crashes" not in view.index
    assert view.loc["acceptance rate, real drafts", (0.0, "host_mask (b)")] == "1.000"  # a rate, not a count
    assert view.loc["real drafts", (0.0, "clamp (a)")] == "42"  # a count, not 42.0
    assert view.loc["acceptance rate, real drafts", (0.0, "clamp (a)")] == "0.429"
    assert crashed == ["no fix at temperature 0.0: IndexError: index out of range in self"]


# -- the paragraphs: numbers read from the recordings, checked here against the recordings themselves --------


def test_fix_cost_paragraphs_quote_the_bench_recording():
    from specfix.figures.performance import fix_costs
    from specfix.tools import recorded

    costs = fix_costs(recorded.load("bench_h200"))
    lo, hi = costs.num_tokens.min(), costs.num_tokens.max()
    at = costs.set_index(["fix", "num_tokens"])
    text = " ".join(fig2.fix_costs_text(costs).split())
    assert (
        f"from {at.loc[('host_mask', lo), 'median_us']:,.0f} us at {lo:,} tokens to "
        f"{at.loc[('host_mask', hi), 'median_us']:,.0f} us at {hi:,}" in text
    )
    clamp = at.loc["clamp", "median_us"]
    assert f"**clamp** costs {clamp[lo]:,.1f} us per step at {lo:,} tokens and {clamp[hi]:,.1f} us at" in text
    # host_mask_async against host_mask at 256 tokens: 133 and 118 us, but 129-158 against 115-138
    assert "even slower" not in text and "ranges overlap at every size" in text
    busy = fig2.busy_gpu_text(costs)
    behind = at.loc["clamp", "host_us_behind_busy_gpu"]
    assert f"to {behind.max():,.0f} us behind the same queue" in busy and "  " not in busy
    # behind a busy GPU host_mask waited at 256 tokens only: at 2,048 and 8,192 it took less than idle
    sync = at.loc["host_mask"]
    assert sync.loc[2048, "host_us_behind_busy_gpu"] < sync.loc[2048, "median_us"]
    assert (
        f"At 2,048 and 8,192 tokens it took {sync.loc[2048, 'host_us_behind_busy_gpu']:,.0f} and "
        f"{sync.loc[8192, 'host_us_behind_busy_gpu']:,.0f} us against {sync.loc[2048, 'median_us']:,.0f} and "
        f"{sync.loc[8192, 'median_us']:,.0f} idle" in busy
    )
    assert "only while its own host work is shorter than the queue" in busy


def _busy_costs(waits: dict[int, float]) -> pd.DataFrame:
    """Every fix at 2 us idle (p20 1, p80 3); host_mask ``waits[n]`` us longer behind the queue."""
    rows = []
    for fix in pf.FIXES:
        for n, wait in waits.items():
            busy = 2.0 + (wait if fix == "host_mask" else 0.0)
            us = {"median_us": 2.0, "p20_us": 1.0, "p80_us": 3.0, "host_syncs_per_step": 0.0}
            rows.append({"fix": fix, "num_tokens": n, **us, "host_us_behind_busy_gpu": busy})
    return pd.DataFrame(rows)


def test_busy_gpu_paragraph_says_at_which_sizes_host_mask_waited():
    always = fig2.busy_gpu_text(_busy_costs({256: 100.0, 8192: 80.0}))
    assert "makes it wait for the queue.**" in always and "it took" not in always
    early = fig2.busy_gpu_text(_busy_costs({256: 100.0, 8192: -5.0}))
    assert "only while" in early and "At 8,192 tokens it took -3 us against 2 idle" in early
    assert "At 256 tokens host_mask's call took 102 us, 100 us more" in early
    never = fig2.busy_gpu_text(_busy_costs({256: -1.0, 8192: -5.0}))
    assert "never made it wait longer" in never and "At 256 and 8,192 tokens it took" in never


def test_async_copy_is_called_slower_only_where_the_spreads_part():
    costs = _busy_costs({256: 0.0, 8192: 0.0}).set_index(["fix", "num_tokens"])
    costs.loc[("host_mask_async", 8192), ["median_us", "p20_us", "p80_us"]] = (5.0, 4.0, 6.0)
    costs.loc[("host_mask_async", 256), ["median_us", "p20_us", "p80_us"]] = (0.5, 0.4, 0.6)
    text = fig2.fix_costs_text(costs.reset_index())
    assert "at 8,192 tokens it is even slower than host_mask" in text and "overlap at every size" not in text
    assert "at 256 tokens it is faster" in text


def _acceptance(fix: str, temperature: float, ver: int, real: int, acc: int, placeholders: int) -> dict:
    return {
        "fix": pf.LABELS[fix],
        "temperature": temperature,
        "same tokens as the clamp": True,
        "verifications": ver,
        "real drafts": real,
        "accepted drafts": acc,
        "acceptance rate, real drafts": acc / real if real else float("nan"),
        "placeholder slots": 6,
        "placeholders accepted": placeholders,
        "acceptance rate, all slots": (acc + placeholders) / (real + 6),
    }


@pytest.mark.parametrize(
    "clamp, zero, said",
    [
        (
            (2, 6, 6, 0),
            (2, 6, 6, 2),
            "yet here both runs verified 6 real drafts in 2 verifications and accepted 6",
        ),
        ((2, 6, 4, 0), (3, 4, 4, 1), "both runs accepted 4 real drafts, and the clamp run verified 2 more"),
        ((2, 6, 4, 0), (3, 8, 4, 1), "both runs accepted 4 real drafts, and the zeroing run verified 2 more"),
        ((2, 6, 4, 0), (3, 4, 6, 1), "the clamp's run verified +2 real drafts and accepted -2"),
    ],
)
def test_greedy_paragraph_says_the_runs_differ_only_when_their_counts_do(clamp, zero, said):
    rows = [_acceptance("clamp", 0.0, *clamp), _acceptance("scheduler_zero", 0.0, *zero)]
    text = fig2.zeroing_greedy_text(rows)
    assert said in text, text
    assert ("did not verify the same drafts" in text) == (clamp[:3] != zero[:3]), text
    slots = "1 placeholder slot as" if zero[-1] == 1 else f"{zero[-1]} placeholder slots as"
    assert slots in text


def test_sampled_paragraph_counts_in_the_singular_when_it_is_one():
    rows = [_acceptance("clamp", 0.7, 0, 0, 0, 0), _acceptance("scheduler_zero", 0.7, 0, 1, 1, 1)]
    text = fig2.zeroing_sampled_text(rows)
    assert "accepted 1 placeholder slot," in text and "with 1 accepted draft in both" in text


def test_sampled_paragraph_without_real_drafts_reads_only_the_placeholder_slots():
    rows = [_acceptance("clamp", 0.7, 0, 0, 0, 0), _acceptance("scheduler_zero", 0.7, 0, 0, 0, 1)]
    rows[1]["same tokens as the clamp"] = False
    text = fig2.zeroing_sampled_text(rows)
    assert "neither run verified a real draft" in text and "0 of 0" not in text, text
    assert "verified were the 6 placeholder slots" in text and "Zeroing accepted 1 of them" in text
    assert "rate of 0.167 for zeroing" in text and "against 0.000 for the clamp" in text
    assert "text is different from the clamp's" in text


def test_greedy_paragraph_heads_with_what_the_counts_show():
    same = [_acceptance("clamp", 0.0, 2, 6, 6, 0), _acceptance("scheduler_zero", 0.0, 2, 6, 6, 2)]
    assert fig2.zeroing_greedy_text(same).startswith("**Zeroing left the real drafts as they were.**")
    apart = [same[0], _acceptance("scheduler_zero", 0.0, 3, 4, 4, 1)]
    assert fig2.zeroing_greedy_text(apart).startswith("**Zeroing changed which drafts were verified.**")


def test_kernel_name_paragraphs_name_the_recorded_kernels():
    from specfix.tools import recorded

    ops = recorded.load("embedding_assert_ops")
    emb = {
        r["num_indices"]: r["cuda"]["kernel"]
        for r in ops["rows"]
        if r["op"] == "F.embedding" and r["bad"] == "-1" and r["cuda"].get("outcome") == "device assert"
    }
    few, many = emb[min(emb)], emb[max(emb)]
    text = " ".join(fig2.kernel_names_text(ops["rows"], ops["meta"]["torch"]).split())
    assert f"With {min(emb):,} ids `F.embedding` failed in `{few}`" in text and ops["meta"]["torch"] in text
    steps = " ".join(fig2.checklist_text(ops["rows"]).split())
    assert f"`{few}` means the `index_select` family" in steps and f"while `{many}`" in steps


@pytest.mark.parametrize(
    "plain, guarded, verdict",
    [
        ((0.10, 0.11), (0.20, 0.21), "every guarded run was slower than every unguarded one"),
        ((0.10, 0.20), (0.15, 0.16), "the two spreads overlap"),
        ((0.30, 0.31), (0.10, 0.11), "the machine's speed drifted"),
    ],
)
def test_guard_cost_paragraph_says_what_the_spreads_show(plain, guarded, verdict):
    text = fig2.guard_cost_text(GuardTiming(plain, guarded, checked=40), steps=4, on_gpu=False)
    assert verdict in text and "40 index tensors per run, 10 per step" in text and "on a CPU" in text
