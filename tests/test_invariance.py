"""The padding-invariance checker: it must flag padding-dependent steps and pass padding-safe ones."""

import pytest
import torch

from specfix import Fixes
from specfix.lab.invariance import (
    GARBAGE_PATTERNS,
    STALE_RUN,
    check_dflash,
    check_padding_invariance,
    check_speculator,
)
from specfix.lab.padding_bench import TableDraft
from specfix.mrv2.dflash import DFlashDrafter, ToyDFlashModel
from specfix.mrv2.speculator import DraftModelSpeculator

N, LIVE = 8, 5


def _toy(pad_with_minus_one):
    """A scatter that mimics the bug in plain torch: rows write table[idx[row]] = x[row]."""
    idx = torch.zeros(N, dtype=torch.int64)
    x = torch.randn(N, 3)
    table = torch.zeros(N, 3)

    def step():
        idx[:LIVE] = torch.tensor([3, 1, 4, 0, 2])
        if pad_with_minus_one:
            idx[LIVE:] = -1
        for row in range(N):
            if idx[row] >= 0:
                table[idx[row]] = x[row]

    return step, {"idx": idx, "x": x, "table": table}


@pytest.mark.parametrize("safe", [True, False])
def test_toy_scatter(safe):
    step, bufs = _toy(safe)
    before = {n: t.clone() for n, t in bufs.items()}
    report = check_padding_invariance(
        step,
        bufs,
        padded={"idx": slice(LIVE, None), "x": slice(LIVE, None)},
        live={"table": [3, 1, 4, 0, 2]},
        bounds={"idx": (-1, N)},
    )
    assert report.ok == safe, str(report)
    if not safe:
        assert {d.buffer for d in report.differences} == {"table"}
        assert set(report.differences[0].rows) <= set(range(5))
        assert "table" in str(report)
    for n, t in bufs.items():  # the check leaves the buffers as it found them
        assert torch.equal(t, before[n]), n


def test_a_fault_under_garbage_is_reported():
    data = torch.zeros(4, dtype=torch.int64)
    table = torch.zeros(4)
    report = check_padding_invariance(
        lambda: table[data].sum(),
        {"data": data, "table": table},
        padded={"data": slice(2, None)},
        live={"table": slice(None)},
    )
    assert not report.ok and report.errors  # "huge" ids without bounds index out of range


def test_bad_arguments():
    t = torch.zeros(4)
    with pytest.raises(ValueError, match="not in buffers"):
        check_padding_invariance(lambda: None, {"t": t}, {"u": [0]}, {"t": [0]})
    assert set(GARBAGE_PATTERNS) == {"random", "nan", "minus_one", "huge"}


def _speculator(fix, device="cpu"):
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    return DraftModelSpeculator(
        TableDraft(table).to(device),
        max_num_reqs=8,
        num_speculative_steps=2,
        vocab_size=16,
        context_len=1,
        device=device,
        fixes=Fixes(pad_idx_mapping=fix),
    )


def _speculator_args(device="cpu"):
    idx = torch.tensor([5, 3, 0], dtype=torch.int32, device=device)
    return (
        3,
        idx,
        torch.ones(8, device=device),
        torch.arange(8, device=device) * 11,
        torch.arange(3, device=device)[:, None],
        torch.arange(3, device=device) + 4,
    )


def _earlier_larger_batch(spec, device="cpu"):
    """Draft for four requests in slots [5, 3, 0, 1]; the checked step then schedules only the first three,
    so padded row 3 still names slot 1, whose request is live but sits the step out (its cached draft
    logits wait for its next verification). Row 3 is slot 1's only writer: no race with a live row."""
    ar, idx = torch.arange(4, device=device), torch.tensor([5, 3, 0, 1], dtype=torch.int32, device=device)
    spec.propose(
        4, idx, torch.ones(8, device=device), torch.arange(8, device=device) * 11, ar[:, None] + 7, ar + 4
    )
    return [1]


@pytest.mark.parametrize("fix", [True, False])
def test_finds_the_stale_idx_mapping_bug(fix):
    report = check_speculator(_speculator(fix), *_speculator_args())
    assert report.ok == fix, str(report)
    if not fix:
        assert "draft_logits" in {d.buffer for d in report.differences}
        assert all(set(d.rows) <= {5, 3, 0} for d in report.differences if d.buffer == "draft_logits")


@pytest.mark.parametrize("fix", [True, False])
def test_a_stale_row_corrupts_a_live_request_left_out_of_the_step(fix):
    spec = _speculator(fix)
    report = check_speculator(spec, *_speculator_args(), unscheduled=_earlier_larger_batch(spec))
    assert report.ok == fix, str(report)
    if not fix:  # the stale run writes slot 1; the exact-size step and -1 padding leave it alone
        assert report.rows("draft_logits", "reference") == report.rows("draft_logits", "minus_one") == [1]


def test_unscheduled_slots_are_checked():
    spec = _speculator(True)
    for bad in ([0], [1, 1], [8], [True]):
        with pytest.raises(ValueError, match="unscheduled"):
            check_speculator(spec, *_speculator_args(), unscheduled=bad)


@pytest.mark.parametrize("fix", [True, False])
def test_finds_the_dflash_bug(fix):
    drafter = DFlashDrafter(
        ToyDFlashModel(16), max_num_reqs=4, num_speculative_steps=3, fixes=Fixes(dflash_pad_idx=fix)
    )
    idx = torch.tensor([2, 0], dtype=torch.int32)
    report = check_dflash(drafter, 2, idx, torch.arange(4), torch.arange(4) + 5)
    assert report.ok == fix, str(report)
    if not fix:
        found = [(d.buffer, d.rows, d.run_b) for d in report.differences]
        assert found == [("draft_logits", [0], "reference")]


@pytest.mark.cuda
@pytest.mark.parametrize("fix", [True, False])
def test_real_cuda_graphs(fix):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    spec = _speculator(fix, "cuda")
    spec.capture_cuda_graphs()
    # Padded row 3 names slot 0 (zeroed at capture), which live row 2 writes in the same launch: which
    # store lands last is up to the GPU, so without the fix only this much is certain: the live drafts
    # never change (they come from each row's own logits), whichever store wins.
    for _ in range(5):
        report = check_speculator(spec, *_speculator_args("cuda"))
        certain = (
            report.ok
            if fix
            else not report.errors and {d.buffer for d in report.differences} <= {"draft_logits"}
        )
        assert certain, str(report)
    # Row 3 naming slot 1, a live request left out of the step, is slot 1's only writer: no race.
    waiting = _earlier_larger_batch(spec, "cuda")
    report = check_speculator(spec, *_speculator_args("cuda"), unscheduled=waiting)
    assert report.ok == fix, str(report)
    if not fix:
        assert report.rows("draft_logits", "reference") == report.rows("draft_logits", "minus_one") == [1]
    drafter = DFlashDrafter(
        ToyDFlashModel(16).cuda(),
        max_num_reqs=4,
        num_speculative_steps=3,
        device="cuda",
        fixes=Fixes(dflash_pad_idx=fix),
    )
    drafter.capture_cuda_graph()
    idx = torch.tensor([2, 0], dtype=torch.int32, device="cuda")
    report = check_dflash(drafter, 2, idx, torch.arange(4, device="cuda"), torch.arange(4, device="cuda") + 5)
    assert report.ok == fix, str(report)


def test_the_stale_run_comes_first_and_names_what_the_padding_corrupts_now():
    step, bufs = _toy(False)
    bufs["idx"][LIVE:] = torch.tensor([1, 7, 6])  # as an earlier step left it: row 5 names live slot 1
    report = check_padding_invariance(
        step,
        bufs,
        padded={"idx": slice(LIVE, None), "x": slice(LIVE, None)},
        live={"table": [3, 1, 4, 0, 2]},
        bounds={"idx": (-1, N)},
        reference=lambda: None,
    )
    assert report.runs[0] == STALE_RUN and report.runs[-1] == "reference"
    assert {d.run_a for d in report.differences} == {STALE_RUN}
    assert report.rows("table", "minus_one") == [1]  # -1 padding writes nothing: only row 5's harm shows
    with pytest.raises(ValueError, match="run must be one of"):
        report.rows("table", "zeros")
