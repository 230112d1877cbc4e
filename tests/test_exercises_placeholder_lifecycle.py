"""Chapter 1's checkers name each typical wrong answer with its own hint (and never raise)."""

import pytest
import torch

from specfix.exercises import placeholder_lifecycle as ex
from specfix.exercises.solutions import placeholder_lifecycle as solutions

# -- ch1.metadata -----------------------------------------------------------------------------------------

RIGHT = solutions.metadata_answer()


@pytest.mark.parametrize(
    "change,hint",
    [
        ({"num_draft_tokens": [3, 0, 0, 1]}, "placeholders_not_counted"),  # only the real drafts
        ({"num_draft_tokens": [3, 3, 3]}, "missing_request"),  # the prefill left out
        ({"num_draft_tokens": [3, 0, 3, 2]}, "num_draft_tokens"),
        ({"cu_num_draft_tokens": [0, 3, 3, 6]}, "exclusive_cumsum"),  # a leading 0, the last sum dropped
        ({"cu_num_draft_tokens": [0, 3, 3, 6, 9]}, "exclusive_cumsum"),  # a leading 0
        ({"cu_num_draft_tokens": [3, 0, 3, 3]}, "cu_num_draft_tokens"),  # the counts again
        ({"placeholder_indices": [11, 12, 13, 16, 17]}, "input_ids_positions"),  # positions in input_ids
        ({"placeholder_indices": [3, 4, 5]}, "placeholder_indices"),  # d's grammar tail forgotten
        ({"placeholder_indices": "3 4 5 7 8"}, "format"),
    ],
)
def test_metadata_names_each_mistake(change, hint):
    verdict = ex.check_metadata({**RIGHT, **change})
    assert verdict.hint_ids == [hint], str(verdict)


def test_metadata_needs_all_three_keys():
    answer = {key: value for key, value in RIGHT.items() if key != "cu_num_draft_tokens"}
    assert ex.check_metadata(answer).hint_ids == ["format"]


def test_metadata_accepts_the_value_or_a_function_returning_it():
    assert ex.check_metadata(RIGHT).solved
    assert ex.check_metadata(lambda: RIGHT).solved


def test_metadata_with_blanks_left_is_not_yet_answered():
    assert ex.check_metadata({**RIGHT, "placeholder_indices": ...}).hint_ids == ["todo"]


def test_metadata_truth_is_what_the_runner_builds():
    truth = ex._metadata_truth()
    drafts = [t for *_, d in ex.METADATA_BATCH for t in d]  # flattened in batch order
    assert truth["placeholder_indices"] == [i for i, t in enumerate(drafts) if t == -1]
    assert truth["num_draft_tokens"] == [len(d) for *_, d in ex.METADATA_BATCH]


# -- ch1.zero_accepts -------------------------------------------------------------------------------------


def test_zero_batch_truth_counts_the_prompts_whose_next_word_is_the():
    step = ex.run_zero_batch()
    accepted = sum(len(t) - 1 for t in step.sampled_token_ids)
    assert accepted == sum(words[0] == "the" for words in ex.zero_batch_continuations())
    assert accepted == solutions.zero_accepts


@pytest.mark.parametrize(
    "answer,hint",
    [
        (0, "none"),
        (len(ex.ZERO_BATCH) * 3, "count"),  # every slot
        (1, "count"),
        ("2", "type"),
        (2.0, "type"),
    ],
)
def test_zero_accepts_names_each_mistake(answer, hint):
    verdict = ex.check_zero_accepts(answer)
    assert verdict.hint_ids == [hint], str(verdict)


def test_zero_accepts_names_counting_every_the():
    every_the = sum(words.count("the") for words in ex.zero_batch_continuations())
    assert every_the > solutions.zero_accepts, "the batch must hold a 'the' that is not the next word"
    assert ex.check_zero_accepts(every_the).hint_ids == ["every_the"]


# -- ch1.reject_negative ----------------------------------------------------------------------------------


def _ratio_test(p, q, u):
    return (q > 0) & ((p / torch.where(q > 0, q, torch.ones_like(q))).double() >= u)


def _at(table, columns):
    """Each slot's entry in ``columns``, read with a plain index (which wraps a -1 to the last column)."""
    return table[torch.arange(columns.numel()), columns]


def _wraps(draft_ids, p, q, u):  # indexes with the -1 itself: torch wraps it to the last column
    return _ratio_test(_at(p, draft_ids), _at(q, draft_ids), u)


def _clamp_only(draft_ids, p, q, u):  # a safe column, but the slot is never rejected
    column = draft_ids.clamp(min=0)
    return _ratio_test(_at(p, column), _at(q, column), u)


def _gathers_minus_one(draft_ids, p, q, u):
    return _ratio_test(p.gather(1, draft_ids[:, None])[:, 0], q.gather(1, draft_ids[:, None])[:, 0], u)


def _divides_by_zero_q(draft_ids, p, q, u):
    column = draft_ids.clamp(min=0)
    return (draft_ids >= 0) & ((_at(p, column) / _at(q, column)).double() >= u)


def _ignores_q(draft_ids, p, q, u):
    column = draft_ids.clamp(min=0)
    return (draft_ids >= 0) & (_at(q, column) > 0) & (_at(p, column).double() >= u)


def _clamps_in_place(draft_ids, p, q, u):
    real = draft_ids >= 0
    draft_ids.clamp_(min=0)  # the caller's -1 is gone
    return real & _ratio_test(_at(p, draft_ids), _at(q, draft_ids), u)


def _returns_a_list(draft_ids, p, q, u):
    return solutions.accept_drafts(draft_ids, p, q, u).tolist()


def _tuned_to_six_slots(draft_ids, p, q, u):  # right on the crafted slots, wrong past them
    accepted = solutions.accept_drafts(draft_ids, p, q, u)
    return accepted & (torch.arange(draft_ids.numel()) < 6)


@pytest.mark.parametrize(
    "answer,hint",
    [
        (_wraps, "wrapped"),
        (lambda d, p, q, u: (d >= 0) & _wraps(d, p, q, u), "wrapped"),  # the -1's read, masked afterwards
        (_clamp_only, "clamp_only"),
        (_gathers_minus_one, "gather_negative"),
        (_divides_by_zero_q, "q_zero"),
        (_ignores_q, "ratio"),
        (_clamps_in_place, "mutated"),
        (_returns_a_list, "shape"),
        (_tuned_to_six_slots, "mismatch"),
    ],
)
def test_reject_negative_names_each_mistake(answer, hint):
    verdict = ex.check_reject_negative(answer)
    assert verdict.hint_ids == [hint], str(verdict)


def _calls_the_kernels_twin(draft_ids, p, q, u):
    from specfix.v1.rejection_kernels import rejection_random_sample

    n = draft_ids.numel()
    out, cu = torch.full((n, 2), -1, dtype=torch.int32), torch.arange(1, n + 1, dtype=torch.int32)
    bonus, recovered = torch.zeros(n, dtype=torch.int32), torch.full((n,), -2)
    rejection_random_sample(out, cu, draft_ids, q, p, bonus, recovered, u, None, 1, backend="torch")
    return out[:, 0] != -2


@pytest.mark.parametrize(
    "answer",
    [
        ex.expected_acceptance,  # accept_drafts = ex.expected_acceptance: the checker's own truth
        lambda d, p, q, u: ex.expected_acceptance(d, p, q, u),
        _calls_the_kernels_twin,
    ],
)
def test_reject_negative_refuses_an_answer_that_calls_specfixs_sampler(answer):
    verdict = ex.check_reject_negative(answer)
    assert verdict.hint_ids == ["bypass"], str(verdict)
    assert "rejection_random_sample" in str(verdict)  # the hint names what was called: true for each
    assert ex.check_reject_negative(solutions.accept_drafts).solved  # the refusal is undone after the check


def test_reject_negative_reports_other_errors_without_raising():
    def broken(draft_ids, p, q, u):
        raise KeyError("oops")

    assert ex.check_reject_negative(broken).hint_ids == ["raised"]


def test_the_crafted_minus_one_slots_tempt_both_naive_reads():
    """Slot 2's column 0 and slot 3's last column pass the ratio test, so each naive read accepts a -1."""
    drafts, p, q, u = ex._crafted_rows()
    assert drafts[2] == drafts[3] == -1
    assert _ratio_test(p[2, 0], q[2, 0], u[2]) and _ratio_test(p[3, -1], q[3, -1], u[3])
    assert not ex.expected_acceptance(drafts, p, q, u)[2:4].any()


# -- ch1.draft_ids: one mistake each, lazy answers, any container ----------------------------------------


def _slice_of_first_request(input_ids, rows, targets):  # right ids on a one-request step, but a view
    start = int(rows[0]) + 1
    return input_ids[start : start + len(targets)]


def _calls_the_runner(input_ids, rows, targets):
    from specfix.v1.model_runner import GPUModelRunner

    return GPUModelRunner._calc_spec_decode_metadata(None, [len(targets)], [len(rows)]).draft_token_ids


@pytest.mark.parametrize(
    "answer,hint",
    [
        (lambda ids, rows, targets: ids[rows.long()][targets.long() + 1][None], "format"),  # 2-D
        (lambda ids, rows, targets: "17 -1 -1", "format"),
        (lambda ids, rows, targets: ids.clamp_(min=0)[rows.long()][targets.long() + 1], "mutated"),
        (lambda ids, rows, targets: torch.tensor([-1, -1, -1]), "constant"),  # the printed value
        (lambda ids, rows, targets: [17, -1, -1], "constant"),  # the first step's
        (lambda ids, rows, targets: ids, "echo"),  # the input echoed
        (lambda ids, rows, targets: ids[: int(rows[-1]) + 1][rows[0] :], "logits_rows"),  # first step: rows
        (lambda ids, rows, targets: ids[rows.long()], "logits_rows"),
        (lambda ids, rows, targets: ids[rows.long()][targets.long()], "unshifted"),
        (lambda ids, rows, targets: ids[targets.long() + 1], "positions"),
        (_slice_of_first_request, "view"),
        (lambda ids, rows, targets: ids.numpy()[int(rows[0]) + 1 : int(rows[0]) + 1 + len(targets)], "view"),
        (lambda ids, rows, targets: ids[rows.long()][targets.long() + 1][:-1], "length"),
        (lambda ids, rows, targets: ids[rows.long()][targets.long() + 1] + 1, "wrong"),
        (_calls_the_runner, "bypass"),
    ],
)
def test_draft_ids_names_each_mistake(answer, hint):
    verdict = ex.check_draft_ids(answer)
    assert verdict.hint_ids == [hint], str(verdict)


def test_draft_ids_hints_never_print_the_ids_to_return():
    for answer in (
        lambda ids, rows, targets: ids[rows.long()][targets.long() + 1] + 1,
        lambda ids, rows, targets: ids[targets.long() + 1],
    ):
        text = str(ex.check_draft_ids(answer))
        assert "[17, -1, -1]" not in text and "17, 4, 9, -1" not in text


def test_draft_ids_accepts_one_gather_and_int32_indices():
    assert ex.check_draft_ids(lambda ids, rows, targets: ids[rows[targets.long() + 1].long()]).solved
    assert ex.check_draft_ids(lambda ids, rows, targets: ids[rows][targets + 1]).solved


def test_draft_ids_steps_are_the_runners_and_a_seeded_family_the_chapter_never_prints():
    batches = ex._draft_ids_batches()
    assert len(batches) >= 5 and ex._draft_ids_batches(seed=1)[2:] != batches[2:]
    for batch in batches:
        runner, _, metadata = ex._prepared(batch)
        drafts = [t for *_, d in batch for t in d]  # what the scheduler sent, in batch order
        assert metadata.draft_token_ids.tolist() == drafts
        assert -1 in drafts and any(t >= 0 for t in drafts)
    assert len(batches[0]) == 1  # one request: a slice gives the right ids, so the view is what fails


def test_clamp_point_hints_ask_without_giving_the_answer():
    hints = ex.check_clamp_point.hints
    for point in ex.CLAMP_POINTS:  # a question to follow, not the value the sampler gets
        assert hints[point].endswith("?"), hints[point]
        assert not any(said in hints[point] for said in ("copies the 0", "cannot reach", "keeps its -1"))
