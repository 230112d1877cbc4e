"""Chapter 4's exercises on the ``is_valid_req`` mask of padded rows, with their checkers.

The reader's kernels run on tables that sit between guard rows, so a stray read or write one row before a
table shows.
"""

from __future__ import annotations

import torch

from specfix import runtime
from specfix.exercises.core import as_int, as_int_list, checker, value_of
from specfix.fixes import Fixes
from specfix.lab import masked_gumbel
from specfix.mrv2 import gumbel

#: The write-it exercise's tables: 4 request slots (slot 2 greedy), 6 rows of which the last 2 are padding.
KERNEL_VOCAB, KERNEL_BLOCK = 24, 32
KERNEL_TEMPERATURE = (1.0, 0.5, 0.0, 2.0)
KERNEL_IDX_MAPPING = (2, 0, 3, 1, -1, -1)
#: What the guard rows hold: the temperature one row before the table, and the output's sentinel.
GUARD_TEMPERATURE = 4.0
OUT_SENTINEL = -555.0
#: The seed exercise's tables: each slot's seed, and the seed the guard rows hold.
KERNEL_SEEDS = (11, 22, 33, 44)
GUARD_SEED = 777
#: The hints both kernel exercises give.
_KERNEL_HINTS = {
    "not_a_kernel": "pass the kernel itself (the function decorated with @triton.jit).",
    "scalar_mask": "Triton's interpreter cannot AND a scalar condition into a tensor mask (it splats it as "
    "int32 and refuses it): make it per lane, e.g. `offs * 0 + req_state_idx >= 0`.",
}


def _run_kernel(answer, verdict, *, seeds: bool = False) -> tuple[torch.Tensor, ...]:
    """Launch the reader's kernel (or the one a reference solution builds), one program per row; logits,
    idx_mapping, the output (guard rows included) and what each row read, back on the CPU. The seed kernel
    also reads a guarded seeds table and writes each row's noisy logits by row."""
    device, rows, slots = runtime.DEVICE, len(KERNEL_IDX_MAPPING), len(KERNEL_TEMPERATURE)
    gen = torch.Generator().manual_seed(41)
    logits = (torch.randn(rows, KERNEL_VOCAB, generator=gen) * 3).to(device)
    idx = torch.tensor(KERNEL_IDX_MAPPING, dtype=torch.int32, device=device)

    def guarded(values, guard, dtype):  # a request-state table between two guard rows
        table, _ = gumbel.guarded_table((len(values),), 0, dtype, guard_fill=guard, device=device)
        return table.copy_(torch.tensor(values))

    temperature = guarded(KERNEL_TEMPERATURE, GUARD_TEMPERATURE, torch.float32)
    if seeds:
        out = out_whole = torch.full((rows, KERNEL_VOCAB), OUT_SENTINEL, device=device)
        row_read = torch.full((rows,), -1, dtype=torch.int64, device=device)
        tables = (logits, idx, temperature, guarded(KERNEL_SEEDS, GUARD_SEED, torch.int64), out, row_read)
    else:
        out, out_whole = gumbel.guarded_table(
            (slots, KERNEL_VOCAB), OUT_SENTINEL, torch.float32, device=device
        )
        row_read = torch.full((rows,), float("nan"), device=device)
        tables = (logits, idx, temperature, out, row_read)
    kernel = answer if hasattr(answer, "fn") else answer()
    verdict.require(hasattr(kernel, "fn"), "not_a_kernel")
    try:
        kernel[(rows,)](*tables, KERNEL_VOCAB, BLOCK=KERNEL_BLOCK)
    except Exception as error:
        verdict.require("mask has unsupported dtype" not in str(error), "scalar_mask")
        raise
    return logits.cpu(), idx.cpu(), out_whole.cpu(), row_read.cpu()


@checker(
    "ch4.mask_kernel",
    solution="masked_gumbel_sampling:scale_rows_kernel",
    todo="write scale_rows: is_valid_req masks the temperature load and the store of a padded row",
    hints={
        **_KERNEL_HINTS,
        "no_mask": "neither the loads nor the store are masked: the padded rows read temperature[-1] (the "
        "guard row's 4.0 here) and wrote out[-1], the row before the table.",
        "load_unmasked": "you masked the store but not the loads: the padded row still reads "
        "temperature[-1] (here the guard row's 4.0; in an engine, whatever lies before the table).",
        "store_unmasked": "you masked the loads but not the store: the padded row overwrote out[-1], the "
        "row before the table (here the guard row; in an engine, another request's draft logits).",
        "skips_slot_0": "you compared req_state_idx > 0: request slot 0 is skipped (its row read "
        "temperature 0.0 and stored nothing). Slot 0 is a real request; only negative entries are padding.",
        "padded_wrote_live": "a padded row wrote into a live request's row: mapping -1 onto a real slot "
        "(clamping req_state_idx to 0) overwrites that request's logits. Keep the -1: the mask skips it.",
        "other_not_zero": "a padded row must come out greedy: give the masked temperature load other=0.0 "
        "(then the real kernel needs no seed and adds no noise for it).",
        "wrong_values": "a live row stored the wrong values: out[req_state_idx] must hold the row's logits "
        "divided by its temperature (the raw logits when the temperature is 0).",
    },
)
def check_mask_kernel(answer, verdict):
    logits, idx, out_whole, row_temp = _run_kernel(answer, verdict)
    padded = idx < 0
    stray_write = bool((out_whole[0] != OUT_SENTINEL).any() or (out_whole[-1] != OUT_SENTINEL).any())
    stray_read = bool((row_temp[padded] == GUARD_TEMPERATURE).any())
    verdict.require(not (stray_write and stray_read), "no_mask")
    verdict.require(not stray_read, "load_unmasked")
    verdict.require(not stray_write, "store_unmasked")
    slot0_row = KERNEL_IDX_MAPPING.index(0)
    verdict.require(bool((out_whole[1] != OUT_SENTINEL).any()) and row_temp[slot0_row] != 0.0, "skips_slot_0")
    live = [(row, slot) for row, slot in enumerate(KERNEL_IDX_MAPPING) if slot >= 0]
    padded_rows = padded.nonzero().flatten().tolist()
    padded_values = [logits[row] / t for row in padded_rows for t in (*KERNEL_TEMPERATURE, 1.0) if t]
    stolen = any(torch.allclose(out_whole[slot + 1], v) for _, slot in live for v in padded_values)
    verdict.require(not stolen, "padded_wrote_live")
    ran = f"(the padded rows ran with {row_temp[padded].tolist()})"
    verdict.require(bool((row_temp[padded] == 0.0).all()), "other_not_zero", ran)
    for row, slot in live:
        temp = KERNEL_TEMPERATURE[slot]
        want = logits[row] / temp if temp != 0.0 else logits[row]
        ok = torch.allclose(out_whole[slot + 1], want) and row_temp[row] == temp
        verdict.require(ok, "wrong_values", f"(row {row}, slot {slot}, temperature {temp})")


@checker(
    "ch4.padded_token",
    solution="masked_gumbel_sampling:padded_token",
    todo="set padded_token to the token the masked kernel returns for row 4 (an int, or over step.logits)",
    hints={
        "not_an_int": "give one token id: an int, or a one-element tensor.",
        "minus_one": "-1 is the row's expanded_idx_mapping entry, not a token: the kernel samples every row "
        "it is given and returns a token for the padded row too (the engine throws it away).",
        "guard_draw": "that is the token the UNMASKED kernel draws, with the temperature 2.0 and seed 12345 "
        "it reads from row -1 (the guard). With the mask the temperature load returns its other=0.0.",
        "not_greedy": "with the mask the padded row's temperature load returns its other, 0.0: what does the "
        "kernel do with a row whose temperature is 0?",
    },
)
def check_padded_token(answer, verdict):
    answer = as_int(value_of(answer))  # a token id, or a function that returns one
    verdict.require(answer is not None, "not_an_int")
    step = masked_gumbel.padded_drafter_step()
    row = int((step.expanded_idx_mapping < 0).nonzero()[0])  # the first padded row
    masked, _ = masked_gumbel.run_drafter_step(step, device=runtime.DEVICE)
    unmasked, _ = masked_gumbel.run_drafter_step(step, Fixes(mask_invalid_reqs=False), device=runtime.DEVICE)
    verdict.require(answer != -1, "minus_one")
    verdict.require(answer != int(unmasked[row]), "guard_draw")
    verdict.require(answer == int(masked[row]), "not_greedy")


#: The stale-padding scenarios a ``find_overwritten`` answer is checked on (the notebook shows the first).
DEBUG_SEEDS = (0, 1, 2, 3)


@checker(
    "ch4.find_overwritten",
    solution="masked_gumbel_sampling:find_overwritten",
    todo="write find_overwritten: the sorted slots whose table[slot, col] is not their own live row's",
    hints={
        "not_a_list": "return a list of ints (request-state slots), sorted.",
        "all_flagged": "every live slot is flagged: read column col of each slot (table[slot, col]) and "
        "compare it with what the kernel stores there: its own row's logits, before temperature.",
        "divided": "you compared with logits / temperature, what vLLM 0.25 cached. vLLM 0.33 (and specfix) "
        "caches the logits before temperature; the verifier divides when it reads them.",
        "rows_not_slots": "you returned batch rows, not request-state slots (row i is slot idx_mapping[i]).",
        "not_live": "a slot with no live row in this step has nothing to compare with: its column holds "
        "older data. Look only at the slots in idx_mapping.",
        "own_logits": "a slot you flagged holds exactly its own row's logits: the cache keeps them as they "
        "are, whatever the request's temperature (0 included).",
        "missed": "an overwritten slot is missing: compare the whole column, not one value or the argmax.",
    },
)
def check_find_overwritten(answer, verdict):
    for seed in DEBUG_SEEDS:
        puzzle, truth = masked_gumbel.stale_padding_step(seed, device=runtime.DEVICE)
        got = as_int_list(answer(**{k: v.clone() if torch.is_tensor(v) else v for k, v in puzzle.items()}))
        verdict.require(got is not None, "not_a_list")
        got = sorted(got)
        if got == truth:
            continue
        live, temps, logits = puzzle["idx_mapping"].tolist(), puzzle["temperature"], puzzle["logits"]
        divided = [logits[row] / temps[s] if temps[s] != 0.0 else logits[row] for row, s in enumerate(live)]
        cached = [puzzle["table"][s, puzzle["col"]] for s in live]
        as_in_025 = sorted(s for s, c, d in zip(live, cached, divided, strict=True) if not torch.equal(c, d))
        verdict.require(got != sorted(live), "all_flagged")
        verdict.require(got != as_in_025, "divided")
        verdict.require(got != sorted(live.index(s) for s in truth), "rows_not_slots")
        verdict.require(set(got) <= set(live), "not_live", f"(slots {sorted(set(got) - set(live))})")
        verdict.require(set(got) <= set(truth), "own_logits")
        verdict.require(False, "missed")


# -- ch4.mask_seed -----------------------------------------------------------------------------------------


@checker(
    "ch4.mask_seed",
    solution="masked_gumbel_sampling:add_noise_kernel",
    todo="mask the seed load of add_noise so that a padded row never reads the seeds table",
    hints={
        **_KERNEL_HINTS,
        "seed_unmasked": "the padded row still read seeds[-1], the row before the table (in an engine, "
        "memory that compute-sanitizer reports). The value goes unused, but the read is the bug: mask it.",
        "noise_on_padded": "a padded row came out with noise: it must run greedy (temperature 0.0 from the "
        "masked load), so its row is its logits unchanged.",
        "seed_by_row": "a live row drew its noise with another request's seed: the seeds table is indexed "
        "by request slot (req_state_idx), like the temperature, not by batch row.",
        "wrong_values": "a live row's noisy logits are not the ones the kernel should write: keep the noise "
        "as given (x / temp plus Gumbel noise from tl.rand(seed, offs)).",
    },
)
def check_mask_seed(answer, verdict):
    logits, idx, out, row_seed = _run_kernel(answer, verdict, seeds=True)
    padded = idx < 0
    read = f"(the padded rows read the seeds {row_seed[padded].tolist()})"
    verdict.require(not bool((row_seed[padded] == GUARD_SEED).any()), "seed_unmasked", read)
    verdict.require(torch.equal(out[padded], logits[padded]), "noise_on_padded")
    by_slot = all(int(row_seed[row]) == KERNEL_SEEDS[s] for row, s in enumerate(KERNEL_IDX_MAPPING) if s >= 0)
    verdict.require(by_slot, "seed_by_row", f"(rows {idx.tolist()} read the seeds {row_seed.tolist()})")
    want = _run_kernel(check_mask_seed.reference()(), verdict, seeds=True)[2]  # the reference kernel's rows
    verdict.require(torch.allclose(out[~padded], want[~padded], equal_nan=True), "wrong_values")
