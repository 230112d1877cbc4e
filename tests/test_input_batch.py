"""InputBatch: drafts, placeholders included, land verbatim in token_ids_cpu and spec_token_ids."""

import pytest

from specfix.v1.input_batch import CachedRequestState, InputBatch
from specfix.v1.scheduler import SamplingParams


def _batch_with_one_request():
    """The source document's set-up: max 1 request, max model length 8; prompt [10, 11], output [12],
    3 computed tokens."""
    batch = InputBatch(max_num_reqs=1, max_model_len=8)
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
    batch = InputBatch(max_num_reqs=2, max_model_len=8)
    for name in "ab":
        batch.add_request(CachedRequestState(name, [1, 2], SamplingParams(), None))
    assert batch.remove_request("a") == 0
    assert batch.add_request(CachedRequestState("c", [3], SamplingParams(), None)) == 0
    assert batch.req_id_to_index == {"c": 0, "b": 1}
    with pytest.raises(ValueError, match="full"):
        batch.add_request(CachedRequestState("d", [3], SamplingParams(), None))
