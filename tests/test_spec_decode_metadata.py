"""SpecDecodeMetadata: layout identities, placeholders kept verbatim, bad input refused."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfix.v1.spec_decode_metadata import SpecDecodeMetadata


def test_make_dummy_matches_the_worked_example_layout():
    # Worked example 1 of the contracts, compact rows: k = [3, 0, 2, 0, 1].
    md = SpecDecodeMetadata.make_dummy([[1, 2, 3], [], [4, 5], [], [6]])
    assert md.num_draft_tokens == [3, 0, 2, 0, 1]
    assert md.max_spec_len == 3
    assert md.draft_token_ids.dtype == torch.int32
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert md.logits_indices.tolist() == list(range(11))


def test_placeholders_are_kept_verbatim():
    # Worked example 2: a padded first decode, an ordinary decode, a request without drafts.
    md = SpecDecodeMetadata.make_dummy([[-1, -1, -1], [11, 12, 13], []])
    assert md.draft_token_ids.tolist() == [-1, -1, -1, 11, 12, 13]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 4, 5, 6]
    assert md.bonus_logits_indices.tolist() == [3, 7, 8]
    assert md.cu_num_draft_tokens.tolist() == [3, 6, 6]


def test_max_spec_len_is_zero_without_drafts():
    md = SpecDecodeMetadata.make_dummy([[], []])
    assert md.max_spec_len == 0
    assert md.draft_token_ids.numel() == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_each_request_owns_its_target_rows_then_its_bonus_row(ks):
    md = SpecDecodeMetadata.make_dummy([[7] * k for k in ks])
    target = md.target_logits_indices.tolist()
    bonus = md.bonus_logits_indices.tolist()
    assert sorted(target + bonus) == list(range(sum(ks) + len(ks)))
    start = 0
    for i, k in enumerate(ks):
        rows = target[start : start + k]
        assert rows == list(range(bonus[i] - k, bonus[i]))
        start += k
    assert md.max_spec_len == max(ks)


def _fields(**overrides):
    base = SpecDecodeMetadata.make_dummy([[1, 2], [3]])
    fields = {
        name: getattr(base, name)
        for name in (
            "draft_token_ids",
            "num_draft_tokens",
            "cu_num_draft_tokens",
            "cu_num_sampled_tokens",
            "target_logits_indices",
            "bonus_logits_indices",
            "logits_indices",
        )
    }
    fields.update(overrides)
    return fields


def test_accepts_its_own_fields():
    md = SpecDecodeMetadata(**_fields())
    assert md.max_spec_len == 2


@pytest.mark.parametrize(
    "overrides, error, word",
    [
        ({"draft_token_ids": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "draft_token_ids"),
        ({"draft_token_ids": torch.tensor([1, 2, 3], dtype=torch.uint8)}, TypeError, "draft_token_ids"),
        ({"draft_token_ids": torch.tensor([1, 2], dtype=torch.int32)}, ValueError, "draft_token_ids"),
        ({"draft_token_ids": [1, 2, 3]}, TypeError, "draft_token_ids"),
        ({"num_draft_tokens": [2.0, 1]}, TypeError, "num_draft_tokens"),
        ({"num_draft_tokens": [3, 0]}, ValueError, "cu_num_draft_tokens"),
        ({"num_draft_tokens": [2, 1, 0]}, ValueError, "cu_num_draft_tokens"),
        ({"cu_num_draft_tokens": torch.tensor([2, 2], dtype=torch.int32)}, ValueError, "cu_num_draft_tokens"),
        ({"cu_num_sampled_tokens": torch.tensor([2, 4], dtype=torch.int32)}, ValueError, "cu_num_sampled"),
        ({"target_logits_indices": torch.tensor([0, 1], dtype=torch.int32)}, ValueError, "target_logits"),
        ({"bonus_logits_indices": torch.tensor([2], dtype=torch.int32)}, ValueError, "bonus_logits"),
        ({"logits_indices": torch.arange(4, dtype=torch.int32)}, ValueError, "logits_indices"),
        ({"logits_indices": torch.arange(5.0)}, TypeError, "logits_indices"),
    ],
)
def test_bad_fields_are_refused_by_name(overrides, error, word):
    with pytest.raises(error, match=word):
        SpecDecodeMetadata(**_fields(**overrides))


def test_negative_draft_count_and_empty_batch_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        SpecDecodeMetadata(**_fields(num_draft_tokens=[-1, 4]))
    with pytest.raises(ValueError, match="empty"):
        SpecDecodeMetadata.make_dummy([])
    with pytest.raises(TypeError, match="ints"):
        SpecDecodeMetadata.make_dummy([[1.5]])
    with pytest.raises(ValueError, match=r"token ids or -1 \(a placeholder\), got \[3, -2\]"):
        SpecDecodeMetadata.make_dummy([[3], [-2]])


def test_a_field_set_after_building_is_checked_as_when_built():
    """RejectionSampler.forward trusts the checks made at build time, so a later change cannot bypass them:
    a 2-column max_spec_len for k = 3 drafts would make the kernel write the bonus past its table."""
    md = SpecDecodeMetadata.make_dummy([[5, 6, 7], [8]])
    for name in ("max_spec_len", "num_draft_tokens"):
        with pytest.raises(AttributeError, match=name):
            setattr(md, name, 1)
    with pytest.raises(ValueError, match="draft_token_ids"):
        md.draft_token_ids = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32)  # 5 entries for 4 drafts
    with pytest.raises(ValueError, match="cu_num_draft_tokens"):
        md.cu_num_draft_tokens = torch.tensor([3], dtype=torch.int32)  # one entry for two requests
    assert md.max_spec_len == 3 and md.draft_token_ids.tolist() == [5, 6, 7, 8]  # nothing half-updated
    md.draft_token_ids = torch.tensor([1, 2, 3, 4], dtype=torch.int32)  # the right length is accepted
    assert md.draft_token_ids.tolist() == [1, 2, 3, 4]
