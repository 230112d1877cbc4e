"""Chapter 4's checkers name each typical wrong answer with its own hint (and never raise)."""

import pytest
import torch

from specfix import Fixes, runtime
from specfix.exercises import masked_gumbel_sampling as ex
from specfix.exercises.solutions import masked_gumbel_sampling as sol
from specfix.lab import masked_gumbel
from specfix.runtime import tl, triton

# -- ch4.mask_kernel: kernels with one mistake each --------------------------------------------------------


@triton.jit
def _scale(
    logits_ptr,
    idx_mapping_ptr,
    temperature_ptr,
    out_ptr,
    row_temp_ptr,
    vocab_size,
    BLOCK: tl.constexpr,
    MASK_LOAD: tl.constexpr,
    MASK_STORE: tl.constexpr,
    STRICT: tl.constexpr,
    OTHER: tl.constexpr,
    SCALAR_STORE_MASK: tl.constexpr,
    ALWAYS_DIVIDE: tl.constexpr,
):
    row = tl.program_id(0)
    req_state_idx = tl.load(idx_mapping_ptr + row).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    if STRICT:
        valid = offs * 0 + req_state_idx > 0
    else:
        valid = offs * 0 + req_state_idx >= 0
    if MASK_LOAD:
        if STRICT:
            temp = tl.load(temperature_ptr + req_state_idx, mask=req_state_idx > 0, other=OTHER)
        else:
            temp = tl.load(temperature_ptr + req_state_idx, mask=req_state_idx >= 0, other=OTHER)
    else:
        temp = tl.load(temperature_ptr + req_state_idx)
    tl.store(row_temp_ptr + row, temp)
    x = tl.load(logits_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
    if ALWAYS_DIVIDE:
        x = x / temp
    elif temp != 0.0:
        x = x / temp
    if SCALAR_STORE_MASK:
        scalar_valid = req_state_idx >= 0
        tl.store(out_ptr + req_state_idx * vocab_size + offs, x, mask=(offs < vocab_size) & scalar_valid)
    elif MASK_STORE:
        tl.store(out_ptr + req_state_idx * vocab_size + offs, x, mask=(offs < vocab_size) & valid)
    else:
        tl.store(out_ptr + req_state_idx * vocab_size + offs, x, mask=offs < vocab_size)


def _variant(
    mask_load=True, mask_store=True, strict=False, other=0.0, scalar_store_mask=False, always_divide=False
):
    class Variant:
        """Launches ``_scale`` with one mistake switched on, as a reader's kernel would be launched."""

        fn = _scale.fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                _scale[grid](
                    *args,
                    **kwargs,
                    MASK_LOAD=mask_load,
                    MASK_STORE=mask_store,
                    STRICT=strict,
                    OTHER=other,
                    SCALAR_STORE_MASK=scalar_store_mask,
                    ALWAYS_DIVIDE=always_divide,
                )

            return launch

    return Variant()


@pytest.mark.parametrize(
    "wrong,hint",
    [
        (dict(mask_load=False, mask_store=False), "no_mask"),
        (dict(mask_load=False), "load_unmasked"),
        (dict(mask_store=False), "store_unmasked"),
        (dict(strict=True), "skips_slot_0"),
        (dict(other=1.0), "other_not_zero"),
        (dict(always_divide=True), "wrong_values"),
    ],
)
def test_mask_kernel_names_each_mistake(wrong, hint):
    verdict = ex.check_mask_kernel(_variant(**wrong))
    assert verdict.hint_ids == [hint], str(verdict)


def test_the_variant_kernel_with_no_mistake_is_accepted():
    """The mistakes above come from switches on one kernel; with every switch right it must pass."""
    assert ex.check_mask_kernel(_variant()).solved


@pytest.mark.skipif(not runtime.INTERPRET, reason="the compiled kernel accepts a scalar in a mask")
def test_mask_kernel_explains_the_interpreters_scalar_mask():
    verdict = ex.check_mask_kernel(_variant(scalar_store_mask=True))
    assert verdict.hint_ids == ["scalar_mask"], str(verdict)


def test_mask_kernel_wants_a_kernel():
    verdict = ex.check_mask_kernel(lambda: 42)
    assert verdict.hint_ids == ["not_a_kernel"], str(verdict)


def test_the_reference_kernel_is_built_by_the_solution():
    assert ex.check_mask_kernel(sol.scale_rows_kernel).solved
    assert ex.check_mask_kernel(sol.scale_rows_kernel()).solved


# -- ch4.padded_token -------------------------------------------------------------------------------------


def _unmasked_padded_token():
    step = masked_gumbel.padded_drafter_step()
    tokens, _ = masked_gumbel.run_drafter_step(step, Fixes(mask_invalid_reqs=False), device=runtime.DEVICE)
    return int(tokens[4])


@pytest.mark.parametrize(
    "answer,hint",
    [
        (-1, "minus_one"),
        ("40", "not_an_int"),
        (torch.tensor(3.0), "not_an_int"),
        (True, "not_an_int"),
    ],
)
def test_padded_token_names_each_mistake(answer, hint):
    verdict = ex.check_padded_token(answer)
    assert verdict.hint_ids == [hint], str(verdict)


def test_padded_token_recognises_the_unmasked_draw():
    unmasked = _unmasked_padded_token()
    assert unmasked != sol.padded_token, "the example must tell the two kernels apart"
    assert ex.check_padded_token(unmasked).hint_ids == ["guard_draw"]


def test_padded_token_wants_the_greedy_token():
    verdict = ex.check_padded_token(sol.padded_token + 1)
    assert verdict.hint_ids == ["not_greedy"], str(verdict)
    assert ex.check_padded_token(torch.tensor(sol.padded_token)).solved
    assert ex.check_padded_token(lambda: sol.padded_token).solved  # a function that returns the answer


# -- ch4.find_overwritten ---------------------------------------------------------------------------------


def _divided(table, col, logits, idx_mapping, temperature):
    """vLLM 0.25's convention: the cache holds logits / T (raw logits when greedy)."""
    return sorted(
        slot
        for row, slot in enumerate(idx_mapping.tolist())
        if not torch.equal(
            table[slot, col], logits[row] / temperature[slot] if temperature[slot] != 0 else logits[row]
        )
    )


def _greedy_slot(idx_mapping, temperature, **_):
    return next(s for s in idx_mapping.tolist() if temperature[s] == 0)


WRONG_FINDERS = {
    "not_a_list": lambda **p: "slot 3",
    "all_flagged": lambda table, col, logits, idx_mapping, temperature: sorted(idx_mapping.tolist()),
    "divided": _divided,
    "rows_not_slots": lambda **p: [p["idx_mapping"].tolist().index(s) for s in sol.find_overwritten(**p)],
    "not_live": lambda **p: sorted(
        sol.find_overwritten(**p) + [next(s for s in range(8) if s not in p["idx_mapping"].tolist())]
    ),
    "own_logits": lambda **p: sorted(sol.find_overwritten(**p) + [_greedy_slot(**p)]),
    "missed": lambda **p: [],
}


@pytest.mark.parametrize("hint", sorted(WRONG_FINDERS))
def test_find_overwritten_names_each_mistake(hint):
    verdict = ex.check_find_overwritten(WRONG_FINDERS[hint])
    assert verdict.hint_ids == [hint], str(verdict)


def test_find_overwritten_reports_a_crash_as_feedback():
    verdict = ex.check_find_overwritten(lambda **p: p["table"][99])
    assert verdict.hint_ids == ["raised"] and "IndexError" in str(verdict)
