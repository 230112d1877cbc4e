"""specfix.lab.guard.check_indices: catches every bad index before a kernel runs; good ones pass."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from specfix.lab.guard import IndexGuardError, check_indices

ROWS, COLS = 10, 4

# name -> (call(weight, index), size of the indexed extent, op name in the message)
OPS = {
    "F.embedding": (lambda w, i: F.embedding(i, w), ROWS, "F.embedding"),
    "nn.Embedding": (None, ROWS, "F.embedding"),  # a module: built per test around the weight
    "torch.embedding": (lambda w, i: torch.embedding(w, i), ROWS, "torch.embedding"),
    "torch.index_select": (lambda w, i: torch.index_select(w, 0, i), ROWS, "index_select"),
    "Tensor.index_select": (lambda w, i: w.index_select(-2, i), ROWS, "Tensor.index_select"),
    "torch.gather": (lambda w, i: torch.gather(w[:, 0], 0, i), ROWS, "gather"),
    "Tensor.gather": (lambda w, i: w[0].gather(-1, i), COLS, "Tensor.gather"),
    "w[idx]": (lambda w, i: w[i], ROWS, "Tensor.__getitem__"),
    "w[:, idx]": (lambda w, i: w[:, i], COLS, "Tensor.__getitem__"),
    "w[..., idx, None]": (lambda w, i: w[..., i, None], COLS, "Tensor.__getitem__"),
    "w[idx] = 0": (lambda w, i: w.clone().__setitem__(i, 0.0), ROWS, "Tensor.__setitem__"),
    "torch.take": (lambda w, i: torch.take(w, i), ROWS * COLS, "take"),
    "Tensor.take": (lambda w, i: w.take(i), ROWS * COLS, "take"),
}

NEEDS_GPU = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_GPU)]


def weight(device):
    return torch.arange(ROWS * COLS, dtype=torch.float32, device=device).reshape(ROWS, COLS)


def call(name, w, index):
    fn = OPS[name][0]
    if fn is None:
        module = torch.nn.Embedding(ROWS, COLS, device=w.device)
        with torch.no_grad():
            module.weight.copy_(w)
        return module(index)
    return fn(w, index)


def bad_index(size, bad, device):
    """Three good entries around two bad ones, at positions 1 and 3; ``bad`` is -1 or the size itself."""
    value = -1 if bad == "negative" else size
    return torch.tensor([0, value, size - 1, value], device=device), value


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", ["negative", "size"])
@pytest.mark.parametrize("name", list(OPS))
def test_bad_indices_are_caught_with_a_readable_message(name, bad, device):
    _, size, op = OPS[name]
    index, value = bad_index(size, bad, device)
    with pytest.raises(IndexGuardError) as caught, check_indices():
        call(name, weight(device), index)
    err = caught.value
    assert isinstance(err, IndexError)
    assert err.op == op and err.values == [value, value] and err.positions == [(1,), (3,)]
    assert err.num_bad == 2 and err.valid_range == (0, size) and err.index_shape == (4,)
    message = str(err)
    assert message.startswith(f"{op}: 2 of 4 indices") and f"[0, {size})" in message
    assert f"{value} at (1,), {value} at (3,)" in message
    assert "PLACEHOLDER_TOKEN_ID" in message if bad == "negative" else "PLACEHOLDER_TOKEN_ID" not in message


def test_positions_are_multidimensional_and_long_lists_are_cut():
    index = torch.zeros(3, 5, dtype=torch.long)
    index[2, 4] = ROWS + 7
    index[0, 1] = -3
    with pytest.raises(IndexGuardError) as caught, check_indices():
        F.embedding(index, weight("cpu"))
    assert caught.value.positions == [(0, 1), (2, 4)] and caught.value.values == [-3, ROWS + 7]
    many = torch.full((50,), -1)
    with pytest.raises(IndexGuardError) as caught, check_indices():
        F.embedding(many, weight("cpu"))
    assert caught.value.num_bad == 50 and len(caught.value.values) < 50 and "more" in str(caught.value)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_valid_indices_pass_untouched(device, data):
    for name, (_, size, _) in OPS.items():
        values = data.draw(st.lists(st.integers(0, size - 1), min_size=COLS, max_size=12), label=name)
        index = torch.tensor(values, device=device)
        expected = call(name, weight(device), index)
        with check_indices() as guard:
            got = call(name, weight(device), index)
        assert guard.checked >= 1
        if expected is None:  # __setitem__
            continue
        assert torch.equal(got, expected)


def test_nested_use_and_exceptions_leave_no_mode_behind():
    before = torch._C._len_torch_function_stack()
    with check_indices():
        with check_indices():
            assert torch._C._len_torch_function_stack() == before + 2
        assert torch._C._len_torch_function_stack() == before + 1
    assert torch._C._len_torch_function_stack() == before
    with pytest.raises(IndexGuardError, match=r"1 of 1 indices"), check_indices(), check_indices():
        F.embedding(torch.tensor([-1]), weight("cpu"))
    assert torch._C._len_torch_function_stack() == before
    with pytest.raises(RuntimeError, match="boom"), check_indices():
        raise RuntimeError("boom")
    assert torch._C._len_torch_function_stack() == before
    # outside the block nothing is checked: the CPU's own error comes back
    with pytest.raises(IndexError, match="index out of range") as caught:
        F.embedding(torch.tensor([-1]), weight("cpu"))
    assert not isinstance(caught.value, IndexGuardError)


def test_nothing_else_is_touched():
    w = weight("cpu")
    with check_indices() as guard:
        y = (w @ w.T).sum(0)[2:5] + w[1:3].mean()  # slices and ints are not index tensors
        mask = w[w > 5]  # boolean masks are not checked
    assert guard.checked == 0 and y.shape == (3,) and mask.numel() == ROWS * COLS - 6


def test_time_guard_times_both_ways_and_counts_the_checks():
    from specfix.lab.guard import time_guard

    w = weight("cpu")
    calls = []

    def lookups():
        calls.append(torch._C._len_torch_function_stack())
        F.embedding(torch.tensor([1, 2]), w)
        w.index_select(0, torch.tensor([0]))

    timing = time_guard(lookups, repeats=3)
    assert len(timing.plain_s) == len(timing.guarded_s) == 3 and timing.checked == 2
    assert min(timing.plain_s + timing.guarded_s) > 0 and timing.ratio > 0
    assert timing.separated == (min(timing.guarded_s) > max(timing.plain_s))
    # one untimed run of each first, then unguarded and guarded runs alternate
    base = min(calls)
    assert calls == [base, base + 1] * 4
    with pytest.raises(ValueError, match="repeats"):
        time_guard(lookups, repeats=0)
