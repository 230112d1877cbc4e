"""Chapter 5's host side (``scripts/record_host_trace.py``'s recording): the numbers its text and figures give
are the recording's, read at the right place."""

import copy
import json
import runpy

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle

from specfix.figures import host_trace, style
from specfix.tools import recorded

PEER = "vllm_0.33.0"


def _timing(host, gpu, back_to_back):
    part = lambda us: None if us is None else {"median_us": us, "p20_us": us, "p80_us": us, "n": 3}
    return {"host": part(host), "gpu": part(gpu), "back_to_back": part(back_to_back)}


def _spans():
    """Two calls, three ops, three launches, three kernels; the GPU busy 5 + 8 + 6 = 19 us of 100."""
    spans = [("call", "rejection_sample", 0.0, 60.0), ("call", "gumbel_sample", 62.0, 100.0)]
    spans += [("op", "aten::empty", a, a + 4) for a in (5.0, 40.0, 70.0)]
    spans += [("launch", "cuLaunchKernelEx", a, a + 3) for a in (25.0, 45.0, 85.0)]
    spans += [("gpu", "kernel", a, b) for a, b in ((30.0, 35.0), (50.0, 58.0), (90.0, 96.0))]
    return [dict(zip(("lane", "name", "start_us", "end_us"), span, strict=True)) for span in spans]


def _timeline(impl, batch):
    return {
        "impl": impl,
        "batch": batch,
        "k": 3,
        "vocab": 151_936,
        "step_host_us": 100.0,
        "spans": _spans(),
        "kernels": 3,
        "launches": 3,
        "gpu_busy_us": 19.0,
        "gpu_end_us": 96.0,
    }


GPU = {"specfix": {1: 5, 8: 8, 64: 30, 256: 95, 1024: 300}, PEER: {1: 8, 8: 12, 64: 100, 256: 180, 1024: 600}}
HOST = {"specfix": 90.0, PEER: 80.0}
FIXTURE = {
    "impls": ["specfix", PEER],
    "peer": {"version": "0.33.0", "impl": PEER},
    "timelines": [_timeline(i, b) for i in ("specfix", PEER) for b in (1, 8)],
    "rows": [
        {"impl": i, "rows": r, **_timing(HOST[i], g, max(HOST[i], g))}
        for i in ("specfix", PEER)
        for r, g in GPU[i].items()
    ],
    "graph": [
        {
            "impl": "specfix",
            "batch": 8,
            "eager": _timing(150.0, 40.0, 160.0),
            "graph": _timing(8.0, 38.0, 42.0),
        },
        {"impl": PEER, "batch": 8, "eager": _timing(120.0, 45.0, 130.0), "graph_error": "not captured"},
    ],
}


def _cpu_fixture():
    """The same recording as a CPU run writes it: no GPU times, no kernels, no graph."""
    cpu = copy.deepcopy(FIXTURE)
    for r in cpu["rows"]:
        r["gpu"] = None
    for t in cpu["timelines"]:
        t["spans"] = [s for s in t["spans"] if s["lane"] != "gpu"]
        t.update(kernels=0, launches=0, gpu_busy_us=0.0, gpu_end_us=None)
    for g in cpu["graph"]:
        g.pop("graph", None)
        g["eager"]["gpu"] = None
    return cpu


def test_host_rows_say_where_the_host_bound_regime_ends():
    df = host_trace.host_rows(FIXTURE)
    assert len(df) == 10 and df.query("impl == 'specfix' and rows == 64")["host_bound"].item()
    assert not df.query("impl == 'specfix' and rows == 256")["host_bound"].item()
    assert not host_trace.host_rows(_cpu_fixture())["host_bound"].any()  # no GPU times: nothing to compare


def test_step_table_puts_specfix_first_and_leaves_an_uncaptured_replay_empty():
    steps = host_trace.step_table(FIXTURE)
    assert list(steps["impl"]) == ["specfix", PEER]
    assert steps.loc[0, "graph_back_to_back_us"] == 42.0 and steps.loc[0, "eager_host_us"] == 150.0
    assert steps.loc[1, "graph_back_to_back_us"] != steps.loc[1, "graph_back_to_back_us"]  # NaN


def test_text_gives_the_recordings_numbers():
    text = host_trace.host_trace_text(FIXTURE)
    assert "the host worked 100 us, the GPU was busy 19 us of it (19%) in 3 kernels from 3 launch" in text
    assert "specfix `gumbel_sample` by rows**: host-bound up to 64 rows; from 256 rows the GPU sets" in text
    assert "vLLM 0.33.0 `gumbel_sample` by rows**: host-bound up to 8 rows; from 64 rows" in text
    assert "1.12x at 1 row (90.0 against 80.0 us); 1.12x at 8 rows" in text
    assert "the step at 8 requests**: 160 us back to back eager, 42 us replayed from one CUDA graph" in text
    assert "the host's work per step 150 us eager, 8 us for a replay; the GPU's 40 and 38 us" in text
    assert text.count("replayed from one CUDA graph") == 1  # vLLM's step was not captured
    assert "ran without a GPU" not in text


def test_text_says_where_the_gpu_went_idle_during_a_host_timing():
    trace = copy.deepcopy(FIXTURE)
    trace["rows"][2]["gpu_busy_throughout_host_timing"] = False
    text = host_trace.host_trace_text(trace)
    assert "ran out of queued work before the host's timing loop ended (specfix at 64 rows)" in text
    assert "ran out of queued work" not in host_trace.host_trace_text(FIXTURE)


def test_text_of_a_cpu_recording_says_it_has_no_gpu_times():
    text = host_trace.host_trace_text(_cpu_fixture())
    assert "ran without a GPU" in text and "sets the pace" not in text and "replayed" not in text


def _bars(ax):
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


@pytest.mark.parametrize("trace", [FIXTURE, _cpu_fixture()], ids=["gpu", "cpu"])
def test_timeline_figure_draws_every_lane_of_each_implementation(trace):
    fig = host_trace.host_timeline_figure(trace, "test source")
    try:
        axes = [ax for ax in fig.axes if ax.axison]
        assert len(axes) == 2
        for ax in axes:
            lanes = _bars(ax)
            assert [len(c.get_paths()) for c in lanes] == [2, 3, 3, 3 if trace is FIXTURE else 0]
            assert "100 us" in ax.get_title()
        assert "8 requests" in fig._suptitle.get_text()
        assert style.legibility(fig)["text_px"] >= style.MIN_TEXT_PX
        assert any(t.get_text().startswith("Read down a column") for t in fig.texts)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("trace", [FIXTURE, _cpu_fixture()], ids=["gpu", "cpu"])
def test_regime_figure_draws_host_and_gpu_by_rows_and_the_step_bars(trace):
    fig = host_trace.host_regime_figure(trace, "test source")
    try:
        top, bottom = [ax for ax in fig.axes if ax.get_xlabel() or ax.get_ylabel()][:2]
        assert len(top.get_lines()) == (4 if trace is FIXTURE else 2)
        heights = [p.get_height() for p in bottom.patches if isinstance(p, Rectangle)]
        if trace is FIXTURE:
            assert {160.0, 42.0, 40.0, 130.0, 45.0} <= set(heights)
        assert style.legibility(fig)["text_px"] >= style.MIN_TEXT_PX
        assert style.legibility(fig)["natural_px"] <= style.COLUMN_PX + 60
    finally:
        plt.close(fig)


def test_the_h200_recording_chapter_5_shows_is_labelled_and_names_what_it_ran():
    trace, source = host_trace.load_host_trace()
    assert source.startswith("Recorded on ") and source.endswith("(not on this machine)")
    assert source.count(trace["meta"]["device"]) == 1
    assert trace["meta"]["device"].startswith("NVIDIA") and trace["peer"]["version"] == "0.33.0"
    assert set(trace["impls"]) == {"specfix", PEER} and not trace["errors"]
    assert host_trace.host_trace_text(trace).count("replayed from one CUDA graph") == len(trace["graph"])


def test_chapter_5_shows_the_host_trace_with_its_label():
    cells = json.loads((recorded.ROOT / "notebooks" / "05_performance.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    (loads,) = [c for c in code if "host_trace.load_host_trace()" in c]
    assert "print(TRACE_SOURCE)" in loads and "host_trace.host_timeline_figure(trace, TRACE_SOURCE)" in loads
    assert any(
        "host_trace.host_regime_figure(trace, TRACE_SOURCE)" in c and "host_trace.host_trace_text(trace)" in c
        for c in code
    )
    titles = [c["source"][0] for c in cells if c["cell_type"] == "markdown" and c["source"]]
    assert (
        titles.index("## 10. The host side: where a small step spends its time\n")
        < titles.index("## The goals, judged\n")
        < titles.index("## Recap\n")
    )


def test_the_recorder_reduces_a_profiler_trace_to_the_steps_spans():
    """A Chrome trace as torch.profiler writes it on a GPU: the last step's annotation sets time 0; nested
    torch ops and events outside that step are dropped; launches and kernels kept; the GPU's busy time is a
    union."""
    x = lambda cat, name, ts, dur, tid=1: dict(ph="X", cat=cat, name=name, ts=ts, dur=dur, tid=tid)
    trace = {
        "traceEvents": [
            x("user_annotation", "step", 500, 300),
            x("cpu_op", "aten::lt", 520, 200),  # an earlier step
            x("kernel", "lt_kernel", 790, 3, tid=7),
            x("user_annotation", "step", 1000, 100),
            x("user_annotation", "gumbel_sample", 1002, 90),
            x("cpu_op", "aten::empty", 990, 5),  # before the step: dropped
            x("cpu_op", "aten::softmax", 1010, 20),
            x("cpu_op", "aten::_softmax", 1012, 10),  # nested: dropped
            x("cuda_runtime", "cudaLaunchKernel", 1025, 4),
            x("cuda_runtime", "cudaGetDevice", 1030, 1),
            x("cuda_driver", "cuLaunchKernelEx", 1060, 5),
            x("kernel", "softmax_kernel", 1040, 10, tid=7),
            x("kernel", "_gumbel_sample_kernel", 1045, 20, tid=7),
            x("cuda_runtime", "cudaDeviceSynchronize", 1101, 50),  # after the step: dropped
            {"ph": "i", "cat": "instant", "name": "x", "ts": 1050},
        ]
    }
    got = runpy.run_path(str(recorded.ROOT / "scripts" / "record_host_trace.py"))["reduce_trace"](trace)
    spans = [(s["lane"], s["name"], s["start_us"], s["end_us"]) for s in got["spans"]]
    assert spans == [
        ("call", "gumbel_sample", 2, 92),
        ("op", "aten::softmax", 10, 30),
        ("launch", "cudaLaunchKernel", 25, 29),
        ("launch", "cuLaunchKernelEx", 60, 65),
        ("gpu", "softmax_kernel", 40, 50),
        ("gpu", "_gumbel_sample_kernel", 45, 65),
    ]
    assert got["step_host_us"] == 100 and got["kernels"] == 2 and got["launches"] == 2
    assert got["gpu_busy_us"] == 25 and got["gpu_end_us"] == 65
