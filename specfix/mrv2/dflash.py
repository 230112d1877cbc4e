"""DFlash-style draft input preparation: a Triton kernel that pads its sample arrays for a full graph.

A simplified ``_prepare_dflash_inputs_kernel`` of vLLM 0.33's
``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py``: a DFlash drafter feeds ``[anchor, MASK x k]`` per
request through one non-causal forward and samples the k MASK positions, and the kernel pads the sample
arrays up to ``max_num_reqs * k`` for a FULL CUDA graph. Before vLLM PR #47066 a padded
``sample_idx_mapping`` entry was 0, a real slot, so it overwrote ``draft_logits[0]``; with
``Fixes.dflash_pad_idx`` it is -1, which the sampler skips. The padding is as in vLLM; left out are the
KV-cache slots and block table, rejected-token handling, ``PAD_SLOT_ID``, the ``max_model_len`` clamp and
the DSpark layout. Read ``prepare_dflash_inputs`` first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from specfix.checks import check_count, check_device, check_id_tensor, check_slots, check_vector
from specfix.fixes import Fixes
from specfix.mrv2.cudagraph import CapturedStep, check_num_reqs
from specfix.mrv2.gumbel import gumbel_sample
from specfix.runtime import HAS_TRITON, tl, triton
from specfix.v1 import device_checks

#: Elements per program when writing the padded tail.
PAD_BLOCK = 256


@dataclass
class DFlashInputs:
    """Persistent input buffers of a DFlash drafter, sized for ``max_num_reqs`` (addresses never change)."""

    input_ids: torch.Tensor  # [max_num_reqs * (1 + k)] int64
    positions: torch.Tensor  # [max_num_reqs * (1 + k)] int64
    query_start_loc: torch.Tensor  # [max_num_reqs + 1] int32
    seq_lens: torch.Tensor  # [max_num_reqs] int32
    sample_indices: torch.Tensor  # [max_num_reqs * k] int64: query row of each drafted token
    sample_pos: torch.Tensor  # [max_num_reqs * k] int64: its position
    sample_idx_mapping: torch.Tensor  # [max_num_reqs * k] int64: its req_state_idx, -1 = none

    @classmethod
    def allocate(cls, max_num_reqs: int, num_speculative_steps: int, device: torch.device | str = "cpu"):
        check_count("max_num_reqs", max_num_reqs)
        check_count("num_speculative_steps", num_speculative_steps)
        m, k = max_num_reqs, num_speculative_steps
        q, n = m * (1 + k), m * k  # query tokens, sampled tokens
        z = lambda size, dtype=torch.int64: torch.zeros(size, dtype=dtype, device=device)
        # the fields in order; sample_idx_mapping starts at -1: no request
        return cls(z(q), z(q), z(m + 1, torch.int32), z(m, torch.int32), z(n), z(n), z(n).fill_(-1))

    @property
    def max_num_reqs(self) -> int:
        return self.seq_lens.numel()

    @property
    def num_speculative_steps(self) -> int:
        return self.sample_pos.numel() // self.max_num_reqs

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _validate(
    num_reqs, idx_mapping, last_sampled, num_computed, out: DFlashInputs, mask_token_id, vocab_size
):
    """Every check ``prepare_dflash_inputs`` makes, all before its first write."""
    check_num_reqs(num_reqs, out.max_num_reqs)
    check_id_tensor("idx_mapping", idx_mapping, min_length=num_reqs)
    check_device("idx_mapping", idx_mapping, out.sample_idx_mapping.device, "out")
    for name, t in (("last_sampled", last_sampled), ("num_computed", num_computed)):
        check_vector(name, t, (torch.int64,), length=out.max_num_reqs)  # a request-state table
        check_device(name, t, out.sample_idx_mapping.device, "out")
    check_count("mask_token_id", mask_token_id, low=0)
    if vocab_size is not None:
        check_count("vocab_size", vocab_size)
    if not device_checks.wanted(idx_mapping, last_sampled, num_computed):
        return  # reading GPU values back is a host sync: checked only under device_checks
    live = idx_mapping[:num_reqs].long().cpu()
    check_slots("idx_mapping[:num_reqs]", live, out.max_num_reqs)
    anchors, positions = last_sampled.cpu()[live], num_computed.cpu()[live]
    high = vocab_size if vocab_size is not None else torch.iinfo(torch.int64).max
    if bool(((anchors < 0) | (anchors >= high)).any()):
        bound = f"[0, vocab_size={vocab_size})" if vocab_size is not None else ">= 0 (a -1 is no token)"
        raise ValueError(
            f"last_sampled of the live slots {live.tolist()} must lie in {bound}, got {anchors.tolist()}"
        )
    if bool((positions < 0).any()):
        raise ValueError(
            f"num_computed of the live slots {live.tolist()} must be >= 0, got {positions.tolist()}"
        )


@triton.jit
def _prepare_dflash_inputs_kernel(
    idx_mapping_ptr,
    last_sampled_ptr,
    num_computed_ptr,
    input_ids_ptr,
    positions_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    sample_indices_ptr,
    sample_pos_ptr,
    sample_idx_mapping_ptr,
    num_reqs,
    mask_token_id,
    pad_sample_idx,
    MAX_NUM_REQS: tl.constexpr,
    NUM_SPEC: tl.constexpr,
    Q_LEN: tl.constexpr,  # 1 + NUM_SPEC, from the host (interpreter: see specfix.runtime)
    BLOCK: tl.constexpr,
    PAD_BLOCK: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    req_state_idx = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    anchor = tl.load(last_sampled_ptr + req_state_idx)
    anchor_pos = tl.load(num_computed_ptr + req_state_idx)
    q_start = batch_idx * Q_LEN
    offs = tl.arange(0, BLOCK)
    in_query = offs < Q_LEN
    ids = tl.where(offs == 0, anchor, mask_token_id)
    tl.store(input_ids_ptr + q_start + offs, ids, mask=in_query)
    tl.store(positions_ptr + q_start + offs, anchor_pos + offs, mask=in_query)
    tl.store(query_start_loc_ptr + batch_idx + 1, (q_start + Q_LEN).to(tl.int32))
    if batch_idx == 0:
        tl.store(query_start_loc_ptr, 0)
    tl.store(seq_lens_ptr + batch_idx, (anchor_pos + Q_LEN).to(tl.int32))
    # The k MASK positions are the drafted tokens: row q_start + 1 + j holds the logits of draft j.
    is_sample = offs < NUM_SPEC
    s_start = batch_idx * NUM_SPEC
    tl.store(sample_indices_ptr + s_start + offs, (q_start + 1 + offs).to(tl.int64), mask=is_sample)
    tl.store(sample_pos_ptr + s_start + offs, anchor_pos + 1 + offs, mask=is_sample)
    tl.store(
        sample_idx_mapping_ptr + s_start + offs, tl.zeros([BLOCK], tl.int64) + req_state_idx, mask=is_sample
    )

    if batch_idx == num_reqs - 1:
        # The last request's program pads every array up to max_num_reqs for the graph replay, looping
        # over the static extent and masking off the live part (interpreter: see specfix.runtime).
        pad = tl.arange(0, PAD_BLOCK)
        live_tokens = num_reqs * Q_LEN
        for start in range(0, MAX_NUM_REQS * Q_LEN, PAD_BLOCK):
            o = start + pad
            m = (o >= live_tokens) & (o < MAX_NUM_REQS * Q_LEN)
            tl.store(input_ids_ptr + o, tl.zeros([PAD_BLOCK], tl.int64), mask=m)  # token 0: a real id
            tl.store(positions_ptr + o, tl.zeros([PAD_BLOCK], tl.int64), mask=m)
        for start in range(0, MAX_NUM_REQS, PAD_BLOCK):
            o = start + pad
            m = (o >= num_reqs) & (o < MAX_NUM_REQS)
            tl.store(query_start_loc_ptr + o + 1, tl.zeros([PAD_BLOCK], tl.int32) + live_tokens, mask=m)
            tl.store(seq_lens_ptr + o, tl.zeros([PAD_BLOCK], tl.int32), mask=m)
        for start in range(0, MAX_NUM_REQS * NUM_SPEC, PAD_BLOCK):
            o = start + pad
            m = (o >= num_reqs * NUM_SPEC) & (o < MAX_NUM_REQS * NUM_SPEC)
            tl.store(sample_indices_ptr + o, tl.zeros([PAD_BLOCK], tl.int64), mask=m)
            tl.store(sample_pos_ptr + o, tl.zeros([PAD_BLOCK], tl.int64), mask=m)
            tl.store(sample_idx_mapping_ptr + o, tl.zeros([PAD_BLOCK], tl.int64) + pad_sample_idx, mask=m)


def prepare_dflash_inputs(
    num_reqs: int,
    idx_mapping: torch.Tensor,  # [num_reqs]: batch row -> req_state_idx
    last_sampled: torch.Tensor,  # [max_num_reqs]: each request's anchor token
    num_computed: torch.Tensor,  # [max_num_reqs]: the anchor's position
    mask_token_id: int,
    out: DFlashInputs,
    fixes: Fixes | None = None,
    use_triton: bool = HAS_TRITON,
    *,
    vocab_size: int | None = None,  # bounds the anchors when given (the drafter passes its model's)
) -> DFlashInputs:
    """Fill ``out`` for ``num_reqs`` requests and pad it to ``out.max_num_reqs``, so that a FULL graph can
    replay it; bad input raises before any buffer is written."""
    _validate(num_reqs, idx_mapping, last_sampled, num_computed, out, mask_token_id, vocab_size)
    if (fixes or Fixes()).dflash_pad_idx:  # [fix]
        pad_sample_idx = -1  # [fix]
    else:  # [no fix]
        pad_sample_idx = 0  # [no fix]
    k = out.num_speculative_steps
    if not use_triton:
        return _prepare_reference(
            num_reqs, idx_mapping, last_sampled, num_computed, mask_token_id, out, pad_sample_idx
        )
    _prepare_dflash_inputs_kernel[(num_reqs,)](
        idx_mapping,
        last_sampled,
        num_computed,
        out.input_ids,
        out.positions,
        out.query_start_loc,
        out.seq_lens,
        out.sample_indices,
        out.sample_pos,
        out.sample_idx_mapping,
        num_reqs,
        mask_token_id,
        pad_sample_idx,
        MAX_NUM_REQS=out.max_num_reqs,
        NUM_SPEC=k,
        Q_LEN=k + 1,
        BLOCK=triton.next_power_of_2(k + 1),
        PAD_BLOCK=PAD_BLOCK,
    )
    return out


def _prepare_reference(num_reqs, idx_mapping, last_sampled, num_computed, mask_token_id, out, pad_sample_idx):
    """The kernel's contract in plain torch (the tests tie the two together)."""
    k, device = out.num_speculative_steps, out.input_ids.device
    slots = idx_mapping[:num_reqs].long()
    anchor, anchor_pos = last_sampled[slots], num_computed[slots]
    offs = torch.arange(1 + k, device=device)
    ids = torch.full((num_reqs, 1 + k), mask_token_id, dtype=torch.int64, device=device)
    ids[:, 0] = anchor
    n_live, n_samples = num_reqs * (1 + k), num_reqs * k
    for t in (out.input_ids, out.positions, out.seq_lens, out.sample_indices, out.sample_pos):
        t.zero_()  # the padding: token 0 (padded rows still run the model) at position 0, sample row 0
    out.input_ids[:n_live] = ids.flatten()
    out.positions[:n_live] = (anchor_pos[:, None] + offs).flatten()
    out.query_start_loc.copy_((torch.arange(out.max_num_reqs + 1, device=device) * (1 + k)).clamp(max=n_live))
    out.seq_lens[:num_reqs] = (anchor_pos + 1 + k).int()
    rows = torch.arange(num_reqs, device=device)[:, None] * (1 + k) + 1 + offs[:k]
    out.sample_indices[:n_samples] = rows.flatten()
    out.sample_pos[:n_samples] = (anchor_pos[:, None] + 1 + offs[:k]).flatten()
    out.sample_idx_mapping.fill_(pad_sample_idx)
    out.sample_idx_mapping[:n_samples] = slots.repeat_interleave(k)
    return out


class ToyDFlashModel(torch.nn.Module):
    """A stand-in block drafter that gives every query row its own distribution, all the padding bug needs:
    logits of row i = ``token_table[input_ids[i]] + pos_table[pos % P]``."""

    def __init__(self, vocab_size: int, num_positions: int = 8, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.mask_token_id = vocab_size, vocab_size  # MASK: an extra embedding row
        self.register_buffer("token_table", torch.randn(vocab_size + 1, vocab_size, generator=g) * 2)
        self.register_buffer("pos_table", torch.randn(num_positions, vocab_size, generator=g))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.token_table[input_ids] + self.pos_table[positions % self.pos_table.shape[0]]


class DFlashDrafter:
    """Prepare inputs (the kernel above), run the block drafter, sample every drafted token into
    ``draft_logits[sample_idx_mapping, col]``."""

    def __init__(
        self,
        model: ToyDFlashModel,
        *,
        max_num_reqs: int,
        num_speculative_steps: int,
        device: torch.device | str = "cpu",
        fixes: Fixes | None = None,
        sampler: Callable[..., torch.Tensor] = gumbel_sample,  # or speculator.reference_sampler
    ):
        self.model, self.fixes = model, fixes or Fixes()
        self.sampler = sampler
        self.device = torch.device(device)
        k, v = num_speculative_steps, model.vocab_size
        self.inputs = DFlashInputs.allocate(max_num_reqs, k, self.device)
        self.temperature = torch.ones(max_num_reqs, device=self.device)
        self.seeds = torch.zeros(max_num_reqs, dtype=torch.int64, device=self.device)
        self.draft_logits = torch.zeros(max_num_reqs, k, v, device=self.device)
        self.draft_tokens = torch.zeros(max_num_reqs * k, dtype=torch.int64, device=self.device)
        self.columns = torch.arange(k, device=self.device).repeat(max_num_reqs)  # each sample's column
        self.graph = None

    def buffers(self) -> dict[str, torch.Tensor]:
        names = ("draft_logits", "draft_tokens", "temperature", "seeds")
        return {n: getattr(self, n) for n in names} | self.inputs.as_dict()

    def _sample(self, num_samples: int) -> None:
        """The half a FULL graph captures: no host sync, fixed buffers."""
        logits = self.model(self.inputs.input_ids, self.inputs.positions)
        rows = self.inputs.sample_indices[:num_samples]
        self.draft_tokens[:num_samples].copy_(
            self.sampler(
                logits[rows].contiguous(),
                self.inputs.sample_idx_mapping[:num_samples],
                self.temperature,
                self.seeds,
                self.inputs.sample_pos[:num_samples] - 1,  # as vLLM 0.33's DFlash _generate_draft keys a draw
                True,
                logits_cache=self.draft_logits,
                logits_cache_col=self.columns[:num_samples],
                is_drafting=True,
                fixes=self.fixes,
            )
        )

    def reset_for_capture(self) -> None:
        """Before capture, as vLLM 0.33: sample rows 0 and ``sample_idx_mapping`` -1 (no request's slot)."""
        self.inputs.sample_indices.zero_()
        self.inputs.sample_pos.zero_()
        self.inputs.sample_idx_mapping.fill_(-1)

    def capture_cuda_graph(self) -> None:
        full = self.inputs.max_num_reqs * self.inputs.num_speculative_steps
        self.reset_for_capture()
        self.graph = CapturedStep(lambda _: self._sample(full), [full], self.device)

    def propose(
        self,
        num_reqs: int,
        idx_mapping: torch.Tensor,
        last_sampled: torch.Tensor,
        num_computed: torch.Tensor,
        *,
        padded: bool = True,  # all max_num_reqs * k entries, as a FULL graph; False: vLLM's eager fallback
    ) -> torch.Tensor:
        """Draft k tokens for each of the ``num_reqs`` requests; returns ``[num_reqs, k]``."""
        k = self.inputs.num_speculative_steps
        prepare_dflash_inputs(
            num_reqs,
            idx_mapping,
            last_sampled,
            num_computed,
            self.model.mask_token_id,
            self.inputs,
            self.fixes,
            vocab_size=self.model.vocab_size,
        )
        full = self.inputs.max_num_reqs * k
        if padded and self.graph is not None:
            self.graph.replay(full)
        else:
            self._sample(full if padded else num_reqs * k)
        return self.draft_tokens[: num_reqs * k].view(num_reqs, k).clone()
