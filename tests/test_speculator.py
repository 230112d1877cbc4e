"""The MRV2 speculator: _copy_request_inputs, the padded step, the stale-row corruption, verification."""

import pytest
import torch

from specfix import Fixes, runtime
from specfix.lab.padding_bench import TableDraft
from specfix.mrv2.gumbel import gumbel_sample
from specfix.mrv2.speculator import (
    DraftModelSpeculator,
    RequestStates,
    reference_sampler,
    rejection_sample_mrv2,
)

V, M, K = 16, 8, 2


def _spec(fix=True, sampler=gumbel_sample, table=None, noise="exact", device="cpu"):
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(1)) if table is None else table
    return DraftModelSpeculator(
        TableDraft(table).to(device),
        max_num_reqs=M,
        num_speculative_steps=K,
        vocab_size=V,
        context_len=1,
        device=device,
        fixes=Fixes(pad_idx_mapping=fix),
        sampler=sampler,
        noise=noise,
    )


TEMP = torch.linspace(0.5, 1.5, M)
SEEDS = torch.arange(M) * 101 + 7


def _idx(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


def _propose(spec, slots, ctx=None, **kw):
    n = len(slots)
    ctx = torch.arange(n)[:, None] % V if ctx is None else ctx
    return spec.propose(n, _idx(*slots), TEMP, SEEDS, ctx, torch.arange(n) + 3, **kw)


@pytest.mark.parametrize("fix", [True, False])
def test_copy_request_inputs(fix):
    spec = _spec(fix)
    spec.idx_mapping.copy_(torch.arange(M, dtype=torch.int32) + 10)  # stale values from "earlier"
    spec._copy_request_inputs(3, torch.tensor([5, 2, 7], dtype=torch.int32), TEMP, SEEDS)
    assert spec.idx_mapping[:3].tolist() == [5, 2, 7]
    assert spec.idx_mapping[3:].tolist() == ([-1] * 5 if fix else [13, 14, 15, 16, 17])
    assert torch.equal(spec.temperature, TEMP) and torch.equal(spec.seeds, SEEDS)


@pytest.mark.parametrize("fix", [True, False])
def test_a_dummy_run_names_no_request_and_writes_no_draft_logits(fix):
    spec = _spec(fix)
    assert spec.idx_mapping.dtype == torch.int64  # vLLM 0.33's dtype
    spec.draft_logits.fill_(7.0)
    _propose(spec, [0, 1, 2], dummy_run=True)  # vLLM 0.33's warm-up batch: an arange over stale slots
    assert spec.idx_mapping.tolist() == [-1] * M
    assert bool((spec.draft_logits == 7.0).all())


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda s: s._copy_request_inputs(M + 1, torch.arange(M + 1, dtype=torch.int32), TEMP, SEEDS),
            ValueError,
            "num_reqs",
        ),
        (
            lambda s: s._copy_request_inputs(2, _idx(0, 1, dtype=torch.uint8), TEMP, SEEDS),
            TypeError,
            "signed",
        ),
        (lambda s: s._copy_request_inputs(2, _idx(1, 1), TEMP, SEEDS), ValueError, "distinct"),
        (lambda s: s._copy_request_inputs(2, _idx(0, M), TEMP, SEEDS), ValueError, "idx_mapping"),
        (lambda s: s._copy_request_inputs(2, _idx(0, 1), TEMP[:4], SEEDS), ValueError, "temperature"),
        (
            lambda s: s.propose(2, _idx(0, 1), -TEMP, SEEDS, torch.zeros(2, 1).long(), torch.arange(2)),
            ValueError,
            "temperature must be >= 0",
        ),
        (
            lambda s: s.propose(
                2,
                torch.tensor([0, 1], dtype=torch.int32),
                TEMP,
                SEEDS,
                torch.tensor([[0], [V]]),
                torch.arange(2),
            ),
            ValueError,
            "context_ids",
        ),
        (
            lambda s: s.propose(
                2,
                torch.tensor([0, 1], dtype=torch.int32),
                TEMP,
                SEEDS,
                torch.zeros(2, 3).long(),
                torch.arange(2),
            ),
            ValueError,
            "context_ids",
        ),
    ],
)
def test_bad_input_leaves_buffers_unchanged(call, exc, match):
    spec = _spec()
    before = {n: t.clone() for n, t in spec.buffers().items()}
    with pytest.raises(exc, match=match):
        call(spec)
    for n, t in spec.buffers().items():
        assert torch.equal(t, before[n]), n


def _expected_logits(spec, slot, ctx_token, drafts):
    """What slot's draft_logits must hold: the draft table row of each step's context, before temperature
    (vLLM 0.33's cache; the verifier divides by T on load)."""
    rows, ctx = [], ctx_token
    for j in range(K):
        rows.append(spec.model.table[ctx])
        ctx = int(drafts[j])
    return torch.stack(rows)


def test_fixed_step_padded_equals_exact_and_stores_the_right_logits():
    spec = _spec(True)
    _propose(spec, [0, 1, 2, 3, 4, 5])  # an earlier, larger batch
    padded = _propose(spec, [5, 3, 0], trace=True)
    assert padded.batch.num_reqs_padded == 4 and padded.ran == "eager (padded size)"
    assert padded.padded_writes == []
    cached = spec.draft_logits.clone()
    exact = _propose(spec, [5, 3, 0], padded=False)
    assert exact.ran == "eager (exact size)"
    assert torch.equal(padded.draft_tokens, exact.draft_tokens)
    for row, slot in enumerate([5, 3, 0]):
        assert torch.equal(cached[slot], spec.draft_logits[slot])
        torch.testing.assert_close(cached[slot], _expected_logits(spec, slot, row, padded.draft_tokens[row]))


def test_unfixed_step_overwrites_a_live_slot_from_a_stale_row():
    spec = _spec(False)
    _propose(spec, [0, 1, 2, 3, 4, 5])  # rows 3.. hold slots 3, 4, 5
    stale = spec.idx_mapping[3].item()
    p = _propose(spec, [5, 3, 0], trace=True)  # padded to 4: row 3 is stale
    assert p.padded_writes == [(3, stale)] and stale == 3  # slot 3 is live at batch row 1
    good = _expected_logits(spec, 3, 1, p.draft_tokens[1])
    assert not torch.allclose(spec.draft_logits[3], good)  # the live request's q is gone
    torch.testing.assert_close(spec.draft_logits[5], _expected_logits(spec, 5, 0, p.draft_tokens[0]))


def test_fresh_buffer_zeros_point_at_slot_zero():
    spec = _spec(False)
    p = _propose(spec, [2, 0, 1], trace=True)
    assert p.padded_writes == [(3, 0)]


def test_reference_sampler_matches_kernel_including_collisions():
    outs = []
    for sampler in (gumbel_sample, reference_sampler):
        spec = _spec(False, sampler)
        _propose(spec, list(range(M))[::-1], ctx=torch.arange(M)[:, None])
        p = _propose(spec, [0, 1, 2])
        outs.append((p.draft_tokens, spec.draft_logits.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_request_states_slots_are_reused_lowest_first():
    states = RequestStates(3, K)
    assert [states.add_request(r, 1.0, i) for i, r in enumerate("abc")] == [0, 1, 2]
    states.remove_request("b")
    assert states.owner(1) is None and states.add_request("d", 1.0, 0) == 1
    with pytest.raises(ValueError, match="slots"):
        states.add_request("e", 1.0, 0)
    with pytest.raises(ValueError, match="temperature"):
        RequestStates(2, K).add_request("x", 0.0, 0)


def _verify_inputs(n, slots):
    g = torch.Generator().manual_seed(3)
    target = torch.randn(n * (K + 1), V, generator=g)
    drafts = torch.randint(0, V, (n, K), generator=g)
    draft_logits = torch.randn(M, K, V, generator=g)
    return target, drafts, draft_logits, torch.tensor(slots, dtype=torch.int32)


def test_verification_is_batch_invariant():
    target, drafts, draft_logits, idx = _verify_inputs(3, [4, 1, 6])
    pos = torch.tensor([7, 9, 11])
    batched, nb = rejection_sample_mrv2(target, drafts, draft_logits, idx, TEMP, SEEDS, pos)
    for i in range(3):
        rows = target[i * (K + 1) : (i + 1) * (K + 1)]
        alone, na = rejection_sample_mrv2(
            rows, drafts[i : i + 1], draft_logits, idx[i : i + 1], TEMP, SEEDS, pos[i : i + 1]
        )
        assert torch.equal(alone[0], batched[i]) and na.item() == nb[i].item()
    assert ((nb >= 1) & (nb <= K + 1)).all()


def test_verification_divides_the_cached_logits_by_the_temperature():
    """The cache holds the draft's logits before temperature (vLLM 0.33); the verifier divides them by the
    request's T on load. A draft distribution equal to the target's (same raw logits, same T) is accepted at
    every step, whatever the drafted tokens (here each row's least likely ones, where q without the
    division, flatter than p at T < 1, would put far more mass than p)."""
    n, slots, temps = 4, [6, 2, 5, 0], torch.full((M,), 0.4)
    target, _, draft_logits, idx = _verify_inputs(n, slots)
    for i, slot in enumerate(slots):
        draft_logits[slot] = target[i * (K + 1) : i * (K + 1) + K]
    drafts = draft_logits[slots].argmin(-1)
    sampled, num_sampled = rejection_sample_mrv2(
        target, drafts, draft_logits, idx, temps, SEEDS, torch.arange(n) * 5
    )
    assert num_sampled.tolist() == [K + 1] * n and torch.equal(sampled[:, :K], drafts.to(sampled.dtype))


def test_verification_bad_input():
    target, drafts, draft_logits, idx = _verify_inputs(2, [0, 1])
    with pytest.raises(ValueError, match="k="):
        rejection_sample_mrv2(target, drafts, draft_logits[:, :1], idx, TEMP, SEEDS, torch.arange(2))
    with pytest.raises(TypeError, match="signed"):
        rejection_sample_mrv2(target, drafts, draft_logits, idx.to(torch.uint8), TEMP, SEEDS, torch.arange(2))
    with pytest.raises(ValueError, match="target_logits"):
        rejection_sample_mrv2(target[:-1], drafts, draft_logits, idx, TEMP, SEEDS, torch.arange(2))


@pytest.mark.cuda
@pytest.mark.parametrize("fix", [True, False])
def test_cuda_graph_replay_matches_eager_padded_step(fix):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    results = []
    for graphs in (True, False):
        spec = _spec(fix, device="cuda")
        if graphs:
            spec.capture_cuda_graphs()
        spec.draft_logits.zero_()
        spec.idx_mapping.zero_()
        temp, seeds = TEMP.cuda(), SEEDS.cuda()
        spec.propose(
            6,
            torch.arange(6, dtype=torch.int32, device="cuda"),
            temp,
            seeds,
            torch.arange(6, device="cuda")[:, None],
            torch.arange(6, device="cuda"),
        )
        p = spec.propose(
            3,
            torch.tensor([5, 3, 0], dtype=torch.int32, device="cuda"),
            temp,
            seeds,
            torch.arange(3, device="cuda")[:, None],
            torch.arange(3, device="cuda"),
            trace=True,
        )
        assert p.ran == ("cuda graph replay" if graphs else "eager (padded size)")
        results.append((p.draft_tokens.cpu(), spec.draft_logits[[5, 0]].cpu(), p.padded_writes))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])  # slots 5, 0: no stale row points there
    assert results[0][2] == results[1][2] == ([] if fix else [(3, 3)])


@pytest.mark.parametrize("name", ["max_num_reqs", "num_speculative_steps", "vocab_size", "context_len"])
@pytest.mark.parametrize("value", [0, 1.5])
def test_bad_sizes_are_refused_by_name(name, value):
    sizes = dict(max_num_reqs=M, num_speculative_steps=K, vocab_size=V, context_len=1)
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
        DraftModelSpeculator(TableDraft(torch.zeros(V, V)), **{**sizes, name: value})


def test_vocab_size_is_checked_against_the_model_at_construction():
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(1))
    with pytest.raises(
        ValueError,
        match=rf"vocab_size={V + 1} does not match the draft model, whose logits "
        rf"have shape \(1, {V}\)",
    ):
        DraftModelSpeculator(
            TableDraft(table), max_num_reqs=M, num_speculative_steps=K, vocab_size=V + 1, context_len=1
        )


def test_bad_noise_mode_is_refused():
    with pytest.raises(ValueError, match="noise must be one of"):
        DraftModelSpeculator(
            TableDraft(torch.zeros(V, V)),
            max_num_reqs=M,
            num_speculative_steps=K,
            vocab_size=V,
            context_len=1,
            noise="philox",
        )


def _expected_drafts(
    spec, slots, ctx, positions, sampler, seeds=SEEDS, step_seed=False, is_drafting=False, cache=None, **kw
):
    """Each step's draw, called directly: step j samples table[last token] keyed by positions + j (and, with
    a ``cache``, stores into its column j, given as vLLM's draft-model speculator gives it: a 0-d tensor)."""
    idx, last, out = _idx(*slots, dtype=torch.int64), ctx[:, -1], []
    for step in range(K):
        seed = seeds ^ (step << 32) if step_seed else seeds
        store = () if cache is None else (cache, torch.tensor(step))
        last = sampler(
            spec.model.table[last].contiguous(),
            idx,
            TEMP,
            seed,
            positions + step,
            True,
            is_drafting,
            *store,
            **kw,
        )
        out.append(last)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("noise", ["exact", "vllm"])
def test_step_j_is_keyed_by_positions_plus_j_as_a_drafters_draw(noise):
    """vLLM keys a draw by the position before the sampled token (the last context token's: positions + j
    at step j) and a drafter's draw with is_drafting (0.33's salt); the vllm mode also mixes the step into
    the seed (0.33's spec_step_seed, since the step is the draft_logits column)."""
    spec = _spec(noise=noise)
    slots, ctx, positions = [5, 3, 0], torch.tensor([[1], [7], [12]]), torch.tensor([40, 2**33, 7])
    got = spec.propose(3, _idx(*slots), TEMP, SEEDS, ctx, positions, padded=False).draft_tokens
    mixed = noise == "vllm"
    want = _expected_drafts(
        spec, slots, ctx, positions, gumbel_sample, step_seed=mixed, is_drafting=True, noise=noise
    )
    assert torch.equal(got, want)
    unsalted = _expected_drafts(spec, slots, ctx, positions, gumbel_sample, step_seed=mixed, noise=noise)
    assert not torch.equal(got, unsalted)


@pytest.mark.skipif(runtime.DEVICE.type != "cpu", reason="compares in Triton's interpreter")
def test_vllm_mode_drafts_and_caches_what_vllms_own_kernel_does(vllm_gumbel):
    """With vLLM 0.33's sampler fetched into .peer/: the drafter's noise="vllm" steps equal its
    gumbel_sample(..., is_drafting=True, logits_cache, step) at positions + j (it mixes the step into the
    seed itself), and the drafter's draft_logits equal vLLM's cache value for value."""
    spec = _spec(noise="vllm")
    slots, ctx, positions = [2, 6, 1, 4], torch.tensor([[3], [3], [9], [15]]), torch.tensor([0, 11, 2**31, 5])
    got = spec.propose(4, _idx(*slots), TEMP, SEEDS, ctx, positions, padded=False).draft_tokens
    cache = torch.zeros_like(spec.draft_logits)
    theirs = _expected_drafts(
        spec, slots, ctx, positions, vllm_gumbel.gumbel_sample, is_drafting=True, cache=cache
    )
    assert torch.equal(got, theirs) and torch.equal(spec.draft_logits, cache)
    assert cache[slots].abs().sum() > 0 and not cache[[0, 3, 5, 7]].any()


def test_temperatures_under_sampling_eps_are_refused_for_probabilistic_drafting():
    with pytest.raises(ValueError, match=r"temperature must be >= SAMPLING_EPS \(1e-05\)"):
        RequestStates(2, K).add_request("x", 1e-6, 0)
    target, drafts, draft_logits, idx = _verify_inputs(2, [0, 1])
    temps = TEMP.clone()
    temps[1] = 1e-40
    with pytest.raises(ValueError, match="probabilistic verification needs temperature >= SAMPLING_EPS"):
        rejection_sample_mrv2(target, drafts, draft_logits, idx, temps, SEEDS, torch.arange(2))


def test_the_drafting_step_reads_nothing_back_unless_device_checks_is_on(monkeypatch):
    """Declared GPU tensors (the test runs anywhere), with the debug switch off, the whole step hands no value
    to the host; with it on, a context id outside the vocabulary is refused by name."""
    from specfix.tools.syncs import host_reads
    from specfix.v1 import device_checks

    monkeypatch.setattr(device_checks, "wanted", lambda *tensors: device_checks.on())
    spec = _spec(sampler=reference_sampler)
    with device_checks.enabled(False):
        _, reads = host_reads(lambda: _propose(spec, [5, 3, 0]))
    assert reads == []
    with device_checks.enabled(), pytest.raises(ValueError, match=r"context_ids must lie in \[0, 16\)"):
        _propose(spec, [5, 3, 0], ctx=torch.tensor([[1], [16], [2]]))


@pytest.mark.cuda
def test_the_whole_drafting_step_is_one_graph_without_host_syncs_and_replays_as_eager():
    """Copying the request inputs and the k draft steps captured together in one CUDA graph: a replay after
    the request tables change gives the tokens and draft logits of an eager step from the same tables, and
    a step that replays the speculator's own graphs makes no host sync."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from specfix.mrv2.cudagraph import CapturedStep
    from specfix.tools.syncs import count_host_syncs

    make = lambda: _spec(device="cuda")
    n, idx = 3, torch.tensor([5, 3, 0], dtype=torch.int32, device="cuda")
    temp, seeds = TEMP.cuda(), SEEDS.cuda()
    ctx, pos = torch.tensor([[1], [4], [9]], device="cuda"), torch.tensor([3, 8, 2], device="cuda")
    graphed = make()

    def whole_step(size):
        graphed._copy_request_inputs(n, idx, temp, seeds)
        graphed.context_ids[:n].copy_(ctx)
        graphed.positions[:n].copy_(pos)
        graphed._draft_step(size)

    graph = CapturedStep(whole_step, [M], "cuda")
    temp.copy_(temp.flip(0))
    seeds.add_(1000)
    ctx.copy_(torch.tensor([[7], [2], [11]], device="cuda"))
    graph.replay(M)
    eager = make()
    want = eager.propose(n, idx, temp, seeds, ctx, pos, padded=False)
    assert torch.equal(graphed.draft_tokens[:n], want.draft_tokens)
    assert torch.equal(graphed.draft_logits[[5, 3, 0]], eager.draft_logits[[5, 3, 0]])
    eager.capture_cuda_graphs()
    step = lambda: eager.propose(n, idx, temp, seeds, ctx, pos)
    assert step().ran == "cuda graph replay"
    assert count_host_syncs(step, torch.device("cuda")) == 0
