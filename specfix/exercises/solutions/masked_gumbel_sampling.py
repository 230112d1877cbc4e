"""Reference solutions of chapter 4's exercises (``specfix.exercises.masked_gumbel_sampling``)."""

from __future__ import annotations

import torch

from specfix.lab.masked_gumbel import padded_drafter_step
from specfix.runtime import tl, triton


def scale_rows_kernel():
    """The write-it kernel with the is_valid_req mask (built in a function so that its source displays)."""

    @triton.jit
    def scale_rows(
        logits_ptr, idx_mapping_ptr, temperature_ptr, out_ptr, row_temp_ptr, vocab_size, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0)
        req_state_idx = tl.load(idx_mapping_ptr + row).to(tl.int64)
        is_valid_req = req_state_idx >= 0  # -1 marks a padded row; slot 0 is real
        temp = tl.load(temperature_ptr + req_state_idx, mask=is_valid_req, other=0.0)  # padded: greedy
        tl.store(row_temp_ptr + row, temp)
        offs = tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
        if temp != 0.0:
            x = x / temp
        valid = offs * 0 + req_state_idx >= 0  # per lane: the interpreter needs a tensor mask
        tl.store(out_ptr + req_state_idx * vocab_size + offs, x, mask=(offs < vocab_size) & valid)

    return scale_rows


padded_token = int(padded_drafter_step().logits[4].argmax())  # temperature load's other=0.0: greedy, argmax


def find_overwritten(table, col, logits, idx_mapping, temperature):
    """The live slots whose column ``col`` is not their own row's logits (cached before temperature, as in
    vLLM 0.33: ``temperature`` plays no part)."""
    slots = idx_mapping.tolist()
    return sorted(slot for row, slot in enumerate(slots) if not torch.equal(table[slot, col], logits[row]))


def add_noise_kernel():
    """The seed exercise's kernel with both request-table loads masked by is_valid_req."""

    @triton.jit
    def add_noise(
        logits_ptr,
        idx_mapping_ptr,
        temperature_ptr,
        seeds_ptr,
        out_ptr,
        row_seed_ptr,
        vocab_size,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        req_state_idx = tl.load(idx_mapping_ptr + row).to(tl.int64)
        is_valid_req = req_state_idx >= 0
        temp = tl.load(temperature_ptr + req_state_idx, mask=is_valid_req, other=0.0)
        seed = tl.load(seeds_ptr + req_state_idx, mask=is_valid_req, other=0)  # a padded row reads nothing
        tl.store(row_seed_ptr + row, seed)
        offs = tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
        if temp != 0.0:  # a padded row (temperature 0.0) stays greedy: no noise, so its seed is never used
            x = x / temp - tl.log(-tl.log(tl.rand(seed, offs)))
        tl.store(out_ptr + row * vocab_size + offs, x, mask=offs < vocab_size)

    return add_noise
