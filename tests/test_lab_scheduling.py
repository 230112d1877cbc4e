"""Chapter 1's scheduling experiments: the workloads, where the clamp-less run crashes, bad input."""

import pytest

from specfix.lab import scheduling as lab
from specfix.v1.engine import generate


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_prefilled_request_crashes_the_first_step_without_the_clamp(async_scheduling):
    assert lab.first_crash("decode node", async_scheduling) == 0


def test_the_tight_budget_crashes_only_in_async_mode_where_the_waiting_request_returns():
    assert lab.first_crash("tight budget", async_scheduling=False) is None
    kinds = lab.slot_kinds(lab.run("tight budget", True))
    first = min(row.index(lab.REACHES_EMBEDDING) for row in kinds.values() if lab.REACHES_EMBEDDING in row)
    assert lab.first_crash("tight budget", async_scheduling=True) == first > 0


def test_both_modes_write_the_same_text():
    """The statistics agree too, except where async verified placeholders that sync verified as drafts:
    the waiting request's return, whose three slots stay -1 (nothing drafted for them)."""
    runs = {(name, a): lab.run(name, a) for name in lab.WORKLOADS for a in (False, True)}
    for name in lab.WORKLOADS:
        sync, asyn = runs[name, False], runs[name, True]
        assert [o.token_ids for o in sync.outputs] == [o.token_ids for o in asyn.outputs]
    assert runs["decode node", False].stats == runs["decode node", True].stats
    sync, asyn = runs["tight budget", False].stats, runs["tight budget", True].stats
    assert (sync.num_placeholder_slots, asyn.num_placeholder_slots) == (0, 3)
    assert asyn.num_placeholders_accepted == 0


def test_only_async_scheduling_runs_steps_for_requests_already_finished():
    for name in lab.WORKLOADS:
        sync, asyn = (lab.run(name, a) for a in (False, True))
        assert lab.wasted_steps(sync) == 0
        waste = lab.wasted_steps(asyn)
        slots = [lab.placeholder_counts(r)["draft slots verified"] for r in (sync, asyn)]
        assert waste > 0 and slots[1] - slots[0] >= 3 * waste  # each such step verified k = 3 slots


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"workload must be one of \[.*\], got 'x'"):
        lab.run("x", False)
    with pytest.raises(TypeError, match="result must be a GenerateResult, got list"):
        lab.slot_kinds([])
    with pytest.raises(ValueError, match="result has no trace"):
        lab.slot_kinds(generate(["the mice"], max_steps=1))
