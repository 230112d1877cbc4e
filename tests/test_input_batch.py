"""InputBatch: drafts, placeholders included, land verbatim in token_ids_cpu and spec_token_ids."""

import copy

import numpy as np
import pytest
import torch

from specfix.v1.input_batch import CachedRequestState, InputBatch
from specfix.v1.scheduler import SamplingParams

VOCAB = 512


def _batch_with_one_request():
    """The source document's set-up: max 1 request, max model length 8; prompt [10, 11], output [12],
    3 computed tokens."""
    batch = InputBatch(max_num_reqs=1, max_model_len=8, vocab_size=VOCAB)
    req = CachedRequestState(
        "req", [10, 11], SamplingParams(), None, output_token_ids=[12], num_computed_tokens=3
    )
    batch.add_request(req)
    return batch, req


def test_placeholder_spec_token_ids_written_verbatim():
    batch, req = _batch_with_one_request()
    batch.update_req_spec_token_ids(req, {"req": [13, -1, -1]})
    assert batch.spec_token_ids[0] == [13, -1, -1]
    assert batch.token_ids_cpu[0, 3:6].tolist() == [13, -1, -1]
    assert batch.token_ids_cpu[0, :3].tolist() == [10, 11, 12]
    assert batch.num_tokens_no_spec[0] == 3  # drafts are tentative
    assert req.prev_num_draft_len == 3


def test_token_ids_cpu_is_a_view_of_the_tensor():
    batch, req = _batch_with_one_request()
    batch.update_req_spec_token_ids(req, {"req": [13, -1, -1]})
    assert batch.token_ids_cpu_tensor[0, 3:6].tolist() == [13, -1, -1]


def test_old_drafts_are_cleared_and_sampled_tokens_overwrite_them():
    batch, req = _batch_with_one_request()
    batch.update_req_spec_token_ids(req, {"req": [13, -1, -1]})
    batch.update_req_spec_token_ids(req, {})
    assert batch.spec_token_ids[0] == [] and req.prev_num_draft_len == 0
    batch.append_sampled("req", [13, 40])
    assert batch.token_ids_cpu[0, :5].tolist() == [10, 11, 12, 13, 40]
    assert batch.num_tokens_no_spec[0] == 5


def test_rows_are_reused_after_removal():
    batch = InputBatch(max_num_reqs=2, max_model_len=8, vocab_size=VOCAB)
    for name in "ab":
        batch.add_request(CachedRequestState(name, [1, 2], SamplingParams(), None))
    assert batch.remove_request("a") == 0
    assert batch.add_request(CachedRequestState("c", [3], SamplingParams(), None)) == 0
    assert batch.req_ids == ["c", "b"] and batch.num_reqs == 2
    with pytest.raises(ValueError, match="full"):
        batch.add_request(CachedRequestState("d", [3], SamplingParams(), None))


def _snapshot(batch):
    return (
        batch.token_ids_cpu.copy(),
        batch.num_tokens_no_spec.copy(),
        copy.deepcopy(batch.spec_token_ids),
        dict(batch.req_id_to_index),
        batch.num_computed_tokens_cpu.copy(),
    )


def _same(a, b):
    pairs = zip(a, b, strict=True)
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in pairs)


@pytest.mark.parametrize(
    "spec, error, word",
    [
        ([13, VOCAB], ValueError, rf"must lie in \[-1, vocab_size={VOCAB}\), got {VOCAB}"),  # id >= vocab
        ([13, -2], ValueError, r"must lie in \[-1, .*got -2"),  # only -1 is a placeholder
        ([13, 1.0], TypeError, "must hold ints, got 1.0"),  # float id
        (torch.tensor([13.0]), TypeError, "must hold signed integers, got dtype torch.float32"),
        (torch.tensor([13], dtype=torch.uint8), TypeError, "torch.uint8"),  # unsigned: -1 would wrap
        ([1, 2, 3, 4, 5, 6], ValueError, "overflow max_model_len"),
    ],
)
def test_bad_drafts_are_refused_and_the_row_is_untouched(spec, error, word):
    batch, req = _batch_with_one_request()
    batch.update_req_spec_token_ids(req, {"req": [13, -1, -1]})
    before, prev = _snapshot(batch), req.prev_num_draft_len
    with pytest.raises(error, match=word):
        batch.update_req_spec_token_ids(req, {"req": spec})
    assert _same(before, _snapshot(batch)) and req.prev_num_draft_len == prev


def test_bad_requests_are_refused():
    batch = InputBatch(max_num_reqs=1, max_model_len=4, vocab_size=VOCAB)
    before = _snapshot(batch)
    with pytest.raises(ValueError, match="max_model_len"):
        batch.add_request(CachedRequestState("a", [1, 2, 3, 4, 5], SamplingParams(), None))
    with pytest.raises(ValueError, match="vocab_size"):
        batch.add_request(CachedRequestState("a", [VOCAB], SamplingParams(), None))
    with pytest.raises(ValueError, match="not in the batch"):
        batch.update_req_spec_token_ids(CachedRequestState("zz", [1], SamplingParams(), None), {})
    with pytest.raises(TypeError, match="request must be a CachedRequestState, got str"):
        batch.add_request("a")
    with pytest.raises(TypeError, match="req_id must be a str, got 3"):
        batch.add_request(CachedRequestState(3, [1], SamplingParams(), None))
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams, got dict"):
        batch.add_request(CachedRequestState("a", [1], {}, None))
    for computed in (-1, 3, 1.5, True):  # the row holds 2 tokens
        request = CachedRequestState("a", [1, 2], SamplingParams(), None, num_computed_tokens=computed)
        with pytest.raises(ValueError, match=rf"must be an int in \[0, 2\], got {computed}"):
            batch.add_request(request)
    assert _same(before, _snapshot(batch))
    with pytest.raises(ValueError, match="positive"):
        InputBatch(0, 4, VOCAB)


@pytest.mark.parametrize("req_id, tokens, error, word", [
    ("zz", [5], ValueError, "request 'zz' is not in the batch"),
    ("req", [5, VOCAB], ValueError, rf"sampled tokens of 'req' must lie in \[0, vocab_size={VOCAB}\)"),
    ("req", [5, -1], ValueError, "got -1"),  # a placeholder is never a sampled token
    ("req", [5] * 6, ValueError, "6 sampled tokens after 3 overflow max_model_len=8"),
])  # fmt: skip
def test_bad_sampled_tokens_are_refused_and_the_row_is_untouched(req_id, tokens, error, word):
    batch, _ = _batch_with_one_request()
    before = _snapshot(batch)
    with pytest.raises(error, match=word):
        batch.append_sampled(req_id, tokens)
    assert _same(before, _snapshot(batch))
