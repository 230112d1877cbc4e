"""specfix.checks: the argument checks every role uses, each naming the argument it refuses."""

import re

import pytest
import torch

from specfix.checks import check_count, check_device, check_id_tensor, check_slots, check_vector, is_int


def test_a_bool_is_not_an_int():
    assert is_int(0) and is_int(-3) and is_int(2**70)
    assert not any(is_int(x) for x in (True, False, 1.0, "1", None))


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, None])
def test_a_count_is_an_int_at_least_its_floor(bad):
    check_count("k", 0, low=0)
    with pytest.raises(ValueError, match=re.escape(f"k must be an int >= 1, got {bad!r}")):
        check_count("k", bad)


@pytest.mark.parametrize(
    "tensor, error, says",
    [
        ([1, 2], TypeError, "ids must be a torch.Tensor, got list"),
        (
            torch.tensor([1.0]),
            TypeError,
            r"ids must hold signed integers \(int32 or int64\), got torch.float32",
        ),
        (torch.tensor([1], dtype=torch.uint8), TypeError, "got torch.uint8"),
        (torch.zeros(2, 2, dtype=torch.int32), ValueError, r"ids must be 1-D, got shape \(2, 2\)"),
        (torch.zeros(2, dtype=torch.int32), ValueError, "ids must have 3 entries, got 2"),
    ],
)
def test_id_tensors_are_refused_by_name(tensor, error, says):
    with pytest.raises(error, match=says):
        check_id_tensor("ids", tensor, 3)


def test_other_vectors_name_their_dtypes_and_minimum_length():
    with pytest.raises(TypeError, match="temperature must hold dtype float32, got torch.float64"):
        check_vector("temperature", torch.zeros(2, dtype=torch.float64), (torch.float32,))
    with pytest.raises(ValueError, match="idx must have at least 4 entries, got 3"):
        check_vector("idx", torch.zeros(3, dtype=torch.int64), min_length=4)
    check_vector("idx", torch.zeros(4, dtype=torch.int64), min_length=4)


def test_a_tensor_on_another_device_is_named_with_where_it_should_be():
    check_device("seed", torch.zeros(1), torch.device("cpu"), "logits")
    with pytest.raises(ValueError, match="seed is on meta but logits is on cpu"):
        check_device("seed", torch.zeros(1, device="meta"), torch.device("cpu"), "logits")


def test_a_strided_vector_is_refused_where_a_kernel_reads_it_with_stride_one():
    strided = torch.zeros(8, dtype=torch.int64)[::2]
    check_vector("pos", strided)
    with pytest.raises(ValueError, match="pos must be contiguous"):
        check_vector("pos", strided, contiguous=True)


@pytest.mark.parametrize("slots", [[0, 4], [-1, 2], [1, 1]])
def test_live_slots_must_be_distinct_and_within_the_tables(slots):
    check_slots("idx", torch.tensor([3, 0]), 4)
    with pytest.raises(ValueError, match=re.escape(f"idx must be distinct slots in [0, 4), got {slots}")):
        check_slots("idx", torch.tensor(slots), 4)
