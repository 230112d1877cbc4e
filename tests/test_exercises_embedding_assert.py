"""Chapter 2's checkers: each typical wrong answer gets its own hint, and nothing raises."""

import pytest

from specfix.exercises import embedding_assert as ex
from specfix.exercises.core import use_solutions


@pytest.fixture(autouse=True)
def readers_answers():
    use_solutions(False)


def _hints(check, answer):
    verdict = check(answer)
    assert not verdict.solved
    return verdict.hint_ids


# -- ch2.clamp: each function is a typical wrong preprocess --------------------------------------------------
def clamps_the_metadata_too(input_ids, num_tokens, num_input_tokens, draft_token_ids):
    draft_token_ids.clamp_(min=0)
    return input_ids[:num_input_tokens].clamp_(min=0)


def clamps_only_the_scheduled_tokens(input_ids, num_tokens, num_input_tokens, draft_token_ids):
    input_ids[:num_tokens].clamp_(min=0)
    return input_ids[:num_input_tokens]


@pytest.mark.parametrize(
    "answer,hint",
    [
        (lambda ids, n, n_input, drafts: ids.clamp_(min=0), "shape"),  # the whole buffer
        (clamps_the_metadata_too, "metadata"),
        (lambda ids, n, n_input, drafts: ids[:n_input], "left_negative"),  # forgets to clamp
        (clamps_only_the_scheduled_tokens, "only_scheduled"),
        (lambda ids, n, n_input, drafts: ids[:n_input].zero_(), "changed_real"),  # zeroes everything
        (lambda ids, n, n_input, drafts: ids[:n_input].clamp(min=0), "allocates"),  # a copy
    ],
)
def test_clamp_mistakes_get_their_hint(answer, hint):
    assert _hints(ex.check_clamp, answer) == [hint]


# -- ch2.which_ops ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer,hint",
    [
        ("F.embedding", "not_ops"),
        ({"embedding"}, "not_ops"),
        ({"F.embedding", "torch.index_select", "torch.gather", "w[idx]"}, "wraps"),
        ({"torch.gather"}, "gather_only"),
        ({"F.embedding", "torch.index_select"}, "family_only"),
        ({"torch.index_select", "torch.gather"}, "missed_embedding"),
        ({"F.embedding"}, "incomplete"),
    ],
)
def test_which_ops_mistakes_get_their_hint(answer, hint):
    assert _hints(ex.check_which_ops, answer) == [hint]


def test_gather_only_hint_points_at_the_table_without_naming_the_answer():
    (message,) = [text for _, text in ex.check_which_ops({"torch.gather"}).hints]
    assert not {op for op in ex.ea.OPS if op in message} - {"torch.gather"}, message
    assert "column" in message


def test_which_ops_reads_the_recording():
    assert "vectorized_gather_kernel" in ex.assert_line()
    assert ex.ops_with_minus_one("vectorized_gather_kernel") >= {"F.embedding", "torch.gather"}
    with pytest.raises(LookupError, match="no assert line"):
        ex.assert_line("no_such_kernel")


# -- ch2.first_bad_op ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer,hint",
    [
        (42, "not_a_line"),
        ("written = slot_mapping >= 0", "traceback_line"),
        (
            "hidden = self.model(input_ids, positions, "
            "self.slot_mapping.gpu[:num_input_tokens], self.kv_cache)",
            "not_in_forward",
        ),
        ("probs = (table(row) + ALPHA * probs) / (totals + ALPHA)[:, None]", "other_embedding"),
        ('totals = getattr(self, f"totals_{m}")[row]', "indexing"),
        ("keys = input_ids.long()", "wrong_line"),
    ],
)
def test_first_bad_op_mistakes_get_their_hint(answer, hint):
    assert _hints(ex.check_first_bad_op, answer) == [hint]


def test_wrong_line_hint_names_no_kernel_family():
    # the recorded assert line names vectorized_gather_kernel, which several ops share (section 2)
    (message,) = [text for _, text in ex.check_first_bad_op("keys = input_ids.long()").hints]
    assert "index_select" not in message and "gather" not in message, message


def test_first_bad_op_accepts_the_line_with_its_indentation():
    line = next(code for code in ex.forward_lines() if "embed_tokens" in code)
    assert ex.check_first_bad_op(line).solved
