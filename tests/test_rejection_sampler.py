"""The V1 rejection sampler: exact greedy cases, placeholders, distribution, seeding, kernels vs references.

Expected values come from hand computation, from an independent numpy softmax, or from properties;
statistical tests use chi-square with bins of expected count < 5 merged and threshold df + 10 sqrt(2 df).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfix import Fixes
from specfix.fixes import show_fix
from specfix.runtime import DEVICE, HAS_TRITON
from specfix.tools.stats import chi_square_samples
from specfix.v1 import device_checks, rejection_kernels
from specfix.v1 import rejection_sampler as rs
from specfix.v1.rejection_sampler import (
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    apply_sampling_constraints,
    generate_uniform_probs,
    rejection_greedy_sample,
    rejection_random_sample,
    rejection_sample,
    sample_recovered_tokens,
)
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton"))]
FIX_OFF = Fixes(reject_negative_drafts=False)


# ----------------------------------------------------------------------------------------------------
# helpers


def logits_with_argmax(argmaxes: list[int], vocab_size: int) -> torch.Tensor:
    """One row per entry, a clear winner at the given token."""
    logits = torch.zeros(len(argmaxes), vocab_size)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


def greedy(batch_size: int, device="cpu") -> SamplingMetadata:
    return SamplingMetadata.from_requests([0.0] * batch_size, [None] * batch_size, device)


def check_output_contract(out: torch.Tensor, num_draft_tokens: list[int], vocab_size: int) -> None:
    """Contract 1 and 3: each row holds a prefix of 1..k_i+1 real ids in [0, V), -1 after it."""
    assert out.dtype == torch.int32
    assert out.shape == (len(num_draft_tokens), max(num_draft_tokens) + 1)
    for row, k in zip(out.tolist(), num_draft_tokens, strict=True):
        n = sum(t != PLACEHOLDER_TOKEN_ID for t in row)
        assert 1 <= n <= k + 1, row
        assert all(0 <= t < vocab_size for t in row[:n]), f"non-token in the valid prefix of {row}"
        assert all(t == PLACEHOLDER_TOKEN_ID for t in row[n:]), f"token after a placeholder in {row}"


def chi_square_passes(samples: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    r = chi_square_samples(samples, probs)
    return r["passed"], r["chi2"], r["threshold"]


def softmax_np(logits: torch.Tensor, temperature: float) -> np.ndarray:
    x = logits.double().numpy() / temperature
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------------------------------
# greedy: exact outputs worked out by hand

GREEDY_CASES = {
    # name: (drafts per request, target argmax of each logits row of each request (k_i targets, then the
    # bonus row), expected output)
    "all accepted, bonus appended": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "first draft rejected": ([[1, 2, 3]], [[5, 2, 3, 4]], [[5, -1, -1, -1]]),
    "rejection in the middle": ([[1, 2, 3]], [[1, 7, 3, 4]], [[1, 7, -1, -1]]),
    "last draft rejected": ([[1, 2, 3]], [[1, 2, 0, 4]], [[1, 2, 0, -1]]),
    "fewer drafts put the bonus earlier; k=0 gets only a bonus": (
        [[1, 2], [], [3]],
        [[1, 2, 9], [6], [3, 8]],
        [[1, 2, 9], [6, -1, -1], [3, 8, -1]],
    ),
    "all requests without drafts": ([[], []], [[4], [5]], [[4], [5]]),
    "all placeholders: argmax emitted at slot 0": ([[-1, -1, -1]], [[4, 5, 6, 7]], [[4, -1, -1, -1]]),
    "placeholder after an accepted draft": ([[1, -1, -1]], [[1, 5, 6, 7]], [[1, 5, -1, -1]]),
    "placeholder in the middle": ([[1, -1, 3]], [[1, 2, 3, 4]], [[1, 2, -1, -1]]),
    "placeholder beside an ordinary request": (
        [[-1, -1], [0, 1]],
        [[3, 3, 3], [0, 1, 2]],
        [[3, -1, -1], [0, 1, 2]],
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fixes", [Fixes(), FIX_OFF], ids=["fix-on", "fix-off"])
@pytest.mark.parametrize("name", list(GREEDY_CASES))
def test_greedy_outputs_worked_out_by_hand(name, fixes, backend):
    drafts, argmaxes, expected = GREEDY_CASES[name]
    vocab_size = 10
    md = SpecDecodeMetadata.make_dummy(drafts, DEVICE)
    logits = logits_with_argmax([a for row in argmaxes for a in row], vocab_size).to(DEVICE)
    out = RejectionSampler(fixes, backend=backend)(md, None, logits, greedy(len(drafts), DEVICE))
    assert out.tolist() == expected
    check_output_contract(out, md.num_draft_tokens, vocab_size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_reads_rows_through_the_metadata_indices(backend):
    # Same request, logits rows shuffled: the indices must follow them.
    md = SpecDecodeMetadata.make_dummy([[1, 2]])
    md.target_logits_indices = torch.tensor([2, 0], dtype=torch.int32)
    md.bonus_logits_indices = torch.tensor([1], dtype=torch.int32)
    logits = logits_with_argmax([2, 9, 1], 10)  # row 2 verifies draft 1, row 0 draft 2, row 1 is the bonus
    out = RejectionSampler(backend=backend)(md, None, logits, greedy(1))
    assert out.tolist() == [[1, 2, 9]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_forward_on_bfloat16_logits_matches_their_float32_copy(backend):
    # the all-greedy forward takes its argmax on the logits as they come: bf16 -> fp32 is exact
    md = SpecDecodeMetadata.make_dummy([[1, 2, 3], [], [4, -1]], DEVICE)
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(8, 6, generator=g) * 2).to(torch.bfloat16).to(DEVICE)
    logits[0, 1] = logits[0].max()  # a tie, which goes to the first column either way
    sampler = RejectionSampler(backend=backend)
    ours = sampler(md, None, logits, greedy(3, DEVICE))
    assert torch.equal(ours, sampler(md, None, logits.float(), greedy(3, DEVICE)))
    expected = logits.float().argmax(-1)
    assert ours[1, 0] == expected[4]  # the request without drafts emits its bonus row's argmax


def test_forward_leaves_the_logits_alone():
    md = SpecDecodeMetadata.make_dummy([[1, 2], [3]])
    logits = torch.randn(5, 8)
    before = logits.clone()
    RejectionSampler(backend="torch")(md, None, logits, SamplingMetadata.from_requests([0.5, 2.0], [1, 2]))
    assert torch.equal(logits, before)


def test_parse_output_drops_placeholders_and_out_of_vocab_ids():
    out = torch.tensor([[1, 2, -1], [-1, -1, -1], [3, 12, -1], [4, 5, 6]], dtype=torch.int32)
    assert RejectionSampler.parse_output(out, 10) == [[1, 2], [], [3], [4, 5, 6]]
    assert RejectionSampler.parse_output(out, 10, discard_req_indices=[3]) == [[1, 2], [], [3], []]
    with pytest.raises(ValueError, match="vocab_size"):
        RejectionSampler.parse_output(out, 0)
    with pytest.raises(ValueError, match="discard_req_indices"):
        RejectionSampler.parse_output(out, 10, discard_req_indices=[4])


# ----------------------------------------------------------------------------------------------------
# helpers mirrored from vLLM


def test_apply_sampling_constraints_expands_each_temperature_over_its_requests_tokens():
    # vLLM's expand_batch_to_tokens: counts [2, 3, 1], then [0, 2, 0] (requests without drafts own no row)
    sm = SamplingMetadata.from_requests([0.5, 0.25, 2.0], [None, None, None])
    out = apply_sampling_constraints(torch.ones(6, 2), torch.tensor([2, 5, 6], dtype=torch.int32), sm)
    assert out[:, 0].tolist() == [2, 2, 4, 4, 4, 0.5]
    out = apply_sampling_constraints(torch.ones(2, 2), torch.tensor([0, 2, 2]), sm)
    assert out[:, 0].tolist() == [4, 4]


def test_apply_sampling_constraints_divides_by_temperature_and_leaves_greedy_rows():
    logits = torch.ones(3, 4)
    sm = SamplingMetadata.from_requests([0.5, 0.0], [None, None])
    out = apply_sampling_constraints(logits, torch.tensor([2, 3]), sm)
    assert out[:2].eq(2.0).all() and out[2].eq(1.0).all()
    all_greedy = torch.ones(2, 4)
    assert apply_sampling_constraints(all_greedy, torch.tensor([2]), greedy(1)).eq(1.0).all()


def test_uniform_probs_are_float64_drawn_from_each_seeded_generator_in_batch_order():
    gens = {0: torch.Generator().manual_seed(3), 1: torch.Generator().manual_seed(4), 3: torch.Generator()}
    gens[3].manual_seed(5)
    u = generate_uniform_probs(6, [2, 0, 1, 3], gens, "cpu")
    assert u.dtype == torch.float64 and ((u >= 0) & (u < 1)).all()
    expect0 = torch.rand(2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expect3 = torch.rand(3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(u[0:2], expect0) and torch.equal(u[3:6], expect3)
    # Request 1 has no drafts: its generator was not touched.
    fresh = torch.rand(4, generator=torch.Generator().manual_seed(4))
    assert torch.equal(torch.rand(4, generator=gens[1]), fresh)


def test_recovered_tokens_follow_the_residual():
    vocab_size = 5
    sm = SamplingMetadata.from_requests([1.0], [None])
    cu = torch.tensor([3], dtype=torch.int32)
    # Target mass almost all on token 0 (rows 0 and 2) or on the last token (row 1).
    p = torch.softmax(torch.tensor([[12.0, 0, 0, 0, 0], [0, 0, 0, 0, 12.0], [12.0, 0, 0, 0, 0]]), dim=-1)
    draft = torch.tensor([0, -1, 2], dtype=torch.int32)
    seen = torch.stack([sample_recovered_tokens(3, [3], cu, draft, None, p, sm, "cpu") for _ in range(200)])
    assert (seen[:, 0] != 0).all(), "the rejected draft token itself must never be recovered"
    # A -1 draft zeroes nothing (in particular not the last entry, which index -1 would hit).
    assert (seen[:, 1] == vocab_size - 1).float().mean() > 0.9
    assert (seen[:, 2] == 0).float().mean() > 0.9
    # With draft probs the residual is max(p - q, 0): here only token 0 has p > q.
    p3 = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0]])
    q3 = torch.tensor([[0.2, 0.4, 0.4, 0.0, 0.0]])
    one = torch.tensor([1], dtype=torch.int32)
    for _ in range(20):
        rec = sample_recovered_tokens(1, [1], one, torch.tensor([1], dtype=torch.int32), q3, p3, sm, "cpu")
        assert rec.tolist() == [0]
    assert seen.dtype == torch.int32 and ((seen >= 0) & (seen < vocab_size)).all()


# ----------------------------------------------------------------------------------------------------
# the random path with the caller's randomness (the interface chapter 3 uses): worked by hand


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_core_with_caller_uniforms_and_recovered_ids(backend):
    p = torch.tensor(
        [
            [0.1, 0.4, 0.3, 0.2],  # draft 1: p/q = 0.4/0.5 = 0.8 >= u 0.3 -> accept
            [0.25, 0.25, 0.2, 0.3],  # draft 2: p/q = 0.2/0.4 = 0.5 < u 0.9 -> reject, emit recovered 3
            [0.25, 0.25, 0.25, 0.25],  # never reached
            [0.7, 0.1, 0.1, 0.1],  # request 1, draft 0: q = 0 -> reject, emit recovered 2
            [0.3, 0.3, 0.2, 0.2],  # request 2, draft 3: p/q = 0.2/0.1 >= 0.99 -> accept, then bonus 1
        ]
    )
    q = torch.tensor(
        [
            [0.1, 0.5, 0.2, 0.2],
            [0.2, 0.2, 0.4, 0.2],
            [0.25, 0.25, 0.25, 0.25],
            [0.0, 0.5, 0.5, 0.0],
            [0.3, 0.3, 0.3, 0.1],
        ]
    )
    # a vocabulary of 10 where ids 4 to 9 have probability 0, so that the bonus ids 7 and 8 stand out
    p, q = torch.nn.functional.pad(p, (0, 6)), torch.nn.functional.pad(q, (0, 6))
    uniform = torch.tensor([0.3, 0.9, 0.5, 0.01, 0.99], dtype=torch.float64)
    recovered = torch.tensor([0, 3, 0, 2, 0], dtype=torch.int32)
    draft = torch.tensor([1, 2, 0, 0, 3], dtype=torch.int32)
    bonus = torch.tensor([7, 8, 1], dtype=torch.int32)
    p, q, uniform, recovered, draft, bonus = (t.to(DEVICE) for t in (p, q, uniform, recovered, draft, bonus))
    cu = torch.tensor([3, 4, 5], dtype=torch.int32, device=DEVICE)
    sm = SamplingMetadata.from_requests([1.0, 1.0, 1.0], [None] * 3, DEVICE)
    out = rejection_sample(
        draft, [3, 1, 1], 3, cu, q, p.log(), bonus, sm,
        uniform_probs=uniform, recovered_token_ids=recovered, backend=backend,
    )  # fmt: skip
    assert out.tolist() == [[1, 3, -1, -1], [2, -1, -1, -1], [3, 1, -1, -1]]
    # Without draft probs (q = 1): accept iff p(d) >= u.
    out = rejection_sample(
        draft, [3, 1, 1], 3, cu, None, p.log(), bonus, sm,
        uniform_probs=uniform, recovered_token_ids=recovered, backend=backend,
    )  # fmt: skip
    # row 0: 0.4 >= 0.3 accept, 0.2 < 0.9 reject -> 3; row 1: 0.7 >= 0.01 accept, bonus 8;
    # row 2: 0.2 < 0.99 -> 0
    assert out.tolist() == [[1, 3, -1, -1], [0, 8, -1, -1], [0, -1, -1, -1]]


# ----------------------------------------------------------------------------------------------------
# placeholders in the random path


def _random_trials(drafts: list[int], trials: int, vocab_size: int, seed: int, draft_probs: bool):
    """Run one request shape ``trials`` times in one batch; target rows random but fixed per position."""
    g = torch.Generator().manual_seed(seed)
    k = len(drafts)
    per_request = torch.randn(k + 1, vocab_size, generator=g) * 1.5
    md = SpecDecodeMetadata.make_dummy([drafts] * trials)
    logits = per_request.repeat(trials, 1)
    q = torch.softmax(-per_request[:k], dim=-1).repeat(trials, 1) if draft_probs else None
    sm = SamplingMetadata.from_requests([1.0] * trials, [None] * trials)
    return md, logits, q, sm, per_request


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no-draft-probs", "draft-probs"])
@pytest.mark.parametrize(
    "drafts, max_tokens",
    [([-1, -1, -1], 1), ([None, -1, -1], 2), ([None, -1, None], 2), ([-1], 1)],
    ids=["all-placeholders", "after-accepted", "in-the-middle", "k1-placeholder"],
)
def test_random_path_never_accepts_a_placeholder(drafts, max_tokens, with_draft_probs):
    # None marks a real draft: the target's own most likely token, so it is often accepted.
    vocab_size, trials = 16, 400
    torch.manual_seed(0)
    md, logits, q, sm, per_request = _random_trials(
        [0] * len(drafts), trials, vocab_size, 1, with_draft_probs
    )
    best = per_request.argmax(-1).tolist()
    real = [best[j] if d is None else d for j, d in enumerate(drafts)]
    md = SpecDecodeMetadata.make_dummy([real] * trials)
    out = RejectionSampler(backend="torch")(md, q, logits, sm)
    check_output_contract(out, md.num_draft_tokens, vocab_size)
    counts = (out != PLACEHOLDER_TOKEN_ID).sum(dim=1)
    assert counts.max() <= max_tokens
    if max_tokens == 2:
        assert (counts == 2).any(), "the real draft before the placeholder should sometimes be accepted"


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_path_placeholders_small_batch_both_backends(backend):
    vocab_size = 8
    drafts = [[-1, -1], [3, -1, 4], [-1], []]
    md = SpecDecodeMetadata.make_dummy(drafts, DEVICE)
    torch.manual_seed(1)
    logits = torch.randn(md.draft_token_ids.numel() + 4, vocab_size)
    logits[:, vocab_size - 1] += 6.0  # the last vocab entry dominates every row
    sm = SamplingMetadata.from_requests([1.0, 0.8, 1.3, 1.0], [1, 2, 3, 4], DEVICE)
    logits = logits.to(DEVICE)
    out = RejectionSampler(backend=backend)(md, None, logits, sm)
    check_output_contract(out, md.num_draft_tokens, vocab_size)


# ----------------------------------------------------------------------------------------------------
# the bug: PR #46533 switched off


def _bug_case(vocab_size: int = 8):
    """Request 0's only row puts almost all mass on the last vocab entry; request 1 starts with -1.

    Without the guard the -1 draft of request 1 is checked against flat offset ``1 * V - 1``: request
    0's last entry, ~1, so the placeholder is accepted and -1 is written as a token."""
    md = SpecDecodeMetadata.make_dummy([[2], [-1, 5]], DEVICE)
    logits = torch.zeros(5, vocab_size)
    logits[0, vocab_size - 1] = 30.0  # request 0, verifying row
    logits[2:4, 5] = 30.0  # request 1's rows favour token 5
    sm = SamplingMetadata.from_requests([1.0, 1.0], [11, 12], DEVICE)
    return md, logits.to(DEVICE), sm


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_the_guard_a_placeholder_is_accepted_and_emitted(backend):
    md, logits, sm = _bug_case()
    out = RejectionSampler(FIX_OFF, backend=backend)(md, None, logits, sm)
    assert out[1, 0].item() == PLACEHOLDER_TOKEN_ID, "the -1 draft should be accepted and emitted"
    assert out[1, 1].item() == 5, "decoding continues after the bogus token"
    with pytest.raises(AssertionError, match="non-token in the valid prefix"):
        check_output_contract(out, md.num_draft_tokens, 8)
    # parse_output silently drops the -1: the request advances by two tokens where one was real.
    assert RejectionSampler.parse_output(out, 8)[1][0] == 5
    md, logits, sm = _bug_case()
    fixed = RejectionSampler(Fixes(), backend=backend)(md, None, logits, sm)
    check_output_contract(fixed, md.num_draft_tokens, 8)
    assert fixed[1, 1].item() == PLACEHOLDER_TOKEN_ID


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_the_guard_the_first_row_reads_nothing(backend):
    # The batch's very first draft is -1: offset -1 lies before the tensor; we mask that read (p = 0).
    md = SpecDecodeMetadata.make_dummy([[-1, 3]], DEVICE)
    logits = torch.zeros(3, 8, device=DEVICE)
    sm = SamplingMetadata.from_requests([1.0], [0], DEVICE)
    out = RejectionSampler(FIX_OFF, backend=backend)(md, None, logits, sm)
    check_output_contract(out, [2], 8)


def _schedule(draw, max_batch=5, max_k=4, max_vocab=10):
    vocab_size = draw(st.integers(2, max_vocab))
    ks = draw(st.lists(st.integers(0, max_k), min_size=1, max_size=max_batch))
    drafts = [draw(st.lists(st.integers(-1, vocab_size - 1), min_size=k, max_size=k)) for k in ks]
    return vocab_size, drafts


@st.composite
def schedules(draw):
    vocab_size, drafts = _schedule(draw)
    temps = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in drafts]
    seeds = [draw(st.one_of(st.none(), st.integers(0, 2**31))) for _ in drafts]
    with_q = draw(st.booleans())
    return vocab_size, drafts, temps, seeds, with_q, draw(st.integers(0, 2**31))


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_property_with_the_fix_no_placeholder_is_ever_emitted(case):
    vocab_size, drafts, temps, seeds, with_q, seed = case
    md = SpecDecodeMetadata.make_dummy(drafts)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(md.draft_token_ids.numel() + len(drafts), vocab_size, generator=g) * 3
    q = (
        torch.softmax(torch.randn(md.draft_token_ids.numel(), vocab_size, generator=g), -1)
        if with_q
        else None
    )
    out = RejectionSampler(backend="torch")(md, q, logits, SamplingMetadata.from_requests(temps, seeds))
    check_output_contract(out, md.num_draft_tokens, vocab_size)


def test_property_flipped_switch_emits_placeholders():
    # Random schedules with placeholders after rows that favour the last vocab entry: with the guard
    # off, some row breaks the output contract; with it on, none does.
    vocab_size, trials = 12, 300
    g = torch.Generator().manual_seed(5)
    drafts = [[int(t) for t in torch.randint(-1, vocab_size, (3,), generator=g)] for _ in range(trials)]
    md = SpecDecodeMetadata.make_dummy(drafts)
    logits = torch.randn(md.draft_token_ids.numel() + trials, vocab_size, generator=g)
    logits[:, vocab_size - 1] += 3.0
    sm_args = ([1.0] * trials, list(range(trials)))
    broken = 0
    for fixes in (Fixes(), FIX_OFF):
        out = RejectionSampler(fixes, backend="torch")(
            md, None, logits, SamplingMetadata.from_requests(*sm_args)
        )
        for i in range(trials):
            try:
                check_output_contract(out[i : i + 1], [3], vocab_size)
            except AssertionError:
                assert fixes == FIX_OFF, f"row {i} broke the contract with the fix on: {out[i].tolist()}"
                broken += 1
    assert broken > 0, "switching the fix off should let some placeholder through"


# ----------------------------------------------------------------------------------------------------
# distribution: emitted tokens at each position follow the target


def _positions_fit_target(out, per_request, temperature, drafts_label):
    probs = softmax_np(per_request, temperature)
    for pos in range(out.shape[1]):
        column = out[:, pos]
        reached = column[column != PLACEHOLDER_TOKEN_ID].numpy()
        if len(reached) < 50:
            continue
        ok, stat, threshold = chi_square_passes(reached, probs[pos])
        assert ok, f"{drafts_label}: position {pos}, chi2 {stat:.1f} >= {threshold:.1f} over {len(reached)}"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no-draft-probs", "draft-probs"])
def test_random_path_output_follows_the_target_distribution(with_draft_probs, temperature):
    vocab_size, trials, k = 32, 4000, 3
    torch.manual_seed(123)
    g = torch.Generator().manual_seed(7)
    per_request = torch.randn(k + 1, vocab_size, generator=g) * 1.5
    logits = per_request.repeat(trials, 1)
    if with_draft_probs:
        # The draft distribution differs from the target (opposite logits) and drafts are drawn from it.
        q_rows = torch.softmax(-per_request[:k] * 0.5, dim=-1)
        drafts = torch.stack([torch.multinomial(q_rows[j], trials, True, generator=g) for j in range(k)], 1)
        q = q_rows.repeat(trials, 1)
    else:
        drafts = torch.randint(0, vocab_size, (trials, k), generator=g)
        q = None
    drafts[: trials // 4, 1] = -1  # a quarter of the trials carry a placeholder at position 1
    if q is not None:
        # Nothing was drafted there, so the draft distribution is all zeros: the residual is p itself.
        q.view(trials, k, vocab_size)[: trials // 4, 1] = 0.0
    md = SpecDecodeMetadata.make_dummy(drafts.tolist())
    sm = SamplingMetadata.from_requests([temperature] * trials, [None] * trials)
    out = RejectionSampler(backend="torch")(md, q, logits, sm)
    check_output_contract(out, md.num_draft_tokens, vocab_size)
    _positions_fit_target(out, per_request, temperature, "all trials")
    _positions_fit_target(out[: trials // 4], per_request, temperature, "placeholder trials")


def test_chi_square_catches_a_wrong_residual():
    # Recovered tokens drawn from the target instead of max(p - q, 0): the output is biased.
    vocab_size, trials, k = 32, 4000, 1
    g = torch.Generator().manual_seed(7)
    per_request = torch.randn(k + 1, vocab_size, generator=g) * 1.5
    q_rows = torch.softmax(-per_request[:k] * 0.5, dim=-1)
    drafts = torch.multinomial(q_rows[0], trials, True, generator=g).int()
    p = torch.softmax(per_request[:k], -1)
    wrong_recovered = torch.multinomial(p[0], trials, True, generator=g).int()
    sm = SamplingMetadata.from_requests([1.0] * trials, [None] * trials)
    out = rejection_sample(
        drafts, [1] * trials, 1, torch.arange(1, trials + 1, dtype=torch.int32), q_rows.repeat(trials, 1),
        per_request[:k].repeat(trials, 1), torch.zeros(trials, dtype=torch.int32), sm,
        recovered_token_ids=wrong_recovered, backend="torch",
    )  # fmt: skip
    ok, stat, threshold = chi_square_passes(out[:, 0].numpy(), softmax_np(per_request, 1.0)[0])
    assert not ok, f"chi2 {stat:.1f} should exceed {threshold:.1f}"


def test_greedy_rows_in_a_mixed_batch_emit_only_argmaxes():
    vocab_size, trials = 16, 300
    md, logits, _, _, per_request = _random_trials([0, 0, 0], trials, vocab_size, 3, False)
    drafts = torch.randint(-1, vocab_size, (trials, 3), generator=torch.Generator().manual_seed(2))
    md = SpecDecodeMetadata.make_dummy(drafts.tolist())
    temps = [0.0 if i % 2 else 1.0 for i in range(trials)]
    out = RejectionSampler(backend="torch")(
        md, None, logits, SamplingMetadata.from_requests(temps, [None] * trials)
    )
    argmax = per_request.argmax(-1)
    greedy_rows = out[1::2]
    for pos in range(4):
        column = greedy_rows[:, pos]
        assert (column[column != PLACEHOLDER_TOKEN_ID] == argmax[pos]).all()
    check_output_contract(out, md.num_draft_tokens, vocab_size)


# ----------------------------------------------------------------------------------------------------
# seeding: reproducible, and batch-invariant for seeded requests


def _run_with(rows, backend="torch"):
    """rows: (drafts, logits [k+1, V], temperature, seed) per request; returns the output."""
    md = SpecDecodeMetadata.make_dummy([r[0] for r in rows], DEVICE)
    logits = torch.cat([r[1] for r in rows]).to(DEVICE)
    sm = SamplingMetadata.from_requests([r[2] for r in rows], [r[3] for r in rows], DEVICE)
    return RejectionSampler(backend=backend)(md, None, logits, sm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_requests_are_reproducible_and_batch_invariant(backend):
    vocab_size = 16
    g = torch.Generator().manual_seed(0)
    flat = lambda k: torch.randn(k + 1, vocab_size, generator=g) * 0.3  # near-uniform: outcomes vary a lot
    target = ([3, 5, 7], flat(3), 1.0, 1234)
    others_a = [([1], flat(1), 0.8, None), ([], flat(0), 1.0, 99)]
    others_b = [([2, 2, 2, 2], flat(4), 0.0, None), ([-1, 4], flat(2), 1.5, None), ([0], flat(1), 1.0, 5)]
    outputs = []
    for batch in ([target] + others_a, others_b + [target], others_a[:1] + [target] + others_b):
        torch.manual_seed(len(outputs))  # unseeded rows draw different numbers each time
        out = _run_with(batch, backend)
        row = out[batch.index(target)]
        outputs.append(row[: 3 + 1].tolist())
    assert outputs[0] == outputs[1] == outputs[2]
    # And the seed matters: other seeds give other outcomes (so the equality above is not vacuous).
    seen = {tuple(_run_with([(target[0], target[1], 1.0, s)], backend)[0].tolist()) for s in range(12)}
    assert len(seen) > 3


def test_a_request_without_drafts_consumes_no_uniforms_from_its_generator():
    gens = {0: torch.Generator().manual_seed(8)}
    generate_uniform_probs(2, [0, 2], gens, "cpu")
    assert torch.equal(
        torch.rand(3, generator=gens[0]), torch.rand(3, generator=torch.Generator().manual_seed(8))
    )


# ----------------------------------------------------------------------------------------------------
# Triton kernels == torch references, bit for bit


@st.composite
def kernel_cases(draw):
    vocab_size, drafts = _schedule(draw, max_batch=4, max_k=4, max_vocab=9)
    ks = [len(d) for d in drafts]
    total, batch = sum(ks), len(ks)
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    target_probs = torch.softmax(torch.randn(total, vocab_size, generator=g) * 2, -1)
    draft_probs = None
    if draw(st.booleans()):
        draft_probs = torch.softmax(torch.randn(total, vocab_size, generator=g) * 2, -1)
        draft_probs[torch.rand(total, vocab_size, generator=g) < 0.2] = 0.0  # q == 0 must reject
    uniform = torch.rand(total, dtype=torch.float64, generator=g)
    flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int32)
    if total and draw(st.booleans()):
        # Ties: u exactly equal to p (q = 1) must accept in both implementations.
        rows = torch.arange(total)
        real = flat >= 0
        uniform[real] = target_probs[rows[real], flat[real].long()].double()
    is_greedy = None if draw(st.booleans()) else torch.tensor(draw(st.lists(st.booleans(), min_size=batch,
                                                                            max_size=batch)))  # fmt: skip
    case = dict(
        drafts=flat,
        target_probs=target_probs,
        draft_probs=draft_probs,
        uniform=uniform,
        recovered=torch.randint(0, vocab_size, (total,), generator=g, dtype=torch.int32),
        bonus=torch.randint(0, vocab_size, (batch,), generator=g, dtype=torch.int32),
        argmax=torch.randint(0, vocab_size, (total,), generator=g, dtype=torch.int32),
        is_greedy=is_greedy,
    )
    case = {name: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for name, t in case.items()}
    return dict(case, ks=ks, reject=draw(st.booleans()))


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
@settings(max_examples=30, deadline=None)
@given(kernel_cases())
def test_triton_kernels_equal_torch_references(case):
    ks = case["ks"]
    cu = torch.tensor(ks, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE)
    max_spec_len = max(ks)
    outs = {}
    garbage = 12345  # each core writes its rows whole, so it must overwrite this everywhere in them
    for backend in ("torch", "triton"):
        out = torch.full((len(ks), max_spec_len + 1), garbage, dtype=torch.int32, device=DEVICE)
        rejection_random_sample(
            out, cu, case["drafts"], case["draft_probs"], case["target_probs"], case["bonus"],
            case["recovered"], case["uniform"], case["is_greedy"], max_spec_len,
            reject_negative_drafts=case["reject"], backend=backend,
        )  # fmt: skip
        greedy_out = torch.full_like(out, garbage)
        rejection_greedy_sample(
            greedy_out, cu, case["drafts"], case["argmax"].long(), case["bonus"], case["is_greedy"],
            max_spec_len, backend=backend,
        )  # fmt: skip
        outs[backend] = (out, greedy_out)
    assert torch.equal(outs["torch"][0], outs["triton"][0])
    assert torch.equal(outs["torch"][1], outs["triton"][1])
    greedy = case["is_greedy"] if case["is_greedy"] is not None else torch.ones(len(ks), dtype=torch.bool)
    greedy = greedy.to(DEVICE).bool()
    random_rows = ~greedy if case["is_greedy"] is not None else torch.ones_like(greedy)
    for out, rows in ((outs["triton"][0], random_rows), (outs["triton"][1], greedy)):
        assert not bool((out[rows] == garbage).any())  # written whole: tokens, then placeholders
        assert bool((out[~rows] == garbage).all())  # the other sampler's rows are left alone


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
@settings(max_examples=15, deadline=None)
@given(schedules())
def test_forward_is_identical_on_both_backends(case):
    vocab_size, drafts, temps, seeds, with_q, seed = case
    md = SpecDecodeMetadata.make_dummy(drafts, DEVICE)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(md.draft_token_ids.numel() + len(drafts), vocab_size, generator=g).to(DEVICE) * 3
    q = (
        torch.softmax(torch.randn(md.draft_token_ids.numel(), vocab_size, generator=g), -1)
        if with_q
        else None
    )
    q = q.to(DEVICE) if with_q else None
    outs = []
    for backend in ("torch", "triton"):
        torch.manual_seed(seed)
        outs.append(RejectionSampler(FIX_OFF if seed % 2 else Fixes(), backend=backend)(
            md, q, logits, SamplingMetadata.from_requests(temps, seeds, DEVICE)))  # fmt: skip
    assert torch.equal(outs[0], outs[1])


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
@pytest.mark.parametrize("splits", [2, 5])
@pytest.mark.parametrize("with_q", [False, True], ids=["no-draft-probs", "draft-probs"])
@pytest.mark.parametrize("temps", [[1.0, 0.8, 0.0, 1.3], [1.0, 0.8, 0.5, 1.3]], ids=["mixed", "all-random"])
def test_split_recovered_keys_reduced_in_the_random_kernel_give_the_same_table(
    monkeypatch, splits, with_q, temps
):
    # the GPU's launch for few tokens: rows split over programs, their keys read by the random kernel itself
    from specfix.v1 import recovered_tokens

    drafts, vocab = [[5, -1, 7], [], [3, 3], [-1]], 300
    md = SpecDecodeMetadata.make_dummy(drafts, DEVICE)
    g = torch.Generator().manual_seed(splits)
    logits = torch.randn(md.draft_token_ids.numel() + len(drafts), vocab, generator=g).to(DEVICE) * 3
    q = torch.softmax(torch.randn(md.draft_token_ids.numel(), vocab, generator=g), -1) if with_q else None

    def sampling():  # fresh generators for each run
        return SamplingMetadata.from_requests(temps, [11, None, None, 12], DEVICE)

    torch.manual_seed(4)
    ref = RejectionSampler(backend="torch")(md, q, logits, sampling())
    monkeypatch.setattr(recovered_tokens, "recovered_launch", lambda programs, v: (64, splits))
    launched = []
    monkeypatch.setattr(recovered_tokens, "_recovered_tokens_reduce_kernel", launched)  # never indexed
    torch.manual_seed(4)
    ours = RejectionSampler(backend="triton")(md, q, logits, sampling())
    assert torch.equal(ours, ref) and not launched
    assert bool((ref[:, 0] != PLACEHOLDER_TOKEN_ID).all())  # every row emitted a token


# ----------------------------------------------------------------------------------------------------
# bad input: a clear error naming the argument, and no randomness consumed


def _good():
    md = SpecDecodeMetadata.make_dummy([[1, 2], [3]])
    return md, torch.randn(5, 8), SamplingMetadata.from_requests([1.0, 0.0], [7, None])


def _with_draft(md, index, value):
    """``md`` with one draft id overwritten after construction (make_dummy refuses such ids itself)."""
    md.draft_token_ids[index] = value
    return md


def _poisoned(table, row, value):
    """A copy with one bad entry in ``row`` (or, for -inf, the whole row -inf)."""
    table = table.clone()
    table[row, slice(None) if value == float("-inf") else 2] = value
    return table


@pytest.mark.parametrize(
    "mutate, error, word",
    [
        (lambda md, lg, q: (md, lg[:4], q), ValueError, "logits must have"),
        (lambda md, lg, q: (md, lg.long(), q), TypeError, "logits"),
        (lambda md, lg, q: (md, lg, torch.rand(3, 7)), ValueError, "draft_probs"),
        (lambda md, lg, q: (md, lg, torch.rand(2, 8)), ValueError, "draft_probs"),
        (lambda md, lg, q: (SpecDecodeMetadata.make_dummy([[1, 8], [3]]), lg, q), ValueError, "draft_token"),
        (lambda md, lg, q: (_with_draft(md, 1, -2), lg, q), ValueError, r"draft_token_ids must lie in \[-1,"),
        (lambda md, lg, q: (SpecDecodeMetadata.make_dummy([[1], [2], [3]]), torch.randn(6, 8), q), ValueError,
         "temperature"),
        # a NaN row used to be sampled silently as token 0; +inf and an all -inf row make the softmax NaN
        (lambda md, lg, q: (md, _poisoned(lg, 3, float("nan")), q), ValueError,
         r"logits must be free of NaN.*1 row\(s\) are not, the first is row 3"),
        (lambda md, lg, q: (md, _poisoned(lg, 0, float("inf")), q), ValueError, "first is row 0"),
        (lambda md, lg, q: (md, _poisoned(lg, 4, float("-inf")), q), ValueError, "first is row 4"),
        (lambda md, lg, q: (md, lg, _poisoned(torch.rand(3, 8), 1, float("nan"))), ValueError,
         r"draft_probs must be in \[0, 1\]; 1 row\(s\) are not, the first is row 1"),
        (lambda md, lg, q: (md, lg, _poisoned(torch.rand(3, 8), 2, -0.1)), ValueError, "first is row 2"),
        (lambda md, lg, q: (md, lg, _poisoned(torch.rand(3, 8), 0, 1.5)), ValueError, "first is row 0"),
    ],
)  # fmt: skip
def test_bad_forward_input_is_refused_before_any_randomness(mutate, error, word):
    md, logits, sm = _good()
    md, logits, q = mutate(md, logits, None)
    state = sm.generators[0].get_state()
    global_state = torch.get_rng_state()
    with pytest.raises(error, match=word):
        RejectionSampler(backend="torch")(md, q, logits, sm)
    assert torch.equal(sm.generators[0].get_state(), state)
    assert torch.equal(torch.get_rng_state(), global_state)


def test_more_drafts_than_max_spec_len_are_refused():
    md = SpecDecodeMetadata.make_dummy([[1] * (MAX_SPEC_LEN + 1)])
    with pytest.raises(ValueError, match="MAX_SPEC_LEN"):
        RejectionSampler()(md, None, torch.randn(MAX_SPEC_LEN + 2, 4), greedy(1))


def test_sampling_metadata_bad_input():
    with pytest.raises(ValueError, match=r"temperatures\[1\]"):
        SamplingMetadata.from_requests([1.0, -0.5], [None, None])
    with pytest.raises(ValueError, match="empty"):
        SamplingMetadata.from_requests([], [])
    with pytest.raises(ValueError, match="seeds"):
        SamplingMetadata.from_requests([1.0], [None, 3])
    with pytest.raises(TypeError, match="temperatures"):
        SamplingMetadata.from_requests([float("nan")], [None])
    with pytest.raises(ValueError, match="temperature"):
        SamplingMetadata(torch.tensor([-1.0]), False, True, {})
    with pytest.raises(ValueError, match="all_greedy"):
        SamplingMetadata(torch.tensor([0.0, 1.0]), True, False, {})
    with pytest.raises(ValueError, match=r"temperature must be finite and >= 0 .*got \[1.0, inf\]"):
        SamplingMetadata(torch.tensor([1.0, float("inf")]), False, True, {})
    with pytest.raises(TypeError, match=r"temperatures\[0\] must be a finite number, got inf"):
        SamplingMetadata.from_requests([float("inf")], [None])
    with pytest.raises(ValueError, match=r"seeds\[1\] must fit in an int64, got 18446744073709551616"):
        SamplingMetadata.from_requests([1.0, 1.0], [3, 2**64])
    with pytest.raises(TypeError, match="generators must be a dict of batch index -> torch.Generator"):
        SamplingMetadata(torch.tensor([1.0]), False, True, {0: 5})
    with pytest.raises(TypeError, match="all_random must be a bool, got 1"):
        SamplingMetadata(torch.tensor([1.0]), False, 1, {})


@pytest.mark.parametrize("backend", BACKENDS)
def test_temperatures_below_sampling_eps_are_greedy(backend):
    """A subnormal temperature (1e-40; 1e-45 in float32) overflows ``logits / T`` into NaN, which made
    every token 0. Below SAMPLING_EPS (vLLM's 1e-5) a request is greedy, however it reaches the sampler."""
    md = SpecDecodeMetadata.make_dummy([[3, 1], [2], [4, 4], [0]])
    logits = torch.randn(10, 6, generator=torch.Generator().manual_seed(0)) * 4
    tiny = torch.tensor([1e-40, 1e-45, 9e-6, 0.0])
    assert tiny[1] > 0  # float32 keeps 1e-45 as a subnormal, not as zero
    direct = SamplingMetadata(tiny, all_greedy=True, all_random=False, generators={})
    assert direct.is_greedy.tolist() == [True] * 4
    built = SamplingMetadata.from_requests([1e-40, 1e-45, 9e-6, 0.0], [1, 2, None, 3])
    assert built.all_greedy and built.temperature is None and built.generators == {}
    expected = RejectionSampler(backend=backend)(md, None, logits.clone(), greedy(4))
    for sm in (direct, built):
        assert torch.equal(RejectionSampler(backend=backend)(md, None, logits.clone(), sm), expected)
    # one tiny temperature among random requests: that row alone is greedy, and its temperature is 1
    mixed = SamplingMetadata.from_requests([1e-40, 1.0, 0.5, 1.0], [None, 5, 6, 7])
    assert mixed.is_greedy.tolist() == [True, False, False, False]
    assert mixed.temperature.tolist() == [0.0, 1.0, 0.5, 1.0]
    out = RejectionSampler(backend=backend)(md, None, logits.clone(), mixed)
    assert torch.equal(out[0], expected[0])
    check_output_contract(out, md.num_draft_tokens, 6)


def test_sampling_metadata_flags_and_generators():
    sm = SamplingMetadata.from_requests([0.0, 1.0, 0.5], [4, 5, None])
    assert (sm.all_greedy, sm.all_random) == (False, False)
    assert list(sm.generators) == [1], "only seeded random requests get a generator"
    assert sm.is_greedy.tolist() == [True, False, False]
    allg = SamplingMetadata.from_requests([0.0, 0.0], [1, None])
    assert allg.temperature is None and allg.all_greedy and not allg.all_random
    assert SamplingMetadata.from_requests([2.0], [None]).all_random


def test_core_refuses_bad_caller_randomness():
    sm = SamplingMetadata.from_requests([1.0], [None])
    args = (torch.tensor([1], dtype=torch.int32), [1], 1, torch.tensor([1], dtype=torch.int32), None,
            torch.randn(1, 4), torch.tensor([0], dtype=torch.int32), sm)  # fmt: skip
    with pytest.raises(TypeError, match="uniform_probs"):
        rejection_sample(*args, uniform_probs=torch.rand(1))
    with pytest.raises(ValueError, match="recovered_token_ids"):
        rejection_sample(*args, recovered_token_ids=torch.tensor([4], dtype=torch.int32))
    with pytest.raises(TypeError, match="bonus_token_ids"):
        rejection_sample(*args[:6], torch.tensor([0.0]), sm)
    with pytest.raises(ValueError, match="backend"):
        rejection_sample(*args, backend="cuda")
    with pytest.raises(ValueError, match="target_logits must be free of NaN"):
        rejection_sample(*args[:5], torch.tensor([[0.0, float("nan"), 1.0, 2.0]]), *args[6:])


def _caller_args(**change):
    """``rejection_sample``'s arguments for two random requests with one draft each (V = 4), changed."""
    args = dict(
        draft_token_ids=torch.tensor([1, 2], dtype=torch.int32),
        num_draft_tokens=[1, 1],
        max_spec_len=1,
        cu_num_draft_tokens=torch.tensor([1, 2], dtype=torch.int32),
        draft_probs=None,
        target_logits=torch.randn(2, 4),
        bonus_token_ids=torch.tensor([0, 3], dtype=torch.int32),
        sampling_metadata=SamplingMetadata.from_requests([1.0, 1.0], [None, None]),
    )
    return {**args, **change}


def _uniforms(*values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("change, word", [
    (dict(uniform_probs=_uniforms(0.5, 1.0)), r"uniform_probs must lie in \[0, 1\), got min 0.5, max 1"),
    (dict(uniform_probs=_uniforms(-0.1, 0.5)), r"uniform_probs must lie in \[0, 1\), got min -0.1"),
    (dict(uniform_probs=_uniforms(float("nan"), 0.5)), r"uniform_probs must lie in \[0, 1\), got min nan"),
    (dict(bonus_token_ids=torch.tensor([0, 4], dtype=torch.int32)), r"bonus_token_ids must lie in \[0, 4\)"),
    (dict(bonus_token_ids=torch.tensor([-1, 0], dtype=torch.int32)), r"bonus_token_ids .* got min -1"),
    (dict(cu_num_draft_tokens=torch.tensor([1, 1], dtype=torch.int32)),
     r"cu_num_draft_tokens must be the inclusive cumulative sum of num_draft_tokens \[1, 1\]; 1 entries"),
    (dict(cu_num_draft_tokens=torch.tensor([0, 2], dtype=torch.int32)), "the first is entry 0"),
    (dict(num_draft_tokens=[], draft_token_ids=torch.tensor([], dtype=torch.int32), max_spec_len=0),
     "num_draft_tokens must be a non-empty list: a batch needs at least one request"),  # not the temperature
    (dict(num_draft_tokens=[2, -1]), r"num_draft_tokens must hold ints >= 0, got -1"),
])  # fmt: skip
def test_rejection_sample_refuses_bad_values_by_name_before_any_randomness(change, word):
    """Uniforms outside [0, 1) or NaN, bonus ids outside the vocabulary, cumulative counts that disagree
    with the counts, and an empty batch, all used to run (or, empty, to be told about the temperature)."""
    args = _caller_args(**change)
    inputs = [t.clone() for t in args.values() if isinstance(t, torch.Tensor)]
    state = torch.get_rng_state()
    with pytest.raises(ValueError, match=word):
        rejection_sample(**args)
    assert torch.equal(torch.get_rng_state(), state)
    after = [t for t in args.values() if isinstance(t, torch.Tensor)]
    for was, now in zip(inputs, after, strict=True):
        torch.testing.assert_close(now, was, rtol=0, atol=0, equal_nan=True)


def test_value_checks_on_a_gpu_run_only_under_device_checks(monkeypatch):
    """On a GPU a value check is a host sync, so a step makes none unless ``device_checks`` is on: here the
    tensors are declared GPU tensors to ``device_checks.wanted`` (the test runs anywhere)."""
    monkeypatch.setattr(device_checks, "wanted", lambda *tensors: device_checks.on())
    bad = _caller_args(
        bonus_token_ids=torch.tensor([0, 9], dtype=torch.int32),
        cu_num_draft_tokens=torch.tensor([1, 1], dtype=torch.int32),
    )
    with device_checks.enabled(False):
        rejection_sample(**bad)  # not read back: nothing refuses it
    with device_checks.enabled(), pytest.raises(ValueError, match="bonus_token_ids must lie in"):
        rejection_sample(**bad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rejection_sample_makes_no_host_sync_on_a_gpu():
    from specfix.tools.syncs import count_host_syncs

    args = {name: t.cuda() if isinstance(t, torch.Tensor) else t for name, t in _caller_args().items()}
    args["sampling_metadata"] = SamplingMetadata.from_requests([1.0, 1.0], [None, None], "cuda")
    args["uniform_probs"] = _uniforms(0.5, 0.25).cuda()
    args["recovered_token_ids"] = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    rejection_sample(**args)  # compile first
    assert count_host_syncs(lambda: rejection_sample(**args), torch.device("cuda")) == 0


def test_parse_output_refuses_a_float_tensor():
    with pytest.raises(TypeError, match="output_token_ids must be a 2-D integer tensor"):
        RejectionSampler.parse_output(torch.zeros(2, 3), 8)


def test_a_negative_draft_is_rejected_without_reading_a_probability():
    """vLLM's kernel masks both probability loads with ``draft >= 0``: nothing is read for a -1 (the
    outputs are those of a clamped read; the memory traffic is not). The fixed lines say so."""
    fixed = " ".join(show_fix("reject_negative_drafts").marked("+"))
    unfixed = " ".join(show_fix("reject_negative_drafts").marked("-"))
    assert "readable = draft >= 0" in fixed and "readable = flat >= 0" in unfixed
    kernel = "\n".join(text for _, text in show_fix("reject_negative_drafts").sites[0][3])
    assert kernel.count("mask=readable") == 2 and "maximum(draft" not in kernel


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no-draft-probs", "draft-probs"])
@pytest.mark.parametrize("fixes", [Fixes(), FIX_OFF], ids=["fix-on", "fix-off"])
@pytest.mark.parametrize("batch", [2, 64])  # 8 and 256 draft tokens: rows split over 64 and 4 programs
def test_compiled_kernels_equal_references_at_realistic_size(with_draft_probs, fixes, batch):
    # A Qwen-sized vocabulary, compiled kernels, CUDA generators: still bit for bit.
    k, vocab_size = 4, 151_936
    g = torch.Generator(device="cuda").manual_seed(0)
    drafts = torch.randint(0, vocab_size, (batch, k), generator=g, device="cuda")
    drafts[::3, 1:] = -1
    drafts[::5, :] = -1
    md = SpecDecodeMetadata.make_dummy(drafts.tolist(), "cuda")
    logits = torch.randn(batch * (k + 1), vocab_size, generator=g, device="cuda") * 3
    logits[:, vocab_size - 1] += 8.0  # makes the pre-fix -1 read likely to accept
    q = (
        torch.softmax(torch.randn(batch * k, vocab_size, generator=g, device="cuda"), -1)
        if with_draft_probs
        else None
    )
    temps = [0.0 if i % 4 == 0 else 1.0 for i in range(batch)]
    outs = []
    for backend in ("torch", "triton"):
        sm = SamplingMetadata.from_requests(temps, list(range(batch)), "cuda")
        outs.append(RejectionSampler(fixes, backend=backend)(md, q, logits, sm))
    assert torch.equal(outs[0], outs[1])
    if fixes == Fixes():
        check_output_contract(outs[1], md.num_draft_tokens, vocab_size)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
def test_the_whole_verification_step_replays_from_one_cuda_graph(mode):
    from specfix.tools.bench import capture_graph

    batch, k, vocab_size = 8, 3, 32_000
    g = torch.Generator(device="cuda").manual_seed(1)
    drafts = torch.randint(0, vocab_size, (batch, k), generator=g, device="cuda")
    drafts[::4, -1] = -1
    md = SpecDecodeMetadata.make_dummy(drafts.tolist(), "cuda")
    logits = torch.randn(batch * (k + 1), vocab_size, generator=g, device="cuda") * 3
    temps = {"greedy": [0.0] * batch, "random": [1.0] * batch, "mixed": [0.0, 1.0] * (batch // 2)}[mode]
    # q = the target's own probabilities (T = 1): p / q = 1 >= u, so every real random draft is accepted
    q = None if mode == "greedy" else torch.softmax(logits[md.target_logits_indices.long()], -1)
    sm = SamplingMetadata.from_requests(temps, [None] * batch, "cuda")
    sampler = RejectionSampler(backend="triton")
    eager = sampler(md, q, logits, sm)
    tables = []
    graph = capture_graph(lambda: tables.append(sampler(md, q, logits, sm)))  # a host sync would fail here
    graph.replay()
    replayed = tables[-1].clone()
    check_output_contract(replayed, md.num_draft_tokens, vocab_size)
    greedy = torch.tensor(temps, device="cuda") == 0.0
    assert torch.equal(replayed[greedy], eager[greedy])
    whole = (drafts >= 0).all(dim=1) & ~greedy  # random rows without a placeholder: all accepted
    assert torch.equal(replayed[whole, :k], drafts[whole].to(torch.int32))


def test_without_triton_the_reference_runs(monkeypatch):

    monkeypatch.setattr(rejection_kernels, "HAS_TRITON", False)
    md = SpecDecodeMetadata.make_dummy([[1, -1]])
    out = RejectionSampler()(md, None, logits_with_argmax([1, 4, 2], 8), greedy(1))
    assert out.tolist() == [[1, 4, -1]]
    with pytest.raises(RuntimeError, match="backend='torch'"):
        RejectionSampler(backend="triton")


def test_recovery_noise_skips_requests_without_drafts_and_greedy_batches_draw_nothing():
    gens = {0: torch.Generator().manual_seed(8), 1: torch.Generator().manual_seed(9)}
    state0 = gens[0].get_state()
    sm = SamplingMetadata(torch.tensor([1.0, 1.0]), False, True, gens)
    probs = torch.softmax(torch.randn(2, 6), -1)
    sample_recovered_tokens(2, [0, 2], torch.tensor([0, 2]), torch.tensor([1, 2]), None, probs, sm, "cpu")
    assert torch.equal(gens[0].get_state(), state0), "request 0 has no drafts: its generator is untouched"
    assert not torch.equal(gens[1].get_state(), torch.Generator().manual_seed(9).get_state())
    # An all-greedy step uses no randomness at all.
    md, logits = SpecDecodeMetadata.make_dummy([[1, 2], [-1]]), torch.randn(5, 6)
    before = torch.get_rng_state()
    RejectionSampler()(md, None, logits, greedy(2))
    assert torch.equal(torch.get_rng_state(), before)


# ----------------------------------------------------------------------------------------------------
# beside vLLM 0.33's own rejection sampler


@pytest.mark.skipif(
    DEVICE.type != "cpu",
    reason="compares in Triton's interpreter; on a GPU the bench (--peer) compares the tables",
)
@pytest.mark.parametrize("mode", ["greedy", "random"])
def test_same_tables_as_vllms_own_rejection_sample(vllm_rejection, mode):
    """vLLM 0.33's ``rejection_sample`` (``vllm/v1/sample/rejection_sampler.py``, fetched into .peer/) and
    specfix's rejection core on the same inputs, both in Triton's interpreter, as the bench compares them on
    the GPU: every fourth request with a placeholder (-1) draft, every request seeded. Same output table."""
    batch, k, vocab = 6, 3, 64
    gen = torch.Generator().manual_seed(11)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    drafts[::4, -1] = -1
    md = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=DEVICE)
    logits = torch.randn(batch * (k + 1), vocab, generator=gen) * 3
    target = logits[md.target_logits_indices.long()].contiguous()
    bonus = torch.randint(0, vocab, (batch,), dtype=torch.int32, generator=gen)
    probs = None if mode == "greedy" else torch.softmax(torch.randn(batch * k, vocab, generator=gen), -1)
    seeds = [1000 + i for i in range(batch)]
    args = (md.draft_token_ids, md.num_draft_tokens, md.max_spec_len, md.cu_num_draft_tokens, probs, target)
    generators = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}
    theirs_meta = vllm_rejection.SamplingMetadata(
        temperature=None if mode == "greedy" else torch.ones(batch),
        all_greedy=mode == "greedy",
        all_random=mode == "random",
        generators=generators,
    )
    torch.manual_seed(0)
    theirs = vllm_rejection.rejection_sample(*args, bonus.view(-1, 1), theirs_meta)
    torch.manual_seed(0)
    temps = [0.0 if mode == "greedy" else 1.0] * batch
    ours = rs._rejection_sample(*args, bonus, SamplingMetadata.from_requests(temps, seeds))
    assert torch.equal(ours, theirs)
    assert (ours[::4] == PLACEHOLDER_TOKEN_ID).any()  # the -1 drafts were rejected, in both
