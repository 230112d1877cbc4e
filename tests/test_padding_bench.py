"""The 50-request reproduction in miniature: identity with the fix, traced corruption without it."""

import pytest

from specfix import Fixes
from specfix.lab.padding_bench import (
    ORIGIN_FRESH,
    count_repeats,
    first_divergence,
    make_requests,
    mark_differences,
    one_step_distribution,
    run_padding_bench,
)
from specfix.models import load_models

KW = dict(max_batch=3, max_num_reqs=4, max_tokens=(8, 14), device="cpu")   # batches of 3 replay size 4


@pytest.fixture(scope="module")
def benches():
    models = load_models("cpu")
    on = run_padding_bench(4, fixes=Fixes(), models=models, **KW)
    off = run_padding_bench(4, fixes=Fixes(pad_idx_mapping=False), models=models, solo=on.solo, **KW)
    return on, off


def test_fixed_batched_equals_solo(benches):
    on, _ = benches
    assert on.differing == []
    assert any(s.num_reqs_padded > len(s.req_ids) for s in on.batched.steps)   # padding really happened
    assert all(s.writes == [] for s in on.batched.steps)


def test_unfixed_corrupts_and_is_traced_to_a_padded_row(benches):
    _, off = benches
    assert off.differing, off.summary()
    req = off.differing[0]
    index, step, writes = off.cause(req)
    record = off.batched.steps[step]
    slot = record.slots[record.req_ids.index(req)]
    assert writes and all(w.slot == slot and w.row >= len(record.req_ids) for w in writes)
    assert any(w.overwritten_cols for w in writes)
    assert off.write_origins()[ORIGIN_FRESH] > 0       # the zeros idx_mapping starts with point at slot 0


@pytest.mark.parametrize("fix", [True, False])
def test_output_distribution(fix):
    result = one_step_distribution(400, fixes=Fixes(pad_idx_mapping=fix), sampler="reference")
    assert result["positions"][0]["passed"] == fix
    assert result["passed"] == fix


def test_helpers():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert count_repeats([4, 4, 5, 5, 5, 6]) == 3
    left, right = mark_differences([0, 1, 2], [0, 1, 1, 2])
    assert "{+" in right and "(dup)" in right and "[-" not in left


def test_bad_input():
    with pytest.raises(ValueError, match="num_requests"):
        make_requests(0)
    with pytest.raises(ValueError, match="sampler"):
        one_step_distribution(10, sampler="gpu")
