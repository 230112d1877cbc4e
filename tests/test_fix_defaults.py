"""Every fix switch through its default path: no ``fixes=`` argument anywhere.

The other tests pass each switch explicitly, on and off, so they cannot see what a component does when
nobody passes ``fixes``: a default turned off in ``Fixes`` (or a constructor that builds its own
defaults) would slip through them. Each test here calls the public entry point exactly as a user who
never heard of the switches would, and checks the fixed behaviour. ``test_every_switch_has_a_test``
makes a new switch need one too.
"""

import sys

import torch

from specfix import Fixes
from specfix.lab.padding_bench import TableDraft
from specfix.mrv2 import gumbel
from specfix.mrv2.dflash import DFlashDrafter, DFlashInputs, ToyDFlashModel, prepare_dflash_inputs
from specfix.mrv2.speculator import DraftModelSpeculator
from specfix.v1.engine import LLMEngine, SamplingParams
from specfix.v1.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata


def test_clamp_placeholders_by_default():
    """A prefilled request's first decode carries -1 drafts; the default engine clamps them away."""
    engine = LLMEngine(num_speculative_tokens=3, sampler_backend="torch", record=True)
    engine.add_request(
        "the fox saw the crow", SamplingParams(temperature=0.0, max_tokens=4), remote_prefill=True
    )
    engine.step()  # with the clamp off this raises IndexError in the embedding
    step = engine.model_runner.trace[0]
    assert PLACEHOLDER_TOKEN_ID in step.input_ids_before_clamp.tolist()
    assert int(step.embedding_input.min()) >= 0


def test_reject_negative_drafts_by_default():
    """Request 1's -1 draft is read, without the guard, as request 0's last probability (~1): accepted."""
    md = SpecDecodeMetadata.make_dummy([[2], [-1, 5]])
    logits = torch.zeros(5, 8)
    logits[0, 7] = 30.0
    logits[2:4, 5] = 30.0
    out = RejectionSampler()(md, None, logits, SamplingMetadata.from_requests([1.0, 1.0], [11, 12]))
    assert out[1, 1].item() == PLACEHOLDER_TOKEN_ID  # rejected at its first slot: nothing after it
    assert out[1, 0].item() != PLACEHOLDER_TOKEN_ID


def test_mask_invalid_reqs_by_default():
    """A padded row (req_state_idx -1) stores nothing: the guard row before the table stays untouched."""
    sentinel = -7.0
    buf, buf_whole = gumbel.guarded_table((2, 1, 32), sentinel, torch.float32)
    temperature, _ = gumbel.guarded_table((2,), 1.0, torch.float32, guard_fill=2.0)
    seed, _ = gumbel.guarded_table((2,), 3, torch.int64, guard_fill=12345)
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([1, -1, 0])
    gumbel.gumbel_sample(logits, idx, temperature, seed, torch.arange(3), True, False, buf)
    assert (buf_whole[0] == sentinel).all() and (buf_whole[-1] == sentinel).all()
    assert torch.equal(buf[1, 0], logits[0]) and torch.equal(buf[0, 0], logits[2])


def test_pad_idx_mapping_by_default():
    """After a batch of 5, a batch of 2: rows 2.. of idx_mapping name no request (-1), not stale slots."""
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    spec = DraftModelSpeculator(
        TableDraft(table), max_num_reqs=8, num_speculative_steps=2, vocab_size=16, context_len=1
    )
    temperature, seeds = torch.linspace(0.5, 1.5, 8), torch.arange(8) * 101 + 7
    for slots in ([4, 0, 6, 2, 7], [3, 5]):
        n = len(slots)
        spec.propose(
            n,
            torch.tensor(slots, dtype=torch.int32),
            temperature,
            seeds,
            torch.arange(n)[:, None] % 16,
            torch.arange(n) + 3,
        )
    assert spec.idx_mapping[:2].tolist() == [3, 5]
    assert spec.idx_mapping[2:].tolist() == [-1] * 6


def test_dflash_pad_idx_by_default():
    """Padded sample entries name no request (-1), so slot 0's draft logits stay its own."""
    out = DFlashInputs.allocate(4, 2)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    prepare_dflash_inputs(2, idx, torch.arange(4), torch.arange(4), 9, out)
    assert out.sample_idx_mapping.tolist() == [2, 2, 0, 0, -1, -1, -1, -1]
    drafter = DFlashDrafter(ToyDFlashModel(16), max_num_reqs=4, num_speculative_steps=2)
    drafter.propose(2, idx, torch.arange(4), torch.arange(4) * 3 + 5)
    own_rows = drafter.model(drafter.inputs.input_ids[4:6], drafter.inputs.positions[4:6])  # slot 0's rows
    assert torch.equal(drafter.draft_logits[0], own_rows)


def test_mark_placeholder_drafts_by_default():
    """Model Runner V2's zeroed draft slots of a prefilled request reach verification as -1, not as 0."""
    engine = LLMEngine(num_speculative_tokens=3, sampler_backend="torch", record=True, model_runner="v2")
    engine.add_request(
        "the fox saw the crow and", SamplingParams(temperature=0.0, max_tokens=4), remote_prefill=True
    )
    engine.step()
    step = engine.model_runner.trace[0]
    assert step.embedding_input[1:4].tolist() == [0, 0, 0]
    assert step.spec_decode_metadata.draft_token_ids.tolist() == [PLACEHOLDER_TOKEN_ID] * 3


def test_every_switch_has_a_test():
    tests = {name for name in dir(sys.modules[__name__]) if name.endswith("_by_default")}
    assert tests == {f"test_{name}_by_default" for name in Fixes.names()}
