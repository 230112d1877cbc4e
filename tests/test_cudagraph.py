"""Capture sizes and dispatch (checked against the rule written out by hand), and real graphs on a GPU."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specfix.mrv2.cudagraph import (
    CapturedStep,
    CudaGraphDispatcher,
    capture_sizes,
    cudagraph_capture_sizes,
    time_eager_vs_graph,
)


def test_capture_sizes_follow_vllm_rule():
    sizes = cudagraph_capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16]
    assert sizes[-1] == 512
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:], strict=False) if b < 256)
    assert all(b - a == 16 for a, b in zip(sizes, sizes[1:], strict=False) if a >= 256)
    assert cudagraph_capture_sizes(20) == [1, 2, 4, 8, 16]


def test_capture_sizes_by_hand_as_vllm_0_33_computes_them():
    # 4 seqs, k = 2: ceiling min(4 * 3 * 2, 512) = 24; grid 1, 2, 4, 8, 16, 24; decode sizes 3 * (1, 2, 4)
    assert capture_sizes(4, 2) == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    # the V1 runner rounds each up to a multiple of 1 + k = 3 and keeps those <= 24
    assert capture_sizes(4, 2, v1_runner=True) == [3, 6, 9, 12, 18, 24]
    # no speculation: max_num_seqs itself is captured; max_num_batched_tokens too when it fits
    assert capture_sizes(5, 0, 9) == [1, 2, 4, 5, 8, 9] == capture_sizes(5, 0, 9, v1_runner=True)
    # 64 seqs, k = 3: the ceiling is min(64 * 4 * 2, 512) = 512, then max_num_batched_tokens caps it
    assert capture_sizes(64, 3)[-1] == 512 and capture_sizes(64, 3, 100)[-1] == 100
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 0"):
        capture_sizes(4, -1)


@given(st.integers(1, 300), st.integers(1, 300))
def test_dispatch_picks_smallest_captured_size_that_fits(max_num_reqs, num_reqs):
    d = CudaGraphDispatcher(max_num_reqs)
    if num_reqs > max_num_reqs:
        with pytest.raises(ValueError, match="num_reqs"):
            d.dispatch(num_reqs)
        return
    desc = d.dispatch(num_reqs)
    fitting = [s for s in cudagraph_capture_sizes() if num_reqs <= s <= max_num_reqs]
    if fitting:
        assert (desc.cg_mode, desc.num_reqs_padded) == ("FULL", min(fitting))
    else:
        assert (desc.cg_mode, desc.num_reqs_padded) == ("NONE", num_reqs)
    assert list(desc.padded_rows) == list(range(num_reqs, desc.num_reqs_padded))


def test_dispatch_examples():
    d = CudaGraphDispatcher(64)
    assert d.dispatch(5).num_reqs_padded == 8 and len(d.dispatch(5).padded_rows) == 3
    assert d.dispatch(4).padded_rows == range(4, 4)
    assert CudaGraphDispatcher(50).dispatch(50).cg_mode == "NONE"  # 56 > max_num_reqs: eager


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_dispatch_bad_num_reqs(bad):
    with pytest.raises((TypeError, ValueError), match="num_reqs"):
        CudaGraphDispatcher(8).dispatch(bad)


def test_bad_dispatcher_args():
    with pytest.raises(ValueError, match="max_num_reqs"):
        CudaGraphDispatcher(0)
    with pytest.raises(ValueError, match="capture_sizes"):
        CudaGraphDispatcher(8, [0, 4])
    with pytest.raises(ValueError, match="CUDA"):
        CapturedStep(lambda n: None, [1], "cpu")


@pytest.mark.cuda
def test_graph_replay_reads_current_buffer_contents():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.zeros(8, device="cuda")
    y = torch.zeros(8, device="cuda")

    def step(n):
        y[:n].copy_(x[:n] * 2 + 1)

    graphs = CapturedStep(step, [4, 8], "cuda")
    x.copy_(torch.arange(8.0, device="cuda"))
    y.zero_()
    graphs.replay(4)
    torch.cuda.synchronize()
    assert y.tolist() == [1, 3, 5, 7, 0, 0, 0, 0]
    rows = time_eager_vs_graph(step, [4], "cuda")
    assert rows[0]["graph_us"] > 0 and rows[0]["eager_us"] > 0
