"""Chapter 4's checkers name each typical wrong answer with its own hint (and never raise)."""

import pytest
import torch

from specfix import Fixes, runtime
from specfix.exercises import masked_gumbel_sampling as ex
from specfix.exercises.solutions import masked_gumbel_sampling as sol
from specfix.lab import masked_gumbel
from specfix.runtime import tl, triton

# -- ch4.mask_kernel and ch4.mask_seed: kernels with one switchable mistake each ------------------------


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
    FIRST_SLOT: tl.constexpr,  # 1: the `> 0` slip, which skips slot 0
    OTHER: tl.constexpr,
    SCALAR_STORE_MASK: tl.constexpr,
    ALWAYS_DIVIDE: tl.constexpr,
    CLAMP: tl.constexpr,
):
    row = tl.program_id(0)
    req_state_idx = tl.load(idx_mapping_ptr + row).to(tl.int64)
    if CLAMP:  # padded rows become slot 0's
        req_state_idx = tl.maximum(req_state_idx, 0)
    offs = tl.arange(0, BLOCK)
    valid = offs * 0 + req_state_idx >= FIRST_SLOT
    if MASK_LOAD:
        temp = tl.load(temperature_ptr + req_state_idx, mask=req_state_idx >= FIRST_SLOT, other=OTHER)
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


@triton.jit
def _noise(
    logits_ptr,
    idx_mapping_ptr,
    temperature_ptr,
    seeds_ptr,
    out_ptr,
    row_seed_ptr,
    vocab_size,
    BLOCK: tl.constexpr,
    MASK_SEED: tl.constexpr,
    MASK_TEMP: tl.constexpr,
    BY_ROW: tl.constexpr,
    SCALE: tl.constexpr,
    SCALAR_MASK: tl.constexpr,
):
    row = tl.program_id(0)
    req_state_idx = tl.load(idx_mapping_ptr + row).to(tl.int64)
    is_valid_req = req_state_idx >= 0
    if MASK_TEMP:
        temp = tl.load(temperature_ptr + req_state_idx, mask=is_valid_req, other=0.0)
    else:
        temp = tl.load(temperature_ptr + req_state_idx)
    where = row if BY_ROW else req_state_idx
    if MASK_SEED:
        seed = tl.load(seeds_ptr + where, mask=is_valid_req, other=0)
    else:
        seed = tl.load(seeds_ptr + where)
    tl.store(row_seed_ptr + row, seed)
    offs = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
    if temp != 0.0:
        x = x / temp - SCALE * tl.log(-tl.log(tl.rand(seed, offs)))
    if SCALAR_MASK:
        tl.store(out_ptr + row * vocab_size + offs, x, mask=(offs < vocab_size) & is_valid_req)
    else:
        tl.store(out_ptr + row * vocab_size + offs, x, mask=offs < vocab_size)


def switched(kernel, **switches):
    """``kernel`` with its constexpr switches set, launched as a reader's kernel is launched."""

    class Switched:
        fn = kernel.fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: kernel[grid](*args, **kwargs, **switches)

    return Switched()


#: Each kernel exercise's switchable kernel, and its switches with no mistake.
RIGHT = {
    "ch4.mask_kernel": (
        _scale,
        dict(
            MASK_LOAD=True,
            MASK_STORE=True,
            FIRST_SLOT=0,
            OTHER=0.0,
            SCALAR_STORE_MASK=False,
            ALWAYS_DIVIDE=False,
            CLAMP=False,
        ),
    ),
    "ch4.mask_seed": (
        _noise,
        dict(MASK_SEED=True, MASK_TEMP=True, BY_ROW=False, SCALE=1.0, SCALAR_MASK=False),
    ),
}


def _variant(check, **wrong):
    kernel, right = RIGHT[check.exercise]
    return switched(kernel, **{**right, **wrong})


#: The interpreter refuses a scalar in a mask; a compiled kernel accepts it.
_INTERPRETER_ONLY = pytest.mark.skipif(not runtime.INTERPRET, reason="the compiled kernel accepts it")


@pytest.mark.parametrize(
    "check,wrong,hint",
    [
        (ex.check_mask_kernel, dict(MASK_LOAD=False, MASK_STORE=False), "no_mask"),
        (ex.check_mask_kernel, dict(MASK_LOAD=False), "load_unmasked"),
        (ex.check_mask_kernel, dict(MASK_STORE=False), "store_unmasked"),
        (ex.check_mask_kernel, dict(FIRST_SLOT=1), "skips_slot_0"),
        (ex.check_mask_kernel, dict(MASK_LOAD=False, MASK_STORE=False, CLAMP=True), "padded_wrote_live"),
        (ex.check_mask_kernel, dict(OTHER=1.0), "other_not_zero"),
        pytest.param(  # the mistake divides the padded rows' zero temperature: numpy warns, as it should
            ex.check_mask_kernel,
            dict(ALWAYS_DIVIDE=True),
            "wrong_values",
            marks=pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning"),
        ),
        pytest.param(
            ex.check_mask_kernel, dict(SCALAR_STORE_MASK=True), "scalar_mask", marks=_INTERPRETER_ONLY
        ),
        (ex.check_mask_seed, dict(MASK_SEED=False), "seed_unmasked"),
        (ex.check_mask_seed, dict(MASK_TEMP=False, MASK_SEED=False), "seed_unmasked"),
        (ex.check_mask_seed, dict(MASK_TEMP=False), "noise_on_padded"),
        (ex.check_mask_seed, dict(BY_ROW=True), "seed_by_row"),
        (ex.check_mask_seed, dict(SCALE=0.5), "wrong_values"),
        pytest.param(ex.check_mask_seed, dict(SCALAR_MASK=True), "scalar_mask", marks=_INTERPRETER_ONLY),
    ],
)
def test_kernel_exercises_name_each_mistake(check, wrong, hint):
    verdict = check(_variant(check, **wrong))
    assert verdict.hint_ids == [hint], str(verdict)


@pytest.mark.parametrize("check", [ex.check_mask_kernel, ex.check_mask_seed], ids=lambda c: c.exercise)
def test_kernel_exercises_accept_the_variant_with_no_mistake_and_want_a_kernel(check):
    """The mistakes above come from switches on one kernel; with every switch right it must pass."""
    assert check(_variant(check)).solved
    assert check(lambda: 42).hint_ids == ["not_a_kernel"]


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
