"""The DFlash prepare-inputs kernel: contract by hand, kernel == torch reference, GPU golden, slot-0 bug."""

import json
from pathlib import Path

import pytest
import torch

from specfix import Fixes
from specfix.mrv2.dflash import DFlashDrafter, DFlashInputs, ToyDFlashModel, prepare_dflash_inputs
from specfix.runtime import HAS_TRITON

GOLDEN = Path(__file__).with_name("golden") / "dflash_prepare.json"


def _prepare(fix, use_triton, num_reqs=3, idx=(4, 0, 2), max_num_reqs=6, k=3):
    out = DFlashInputs.allocate(max_num_reqs, k)
    for t in out.as_dict().values():
        t.fill_(77)                                        # sentinel: every entry must be written
    last_sampled = torch.arange(100, 100 + max_num_reqs)
    num_computed = torch.arange(10, 10 * (max_num_reqs + 1), 10)
    prepare_dflash_inputs(num_reqs, torch.tensor(idx, dtype=torch.int32), last_sampled, num_computed, 99, out,
                          Fixes(dflash_pad_idx=fix), use_triton=use_triton)
    return out


@pytest.mark.parametrize("fix", [True, False])
def test_prepare_contract_by_hand(fix):
    out = _prepare(fix, HAS_TRITON)
    # request rows 0,1,2 -> slots 4,0,2: anchors 104,100,102 at positions 50,10,30, then MASK=99 x3
    assert out.input_ids[:12].tolist() == [104, 99, 99, 99, 100, 99, 99, 99, 102, 99, 99, 99]
    assert out.positions[:4].tolist() == [50, 51, 52, 53] and out.positions[4:8].tolist() == [10, 11, 12, 13]
    assert out.input_ids[12:].tolist() == [0] * 12 and out.positions[12:].tolist() == [0] * 12
    assert out.query_start_loc.tolist() == [0, 4, 8, 12, 12, 12, 12]
    assert out.seq_lens.tolist() == [54, 14, 34, 0, 0, 0]
    assert out.sample_indices.tolist() == [1, 2, 3, 5, 6, 7, 9, 10, 11] + [0] * 9
    assert out.sample_pos.tolist() == [51, 52, 53, 11, 12, 13, 31, 32, 33] + [0] * 9
    pad = -1 if fix else 0
    assert out.sample_idx_mapping.tolist() == [4, 4, 4, 0, 0, 0, 2, 2, 2] + [pad] * 9


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("fix", [True, False])
@pytest.mark.parametrize("num_reqs,idx", [(1, (3,)), (4, (0, 1, 2, 3)), (6, (5, 4, 3, 2, 1, 0))])
def test_kernel_matches_reference(fix, num_reqs, idx):
    a, b = _prepare(fix, True, num_reqs, idx), _prepare(fix, False, num_reqs, idx)
    for name, t in a.as_dict().items():
        assert torch.equal(t, getattr(b, name)), name


def test_golden_from_gpu():
    if not GOLDEN.exists():
        pytest.skip("no GPU golden file yet: run scripts/record_cudagraph.py on the GPU")
    golden = json.loads(GOLDEN.read_text())
    for case in golden["cases"]:
        out = _prepare(case["fix"], HAS_TRITON, case["num_reqs"], tuple(case["idx"]))
        for name, values in case["outputs"].items():
            assert getattr(out, name).tolist() == values, (case, name)


def test_bad_input():
    out = DFlashInputs.allocate(4, 2)
    args = (torch.arange(4), torch.arange(4), 9, out)
    with pytest.raises(ValueError, match="num_reqs"):
        prepare_dflash_inputs(5, torch.arange(5, dtype=torch.int32), *args)
    with pytest.raises(TypeError, match="signed"):
        prepare_dflash_inputs(2, torch.tensor([0, 1], dtype=torch.uint8), *args)
    with pytest.raises(ValueError, match="idx_mapping"):
        prepare_dflash_inputs(2, torch.tensor([0, 7], dtype=torch.int32), *args)
    with pytest.raises(ValueError, match="last_sampled"):
        prepare_dflash_inputs(2, torch.tensor([0, 1], dtype=torch.int32), torch.arange(3), torch.arange(4), 9,
                              out)


@pytest.mark.parametrize("fix", [True, False])
def test_unfixed_padding_corrupts_request_state_zero(fix):
    v, m, k = 16, 4, 3
    drafter = DFlashDrafter(ToyDFlashModel(v), max_num_reqs=m, num_speculative_steps=k,
                            fixes=Fixes(dflash_pad_idx=fix))
    idx = torch.tensor([2, 0], dtype=torch.int32)           # slot 0 is live, at batch row 1
    last, num_computed = torch.arange(m), torch.arange(m) * 3 + 5
    drafter.propose(2, idx, last, num_computed)
    # what slot 0 must hold: its own MASK rows' logits (query rows 5, 6, 7), temperature 1
    model = drafter.model
    expected = model(drafter.inputs.input_ids[5:8], drafter.inputs.positions[5:8])
    assert torch.equal(drafter.draft_logits[0], expected) == fix
    # slot 2 (batch row 0) is never hit
    own = model(drafter.inputs.input_ids[1:4], drafter.inputs.positions[1:4])
    assert torch.equal(drafter.draft_logits[2], own)
