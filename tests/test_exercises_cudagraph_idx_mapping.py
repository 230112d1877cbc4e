"""Chapter 3's checkers name each typical wrong answer with its own hint (and never raise)."""

import pytest
import torch

from specfix.exercises import cudagraph_idx_mapping as ex
from specfix.exercises.solutions import cudagraph_idx_mapping as solutions
from specfix.mrv2.cudagraph import CudaGraphDispatcher

# -- ch3.pad_idx_mapping: one mistake each -----------------------------------------------------------------


def _fill_zero(buffer, idx, n):
    buffer[:n] = idx[:n]
    buffer[n:] = 0


def _forgets_padding(buffer, idx, n):
    buffer[:n] = idx[:n]


def _pads_only_up_to_graph(buffer, idx, n):
    buffer[:n] = idx[:n]
    buffer[n : CudaGraphDispatcher(len(buffer)).dispatch(n).num_reqs_padded] = -1


def _new_tensor(buffer, idx, n):
    fresh = torch.full_like(buffer, -1)
    fresh[:n] = idx[:n]
    return fresh


def _rebinds(buffer, idx, n):
    buffer = torch.cat([idx[:n], torch.full((len(buffer) - n,), -1, dtype=buffer.dtype)])  # noqa: F841


def _pads_live_rows(buffer, idx, n):
    buffer[:n] = idx[:n]
    buffer.fill_(-1)


def _shifted(buffer, idx, n):
    buffer[1 : n + 1] = idx[:n]
    buffer[n + 1 :] = -1
    buffer[0] = idx[0]
    buffer[n] = -1


def _pads_with_minus_two(buffer, idx, n):
    buffer[:n] = idx[:n]
    buffer[n:] = -2


def _sorts_input(buffer, idx, n):
    idx[:n] = idx[:n].sort().values
    buffer[:n] = idx[:n]
    buffer[n:] = -1


@pytest.mark.parametrize(
    "answer,hint",
    [
        (_fill_zero, "fill_zero"),
        (_forgets_padding, "stale_tail"),
        (_pads_only_up_to_graph, "stale_tail"),
        (_new_tensor, "new_tensor"),
        (_rebinds, "new_tensor"),
        (_pads_live_rows, "padded_live"),
        (_shifted, "live_rows"),
        (_pads_with_minus_two, "pad_value"),
        (_sorts_input, "changed_input"),
    ],
)
def test_pad_idx_mapping_hints(answer, hint):
    verdict = ex.check_pad_idx_mapping(answer)
    assert not verdict.solved and verdict.hint_ids == [hint], str(verdict)


def test_pad_idx_mapping_names_the_buffer_it_saw():
    verdict = ex.check_pad_idx_mapping(_fill_zero)
    assert "[5, 3, 0, 1, 4, 2, 0, 0]" in str(verdict)


# -- ch3.stale_victims ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer,hint",
    [
        (42, "format"),
        ({"a", "z"}, "unknown"),
        ({"a", "g", "f"}, "finished"),
        ({"g"}, "not_written"),
        ({"a"}, "moved"),
        ({"a", "g", "b"}, "too_many"),
        (set(), "moved"),  # the first padded row that names a live slot is row 6
    ],
)
def test_stale_victims_hints(answer, hint):
    verdict = ex.check_stale_victims(answer)
    assert not verdict.solved and verdict.hint_ids == [hint], str(verdict)


# -- ch3.find_stale_row --------------------------------------------------------------------------------------


def _culprit():
    (found,) = ex._culprits(ex.mystery_batch())
    return found


def test_the_mystery_has_one_culprit_among_padded_rows_that_name_free_slots():
    mystery = ex.mystery_batch()
    n = len(mystery.batch)
    padded = mystery.spec.dispatcher.dispatch(n).num_reqs_padded
    stale = mystery.spec.idx_mapping[n:padded].tolist()
    assert len(ex._culprits(mystery)) == 1
    assert sum(mystery.states.owner(s) is None for s in stale) >= 1  # distractors: writes into free slots


@pytest.mark.parametrize(
    "make,hint",
    [
        (lambda row, slot: "row 5", "format"),
        (lambda row, slot: (row, float(slot)), "format"),
        (lambda row, slot: (slot, row), "swapped"),
        (lambda row, slot: (0, slot), "live_row"),
        (lambda row, slot: (8, slot), "beyond_graph"),
        (lambda row, slot: (row, slot + 1), "not_there"),
        (lambda row, slot: (7, 0), "free_slot"),
    ],
)
def test_find_stale_row_hints(make, hint):
    row, slot = _culprit()
    assert (7, 0) != (row, slot) and (slot, row) != (row, slot)  # the wrong answers really are wrong
    verdict = ex.check_find_stale_row(lambda mystery: make(row, slot))
    assert not verdict.solved and verdict.hint_ids == [hint], str(verdict)


# -- ch3.corrupted_responses: every hint earned, lazy answers refused, the cases fit -----------------------


#: What the padded writes of each case did, worked out before any answer runs (an answer may not play the
#: speculator itself).
KINDS = {events: ex._write_kinds(events) for events in ex._RESPONSE_CASES}


def _plus(kind, *but):
    """The reference answer plus the requests of one kind of harmless write (each kind's own mistake), less
    those of the kinds ``but`` (a request can be hit twice, for two reasons)."""

    def answer(events, m):
        kinds = KINDS[tuple(events)]
        return solutions.corrupted_responses(events, m) | kinds[kind].difference(*(kinds[b] for b in but))

    return answer


@pytest.mark.parametrize(
    "answer,hint",
    [
        (lambda e, m: 3, "format"),
        (lambda e, m: {"z"}, "unknown"),
        (_plus("finished"), "finished"),
        (_plus("undrafted"), "undrafted"),
        (_plus("unread", "finished", "undrafted"), "unread"),
        (lambda e, m: solutions.corrupted_responses(e, m) - KINDS[tuple(e)]["earlier"], "earlier"),
        (lambda e, m: solutions.corrupted_responses(e, m) & KINDS[tuple(e)]["earlier"], "missed"),
        (lambda e, m: solutions.corrupted_responses(e, m) | {"d"}, "too_many"),  # d: never named by a row
    ],
)
def test_corrupted_responses_names_each_mistake(answer, hint):
    verdict = ex.check_corrupted_responses(answer)
    assert verdict.hint_ids == [hint], str(verdict)


@pytest.mark.parametrize(
    "answer",
    [
        lambda e, m: {"g"},  # the chapter's answer, read off its run
        lambda e, m: {n for event in e for n in event.split()[1]},  # every request
        lambda e, m: e,  # the input echoed
    ],
)
def test_corrupted_responses_refuses_lazy_answers(answer):
    verdict = ex.check_corrupted_responses(answer)
    assert not verdict.solved and verdict.hints and verdict.hint_ids != ["raised"], str(verdict)


def test_corrupted_responses_refuses_running_the_engine():
    verdict = ex.check_corrupted_responses(lambda e, m: set(ex.run_schedule(e, ex.UNFIXED)))
    assert verdict.hint_ids == ["bypass"]


def _corrupted(events):
    """The requests whose response the unfixed engine changes: two real runs, fix on and fix off."""
    fixed, broken = ex.run_schedule(events, ex.Fixes()), ex.run_schedule(events, ex.UNFIXED)
    return {n for n in fixed if fixed[n] != broken[n]}


def test_corrupted_responses_cases_fit_and_hold_every_trap():
    cases = ex._RESPONSE_CASES
    assert len(cases) >= 4 and cases[0] == ex.RESPONSE_EVENTS
    kinds = [KINDS[events] for events in cases]
    for events, kind in zip(cases, kinds, strict=True):  # real runs, fix off against fix on
        assert kind["victim"] == _corrupted(events) != set(), events
    for kind in ("finished", "undrafted", "unread", "earlier"):
        assert any(k[kind] for k in kinds), kind
    assert len(set(cases)) == len(cases)


def test_corrupted_responses_victims_wait_out_the_step_that_overwrites_them():
    for events in ex._RESPONSE_CASES:
        for i, write in ex.padded_writes(events):
            assert write.victim is None or write.victim not in events[i].split()[1], (events, i, write)
