"""The DFlash prepare-inputs kernel: contract by hand, kernel == torch reference, GPU golden, slot-0 bug."""

import json
from pathlib import Path

import pytest
import torch

from specfix import Fixes
from specfix.mrv2.dflash import DFlashDrafter, DFlashInputs, ToyDFlashModel, prepare_dflash_inputs
from specfix.runtime import HAS_TRITON
from specfix.v1 import device_checks

GOLDEN = Path(__file__).with_name("golden") / "dflash_prepare.json"


def _prepare(fix, use_triton, num_reqs=3, idx=(4, 0, 2), max_num_reqs=6, k=3):
    """``fix`` True/False passes the switch; None passes no ``fixes`` at all (the default path)."""
    out = DFlashInputs.allocate(max_num_reqs, k)
    for t in out.as_dict().values():
        t.fill_(77)  # sentinel: every entry must be written
    last_sampled = torch.arange(100, 100 + max_num_reqs)
    num_computed = torch.arange(10, 10 * (max_num_reqs + 1), 10)
    fixes = () if fix is None else (Fixes(dflash_pad_idx=fix),)
    prepare_dflash_inputs(
        num_reqs,
        torch.tensor(idx, dtype=torch.int32),
        last_sampled,
        num_computed,
        99,
        out,
        *fixes,
        use_triton=use_triton,
    )
    return out


@pytest.mark.parametrize("fix", [True, False, None], ids=["fix", "no-fix", "default"])
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
    pad = 0 if fix is False else -1  # by default the fix is on: padded entries name no request
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


@pytest.mark.parametrize("change, error, word", [
    (dict(num_reqs=5, idx_mapping=torch.arange(5, dtype=torch.int32)), ValueError, "num_reqs=5"),
    (dict(idx_mapping=torch.tensor([0, 1], dtype=torch.uint8)), TypeError, "idx_mapping must hold signed"),
    (dict(idx_mapping=torch.tensor([0, 7], dtype=torch.int32)), ValueError, r"idx_mapping\[:num_reqs\]"),
    # two requests naming one slot would both write its draft logits
    (dict(idx_mapping=torch.tensor([1, 1], dtype=torch.int32)), ValueError, r"distinct slots.*got \[1, 1\]"),
    (dict(last_sampled=torch.arange(3)), ValueError, "last_sampled must have 4 entries, got 3"),
    (dict(num_computed=torch.arange(4, dtype=torch.int32)), TypeError, "num_computed must hold dtype int64"),
    # a -1 anchor would go verbatim into input_ids: the very leak the suite is about
    (dict(last_sampled=torch.tensor([5, -1, 3, 3])), ValueError, r"last_sampled of the live slots \[1, 0\]"),
    (dict(last_sampled=torch.tensor([5, 8, 3, 3])), ValueError, r"must lie in \[0, vocab_size=8\)"),
    (dict(num_computed=torch.tensor([0, -2, 0, 0])), ValueError, "num_computed of the live slots .* >= 0"),
    (dict(mask_token_id=-1), ValueError, "mask_token_id"),
    (dict(vocab_size=0), ValueError, "vocab_size must be an int >= 1"),
])  # fmt: skip
def test_bad_input_is_refused_by_name_before_any_write(change, error, word):
    out = DFlashInputs.allocate(4, 2)
    for t in out.as_dict().values():
        t.fill_(77)
    args = dict(
        num_reqs=2,
        idx_mapping=torch.tensor([1, 0], dtype=torch.int32),
        last_sampled=torch.arange(4),
        num_computed=torch.arange(4),
        mask_token_id=9,
        out=out,
        vocab_size=8,
    )
    with pytest.raises(error, match=word):
        prepare_dflash_inputs(**{**args, **change})
    assert all(t.eq(77).all() for t in out.as_dict().values())


def test_anchors_of_free_slots_are_not_checked():
    """Only the live slots' anchors are tokens; a free slot's table entry may hold anything (-1 too)."""
    out = DFlashInputs.allocate(4, 2)
    prepare_dflash_inputs(
        2,
        torch.tensor([1, 0], dtype=torch.int32),
        torch.tensor([5, 6, -1, 99]),
        torch.tensor([3, 4, -7, 0]),
        9,
        out,
        vocab_size=8,
    )
    assert out.input_ids[:6].tolist() == [6, 9, 9, 5, 9, 9]


def test_value_checks_read_gpu_tensors_only_under_device_checks(monkeypatch):
    """Reading slots, anchors and positions back is a host sync on a GPU: the tensors are declared GPU
    tensors to ``device_checks.wanted`` here (the test runs anywhere), as the speculator's checks are."""
    monkeypatch.setattr(device_checks, "wanted", lambda *tensors: device_checks.on())
    args = dict(
        num_reqs=2,
        idx_mapping=torch.tensor([1, 0], dtype=torch.int32),
        last_sampled=torch.arange(4),
        num_computed=torch.tensor([0, -5, 2, 3]),
        mask_token_id=9,
        out=DFlashInputs.allocate(4, 2),
        use_triton=False,
        vocab_size=8,
    )
    with device_checks.enabled(False):
        prepare_dflash_inputs(**args)  # not read back: nothing refuses the negative position
    with device_checks.enabled(), pytest.raises(ValueError, match="num_computed of the live slots"):
        prepare_dflash_inputs(**args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_prepare_makes_no_host_sync_on_a_gpu():
    from specfix.tools.syncs import count_host_syncs

    out = DFlashInputs.allocate(4, 2, device="cuda")
    args = (
        2,
        torch.tensor([1, 0], dtype=torch.int32, device="cuda"),
        torch.arange(4, device="cuda"),
        torch.arange(4, device="cuda"),
        9,
        out,
    )
    prepare_dflash_inputs(*args)  # compile first
    assert count_host_syncs(lambda: prepare_dflash_inputs(*args), torch.device("cuda")) == 0


def test_the_drafter_refuses_an_out_of_vocabulary_anchor_before_touching_a_buffer():
    drafter = DFlashDrafter(ToyDFlashModel(16), max_num_reqs=4, num_speculative_steps=3)
    before = {name: t.clone() for name, t in drafter.buffers().items()}
    idx, last = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([0, 1, 16, 3])
    with pytest.raises(ValueError, match=r"last_sampled .* must lie in \[0, vocab_size=16\), got \[16, 0\]"):
        drafter.propose(2, idx, last, torch.arange(4))
    assert all(torch.equal(t, before[name]) for name, t in drafter.buffers().items())


@pytest.mark.parametrize("fix", [True, False, None], ids=["fix", "no-fix", "default"])
def test_unfixed_padding_corrupts_request_state_zero(fix):
    v, m, k = 16, 4, 3
    fixes = {} if fix is None else {"fixes": Fixes(dflash_pad_idx=fix)}
    drafter = DFlashDrafter(ToyDFlashModel(v), max_num_reqs=m, num_speculative_steps=k, **fixes)
    idx = torch.tensor([2, 0], dtype=torch.int32)  # slot 0 is live, at batch row 1
    last, num_computed = torch.arange(m), torch.arange(m) * 3 + 5
    drafter.propose(2, idx, last, num_computed)
    # what slot 0 must hold: its own MASK rows' logits (query rows 5, 6, 7), temperature 1
    model = drafter.model
    expected = model(drafter.inputs.input_ids[5:8], drafter.inputs.positions[5:8])
    assert torch.equal(drafter.draft_logits[0], expected) == (fix is not False)
    # slot 2 (batch row 0) is never hit
    own = model(drafter.inputs.input_ids[1:4], drafter.inputs.positions[1:4])
    assert torch.equal(drafter.draft_logits[2], own)


def test_each_draw_is_keyed_by_the_position_before_it_with_the_drafting_salt():
    """vLLM 0.33's DFlash samples the token at position P with the draw keyed by P - 1, as a drafter's."""
    from specfix.mrv2.gumbel import gumbel_sample

    v, m, k = 16, 4, 3
    drafter = DFlashDrafter(ToyDFlashModel(v), max_num_reqs=m, num_speculative_steps=k)
    drafter.temperature.copy_(torch.tensor([0.7, 1.0, 1.3, 2.0]))
    drafter.seeds.copy_(torch.tensor([11, 22, 33, 44]))
    tokens = drafter.propose(2, torch.tensor([2, 0]), torch.arange(m), torch.arange(m) * 3 + 5, padded=False)
    inp, n = drafter.inputs, 2 * k
    logits = drafter.model(inp.input_ids, inp.positions)[inp.sample_indices[:n]].contiguous()

    def draw(pos, **kw):
        return gumbel_sample(
            logits, inp.sample_idx_mapping[:n], drafter.temperature, drafter.seeds, pos, True, **kw
        )

    assert torch.equal(tokens.flatten(), draw(inp.sample_pos[:n] - 1, is_drafting=True))
    assert not torch.equal(tokens.flatten(), draw(inp.sample_pos[:n], is_drafting=True))  # the key matters


def test_sample_idx_mapping_is_int64_and_names_no_request_at_allocation_and_capture():
    v, m, k = 16, 4, 3
    drafter = DFlashDrafter(
        ToyDFlashModel(v), max_num_reqs=m, num_speculative_steps=k, fixes=Fixes(dflash_pad_idx=False)
    )
    idx = drafter.inputs.sample_idx_mapping
    assert idx.dtype == torch.int64 and idx.tolist() == [-1] * (m * k)  # vLLM 0.33: full of -1
    drafter.propose(2, torch.tensor([2, 0]), torch.arange(m), torch.arange(m))  # unfixed: padding -> slot 0
    drafter.reset_for_capture()  # what capture does first
    before = drafter.draft_logits.clone()
    drafter._sample(m * k)  # the captured step
    assert idx.tolist() == [-1] * (m * k) and torch.equal(drafter.draft_logits, before)


def test_the_drafting_step_reads_nothing_back_unless_device_checks_is_on(monkeypatch):
    """The whole step (prepare, draft, sample) hands no value to the host when the tensors are declared GPU
    tensors and the debug switch is off; with it on, the same bad position is refused by name."""
    from specfix.mrv2.speculator import reference_sampler
    from specfix.tools.syncs import host_reads

    monkeypatch.setattr(device_checks, "wanted", lambda *tensors: device_checks.on())
    drafter = DFlashDrafter(
        ToyDFlashModel(16), max_num_reqs=4, num_speculative_steps=2, sampler=reference_sampler
    )
    idx, last, bad = torch.tensor([2, 0], dtype=torch.int32), torch.arange(4), torch.tensor([3, 1, -4, 2])
    with device_checks.enabled(False):
        _, reads = host_reads(lambda: drafter.propose(2, idx, last, torch.arange(4), padded=True))
    assert reads == []
    with device_checks.enabled(), pytest.raises(ValueError, match="num_computed of the live slots"):
        drafter.propose(2, idx, last, bad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_the_whole_dflash_step_is_one_graph_without_host_syncs_and_replays_as_eager():
    """Prepare and sample captured together in one CUDA graph over fixed input tables: a replay after the
    tables change gives the tokens and draft logits an eager step gives from the same tables; an eager
    step makes no host sync."""
    from specfix.mrv2.cudagraph import CapturedStep
    from specfix.tools.syncs import count_host_syncs

    m, k, v, n = 4, 3, 32, 3
    idx = torch.tensor([2, 0, 3], dtype=torch.int32, device="cuda")
    last, computed = torch.arange(m, device="cuda"), torch.arange(m, device="cuda") * 5 + 2

    def drafter():
        d = DFlashDrafter(ToyDFlashModel(v).cuda(), max_num_reqs=m, num_speculative_steps=k, device="cuda")
        d.temperature.fill_(0.8)
        d.seeds.copy_(torch.arange(m, device="cuda") * 11)
        return d

    graphed = drafter()

    def whole_step(_size):
        prepare_dflash_inputs(
            n, idx, last, computed, graphed.model.mask_token_id, graphed.inputs, graphed.fixes, vocab_size=v
        )
        graphed._sample(m * k)

    graph = CapturedStep(whole_step, [m * k], "cuda")
    last.copy_(torch.tensor([7, 1, 30, 12], device="cuda"))
    computed.copy_(torch.tensor([40, 9, 3, 17], device="cuda"))
    graph.replay(m * k)
    eager = drafter()
    want = eager.propose(n, idx, last, computed, padded=True)
    assert torch.equal(graphed.draft_tokens[: n * k].view(n, k), want)
    assert torch.equal(graphed.draft_logits, eager.draft_logits)
    step = lambda: eager.propose(n, idx, last, computed, padded=True)
    assert count_host_syncs(step, torch.device("cuda")) == 0
