"""The recovered-token draw as one Triton kernel: the same tokens as its torch twin from the same seeds, and
value checks that read GPU tensors only under the debug switch."""

import pytest
import torch

from specfix.runtime import HAS_TRITON
from specfix.v1 import device_checks, recovered_tokens
from specfix.v1 import rejection_sampler as rs
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton (compiled or interpreted)")


def _draw(backend, ks, vocab, drafts, target, draft_probs, seeded):
    seeds = [50 + i if seeded else None for i in range(len(ks))]
    meta = SamplingMetadata.from_requests([1.0] * len(ks), seeds)
    cu = torch.tensor(ks).cumsum(0).to(torch.int32)
    torch.manual_seed(3)
    return rs.sample_recovered_tokens(
        max(ks), ks, cu, drafts, draft_probs, target, meta, "cpu", backend=backend
    )


@needs_triton
@pytest.mark.parametrize("vocab", [17, 300, 4099])
@pytest.mark.parametrize("ks", [[1], [3, 0, 2], [5, 5, 1, 4]])
@pytest.mark.parametrize("with_draft_probs", [False, True])
@pytest.mark.parametrize("seeded", [False, True])
def test_kernel_draws_the_torch_twins_tokens(vocab, ks, with_draft_probs, seeded):
    gen = torch.Generator().manual_seed(vocab * 7 + len(ks))
    total = sum(ks)
    drafts = torch.randint(0, vocab, (total,), generator=gen, dtype=torch.int32)
    drafts[::3] = -1  # placeholders zero nothing
    target = torch.softmax(torch.randn(total, vocab, generator=gen) * 4, dim=-1)
    draft_probs = None
    if with_draft_probs:
        draft_probs = torch.softmax(torch.randn(total, vocab, generator=gen) * 4, dim=-1)
    ours = _draw("triton", ks, vocab, drafts, target, draft_probs, seeded)
    ref = _draw("torch", ks, vocab, drafts, target, draft_probs, seeded)
    assert ours.dtype == torch.int32 and ours.shape == (total,)
    assert torch.equal(ours, ref)
    if not with_draft_probs:  # the draft's own token is never recovered (its residual is 0)
        real = drafts >= 0
        assert not bool((ours[real] == drafts[real]).any())


@needs_triton
def test_ties_go_to_the_first_column(monkeypatch):
    # equal residual and equal noise everywhere: torch's argmax takes column 0, so must the kernel
    target = torch.full((2, 64), 1 / 64)
    cu = torch.tensor([2], dtype=torch.int32)
    noise = torch.ones(1, 64)
    drafts = torch.tensor([0, 5], dtype=torch.int32)
    monkeypatch.setattr(recovered_tokens, "_exponential_noise", lambda *args: noise)
    meta = SamplingMetadata.from_requests([1.0], [None])
    for backend in ("torch", "triton"):
        out = rs.sample_recovered_tokens(2, [2], cu, drafts, None, target, meta, "cpu", backend=backend)
        assert out.tolist() == [1, 0], backend  # row 0 zeroed its draft (column 0): column 1 is first


@needs_triton
@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_rows_split_over_programs_draw_the_same_tokens(monkeypatch, splits, with_draft_probs):
    # the GPU's launch for few tokens: each row split over several programs, then a second kernel picks
    gen = torch.Generator().manual_seed(splits)
    ks, vocab = [2, 0, 3], 1000
    drafts = torch.randint(0, vocab, (sum(ks),), generator=gen, dtype=torch.int32)
    drafts[1] = -1
    target = torch.softmax(torch.randn(sum(ks), vocab, generator=gen) * 4, dim=-1)
    draft_probs = (
        torch.softmax(torch.randn(sum(ks), vocab, generator=gen) * 4, dim=-1) if with_draft_probs else None
    )
    ref = _draw("torch", ks, vocab, drafts, target, draft_probs, seeded=True)
    monkeypatch.setattr(recovered_tokens, "recovered_launch", lambda programs, v: (128, splits))
    assert torch.equal(_draw("triton", ks, vocab, drafts, target, draft_probs, seeded=True), ref)


@needs_triton
def test_ties_across_splits_go_to_the_first_column(monkeypatch):
    # the same best score in every split: the lowest column wins, as torch's argmax picks it
    target = torch.full((1, 512), 1 / 512)
    cu, drafts = torch.tensor([1], dtype=torch.int32), torch.tensor([-1], dtype=torch.int32)
    monkeypatch.setattr(recovered_tokens, "_exponential_noise", lambda *args: torch.ones(1, 512))
    monkeypatch.setattr(recovered_tokens, "recovered_launch", lambda programs, v: (64, 4))
    meta = SamplingMetadata.from_requests([1.0], [None])

    def draw():
        return rs.sample_recovered_tokens(1, [1], cu, drafts, None, target, meta, "cpu", backend="triton")

    assert draw().tolist() == [0]
    target[0, 300] = 2 / 512  # a strict best in the third split wins
    assert draw().tolist() == [300]


def test_recovered_launch_fills_the_gpu_at_small_batches(monkeypatch):
    monkeypatch.setattr(recovered_tokens.runtime, "INTERPRET", False)
    block, one = recovered_tokens.recovered_launch(1, 151_936)
    assert one == recovered_tokens.MAX_RECOVERED_SPLITS and block * one <= 151_936
    assert (
        recovered_tokens.recovered_launch(1280, 151_936)[1] == 1
    )  # enough tokens: one program each, as vLLM
    assert recovered_tokens.recovered_launch(64, 151_936)[1] * 64 >= recovered_tokens.RECOVERED_PROGRAMS
    assert recovered_tokens.recovered_launch(1, 3000)[1] == 2  # never more splits than tiles


@needs_triton
def test_whole_random_step_same_tables_on_both_backends():
    gen = torch.Generator().manual_seed(11)
    ks, vocab = [3, 1, 0, 2], 257
    drafts = [torch.randint(0, vocab, (k,), generator=gen).tolist() for k in ks]
    meta = SpecDecodeMetadata.make_dummy(drafts)
    logits = torch.randn(sum(ks) + len(ks), vocab, generator=gen) * 3
    probs = torch.softmax(torch.randn(sum(ks), vocab, generator=gen), -1)
    tables = []
    for backend in ("triton", "torch"):
        sm = SamplingMetadata.from_requests([1.0] * len(ks), [9, 10, 11, 12])
        tables.append(rs.RejectionSampler(backend=backend)(meta, probs, logits, sm))
    assert torch.equal(*tables)


def test_device_checks_switch_scopes_and_cpu_is_always_checked():
    cpu = torch.zeros(2)
    assert device_checks.wanted(cpu, None)  # a CPU tensor costs no sync: always checked
    assert device_checks.on() is False
    with device_checks.enabled():
        assert device_checks.on()
        with device_checks.enabled(False):
            assert not device_checks.on()
        assert device_checks.on()
    assert not device_checks.on()


def test_cpu_values_are_still_checked():
    # value checks on CPU tensors stay on with the switch off
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        SamplingMetadata(temperature=torch.tensor([-1.0]), all_greedy=False, all_random=True, generators={})
    meta = SpecDecodeMetadata.make_dummy([[1, 2]])
    with pytest.raises(ValueError, match="cu_num_draft_tokens must be the inclusive cumsum"):
        SpecDecodeMetadata(
            meta.draft_token_ids,
            [2],
            torch.tensor([3], dtype=torch.int32),
            meta.cu_num_sampled_tokens,
            meta.target_logits_indices,
            meta.bonus_logits_indices,
            meta.logits_indices,
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_step_path_makes_no_host_sync_on_a_gpu():
    from specfix.tools.syncs import sync_warnings

    dev = torch.device("cuda")
    drafts = [[5, 6, -1], [7], [8, 9, 10]]
    sm = SamplingMetadata.from_requests([1.0, 0.0, 0.7], [1, None, 3], device=dev)
    meta = SpecDecodeMetadata.make_dummy(drafts, device=dev)
    logits = torch.randn(10, 1000, device=dev)
    probs = torch.softmax(torch.randn(7, 1000, device=dev), -1)
    sampler = rs.RejectionSampler(backend="triton")
    sampler(meta, probs, logits, sm)  # compile first
    assert sync_warnings(lambda: SpecDecodeMetadata.make_dummy(drafts, device=dev)) == []
    assert sync_warnings(lambda: SamplingMetadata.from_requests([1.0], [2], device=dev)) == []
    assert sync_warnings(lambda: sampler(meta, probs, logits, sm)) == []
